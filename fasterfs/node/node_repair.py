"""NodeRepair: a storage node's part in repair. The leader's hooks (survey, check the changes,
repair under its lease), a scrub's rebuilds, and the chunks a repair assigns this node, all
against the namespace as this node's copy has it (caught up by the log, never fetched whole)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..control import registry
from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState
from ..core.errors import FasterFSError
from ..core.manifest import Manifest
from ..core.pace import Throttle
from ..meta.follower import Follower
from . import repair, repair_rebuild, repair_survey
from .repair_health import Health


class NodeRepair:
    def __init__(self, cfg, index: int, state: Callable[[], ClusterState], creds, namespace: Follower,
                 nodes: NodeDirectory):
        self.cfg, self.index, self.state, self.creds, self.namespace, self.nodes = \
            cfg, index, state, creds, namespace, nodes
        # (for, avoiding, it)
        self._rebuilder: tuple[ClusterState, frozenset[int], repair_rebuild.Rebuilder] | None = None
        self._rebuilder_lock = threading.Lock()

    def survey(self, trusted: frozenset[int]) -> Health:
        return repair_survey.survey(self.state(), self.creds, self.cfg.placement.load_slack, self.names_now,
                             self.cfg.minio.list_share, trusted)

    def names_now(self) -> dict[str, Manifest]:
        """Every name's manifest as the Registry has it now: this node's copy, caught up by the
        log (a delta), not the whole namespace fetched (a million names, per survey)."""
        self.namespace.catch_up()
        return self.namespace.snapshot()

    def check_changes(self, since: int) -> tuple[int, Health] | None:
        changes = registry.fetch_changes(self.cfg.cluster.name, since)
        if changes is None:
            return None
        manifests = [m for m in changes.names.values() if m is not None]
        return changes.version, repair_survey.check(self.state(), self.creds, manifests,
                                             self.cfg.placement.load_slack)

    def lease(self, ttl_s: float) -> int | None:
        return registry.lease_repair(self.cfg.cluster.name, self.index, ttl_s)

    def run(self, waiting: set[int], epoch: int, trusted: frozenset[int]) -> repair.Outcome:
        """The leader's repair, fenced by its lease, which each chunk done renews (a long repair
        keeps it; a leader cut off from the Registry loses it, and its repair is not applied)."""
        def renew(done: int, total: int) -> None:
            if self.lease(3 * self.cfg.repair.check_s) != epoch:
                raise FasterFSError(f"node {self.index} lost the repair lease (epoch {epoch}) while repairing")
        return repair.run(self.cfg, self.state(), self.creds, renew, waiting=waiting,
                          fence=(self.index, epoch), names=self.names_now, spread=self.spread(),
                          share=self.cfg.minio.list_share, trusted=trusted)

    def rebuild_bad(self, bad_pieces: set[tuple[int, str]], bad: dict[str, set[int]]) -> repair.Outcome:
        """The pieces a scrub found bad or missing, rebuilt (spread over the nodes)."""
        return repair.run(self.cfg, self.state(), self.creds, bad=bad_pieces, only=bad,
                          names=self.names_now, spread=self.spread(), share=self.cfg.minio.list_share)

    def spread(self) -> repair_rebuild.Spread:
        return repair_rebuild.through(self.nodes, own=self.index, here=self.rebuild)

    def rebuild(self, jobs: list[repair_rebuild.Rebuild], down: Iterable[int],
                mb_per_s: float | None = None) -> list[int | str]:
        """Chunks a repair assigned to this node (it takes their pieces): rebuilt from the
        survivors here, so a lost node's data is rebuilt by every target at once, at most
        `mb_per_s` (default repair.mb_per_s: a drain may ask for less). Bytes written per job,
        or why it failed."""
        state, avoid = self.state(), frozenset(down)
        rate = (self.cfg.repair.mb_per_s if mb_per_s is None else mb_per_s) * 1e6
        with self._rebuilder_lock:  # kept across a repair's calls: its clients are one per node to make
            if self._rebuilder is None or self._rebuilder[0] is not state or self._rebuilder[1] != avoid:
                self._rebuilder = (state, avoid, repair_rebuild.Rebuilder(self.cfg, state, self.creds, avoid))
            rebuilder = self._rebuilder[2]
            if rebuilder.throttle.rate != rate:
                rebuilder.throttle = Throttle(rate)
        return rebuilder.many(jobs)
