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
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import urllib3

from ..control import registry, s3
from ..control.node_directory import LONG
from ..control.state import ClusterState
from ..core import erasure
from ..core.errors import FasterFSError
from ..core.manifest import ChunkInfo, Manifest
from ..core.pace import Throttle
from ..core.placement import chunk_homes, node_name, score
from ..write import bucket_walk, ingest

if TYPE_CHECKING:
    from ..read.client import Client

log = logging.getLogger("fasterfs.node.repair")


UPDATE_BATCH = 1000  # names whose moved pieces one namespace transaction records (as put -r's batches)


def needed(m: Manifest) -> int:
    """Good pieces that rebuild a chunk."""
    return m.ec_data if m.layout == "ec" else 1


def homes(m: Manifest, state: ClusterState, load_slack: float) -> list[list[int]]:
    width = m.ec_data + m.ec_parity if m.layout == "ec" else m.replicas
    nodes = [n.index for n in state.nodes[:m.node_count]]
    if width > len(nodes):  # written on a larger cluster than runs now: no home for every piece
        return [list(c.nodes) for c in m.chunks]
    return chunk_homes(m.name, len(m), nodes, width, load_slack)


class _Trusted(frozenset[str]):
    """A node's holdings taken from the namespace, not listed: every piece placed there is there."""

    def __contains__(self, key) -> bool:
        return True

    def __or__(self, other):  # what a later listing adds to a believed node's: nothing
        return self


TRUSTED = _Trusted()
Listing = dict[int, Set[str] | None]  # node -> the keys it holds (TRUSTED: believed); None: no answer


def _per_node(state: ClusterState, creds, timeout: float,
              ask: Callable[[int, s3.MarkedGetter], Set[str] | None]) -> Listing:
    """`ask(node, its MinIO)` of every node at once; None for a node whose MinIO does not answer."""
    def one(node) -> Set[str] | None:
        getter = s3.MarkedGetter(node.endpoint, creds, state.settings.fill_mark,  # the kernel skips it
                                 urllib3.Timeout(connect=timeout, read=30.0))
        try:
            return ask(node.index, getter)
        except Exception:
            return None
        finally:
            getter.close()
    with ThreadPoolExecutor(8) as pool:
        return dict(zip((n.index for n in state.nodes), pool.map(one, state.nodes)))


def listings(state: ClusterState, creds, timeout: float = 2.0, share: float = 1.0,
             trusted: Set[int] = frozenset()) -> Listing:
    """Every node's object keys, each bucket walked with at most `share` of the time
    (bucket_walk); None for a node whose MinIO does not answer. A `trusted` node that answers
    is not listed: it holds what the namespace places on it (TRUSTED)."""
    def keys(node: int, lister: s3.MarkedGetter) -> Set[str] | None:
        if node in trusted:
            return TRUSTED if lister.answers(state.settings.bucket, timeout) else None
        return {key for key, _ in bucket_walk.walk(lister, state.settings.bucket, share)}
    return _per_node(state, creds, timeout, keys)


def holdings(state: ClusterState, creds, pieces: Iterable[tuple[int, str]],
             timeout: float = 2.0) -> Listing:
    """Of `pieces` (node, key), those each node holds, asked one HEAD each (a listing's shape,
    of just these keys); None for a node whose MinIO does not answer. A node asked for
    nothing is probed."""
    wanted: dict[int, list[str]] = {n.index: [] for n in state.nodes}
    for node, key in pieces:
        if node in wanted:  # a node no longer in the cluster is down to _plan, as in a survey
            wanted[node].append(key)
    bucket = state.settings.bucket

    def held(node: int, asker: s3.MarkedGetter) -> Set[str] | None:
        if not wanted[node]:
            return set() if asker.answers(bucket, timeout) else None
        with ThreadPoolExecutor(8) as pool:
            return {k for k, there in zip(wanted[node], pool.map(lambda k: asker.holds(bucket, k), wanted[node]))
                    if there}
    return _per_node(state, creds, timeout, held)


def check(state: ClusterState, creds, manifests: list[Manifest], load_slack: float) -> Health:
    """The redundancy of just `manifests` (a change of the namespace): what a change costs is
    what it wrote, not what the cluster holds."""
    pieces = [p for m in manifests for c in m.chunks for p in m.pieces(c)]
    return _plan(manifests, state, holdings(state, creds, pieces), load_slack)[0]


def answering(state: ClusterState, getter: Callable[[int], s3.MarkedGetter], timeout: float = 1.0) -> set[int]:
    """The nodes whose MinIO answers now (one cheap request each), through `getter(node)`'s
    kept-alive connection (a new connection at every probe is one more MinIO connection for
    SOCK_OPS to count)."""
    bucket = state.settings.bucket
    with ThreadPoolExecutor(8) as pool:
        return {n.index for n, ok in zip(state.nodes, pool.map(lambda n: getter(n.index).answers(bucket, timeout),
                                                                state.nodes)) if ok}


