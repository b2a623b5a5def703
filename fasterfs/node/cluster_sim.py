"""A cluster of many nodes in one process, on a simulated network (issue 47): how the traffic and
work of the nodes' cache gossip and of their invalidations grow with the nodes, at sizes this
machine cannot run as processes.

What is real: each node's PeerTier (what its cache gained and lost, told to every peer; a peer
that missed some asks for everything) and the cache's ChangeLog. What stands in: RecordingCache,
a set of entry names with that log and no bytes (a fill adds a name, an eviction drops one), and
Network, which delivers each message in order and counts it with its pickled size (what a Ray
call carries, less Ray's framing). Memory bounds the receivers: `observers` nodes keep what they
are told (as every node does), the rest count it unread; each node sends as a real one would.

The other measures over the same stand-ins: fasterfs.node.cluster_sim_invalidation (the
invalidations), cluster_sim_pushes (the namespace's pushes), cluster_sim_repair (repair after a
node's loss).
"""
from __future__ import annotations

import pickle
import time
from collections import deque
from dataclasses import dataclass, field

from ..read.cache_entry import entry_name
from .change_log import LOG_MAX, ChangeLog
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
