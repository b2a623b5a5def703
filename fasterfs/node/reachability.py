"""Which nodes' MinIO answer, as the repair leader asks at each tick. A node that answers again may
have taken writes while out of reach that never invalidated this node's cache: its entries here
are checked against their holders then."""
from __future__ import annotations

import logging
from collections.abc import Callable

from ..control.state import ClusterState
from .repair_listing import answering

log = logging.getLogger("fasterfs.node.reachability")


class Reachability:
    def __init__(self, state: Callable[[], ClusterState], pool, check_back: Callable[[set[int]], int]):
        self.state, self.pool, self.check_back = state, pool, check_back
        self.answering: set[int] | None = None  # the nodes whose MinIO answered the last probe

    def probe(self) -> tuple[list[int], set[int]]:
        """Every node of the cluster, and those answering now (over the fills' pooled connections)."""
        state = self.state()
        alive = answering(state, self.pool)
        back = alive - self.answering if self.answering is not None else set()
        self.answering = alive
        if back:
            dropped = self.check_back(back)
            log.warning("nodes %s answer again: %d cache entries of their chunks had changed, dropped",
                        sorted(back), dropped)
        return [n.index for n in state.nodes], alive