LOST_SHOWN = 20  # lost names a summary, `status` or the dashboard names (a lost disk may hold a million)


@dataclass
class Health:
    """The namespace's redundancy as one survey found it."""
    chunks: int = 0
    degraded: dict[str, list[int]] = field(default_factory=dict)  # name -> chunks with a piece missing
    lost: dict[str, list[int]] = field(default_factory=dict)      # name -> chunks too few pieces rebuild
    misplaced: int = 0      # pieces away from a home that answers (a returned host, to refill)
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
        return (f"{self.chunks} chunks: {self.chunks - self.degraded_count} at full redundancy, "
                f"{self.degraded_count} degraded{lost}{down}")

    def to_dict(self) -> dict:
        return {"chunks": self.chunks, "degraded": self.degraded_count, "lost": self.lost_count,
                "lost_chunks": self.lost_shown(), "lost_names": len(self.lost), "misplaced": self.misplaced,
                "repairable": self.repairable,
                "nodes_down": self.nodes_down, "believed": self.believed,
                "time": self.time, "summary": self.summary()}


@dataclass
class _Plan:
    manifest: Manifest
    chunk: ChunkInfo
    missing: list[int]      # slots to rewrite
    moves: list[int]        # slots to move home
    home: list[int]


def _plan(manifests: Iterable[Manifest], state: ClusterState, listing: Mapping[int, Set[str] | None], load_slack: float,
          waiting: Set[int] = frozenset(), bad: Set[tuple[int, str]] = frozenset(),
          only: dict[str, set[int]] | None = None) -> tuple[Health, list[_Plan]]:
    """What is missing or away from home. Pieces on a `waiting` node whose listing failed
    (down, not for long; or a listing that failed on a node up again) are left alone: rebuilt
    elsewhere, they would only move back. `bad` pieces (node, key) count as missing (the
    scrub found them wrong). A name whose every piece is on a believed node (TRUSTED) and at
    home is whole without looking further: after a node's loss, the plan's work is what the
    changed nodes held, not every chunk."""
    held = {n: keys for n, keys in listing.items() if keys is not None}
    alive = set(held)
    health = Health(nodes_down=sorted(set(listing) - alive),
                    believed=sorted(n for n, keys in held.items() if keys is TRUSTED))
    believed = set(health.believed) if only is None and not bad else set()
    plans = []
    stored_on: set[int] = set()
    for m in manifests:
        if believed and not m.moved and believed.issuperset(itertools.chain.from_iterable(c.nodes for c in m.chunks)):
            health.chunks += len(m.chunks)
            continue
        # placing a chunk ranks every node: only for a name whose pieces repair moved (else every
        # piece is where ingest put it, its home: placing a lost node's files again was most of a
        # plan's time, 20 s at 128 nodes and a million chunks, simulated)
        home: list[list[int]] | None = None
        for c in m.chunks:
            if only is not None and c.id not in only.get(m.name, ()):
                continue
            health.chunks += 1
            slots = m.pieces(c)
            present = [s for s, (node, key) in enumerate(slots)
                       if node in alive and key in held[node] and (node, key) not in bad]
            missing = [s for s in range(len(slots))
                       if s not in present and (slots[s][0] in alive or slots[s][0] not in waiting)]
            if m.moved and home is None:
                home = homes(m, state, load_slack)
            at = home[c.id] if home is not None else list(c.nodes)
            moves = [s for s in present if at[s] != c.nodes[s] and at[s] in alive and at[s] not in c.nodes
                     ] if m.moved else []
            health.misplaced += len(moves)
            if len(present) < len(slots):
                health.degraded.setdefault(m.name, []).append(c.id)
            if len(present) < needed(m):
                health.lost.setdefault(m.name, []).append(c.id)
            elif missing or moves:
                plans.append(_Plan(m, c, missing, moves, at))
                health.repairable += 1
            stored_on.update(c.nodes)
    # a node the data was stored on that is not part of the cluster now: down, as a machine that is
    health.nodes_down = sorted(set(health.nodes_down) | (stored_on - {n.index for n in state.nodes}))
    return health, plans


Names = Callable[[], dict[str, Manifest]]  # every name's manifest, current as of the call


def _registrys(state: ClusterState) -> Names:
    return lambda: registry.fetch_manifests(state.name)[1]


