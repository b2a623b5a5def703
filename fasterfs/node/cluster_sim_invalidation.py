"""Invalidation (`measure_invalidation`): each node's real Invalidations queues the writes its
kernel saw and tells them in one batch a second, as a StorageNode does: to the peers its real
WriteRouter picks by its views of their caches, or (the design before) to every peer; each peer
applies the batch with its own Invalidations, over the simulated kernel's maps (a real kernel's
map updates are system calls: the CPU figure is Python's share alone).

The network and the caches that stand in are fasterfs.node.cluster_sim's.
"""
from __future__ import annotations

import time
from typing import cast

from ..bpf.events import key_hash
from ..bpf.simulated import SimulatedPrograms
from ..read.cache_entry import entry_name
from .cache import ChunkCache
from .cluster_sim import Network, RecordingCache
from .invalidation import Invalidations, WriteRouter
from .peer_tier import CacheNews, PeerTier


class NoFills:
    """A filler with nothing queued: a write's key has no fill to cancel."""

    def mark_stale(self, key: str) -> None:
        pass


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
