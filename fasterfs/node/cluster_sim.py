"""A cluster of many nodes in one process, on a simulated network (issue 47): how the traffic and
work of the nodes' cache gossip and of their invalidations grow with the nodes, at sizes this
machine cannot run as processes.

What is real: each node's PeerTier (what its cache gained and lost, told to every peer; a peer
that missed some asks for everything) and the cache's ChangeLog. What stands in: RecordingCache,
a set of entry names with that log and no bytes (a fill adds a name, an eviction drops one), and
Network, which delivers each message in order and counts it with its pickled size (what a Ray
call carries, less Ray's framing). Memory bounds the receivers: `observers` nodes keep what they
are told (as every node does), the rest count it unread; each node sends as a real one would.

Invalidation (`measure_invalidation`): each node's real Invalidations queues the writes its
kernel saw and tells them in one batch a second, as a StorageNode does: to the peers its real
WriteRouter picks by its views of their caches, or (the design before) to every peer; each peer
applies the batch with its own Invalidations, over the simulated kernel's maps (a real kernel's
map updates are system calls: the CPU figure is Python's share alone).

The namespace's pushes (`measure_pushes`): a real NamespaceStore (SQLite, in a temporary
directory) publishes batches of one-chunk files as `put -r` makes them, and pushes each batch's
Changes to every node, as the Registry does (one call per node: Ray pickles the argument per
call); `observers` nodes apply it with a real Follower and NodeIndex, as a StorageNode does.

Repair after a node's loss (`measure_repair`): manifests of many chunks placed by the real
placement, the lost node's listing failed; the real planner (`repair._plan`, what a survey
computes) and the real assignment of targets (`repair.assign`) run, timed. What stands in is
the moving of bytes: each node's reads and writes are counted and divided by the configured
per-node rate (`repair.mb_per_s`, which a node's Rebuilder enforces), both for the leader
rebuilding everything (the design before) and for each target rebuilding what it takes.
"""
from __future__ import annotations

import dataclasses
import pickle
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

from ..bpf.events import key_hash
from ..bpf.simulated import SimulatedPrograms
from ..control.state import ClusterState
from ..core.manifest import ChunkInfo, Manifest
from ..core.placement import chunk_homes
from ..meta import NamespaceStore
from ..meta.follower import Follower
from ..meta.sqlite import SQLiteEngine
from ..read.cache_entry import entry_name
from . import repair
from .cache import ChunkCache
from .change_log import LOG_MAX, ChangeLog
from .invalidation import Invalidations, WriteRouter
from .node_index import NodeIndex
from .peer_tier import CacheNews, PeerTier


class RecordingCache:
    """The cache as its peers see it: names and their change log (`deltas=False`: a log that
    keeps nothing, so every change is told as the whole set, as before issue 47)."""

    def __init__(self, deltas: bool = True):
        self.names: set[str] = set()
        self.log = ChangeLog(LOG_MAX if deltas else 0)

    @property
    def epoch(self) -> str:
        return self.log.epoch

    def snapshot(self) -> tuple[int, frozenset[str]]:
        return self.log.version, frozenset(self.names)

    def changes_since(self, version: int) -> tuple[int, list[str], list[str]] | None:
        return self.log.since(version)

    def holds(self, name: str) -> bool:
        return name in self.names

    def contains(self, key: str) -> bool:
        return entry_name(key) in self.names

    def clear(self) -> int:
        removed = len(self.names)
        for name in list(self.names):
            self.evict(name)
        return removed

    def read(self, key: str) -> None:
        return None  # no bytes: names only

    def fill(self, name: str) -> None:
        self.names.add(name)
        self.log.record(name, True)

    def evict(self, name: str) -> None:
        self.names.discard(name)
        self.log.record(name, False)


class NoFills:
    """A filler with nothing queued: a write's key has no fill to cancel."""

    def mark_stale(self, key: str) -> None:
        pass


@dataclass
class Counts:
    messages: list[int]
    bytes: list[int]
    cpu_s: list[float]  # each node's time in its PeerTier, sending and hearing

    @classmethod
    def zero(cls, n: int) -> Counts:
        return cls([0] * n, [0] * n, [0.0] * n)


