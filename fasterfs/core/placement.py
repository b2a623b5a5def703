"""Chunk -> node placement by rendezvous (highest-random-weight) hashing with bounded loads.

Every node scores every chunk with a hash of (node, chunk); a chunk goes to the
`replicas` best-scoring nodes. Adding a node moves only the chunks the new node
now wins (about 1/N). A cap of (1 + slack) x the fair share per node keeps small
datasets balanced: a chunk whose favourite node is full goes to its next choice.
Placement is a pure function of names and counts, so it is never stored centrally
beyond the manifest that records its result.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence


def score(node: str, key: str) -> int:
    digest = hashlib.blake2b(f"{node}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def node_name(index: int) -> str:
    return f"node-{index}"


def place(keys: Sequence[str], nodes: int, replicas: int = 1, load_slack: float = 0.1) -> list[list[int]]:
    """For each key (in order), the indices of the nodes that hold it, preferred owner first."""
    if nodes < 1:
        raise ValueError("placement needs at least one node")
    if not 1 <= replicas <= nodes:
        raise ValueError(f"replicas={replicas} must be between 1 and nodes={nodes}")
    # score()'s ranking with its digests compared as bytes (big-endian: the same order), the
    # node's part encoded once: repair places every degraded chunk again
    prefixes = [f"{node_name(i)}\0".encode() for i in range(nodes)]
    cap = max(1, math.ceil(len(keys) * replicas / nodes * (1 + load_slack)))
    load = [0] * nodes
    out = []
    for key in keys:
        k = key.encode()
        digests = [hashlib.blake2b(p + k, digest_size=8).digest() for p in prefixes]
        ranked = sorted(range(nodes), key=digests.__getitem__, reverse=True)
        chosen = [i for i in ranked if load[i] < cap][:replicas]
        if len(chosen) < replicas:  # every node at the cap: fall back to pure rendezvous
            chosen = ranked[:replicas]
        for i in chosen:
            load[i] += 1
        out.append(chosen)
    return out


def chunk_homes(name: str, count: int, node_ids: Sequence[int], width: int, load_slack: float) -> list[list[int]]:
    """Where a write of `count` chunks of `name` puts each chunk's `width` pieces (replicas, or
    shards in shard order), as node ids: what ingest writes, and where repair moves pieces back."""
    return [[node_ids[p] for p in holders] for holders in place(
        [f"{name}/chunk-{i:05d}" for i in range(count)], len(node_ids), width, load_slack)]
