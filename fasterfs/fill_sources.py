"""Where a cache fill fetches a chunk from, over connections the kernel does not count.

An erasure-coded chunk is gathered from its shards' nodes (fasterfs.erasure.gather, the same
degraded-read path readers use) and checked against the manifest; a replica comes from this node
if it holds a copy, else from the chunk's owner (a reader on this host made it hot, wherever it
lives).
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from . import erasure
from .manifest import ChunkInfo
from .node_index import NodeIndex
from .s3 import MarkedGetter, MarkedPool


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


class FillSources:
    """`getter(key)` for the CacheFiller of node `node`; `index()` is the node's current NodeIndex."""

    def __init__(self, node: int, marked: MarkedPool, index: Callable[[], NodeIndex]):
        self.node, self.marked, self.index = node, marked, index
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="fill-shards")

    def getter(self, key: str):
        index = self.index()
        coded = index.coded.get(key)
        if coded is not None:
            return ShardedGetter(coded.chunk, coded.data, coded.parity, self.marked, self._pool)
        holders = index.holders.get(key)
        return self.marked(self.node if not holders or self.node in holders else holders[0])

    def close(self) -> None:
        self._pool.shutdown(wait=False)
