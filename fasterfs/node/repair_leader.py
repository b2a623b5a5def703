"""RepairLeader: auto repair with no coordinator, as one node's part of it.

Every node probes the others each `repair.check_s`; the lowest-numbered node whose MinIO answers
asks the Registry for the repair lease (fasterfs.core.lease) and, holding it, surveys the namespace and
repairs it, its changes fenced by the lease's epoch. Pieces on a node down for less than `repair.after_s` are
left alone (it may come back). A survey lists every node's bucket (most of an idle node's CPU with
10,000 chunks if done every check), so the leader surveys only when the nodes changed (down or
back, one down past `after_s`), while the last survey found anything to do, and at least every
`repair.survey_s` (objects lost behind MinIO's back; less often when surveys that often would
take over SURVEY_SHARE of the time, and not while the namespace changes: a survey listing every
bucket beside a load slows the load's every batch, for nothing the load's own checks miss — it
waits for `repair.quiet_s` without a change, DEFER_MAX times its spacing at most). A change of the
namespace alone is checked, not surveyed: only the pieces of the names that changed, so a load of
a million files costs per batch what the batch holds, not what is stored already; what the check
finds wrong is repaired by a survey.
A change of the nodes alone (one down, one back) is looked at by what the namespace places on
them: nodes listed whole by an earlier look and answering every probe since are believed, not
listed again, so a lost node's chunks are rebuilt as soon as it is gone, not after minutes of
listing what the others hold; a node back is listed (it may have come back empty). What the
believed nodes may have lost meanwhile behind MinIO's back is each node's scrub's (by what its
index places there) and the periodic survey's.

The probes, the survey and the repair come in as functions, so the decisions are testable
without MinIO: `tick(now)` is one round.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .repair import Outcome
from .repair_health import Health

log = logging.getLogger("fasterfs.node.repair_leader")

HISTORY = 20  # repairs kept for `status`
MOVES_RECENT_S = 300  # moves this recent make the rate `status` and the dashboard show
SURVEY_SHARE = 0.05  # of the leader's time its periodic surveys may take
DEFER_MAX = 4  # a periodic survey waits for the namespace to rest at most this many times its spacing


@dataclass(frozen=True)
class Timing:
    check_s: float
    after_s: float
    survey_s: float
    auto: bool
    quiet_s: float = 30.0

    @classmethod
    def of(cls, repair_cfg) -> Timing:
        return cls(repair_cfg.check_s, repair_cfg.after_s, repair_cfg.survey_s, bool(repair_cfg.auto),
                   repair_cfg.quiet_s)


class RepairLeader:
    """`probe()` -> (every node of the cluster, those whose MinIO answers now); `version()` -> the
    namespace's version; `survey(trusted)` -> its Health, the nodes in `trusted` believed to hold
    what the namespace places on them (not listed); `check(since)` -> (the namespace's version,
    the Health of just the names changed since version `since`), or None when that cannot be
    told (the store's log no longer reaches back); `repair(waiting, epoch, trusted)` -> the Outcome
    of a repair that leaves the pieces of the nodes in `waiting` alone, fenced by the lease's epoch;
    `lease(ttl_s)` -> the repair lease's epoch for this node (granted or renewed), or None: held by
    another, or the granter unreachable. The lowest answering node asks for it; only its holder
    leads, so two sides of a partition never both repair."""

    def __init__(self, node: int, timing: Timing, probe: Callable[[], tuple[list[int], set[int]]],
                 version: Callable[[], int], survey: Callable[[frozenset[int]], Health],
                 check: Callable[[int], tuple[int, Health] | None],
                 repair: Callable[[set[int], int, frozenset[int]], Outcome], lease: Callable[[float], int | None]):
        self.node, self.timing = node, timing
        self.probe, self.version, self.survey, self.check = probe, version, survey, check
        self.repair, self.lease = repair, lease
        self.health: dict | None = None  # the namespace's redundancy as this node last surveyed it (when it leads)
        self.repairs: list[dict] = []    # what this node's own repairs did, latest last
        self._down_since: dict[int, float] = {}
        self._seen: tuple | None = None  # what the last survey saw
        self._listed: set[int] = set()  # nodes listed whole by a look, answering every probe since
        self._surveyed = float("-inf")
        self._took = 0.0  # seconds the last survey (or repair) took
        self._version: tuple[int, float] | None = None  # the namespace's version, and when first seen
        self._survey_lock = threading.Lock()
        self._survey_began = float("-inf")  # when the last survey began,
        self._surveyed_health: dict = {}       # and what it found

    def tick(self, now: float | None = None) -> str:
        """One round; returns what it did: follow (another node leads), wait (nothing changed),
        check (only the namespace changed, and its changes are whole), survey (repair.auto off)
        or repair."""
        now = time.monotonic() if now is None else now
        nodes, alive = self.probe()
        for n in nodes:
            if n in alive:
                self._down_since.pop(n, None)
            else:
                self._down_since.setdefault(n, now)
        self._listed &= alive
        epoch = None  # the repair lease's, when this node holds it
        if alive and min(alive) == self.node:
            try:  # a few checks' worth: a leader that stops renewing is replaced soon after
                epoch = self.lease(3 * self.timing.check_s)
            except Exception as e:
                log.warning("node %d cannot reach the repair lease's granter: %s", self.node, e)
        if epoch is None:
            self.health, self._seen = None, None
            return "follow"
        if self.timing.auto and self.health is None:
            # new to leading: learn the nodes the data names that are no longer part of the
            # cluster (a host left out at `up`), which no probe sees, so they wait like any down one
            self._looked(alive, self.survey_now())
        for n in set((self.health or {}).get("nodes_down", ())) - set(nodes):
            self._down_since.setdefault(n, now)
        # a node is gone only after after_s down; one that answered the probe but not the
        # survey's listing (just back, busy) must not have its pieces rebuilt elsewhere
        gone = {n for n, t in self._down_since.items() if now - t >= self.timing.after_s}
        waiting = (set(nodes) | set(self._down_since)) - gone
        seen = (frozenset(alive), frozenset(waiting), self.version())
        if self._version is None or self._version[0] != seen[2]:
            self._version = (seen[2], now)
        # nothing a repair can do now: no piece to move, and every degraded chunk lost (too few
        # pieces to rebuild it from) or missing only pieces of a node waited for, either of which
        # waits for a change of the nodes. Lost chunks, and a node down for less than after_s,
        # kept the leader listing every bucket every round (at a million objects, for ever).
        settled = self.health is not None and not self.health.get("repairable")
        # the periodic survey, spaced so that it takes at most SURVEY_SHARE of the time (a million
        # objects take minutes, paced: bucket_walk), once the namespace rests
        spacing, since = max(self.timing.survey_s, self._took / SURVEY_SHARE), now - self._surveyed
        due = since >= spacing and (now - self._version[1] >= self.timing.quiet_s or since >= DEFER_MAX * spacing)
        if seen == self._seen and settled and not due:
            return "wait"
        if settled and not due and self._seen is not None and seen[:2] == self._seen[:2] and self._checked(seen):
            return "check"
        trusted: frozenset[int] = frozenset()
        if settled and not due and self._seen is not None and seen[:2] != self._seen[:2]:
            # the nodes changed, nothing else is due: believe those listed before (the module's
            # doc); the names changed meanwhile are still checked, from the version seen before
            trusted = frozenset(self._listed & alive)
            seen = (*seen[:2], self._seen[2])
        self._seen, began = seen, time.monotonic()
        if not trusted:
            self._surveyed = now
        try:
            if not self.timing.auto:
                self._looked(alive, self.survey_now(trusted))
                return "survey"
            out = self.repair(waiting, epoch, trusted)
            self.health = out.health.to_dict()
            if out.repaired or out.failed:
                self.record("auto", out)
                self.survey_now(frozenset() if out.failed else trusted)  # a failure may be a belief wrong
            self._looked(alive, self.health)
            return "repair"
        finally:
            if not trusted:
                self._took = time.monotonic() - began

    def _looked(self, alive: set[int], health: dict) -> None:
        """After a look: every node that answered it was listed whole, or believed as listed before."""
        self._listed = set(alive) - set(health["nodes_down"])

    def _checked(self, seen: tuple) -> bool:
        """The names changed since the last look checked, and nothing found to do (else a
        survey follows). The health shown stays the last survey's, with the check beside it."""
        assert self._seen is not None and self.health is not None
        got = self.check(self._seen[2])
        if got is None:
            return False
        version, found = got
        if found.degraded or found.lost or found.misplaced or found.nodes_down:
            log.warning("node %d: the namespace's changes up to version %s are not all at full redundancy (%s): "
                        "surveying", self.node, version, found.summary())
            return False
        self._seen = seen
        self.health = {**self.health, "changes_checked": {"version": version, "chunks": found.chunks,
                                                          "time": found.time}}
        return True

    def survey_now(self, trusted: frozenset[int] = frozenset()) -> dict:
        """The result of a survey begun after this call, kept as this node's latest (what `status`
        and the dashboard show). Callers at once share one: a million names' survey takes
        minutes, and `up`, a `status` and the leader's own round need not each run it. One that
        believes `trusted` nodes lists only the others, and is not shared."""
        if trusted:
            self.health = self._with_rate(self.survey(trusted))
            return self.health
        asked = time.monotonic()
        with self._survey_lock:
            if self._survey_began < asked:  # else one began after the ask and has just ended
                self._survey_began = time.monotonic()
                self._surveyed_health = self._with_rate(self.survey(frozenset()))
            self.health = self._surveyed_health
            return self._surveyed_health

    def moving_mb_s(self) -> float:
        """Bytes this leader's moves wrote of late over the wall time since the first of them
        began (the pauses between rounds count: what an ETA needs); 0 without moves of late."""
        now = time.time()
        recent = [r for r in self.repairs if r["moved"] and now - r["time"] < MOVES_RECENT_S]
        if not recent:
            return 0.0
        began = min(r["time"] - r["seconds"] for r in recent)
        return sum(r["bytes_written"] for r in recent) / 1e6 / max(now - began, 1e-3)

    def _with_rate(self, health: Health) -> dict:
        health.moving_mb_s = self.moving_mb_s()
        return health.to_dict()

    def record(self, why: str, out: Outcome) -> None:
        log.warning("%s repair: %d chunks repaired, %d pieces written (%d moved home), %d failed; found %s",
                    why, out.repaired, out.pieces_written, out.moved, len(out.failed), out.health.summary())
        self.repairs.append({"why": why, "time": time.time(), "repaired": out.repaired,
                             "pieces_written": out.pieces_written, "moved": out.moved,
                             "bytes_written": out.bytes_written, "seconds": out.seconds, "by_node": out.by_node,
                             "failed": out.failed[:10]})
        self.repairs[-1]["found"] = self._with_rate(out.health)  # its own moves in the rate
        del self.repairs[:-HISTORY]
