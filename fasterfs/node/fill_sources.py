"""Where a cache fill fetches a chunk from, over connections the kernel does not count.

An erasure-coded chunk is gathered from its shards' nodes (fasterfs.core.erasure.gather, the same
degraded-read path readers use) and checked against the manifest; a replica comes from this node
if it holds a copy, else from the chunk's owner (a reader on this host made it hot, wherever it
lives), checked against the manifest too, the next copy tried if it is rotten. Nothing enters a
cache that is not the manifest's bytes.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import xxhash

from ..bpf.events import key_hash
from ..control.s3 import MarkedGetter, MarkedPool
from ..core import erasure
from ..core.errors import FasterFSError
from ..core.manifest import ChunkInfo
from .node_index import NodeIndex

log = logging.getLogger("fasterfs.node.fill_sources")


class ShardedGetter:
    """A fill of an erasure-coded chunk: its shards fetched over `marked(node)`, joined or
    decoded, and checked against the manifest like a reader's."""

    def __init__(self, chunk: ChunkInfo, data: int, parity: int, marked: Callable[[int], MarkedGetter],
                 pool: ThreadPoolExecutor):
        self.chunk, self.data, self.parity, self.marked, self.pool = chunk, data, parity, marked, pool

    @staticmethod
    def etag(chunk: ChunkInfo) -> str:
        """What the cache records as the entry's version: the chunk's checksum in the manifest."""
        return f"xxh3-{chunk.xxh3:016x}"

    def get(self, bucket: str, key: str) -> tuple[bytes, str]:
        def fetch(slot: int) -> bytes:
            return self.marked(self.chunk.nodes[slot]).get(bucket, erasure.shard_key(key, slot))[0]
        data, _, _ = erasure.gather(self.chunk, self.data, self.parity, fetch, self.pool)
        return data, self.etag(self.chunk)


class ReplicaGetter:
    """A fill of a replicated chunk from its copies in `order`, each checked against the
    manifest's checksum before it may enter the cache: a rotten copy is refused, counted
    (`refused`) and the next one tried."""

    def __init__(self, chunk: ChunkInfo, order: list[int], marked: Callable[[int], MarkedGetter],
                 refused: Callable[[int, str], None]):
        self.chunk, self.order, self.marked, self.refused = chunk, order, marked, refused

    def get(self, bucket: str, key: str) -> tuple[bytes, str]:
        for node in self.order:
            data, etag = self.marked(node).get(bucket, key)
            if len(data) == self.chunk.bytes and xxhash.xxh3_64_intdigest(data) == self.chunk.xxh3:
                return data, etag
            self.refused(node, key)
        raise FasterFSError(f"no copy of {key} (nodes {self.order}) matches its manifest's checksum: not cached")


class FillSources:
    """`getter(key)` for the CacheFiller of node `node`; `index()` is the node's current NodeIndex."""

    def __init__(self, node: int, marked: MarkedPool, index: Callable[[], NodeIndex], bucket: str):
        self.node, self.marked, self.index, self.bucket = node, marked, index, bucket
        self.rotten_refused = 0  # copies a fill fetched that were not the manifest's bytes
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="fill-shards")

    def getter(self, key: str):
        index = self.index()
        coded = index.coded.get(key)
        if coded is not None:
            return ShardedGetter(coded.chunk, coded.data, coded.parity, self.marked, self._pool)
        holders = list(index.holders.get(key, ()))
        chunk = index.by_hash.get(key_hash(f"/{self.bucket}/{key}"))
        if chunk is None or not holders:
            raise FasterFSError(f"{key} is no chunk of the namespace this node knows: nothing to check it against")
        # this node's own copy first, then the others in the manifest's order
        order = sorted(holders, key=lambda n: n != self.node)
        return ReplicaGetter(chunk, order, self.marked, self._refused)

    def _refused(self, node: int, key: str) -> None:
        self.rotten_refused += 1
        log.warning("node %d's copy of %s does not match the manifest's checksum: not cached (the scrub repairs it)",
                    node, key)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
