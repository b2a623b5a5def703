"""A repair's rebuilds (fasterfs.node.repair): where each missing or moved piece goes (`assign`),
the chunks rebuilt through the reader's verified path and written (`Rebuilder`), and the work
spread over the writers' StorageNodes in batches (`batches`, `through`)."""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..control import s3
from ..control.node_directory import LONG
from ..control.state import ClusterState
from ..core import erasure
from ..core.errors import FasterFSError
from ..core.pace import Throttle
from ..core.placement import node_name, score
from .repair_survey import ChunkPlan

if TYPE_CHECKING:
    from ..read.client import Client


@dataclass
class Rebuild:
    """One chunk's repair, its targets chosen: the pieces in `slots` are written so that the
    chunk's pieces live on `nodes`. Its writer (the node taking its first piece) rebuilds it:
    the chunk's bytes flow from a survivor to the target, not through one leader."""
    plan: ChunkPlan
    nodes: list[int]
    slots: list[int]

    @property
    def writer(self) -> int:
        return self.nodes[self.slots[0]]

    def __str__(self) -> str:
        return f"{self.plan.manifest.name} chunk {self.plan.chunk.id} ({self.plan.chunk.key})"


def assign(plans: Iterable[ChunkPlan], alive: Set[int]) -> tuple[list[Rebuild], list[str]]:
    """Where every missing or moved piece goes, before anything is read: its own node if it
    answers, then its home, then of the live nodes holding nothing of this chunk the one this
    repair has given the fewest pieces (ties by the chunk's rendezvous score): a lost node's
    pieces spread evenly over every other, so that each rebuilds an equal share. A piece
    leaving a draining node goes the same way (`alive` holds no draining node). Also the
    chunks with no such node, and why."""
    jobs: list[Rebuild] = []
    failed: list[str] = []
    given: collections.Counter = collections.Counter()
    for plan in plans:
        nodes = list(plan.chunk.nodes)
        slots = plan.missing + [s for s in plan.moves + plan.leaving if s not in plan.missing]
        for slot in slots:
            others = set(nodes[:slot] + nodes[slot + 1:])
            node: int | None
            if slot in plan.moves:
                node = plan.home[slot]
            elif plan.chunk.nodes[slot] in alive and plan.chunk.nodes[slot] not in others:
                node = plan.chunk.nodes[slot]
            else:
                free = [n for n in sorted(alive) if n not in others]
                node = plan.home[slot] if plan.home[slot] in free else min(
                    free, key=lambda n: (given[n], -score(node_name(n), plan.chunk.key)), default=None)
            if node is None:
                failed.append(f"{plan.manifest.name} chunk {plan.chunk.id} ({plan.chunk.key}): no live node without "
                              f"a piece of this chunk for piece {slot}: its {len(nodes)} pieces need {len(nodes)} "
                              f"distinct nodes, {len(alive)} answer")
                break
            given[node] += 1
            nodes[slot] = node
        else:
            jobs.append(Rebuild(plan, nodes, slots))
    return jobs, failed


class Rebuilder:
    """Rebuilds chunks where it runs: reads each through the reader's verified path (over
    sockets the kernel does not count), re-encodes it, writes the missing pieces; at most
    repair.mb_per_s of reads and writes, repair.threads chunks at once (repair.move_threads
    for a call of moves alone: nothing is missing, and each read shares a disk with readers)."""

    def __init__(self, cfg, state: ClusterState, creds, avoid: Set[int] = frozenset()):
        from ..read.read_session import ReadSession

        self.cfg = cfg
        self.clients = {n.index: s3.client(n.endpoint, creds, cfg.client.connect_timeout_s, cfg.client.read_timeout_s)
                        for n in state.nodes}
        self.session = ReadSession(state, creds, cfg, use_cache=False, prefetch=False, mark=state.settings.fill_mark)
        self.session.avoid(set(avoid))
        self.throttle = Throttle(cfg.repair.mb_per_s * 1e6)

    def one(self, job: Rebuild, reader: Client) -> int:
        """Bytes written (`reader`: a Client of the job's manifest)."""
        m, c = job.plan.manifest, job.plan.chunk
        data = reader.read_chunk(c.id)  # verified: checksums per piece and of the chunk
        self.throttle.take(len(data))
        bodies = erasure.encode(data, m.ec_data, m.ec_parity) if m.layout == "ec" else [data] * len(c.nodes)
        sums = c.shards if m.layout == "ec" else [c.xxh3] * len(c.nodes)
        wrote = 0
        for slot in job.slots:
            if erasure.checksum(bodies[slot]) != sums[slot] and m.layout == "ec":
                raise FasterFSError(f"shard {slot} re-encoded does not match its recorded checksum")
            self.throttle.take(len(bodies[slot]))
            self.clients[job.nodes[slot]].put_object(Bucket=m.bucket, Key=m.pieces(c)[slot][1], Body=bodies[slot],
                                                     Metadata={"xxh3": str(sums[slot])})
            wrote += len(bodies[slot])
        return wrote

    def many(self, jobs: list[Rebuild]) -> list[int | str]:
        """Each job's bytes written, or why it failed. A Client per file of these jobs alone (a
        Rebuilder outlives its calls; what it reads must not pile up)."""
        from ..read.client import Client

        readers: dict[tuple[str, str], Client] = {}
        lock = threading.Lock()

        def guarded(job: Rebuild) -> int | str:
            m = job.plan.manifest
            try:
                with lock:
                    reader = readers.get((m.name, m.generation))
                    if reader is None:
                        reader = readers[m.name, m.generation] = Client(self.session, m)
                return self.one(job, reader)
            except Exception as e:
                return f"{job}: {e}"[:400]
        moves_only = all(not job.plan.missing for job in jobs)
        threads = self.cfg.repair.move_threads if moves_only else self.cfg.repair.threads
        with ThreadPoolExecutor(max(1, int(threads))) as pool:
            return list(pool.map(guarded, jobs))


Spread = Callable[[int, list[Rebuild], Set[int]], list]  # (writer, jobs, nodes down) -> Rebuilder.many there


def batches(jobs: list[Rebuild], max_bytes: int) -> dict[int, list[list[Rebuild]]]:
    """Each writer's jobs in batches of about `max_bytes` of chunks (one call each)."""
    out: dict[int, list[list[Rebuild]]] = collections.defaultdict(list)
    size: dict[int, int] = collections.defaultdict(lambda: max_bytes)
    for job in jobs:
        if size[job.writer] >= max_bytes:
            out[job.writer].append([])
            size[job.writer] = 0
        out[job.writer][-1].append(job)
        size[job.writer] += job.plan.chunk.bytes
    return out


BATCH_BYTES = 64 << 20  # a writer's chunks per call: a lease renewal at least every few seconds
CALL_TIMEOUT_S = 600.0   # one batch at a node, queued behind its other work; past it, rebuilt here


def through(directory, own: int | None = None, here: Callable[[list[Rebuild], Set[int]], list] | None = None,
            mb_per_s: float | None = None) -> Spread:
    """Spread over the StorageNodes `directory` (a NodeDirectory) finds; node `own`'s jobs by
    `here` in this process (a StorageNode calling itself through Ray would wait on itself);
    `mb_per_s`: each node's pace for these jobs (default: its repair.mb_per_s)."""
    def spread(node: int, jobs: list[Rebuild], down: Set[int]) -> list:
        import ray

        if node == own and here is not None:
            return here(jobs, down)
        return ray.get(directory.require(node).rebuild.options(concurrency_group=LONG).remote(jobs, sorted(down),
                                                                                            mb_per_s),
                       timeout=CALL_TIMEOUT_S)
    return spread
