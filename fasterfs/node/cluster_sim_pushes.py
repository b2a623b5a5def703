"""The namespace's pushes (`measure_pushes`): a real NamespaceStore (SQLite, in a temporary
directory) publishes batches of one-chunk files as `put -r` makes them, and pushes each batch's
Changes to every node, as the Registry does (one call per node: Ray pickles the argument per
call); `observers` nodes apply it with a real Follower and NodeIndex, as a StorageNode does.

The counted network is fasterfs.node.cluster_sim's.
"""
from __future__ import annotations

import time

from ..core.manifest import ChunkInfo, Manifest
from ..meta import NamespaceStore
from ..meta.follower import Follower
from ..meta.sqlite import SQLiteEngine
from .cluster_sim import Network
from .node_index import NodeIndex


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
    follow = [Follower(lambda since: None, lambda texts: (0, {})) for _ in range(min(observers, nodes))]
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
