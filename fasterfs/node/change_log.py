"""ChangeLog: what a set of names gained and lost, version by version, kept for a bounded number
of changes. The cache's (its readable entries) lets each node tell its peers what changed instead
of everything it holds; a peer further behind than the log reaches is told everything."""
from __future__ import annotations

import secrets
from collections import deque

LOG_MAX = 100_000  # changes kept (a peer further behind gets everything)


class ChangeLog:
    """Not thread-safe: its owner records and asks under its own lock."""

    def __init__(self, max_changes: int = LOG_MAX):
        self.epoch = secrets.token_hex(4)  # this incarnation's: versions restart with it
        self.version = 0
        self._log: deque[tuple[int, str, bool]] = deque(maxlen=max_changes)

    def record(self, name: str, present: bool) -> None:
        self.version += 1
        self._log.append((self.version, name, present))

    def since(self, version: int) -> tuple[int, list[str], list[str]] | None:
        """(version now, names present now and not at `version`, names present then and not now),
        or None when the log no longer reaches back that far (or `version` is not this
        incarnation's): take a snapshot. A name that came and went (or went and came back) since is
        in neither: its owner records each name's changes alternately, so its state at `version` is
        the opposite of its first change since."""
        if version > self.version or (version < self.version and
                                      (not self._log or self._log[0][0] > version + 1)):
            return None
        first: dict[str, bool] = {}
        last: dict[str, bool] = {}
        for v, name, present in reversed(self._log):
            if v <= version:
                break
            last.setdefault(name, present)
            first[name] = present
        return (self.version, sorted(n for n, p in last.items() if p and first[n]),
                sorted(n for n, p in last.items() if not p and not first[n]))
