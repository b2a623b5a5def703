"""Health: the namespace's redundancy as one repair survey found it (fasterfs.node.repair_survey),
as `status`, the dashboard and the repair leader show it."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..control.report import fmt_bytes

LOST_SHOWN = 20  # lost names a summary, `status` or the dashboard names (a lost disk may hold a million)


@dataclass
class Health:
    """The namespace's redundancy as one survey found it."""
    chunks: int = 0
    degraded: dict[str, list[int]] = field(default_factory=dict)  # name -> chunks with a piece missing
    lost: dict[str, list[int]] = field(default_factory=dict)      # name -> chunks too few pieces rebuild
    misplaced: int = 0      # pieces away from a home that answers (a returned host, to refill)
    misplaced_bytes: int = 0  # ... their bytes (an erasure-coded chunk's shard: its share)
    moving_mb_s: float = 0.0  # the repair leader's moves of late, MB/s (0: none of late)
    repairable: int = 0     # chunks a repair would rebuild or move now (not those waiting for a node)
    nodes_down: list[int] = field(default_factory=list)
    believed: list[int] = field(default_factory=list)  # nodes not listed: they hold what the namespace says
    time: float = field(default_factory=time.time)

    @property
    def degraded_count(self) -> int:
        return sum(map(len, self.degraded.values()))

    @property
    def lost_count(self) -> int:
        return sum(map(len, self.lost.values()))

    def lost_names(self) -> str:
        """The first LOST_SHOWN lost names and their chunks, and how many more."""
        shown = self.lost_shown()
        more = len(self.lost) - len(shown)
        return ("; ".join(f"{name}: chunks {', '.join(map(str, ids))}" for name, ids in shown.items())
                + (f"; and {more:,} more names" if more else ""))

    def lost_shown(self) -> dict[str, list[int]]:
        return dict(itertools.islice(self.lost.items(), LOST_SHOWN))

    def summary(self) -> str:
        down = f"; nodes down: {', '.join(map(str, self.nodes_down))}" if self.nodes_down else ""
        lost = f"; LOST {self.lost_count} ({self.lost_names()})" if self.lost else ""
        moving = f"; {self.moving()}" if self.misplaced else ""
        return (f"{self.chunks} chunks: {self.chunks - self.degraded_count} at full redundancy, "
                f"{self.degraded_count} degraded{lost}{down}{moving}")

    def moving(self) -> str:
        """The pieces on their way to their homes (growth, a drain): how many, their bytes, and at
        the leader's rate of late, how long they take."""
        if not self.misplaced:
            return ""
        rate = (f", moving at {self.moving_mb_s:.1f} MB/s: about "
                f"{self.misplaced_bytes / 1e6 / self.moving_mb_s:.0f} s left") if self.moving_mb_s else ""
        return f"{self.misplaced:,} pieces ({fmt_bytes(self.misplaced_bytes)}) to move to their homes{rate}"

    def to_dict(self) -> dict:
        return {"chunks": self.chunks, "degraded": self.degraded_count, "lost": self.lost_count,
                "lost_chunks": self.lost_shown(), "lost_names": len(self.lost), "misplaced": self.misplaced,
                "misplaced_bytes": self.misplaced_bytes, "moving_mb_s": self.moving_mb_s, "moving": self.moving(),
                "repairable": self.repairable,
                "nodes_down": self.nodes_down, "believed": self.believed,
                "time": self.time, "summary": self.summary()}