@dataclass
class Network:
    """In-order delivery between nodes 0..n-1; `cut` nodes hear nothing (their messages are lost)."""
    n: int
    counts: Counts = field(init=False)
    cut: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.counts = Counts.zero(self.n)
        self._queue: deque = deque()
        self._sizes: dict[int, tuple[object, int]] = {}

    def size(self, message) -> int:
        got = self._sizes.get(id(message))
        if got is None or got[0] is not message:  # one pickling per message, whatever its fan-out
            got = (message, len(pickle.dumps(message, protocol=5)))
            self._sizes[id(message)] = got
        return got[1]

    def send(self, src: int, dst: int, deliver, message) -> None:
        self.counts.messages[src] += 1
        self.counts.bytes[src] += self.size(message)
        if dst not in self.cut:
            self._queue.append((deliver, message))

    def drain(self) -> None:
        while self._queue:
            deliver, message = self._queue.popleft()
            deliver(message)
        self._sizes.clear()


class SimulatedCluster:
    """`nodes` nodes, each cache holding `entries` names; `observers` (default: every node) keep
    what their peers tell them."""

    def __init__(self, nodes: int, entries: int, deltas: bool = True, observers: set[int] | None = None):
        self.n = nodes
        self.observers = set(range(nodes)) if observers is None else observers
        self.net = Network(nodes)
        self.caches = [RecordingCache(deltas) for _ in range(nodes)]
        self._filled = [0] * nodes
        self._held: list[deque[str]] = [deque() for _ in range(nodes)]
        for i in range(nodes):
            for _ in range(entries):
                self.fill(i)
        self.tiers = [PeerTier(i, self.caches[i], self._teller(i), self._asker(i)) for i in range(nodes)]

    def fill(self, i: int) -> None:
        name = f"{i:04d}{self._filled[i]:028x}.chunk"  # as long as a cache entry's name
        self._filled[i] += 1
        self.caches[i].fill(name)
        self._held[i].append(name)

    def churn(self, i: int, changes: int) -> None:
        """`changes` fills at node i, each evicting its oldest entry (a full cache)."""
        for _ in range(changes):
            self.fill(i)
            self.caches[i].evict(self._held[i].popleft())

    def _timed(self, i: int, fn, *args) -> None:
        t = time.process_time()
        fn(*args)
        self.net.counts.cpu_s[i] += time.process_time() - t

    def _teller(self, i: int):
        def tell(news: CacheNews, to: int | None) -> None:
            for j in ([to] if to is not None else [j for j in range(self.n) if j != i]):
                self.net.send(i, j, lambda m, j=j: self._hear(j, m), news)
        return tell

    def _hear(self, j: int, news: CacheNews) -> None:
        if j in self.observers:
            self._timed(j, self.tiers[j].heard, news)

    def _asker(self, i: int):
        def ask(node: int | None) -> None:
            if i not in self.observers:
                return  # a node that keeps nothing needs nothing
            for j in ([node] if node is not None else [j for j in range(self.n) if j != i]):
                self.net.send(i, j, lambda _m, j=j: self._timed(j, self.tiers[j].tell_all, i), ("ask", i))
        return ask

    def second(self, now: float, churn_per_node: int = 0) -> None:
        """One second: each node's cache changes `churn_per_node` times, then each shares."""
        for i in range(self.n):
            if churn_per_node:
                self.churn(i, churn_per_node)
            self._timed(i, self.tiers[i].share, now)
        self.net.drain()

    def consistent(self) -> bool:
        """Whether every observer's view of every peer holds that peer's cache: every name it
        holds found, and as many names counted."""
        for o in self.observers:
            for p in range(self.n):
                view = self.tiers[o].peers.get(p, ("", 0, None))[2] if p != o else None
                names = self.caches[p].names
                if p != o and (view is None or view.count != len(names) or view.found(names) != len(names)):
                    return False
        return True

    def false_positives(self, node: int, tries: int = 10_000) -> float:
        """The share of names no cache ever held that node `node`'s view of a peer says it holds."""
        peer = next(p for p in range(self.n) if p != node)
        never = [f"never{i:032x}.chunk" for i in range(tries)]
        return self.tiers[node].peers[peer][2].found(never) / tries

    def index_bytes(self, node: int) -> int:
        """What node `node` holds of its peers' names: their filters' counters, in bytes."""
        return sum(names.nbytes for _, _, names in self.tiers[node].peers.values())