def _look(state: ClusterState, creds, plan: Callable[[dict, dict], tuple[Health, list[_Plan]]], names: Names,
          share: float = 1.0, trusted: Set[int] = frozenset()):
    """The nodes' listings and the manifests (`names()`: a StorageNode's own copy, caught up,
    else fetched whole from the Registry), planned by `plan(listing, manifests)`, so that a
    piece another writer moves meanwhile (a concurrent repair, a refill) is not taken for
    missing. Listed before the manifests are fetched, so a piece retired since still counts;
    when that finds anything to do, listed again after, so a piece written since counts too,
    and a node is up or down by its later answer (a host back from a power cut mid-survey);
    a piece still missing from both is asked of its node. `trusted` nodes are not listed (listings)."""
    first = listings(state, creds, share=share, trusted=trusted)
    manifests = names()
    health, plans = plan(first, manifests)
    if not plans and not health.nodes_down:
        return first, manifests, health, plans
    again = listings(state, creds, share=share, trusted=trusted)
    merged = {n: None if keys is None else keys | (first.get(n) or set()) for n, keys in again.items()}
    # a listing may come from MinIO's metacache, a little behind: what it misses is asked by HEAD
    _, plans = plan(merged, manifests)
    unlisted = [piece for p in plans for s, piece in enumerate(p.manifest.pieces(p.chunk))
                if s in p.missing and merged.get(piece[0]) is not None]
    for n, keys in holdings(state, creds, unlisted).items() if unlisted else ():
        listed = merged.get(n)
        if keys and listed is not None:
            merged[n] = listed | keys
    return (merged, manifests, *plan(merged, manifests))


def survey(state: ClusterState, creds, load_slack: float, names: Names | None = None, share: float = 1.0,
           trusted: Set[int] = frozenset()) -> Health:
    """The namespace's redundancy as the nodes' listings show it; `share`: of the time the
    listings may take (bucket_walk; the StorageNodes' own surveys are paced, a user's are not);
    `trusted` nodes are believed, not listed (listings)."""
    return _look(state, creds, lambda listing, ms: _plan(ms.values(), state, listing, load_slack),
                 names or _registrys(state), share, trusted)[2]


@dataclass
class Outcome:
    health: Health                      # as found, before repairing
    repaired: int = 0                   # chunks back to full redundancy
    pieces_written: int = 0
    moved: int = 0                      # pieces moved back home
    bytes_written: int = 0
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)   # chunks a repair could not finish, and why
    by_node: dict[str, int] = field(default_factory=dict)  # node (or "here": the repair itself) -> chunks

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class Rebuild:
    """One chunk's repair, its targets chosen: the pieces in `slots` are written so that the
    chunk's pieces live on `nodes`. Its writer (the node taking its first piece) rebuilds it:
    the chunk's bytes flow from a survivor to the target, not through one leader."""
    plan: _Plan
    nodes: list[int]
    slots: list[int]

    @property
    def writer(self) -> int:
        return self.nodes[self.slots[0]]

    def __str__(self) -> str:
        return f"{self.plan.manifest.name} chunk {self.plan.chunk.id} ({self.plan.chunk.key})"


def assign(plans: Iterable[_Plan], alive: Set[int]) -> tuple[list[Rebuild], list[str]]:
    """Where every missing or moved piece goes, before anything is read: its own node if it
    answers, then its home, then of the live nodes holding nothing of this chunk the one this
    repair has given the fewest pieces (ties by the chunk's rendezvous score): a lost node's
    pieces spread evenly over every other, so that each rebuilds an equal share. Also the
    chunks with no such node, and why."""
    jobs: list[Rebuild] = []
    failed: list[str] = []
    given: collections.Counter = collections.Counter()
    for plan in plans:
        nodes = list(plan.chunk.nodes)
        slots = plan.missing + [s for s in plan.moves if s not in plan.missing]
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
    repair.mb_per_s of reads and writes, repair.threads chunks at once."""

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
        with ThreadPoolExecutor(max(1, int(self.cfg.repair.threads))) as pool:
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


def through(directory, own: int | None = None, here: Callable[[list[Rebuild], Set[int]], list] | None = None) -> Spread:
    """Spread over the StorageNodes `directory` (a NodeDirectory) finds; node `own`'s jobs by
    `here` in this process (a StorageNode calling itself through Ray would wait on itself)."""
    def spread(node: int, jobs: list[Rebuild], down: Set[int]) -> list:
        import ray

        if node == own and here is not None:
            return here(jobs, down)
        return ray.get(directory.require(node).rebuild.options(concurrency_group=LONG).remote(jobs, sorted(down)),
                       timeout=CALL_TIMEOUT_S)
    return spread


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
    ingest.collect_garbage(cfg, state, {n.index: s3.client(n.endpoint, creds) for n in state.nodes})
    listing, manifests, health, plans = _look(state, creds, lambda listing, ms: _plan(
        ms.values(), state, listing, cfg.placement.load_slack, waiting, bad, only), names or _registrys(state), share,
        trusted)
    alive = {n for n, keys in listing.items() if keys is not None}
    out = Outcome(health)
    if not plans:
        out.seconds = time.monotonic() - started
        return out
    jobs, out.failed = assign(plans, alive)
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
        out.moved += len(job.plan.moves)
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
