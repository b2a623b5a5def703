"""The reader's side: `Client.read_chunk` and the ranges, cached parts and entries the mount
and fsspec read (LOBSTER tables on top: fasterfs.read.tables).

A read first looks in the cache of the nodes holding the chunk (this node's first):
a hit is a file read inside this process. A miss goes straight to a MinIO server holding the
chunk — this node's own copy when it has one, else the owner, then the other replicas when a
server is down — where the kernel programs see and count it. No actor call and no central
service sits on the read path; the session's thread sends prefetch hints (sequential readers)
and, in SIMULATED mode only, reports reads to the node's user-space counter.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import xxhash

from ..bpf.events import key_hash
from ..core import erasure
from ..core.errors import FasterFSError
from ..core.manifest import Manifest
from . import cache_entry, holder_reads
from .read_session import ReadSession
from .reader_stats import BYTES_MINIO, DAMAGED_ENTRIES, MISSES, PREFETCH

log = logging.getLogger("fasterfs.read.client")


class Client:
    """One manifest (a dataset's or a file's current generation) read through a ReadSession."""

    def __init__(self, session: ReadSession, manifest: Manifest):
        self.session = session
        self.state, self.paths, self.local_node = session.state, session.paths, session.local_node
        self.use_cache = session.use_cache
        self._bind(manifest)

    def _bind(self, manifest: Manifest) -> None:
        """Derived once per manifest, so a hit costs only the file read."""
        self.manifest = manifest
        self._sources = [self._order(c.nodes) for c in manifest.chunks]
        self._places = cache_entry.places(manifest)  # a file's chunks are cached together, at its home
        self._caches = [self._cache_nodes([p.home] if p else c.nodes) for c, p in zip(manifest.chunks, self._places)]
        self._paths = {n: [str(cache_entry.entry_path(d, c.key, p)) for c, p in zip(manifest.chunks, self._places)]
                       for n, d in self.session.cache_dirs.items()}
        self._key_hashes = [key_hash(f"/{manifest.bucket}/{c.key}") for c in manifest.chunks]
        self._bucket_hash = key_hash(f"/{manifest.bucket}")
        self._last_read: int | None = None
        self._in_order, self._prefetched_to = 0, -1

    def sibling(self, manifest: Manifest) -> Client:
        """A client of another dataset or file of the namespace, through the same session."""
        return type(self)(self.session, manifest)

    # the session's figures, as every client of it sees them
    served_by = property(lambda self: self.session.served_by)
    degraded_reads = property(lambda self: self.session.degraded_reads)
    degraded_why = property(lambda self: self.session.degraded_why)
    peer_reads = property(lambda self: self.session.peer_reads)
    hints_dropped = property(lambda self: self.session.hints_dropped)
    hint_errors = property(lambda self: self.session.hint_errors)

    def avoid(self, nodes: set[int]) -> None:
        self.session.avoid(nodes)

    def stats(self, node: int):
        return self.session.stats(node)

    def __len__(self) -> int:
        return len(self.manifest)

    def _order(self, holders: list[int]) -> list[int]:
        nodes = list(holders)
        if self.local_node in nodes:
            nodes.remove(self.local_node)
            nodes.insert(0, self.local_node)
        return nodes

    def _cache_nodes(self, holders: list[int]) -> list[int]:
        """Caches a reader here can read as local files, where a fill is likeliest first: its own
        node's where this host's kernel counts its GETs (kernel.watch=any), else the chunk's
        holders' on the same host (every node, on a one-machine cluster), then its own."""
        here = [n for n in self._order(holders)
                if n in self.session.cache_dirs and self.state.node(n).host_id == self.session.here]
        own = [] if self.local_node is None else [self.local_node]
        first, then = (own, here) if self.session.counted_here else (here, own)
        return first + [n for n in then if n not in first]

    def sources(self, i: int) -> list[int]:
        """Nodes to try for chunk i, in order: this node if it holds a copy, then the owner first."""
        self.manifest.chunk(i)  # names the valid range for a bad id
        return self._sources[i]

    def presigned(self, ids: Sequence[int], expires_s: int) -> list[dict] | None:
        """Chunks `ids` as another process on this host may GET them itself: each one's size,
        xxh3 and holders as presigned URLs, in the order this client tries them (holders that
        refused lately last). None where such GETs would go uncounted (MinIO over TLS, a node's
        kernel simulated: this client reports its GETs to the node instead). An erasure-coded
        chunk's are its data shards' (each its size, xxh3 and node's URL), "urls" empty; None
        while a data shard's node is down (this client reads parity in its place, hedged)."""
        s, m = self.session, self.manifest
        if s.state.tls_ca or s.mark or any(n.kernel_mode == "simulated" for n in self.state.nodes):
            return None
        out = []
        for i in ids:
            c = m.chunk(i)
            if m.layout == "ec":
                if any(self._down(node) for node, _ in m.pieces(c)[:m.ec_data]):
                    return None
                size = erasure.fragment_size(c.bytes, m.ec_data, m.ec_parity)
                shards = [{"bytes": size, "xxh3": c.shards[slot],
                           "urls": [s.getter(node).presign(m.bucket, key, expires_s)]}
                          for slot, (node, key) in enumerate(m.pieces(c)[:m.ec_data])]
                out.append({"bytes": c.bytes, "xxh3": c.xxh3, "urls": [], "shards": shards})
                continue
            urls = [s.getter(n).presign(m.bucket, c.key, expires_s) for n in sorted(self.sources(i), key=self._down)]
            out.append({"bytes": c.bytes, "xxh3": c.xxh3, "urls": urls})
        return out

    def cache_path(self, node: int, i: int) -> str:
        """The file in `node`'s cache holding chunk i: its own entry, or its file's."""
        return self._paths[node][i]

    def cached_parts(self, ids) -> tuple[str, int, list[int], int, int] | None:
        """Chunks `ids` of a stored file of several chunks, as far as its file entry on this host
        holds them: the entry's path and inode, the ids it holds, their oldest fill time and the
        entry's node; None if there is no entry. Not checked against the stale marks: whoever
        reads the entry on the strength of this checks them (the mount's daemon does)."""
        places = [self._places[i] for i in ids]
        if not ids or places[0] is None or not self.use_cache:
            return None
        for node in self._caches[ids[0]]:
            path = self.cache_path(node, ids[0])
            got = cache_entry.filled(path, places)
            if got is not None:
                inode, headers = got
                have = [(i, h.fetched_ns) for i, h in zip(ids, headers) if h is not None]
                return path, inode, [i for i, _ in have], min((f for _, f in have), default=0), node
        return None

    def mark_keys(self, ids) -> tuple[list[int], int]:
        """What the kernel's stale marks of chunks `ids` are kept under: their keys' hashes and
        the bucket's (a bucket-wide write marks the bucket)."""
        return [self._key_hashes[i] for i in ids], self._bucket_hash

    def marks_pin(self, node: int) -> str | None:
        """Where `node` pins its kernel's stale marks on this host; None if it keeps none."""
        return str(self.paths.stale_pin(node)) if self.state.node(node).kernel_mode == "real" else None

    def cache_place(self, i: int) -> cache_entry.Place | None:
        """Where chunk i is cached: in its file's entry (a stored file of several chunks), or None:
        in an entry of its own."""
        return self._places[i]

    # -- reads ---------------------------------------------------------------------------

    def read_chunk(self, i: int) -> bytes:
        t = time.perf_counter()
        chunk = self.manifest.chunk(i)
        self._note_order(i)
        data = self._cache_hit(i, cache_entry.read_entry) if self.use_cache else None
        data = data if data is not None else self._read_minio(i, chunk)
        self.stats(chunk.nodes[0]).latency(time.perf_counter() - t)
        return data

    def read_range(self, i: int, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of chunk i from a holder's MinIO: one ranged GET, which the kernel
        counts as an access of the chunk like a whole one (it makes the chunk hot). For a small
        read of a chunk not cached here: a random reader should not pay a whole chunk per read.
        A range cannot be checked against the chunk's checksum (MinIO checks its own disks); an
        erasure-coded chunk, or a range no holder serves, is read whole (checked) and cut."""
        chunk = self.manifest.chunk(i)
        if self.manifest.layout != "ec":
            for node in sorted(self.sources(i), key=self._down):
                try:  # a plain signed GET: boto3's own overhead is most of a small read's cost
                    body = self.session.getter(node).get_object(self.manifest.bucket, chunk.key, start, stop)[0]
                except Exception as e:
                    self.session.note_failure(node, e)
                    continue
                if len(body) == min(stop, chunk.bytes) - start:
                    st = self.stats(node)
                    st.add(MISSES)
                    st.add(BYTES_MINIO, len(body))
                    self.session.report_read(node, f"/{self.manifest.bucket}/{chunk.key}")
                    return body
        return self.read_chunk(i)[start:stop]

    def _cache_hit(self, i: int, lookup):
        """Chunk i from the first cache on this host that has a good, fresh entry, through
        `lookup` (cache_entry.read_entry: bytes; cache_entry.map_entry: a mapped buffer); else None."""
        for node in self._caches[i]:
            got = lookup(self.cache_path(node, i), self.session.verify_cache, partial(self._stale_mark, node, i),
                         place=self._places[i])
            if got is cache_entry.DAMAGED:
                self._damaged(node, i)
            elif got is not None and got is not cache_entry.STALE and got is not cache_entry.SUSPECT:
                self.session.count_hit(node, len(got) if isinstance(got, bytes) else got.size)
                return got
        return None

    def open_cached(self, i: int, count: bool = True, verify: bool = False
                    ) -> tuple[int, cache_entry.Header, str, int] | None:
        """A descriptor, header, path and owning node of a whole, fresh entry of chunk i in a
        cache on this host, or None. count=True makes it a read (a hit: counted, touched for
        the LRU); False only looks. verify=True: its bytes read whole and checked against the
        manifest's checksum first (a rotten entry is dropped and the node asked to heal it)."""
        for node in self._caches[i] if self.use_cache else ():
            path = self.cache_path(node, i)
            got = cache_entry.open_entry(path, partial(self._stale_mark, node, i), self._places[i], touch=count)
            if got is not None and verify and not self._intact(got[0], got[1], i):
                log.warning("dropping cache entry %s: its bytes are not chunk %d of %s as the manifest has it",
                            path, i, self.manifest.name)
                cache_entry.unlink_entry(Path(path), got[0])
                os.close(got[0])
                self._damaged(node, i)
                continue
            if got is not None:
                if count:
                    self._note_order(i)
                    self.session.count_hit(node, got[1].size)
                return (*got, path, node)
        return None

    def _intact(self, fd: int, header: cache_entry.Header, i: int) -> bool:
        """Whether the entry open at `fd` holds chunk i's bytes: the manifest's checksum, not the
        entry's own (which a fill computed from whatever it fetched)."""
        place = self._places[i]
        data = os.pread(fd, header.size, place.offset if place else 0)
        chunk = self.manifest.chunk(i)
        return len(data) == chunk.bytes and xxhash.xxh3_64_intdigest(data) == chunk.xxh3

    def _stale_mark(self, node: int, i: int) -> tuple[int, int]:
        """When the node's kernel last saw chunk i written (0: never, or no pinned marks), and
        when it last marked the bucket suspect (a write it could not name: every entry fetched
        before is checked before it is trusted again)."""
        return self.session.marks(node).marks(self._key_hashes[i], self._bucket_hash)

    def _damaged(self, node: int, i: int) -> None:
        """The entry was dropped; this read goes to MinIO, and the node fetches a good copy."""
        self.stats(node).add(DAMAGED_ENTRIES)
        self.session.hint(node, "heal", self.manifest.chunk(i).key)

    def _read_minio(self, i: int, chunk) -> bytes:
        """Chunk i from MinIO; when its holders are down, from a cache on another host (the
        peer tier): first if every holder refused lately, else once MinIO failed."""
        holders_down = all(self._down(n) for n in chunk.nodes)
        readers_of = chunk.nodes[:self.manifest.ec_data] if self.manifest.layout == "ec" else chunk.nodes
        if holders_down or self.session.slow(readers_of):
            data = holder_reads.from_peer(self, chunk)
            if data is not None:
                return data
        try:
            return (holder_reads.shards if self.manifest.layout == "ec" else holder_reads.replicas)(self, i, chunk)
        except FasterFSError:
            data = None if holders_down else holder_reads.from_peer(self, chunk)
            if data is None:
                raise
            return data

    def _down(self, node: int) -> bool:
        return self.session.down(node)

    # -- prefetch -------------------------------------------------------------------------

    def _note_order(self, i: int) -> None:
        """Sequential reader detection: after `trigger` in-order reads, prefetch a window ahead."""
        self._in_order = self._in_order + 1 if self._last_read is not None and i == self._last_read + 1 else 1
        self._last_read = i
        window, trigger = self.session.prefetch_window, self.session.prefetch_trigger
        if not (self.use_cache and window and self._in_order >= trigger) \
                or self.manifest.layout == "ec":  # a node fills whole objects; an ec chunk is shards
            return
        if self._in_order == trigger:
            self._prefetched_to = i  # a new sequential run
        ahead = list(range(max(i + 1, self._prefetched_to + 1), min(i + 1 + window, len(self.manifest))))
        if not ahead:
            return
        self._prefetched_to = ahead[-1]
        by_node: dict[int, list[str]] = {}
        for j in ahead:
            by_node.setdefault(self.sources(j)[0], []).append(self.manifest.chunk(j).key)
        for node, keys in by_node.items():
            self.stats(node).add(PREFETCH, len(keys))
            self.session.hint(node, "prefetch", keys)