def measure(nodes: int, entries: int, churn_per_node: int, seconds: int, deltas: bool = True,
            observers: int | None = None) -> dict:
    """Per node per second, in the steady state after every node has told its peers once: messages
    and bytes sent, CPU seconds in the PeerTier (senders: every node; receivers: the observers')."""
    watched = set(range(nodes if observers is None else min(observers, nodes)))
    sim = SimulatedCluster(nodes, entries, deltas, watched)
    sim.second(0.0)  # start-up: every node tells everything once
    sim.net.counts = Counts.zero(nodes)
    t = time.perf_counter()
    for s in range(1, seconds + 1):
        sim.second(float(s), churn_per_node)
    wall = time.perf_counter() - t
    c = sim.net.counts

    def per(xs: list) -> float:
        return sum(xs) / len(xs) / seconds
    return {"nodes": nodes, "entries": entries, "churn_per_node_s": churn_per_node, "deltas": deltas,
            "seconds": seconds, "observers": len(watched),
            "messages_per_node_s": per(c.messages), "bytes_per_node_s": per(c.bytes),
            "cpu_s_per_node_s": max(c.cpu_s[o] for o in watched) / seconds,
            "index_bytes_per_node": sim.index_bytes(min(watched)),
            "false_positives": sim.false_positives(min(watched)),
            "consistent": sim.consistent(), "wall_s": wall}


def measure_invalidation(nodes: int, writes_per_node: int, seconds: int, bucket: str = "b",
                         targeted: bool = True, entries: int = 1_000, cached_share: float = 0.1,
                         seed: int = 0) -> dict:
    """Each simulated second every node's kernel sees `writes_per_node` writes: a `cached_share`
    of them of a key another node (at random) caches, the rest of keys never seen before. Each node
    tells them in one batch: `targeted`, to the nodes its WriteRouter picks (its views of every
    peer's cache of `entries` names, real filters, one per peer shared by every viewer since the
    caches do not change meanwhile), else to every peer (the design before). Each peer applies what
    it is told with its own Invalidations. Per node per second: messages and bytes sent, writes
    applied as told and of them to keys the node did not cache (a filter's false positives), CPU
    seconds routing and applying."""
    import random

    net = Network(nodes)
    applied, needless = [0] * nodes, [0] * nodes
    invs: list[Invalidations] = []
    rng = random.Random(seed)

    def key_of(node: int, j: int) -> str:
        return f"files/{node:04x}{j:012x}/g/000000"

    caches = [RecordingCache() for _ in range(nodes)]
    for i, cache in enumerate(caches):
        for j in range(entries):
            cache.fill(entry_name(key_of(i, j)))
    routers = [WriteRouter(PeerTier(i, caches[i], lambda news, to: None), window_s=60.0) for i in range(nodes)]
    if targeted:
        for p in range(nodes):
            version, names = caches[p].snapshot()
            hearer = routers[0 if p else 1]  # any node but p itself builds p's view, shared by all
            hearer.heard(CacheNews(p, caches[p].epoch, None, version, names), now=0.0)
            view = hearer.peers.peers[p]
            for i in range(nodes):
                routers[i].peers.peers[p] = view
    now = [0.0]

    def tell(i: int):
        others = [j for j in range(nodes) if j != i]

        def to_peers(batch: list, seen: list[float]) -> None:  # StorageNode._tell_writes
            t = time.process_time()
            routes = routers[i].route(batch, others, [now[0]] * len(batch)) if targeted else {j: batch for j in others}
            net.counts.cpu_s[i] += time.process_time() - t
            for j, writes in routes.items():
                net.send(i, j, lambda b, j=j: hear(j, b), writes)
        return to_peers

    def hear(j: int, batch: list) -> None:
        needless[j] += sum(1 for _, key in batch if not caches[j].contains(key))  # before it drops them
        t = time.process_time()
        invs[j].invalidate(batch)
        net.counts.cpu_s[j] += time.process_time() - t
        applied[j] += len(batch)

    for i in range(nodes):
        invs.append(Invalidations(i, bucket, SimulatedPrograms(hot_threshold=2), cast(ChunkCache, caches[i]),
                                  NoFills(), False, lambda key, why: None, tell(i), lambda from_peer: None))
    cached = round(writes_per_node * cached_share)
    t = time.perf_counter()
    for s in range(seconds):
        now[0] = float(s)
        for i in range(nodes):
            for w in range(writes_per_node):
                if w < cached:
                    p = rng.choice([j for j in range(nodes) if j != i])
                    key = key_of(p, rng.randrange(entries))
                else:
                    key = f"files/new-{i:04x}{s:06x}{w:06x}/g/000000"
                invs[i].queue((key_hash(f"/{bucket}/{key}"), key))
            invs[i].send(wait_s=0)
        net.drain()
    wall = time.perf_counter() - t
    c = net.counts

    def per(xs: list) -> float:
        return sum(xs) / len(xs) / seconds
    return {"nodes": nodes, "writes_per_node_s": writes_per_node, "seconds": seconds, "targeted": targeted,
            "entries": entries, "cached_share": cached_share,
            "messages_per_node_s": per(c.messages), "bytes_per_node_s": per(c.bytes),
            "applied_per_node_s": per(applied), "needless_per_node_s": per(needless),
            "cpu_s_per_node_s": max(c.cpu_s) / seconds, "wall_s": wall}


