"""Repair: every chunk back to full redundancy, from what survives.

A survey lists every node's bucket once and holds it against the namespace: a piece (a
replica, or an erasure-coded shard) is missing when its node does not answer or does not
have it. Repair rebuilds each degraded chunk through the reader's own verified read path
(any good replica; any ec.data good shards), re-encodes it and writes the missing pieces:
on their own node when it answers (a host back empty, an object the scrub found bad), else
on a live node holding nothing of the chunk. A piece living away from its home (where
ingest's placement put it) moves back once the home answers again, so a host that returns
empty is refilled. The Registry applies new locations only to chunks still as the repair
saw them; moved-away pieces are deleted ingest.keep_old_s later (readers may hold the
manifest naming them).

A chunk with fewer good pieces than it needs is lost: named, and left as it is (its
surviving pieces may yet be joined by a host that comes back).

The survey is fasterfs.node.repair_survey (the nodes' listings: repair_listing; its result:
repair_health), the rebuilds fasterfs.node.repair_rebuild; `run` here ties them together.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..control import registry
from ..control.state import ClusterState
from ..write import ingest
from .repair_health import Health
from .repair_rebuild import BATCH_BYTES, Rebuild, Rebuilder, Spread, assign, batches
from .repair_survey import Names, look, plan_repairs, registry_names

log = logging.getLogger("fasterfs.node.repair")


UPDATE_BATCH = 1000  # names whose moved pieces one namespace transaction records (as put -r's batches)


@dataclass
class Outcome:
    health: Health                      # as found, before repairing
    repaired: int = 0                   # chunks back to full redundancy
    pieces_written: int = 0
    moved: int = 0                      # pieces moved home, or off a draining node
    bytes_written: int = 0
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)   # chunks a repair could not finish, and why
    by_node: dict[str, int] = field(default_factory=dict)  # node (or "here": the repair itself) -> chunks

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds else 0.0


def run(cfg, state: ClusterState, creds, progress: Callable[[int, int], None] | None = None,
        waiting: Set[int] = frozenset(), bad: Set[tuple[int, str]] = frozenset(),
        only: dict[str, set[int]] | None = None, fence: tuple[int, int] | None = None,
        names: Names | None = None, spread: Spread | None = None, share: float = 1.0,
        trusted: Set[int] = frozenset()) -> Outcome:
    """Repair the namespace (or the chunks in `only`: {name: ids}); see the module's doc.
    `fence`: (node, epoch) of the repair lease this repair runs under (the automatic leader's).
    `spread(node, jobs, down)`: has node `node` rebuild `jobs` (its StorageNode), so that a lost
    node's data is rebuilt by every target at once; a call that fails is rebuilt here.
    `trusted`: nodes believed to hold what the namespace places on them, not listed (the
    leader's repair after a change of the nodes: what a lost node held is in the manifests)."""
    started = time.monotonic()
    ingest.collect_garbage(cfg, state)
    listing, manifests, health, plans = look(state, creds, lambda listing, ms: plan_repairs(
        ms.values(), state, listing, cfg.placement.load_slack, waiting, bad, only), names or registry_names(state),
        share, trusted)
    alive = {n for n, keys in listing.items() if keys is not None}
    out = Outcome(health)
    if not plans:
        out.seconds = time.monotonic() - started
        return out
    draining = {n.index for n in state.nodes if n.draining}  # read from, never written to
    jobs, out.failed = assign(plans, alive - draining)
    down = set(listing) - alive
    local: list[Rebuilder] = []

    def here(batch: list[Rebuild]) -> list[int | str]:
        if not local:
            local.append(Rebuilder(cfg, state, creds, down))
        return local[0].many(batch)

    def node_work(node: int, work: list[list[Rebuild]]) -> list[tuple[Rebuild, int | str, str]]:
        done: list[tuple[Rebuild, int | str, str]] = []
        for batch in work:
            by = str(node) if spread else "here"
            try:
                results = spread(node, batch, down) if spread else here(batch)
            except Exception as e:
                log.warning("node %d could not rebuild %d chunks (%s): rebuilding them here", node, len(batch), e)
                results, by = here(batch), "here"
            done.extend((job, result, by) for job, result in zip(batch, results))
            with lock:
                count[0] += len(batch)
                if progress:
                    progress(count[0], len(jobs))
        return done

    lock, count = threading.Lock(), [0]
    work = batches(jobs, BATCH_BYTES)
    if not spread:  # one writer here, batch after batch
        work = {-1: [b for bs in work.values() for b in bs]}
    with ThreadPoolExecutor(max(1, len(work))) as pool:
        results = [r for rs in pool.map(node_work, work, work.values()) for r in rs]
    moves: dict[str, dict[int, tuple[list[int], list[int]]]] = collections.defaultdict(dict)
    for job, result, by in results:
        if isinstance(result, str):
            out.failed.append(result)
            continue
        c = job.plan.chunk
        out.repaired += 1
        out.pieces_written += len(job.slots)
        out.moved += len(job.plan.moves) + len(job.plan.leaving)
        out.bytes_written += result
        out.by_node[by] = out.by_node.get(by, 0) + 1
        if job.nodes != c.nodes:
            moves[job.plan.manifest.name][c.id] = (c.nodes, job.nodes)
    moved = [(m.name, m.generation, dict(moves[m.name])) for m in manifests.values() if moves.get(m.name)]
    for at in range(0, len(moved), UPDATE_BATCH):  # a lost node's files: one transaction per batch
        applied = registry.update_chunks(state.name, moved[at:at + UPDATE_BATCH], fence)
        for name, _, chunks in moved[at:at + UPDATE_BATCH]:
            for cid in set(chunks) - set(applied[name]):
                out.failed.append(f"{name} chunk {cid}: changed while repaired (re-ingested?); not applied")
    out.seconds = time.monotonic() - started
    return out