def batch_of(files: int, first: int, nodes: int, bucket: str = "b") -> list[tuple[Manifest, str]]:
    """`files` one-chunk files of 4 KiB as `put -r` publishes them (a name, a hashed key, a node)."""
    out = []
    for i in range(first, first + files):
        name, generation = f"d{i // 1000:04d}/f{i % 1000:04d}.bin", f"g{i:08x}"
        prefix = f"files/{i:016x}/"
        chunk = ChunkInfo(0, f"{prefix}{generation}/part-00000", [i % nodes], 4096, 0, 0, 0.0, 0.0, 2**63 + i)
        out.append((Manifest(name, "bytes", 0, 0, 0, 1, nodes, bucket, generation, [chunk], kind="file"), prefix))
    return out


def measure_pushes(nodes: int, batch_files: int, batches: int, observers: int, work, once: bool = True) -> dict:
    """Per batch: the Changes' pickled bytes to one node and from the head to all, the head's CPU
    seconds publishing it (the store's transaction, and the pickling: once, as the Registry does
    with ray.put; `once=False`: once per node, as a plain argument to each node's call) and an
    observer's applying it (Follower and NodeIndex)."""
    net = Network(nodes)
    follow = [Follower(lambda since: None, lambda: (0, {})) for _ in range(min(observers, nodes))]
    index = [NodeIndex.build({}, n) for n in range(len(follow))]
    apply_cpu = [0.0] * len(follow)

    def apply(n: int, changes) -> None:
        t = time.process_time()
        follow[n].apply(changes)
        index[n] = index[n].updated([(name, None, m) for name, m in changes.names.items()])
        apply_cpu[n] += time.process_time() - t

    def push(method: str, changes) -> list[int]:
        for n in range(nodes):  # the Registry's _push: a call per node
            if not once:
                net._sizes.clear()
            net.send(0, n, (lambda c, n=n: apply(n, c)) if n < len(follow) else (lambda c: None), changes)
        return list(range(nodes))

    store = NamespaceStore(SQLiteEngine(work / "namespace.sqlite"), "sim", push)
    for f in follow:
        f.version = store.version  # as a node that fetched the (empty) namespace whole
    publish_cpu = 0.0
    for b in range(batches):
        items = batch_of(batch_files, b * batch_files, nodes)
        t = time.process_time()
        store.publish_batch(items)
        publish_cpu += time.process_time() - t
        net.drain()
    c = net.counts
    return {"nodes": nodes, "batch_files": batch_files, "batches": batches, "pickled_once": once,
            "bytes_per_node_per_batch": c.bytes[0] / nodes / batches,
            "head_bytes_per_batch": c.bytes[0] / batches,
            "head_cpu_s_per_batch": publish_cpu / batches,
            "apply_cpu_s_per_batch": max(apply_cpu) / batches,
            "consistent": all(len(f.manifests) == batches * batch_files for f in follow)}


def measure_repair(nodes: int, chunks: int, chunks_per_file: int = 16, chunk_mb: float = 4.0, replicas: int = 2,
                   mb_per_s: float = 200.0, load_slack: float = 0.1, every_home: bool = True) -> dict:
    """Node 0 lost from `nodes` holding `chunks` chunks (files of `chunks_per_file`, `replicas`
    copies): the planner's CPU seconds (every node listed; and the others believed, as the
    leader's look after a change of the nodes plans, which must plan the same), the
    assignment's, and the seconds to move the bytes at `mb_per_s` per node (reads and writes)
    with one leader against every target rebuilding. `every_home`: also the planner's CPU placing
    every chunk again (as before manifests said which a repair had moved)."""
    ids = list(range(nodes))
    state = cast(ClusterState, SimpleNamespace(nodes=[SimpleNamespace(index=i) for i in ids]))
    size = int(chunk_mb * 2**20)
    manifests: list[Manifest] = []
    listing: dict[int, set[str] | None] = {n: set() for n in ids}
    for f in range(chunks // chunks_per_file):
        name = f"d{f // 1000:04d}/f{f % 1000:04d}.bin"
        placed = chunk_homes(name, chunks_per_file, ids, replicas, load_slack)
        cs = [ChunkInfo(i, f"files/{f:016x}/g/part-{i:05d}", where, size, 0, 0, 0.0, 0.0, i)
              for i, where in enumerate(placed)]
        manifests.append(Manifest(name, "bytes", 0, 0, 0, replicas, nodes, "b", "g", cs, kind="file"))
        for c in cs:
            for n in c.nodes:
                cast(set, listing[n]).add(c.key)
    listing[0] = None  # its MinIO does not answer: gone
    t = time.process_time()
    health, plans = repair._plan(manifests, state, listing, load_slack)
    plan_cpu = time.process_time() - t
    t = time.process_time()  # the leader's look after a loss: the nodes listed before believed
    believed_health, believed_plans = repair._plan(
        manifests, state, {n: repair.TRUSTED if keys is not None else None for n, keys in listing.items()}, load_slack)
    believed_cpu = time.process_time() - t
    same = (believed_health.degraded == health.degraded and believed_health.chunks == health.chunks
            and [(p.manifest.name, p.chunk.id, p.missing) for p in believed_plans]
            == [(p.manifest.name, p.chunk.id, p.missing) for p in plans])
    every_cpu = None
    if every_home:
        t = time.process_time()
        repair._plan([dataclasses.replace(m, moved=True) for m in manifests], state, listing, load_slack)
        every_cpu = time.process_time() - t
    alive = set(ids[1:])
    t = time.process_time()
    jobs, failed = repair.assign(plans, alive)
    assign_cpu = time.process_time() - t
    work: Counter[int] = Counter()  # bytes each writer reads and writes
    served: Counter[int] = Counter()  # bytes each survivor is read for
    for job in jobs:
        work[job.writer] += job.plan.chunk.bytes * (1 + len(job.slots))
        served[next(n for n in job.plan.chunk.nodes if n in alive)] += job.plan.chunk.bytes
    rate = mb_per_s * 1e6
    moved = sum(work.values())
    return {"nodes": nodes, "chunks": chunks, "chunk_mb": chunk_mb, "replicas": replicas, "mb_per_s": mb_per_s,
            "degraded": health.degraded_count, "lost": health.lost_count, "failed": len(failed),
            "bytes_rebuilt": sum(j.plan.chunk.bytes for j in jobs),
            "plan_cpu_s": plan_cpu, "plan_every_home_cpu_s": every_cpu, "assign_cpu_s": assign_cpu,
            "plan_believed_cpu_s": believed_cpu, "believed_same_plan": same,
            "writers": len(work), "max_writer_bytes": max(work.values(), default=0),
            "max_served_bytes": max(served.values(), default=0),
            "leader_move_s": moved / rate, "spread_move_s": max(work.values(), default=0) / rate,
            "leader_total_s": plan_cpu + assign_cpu + moved / rate,
            "spread_total_s": plan_cpu + assign_cpu + max(work.values(), default=0) / rate,
            "believed_total_s": believed_cpu + assign_cpu + max(work.values(), default=0) / rate}
