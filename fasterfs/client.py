"""The reader's side: `fasterfs.connect()` and `Client.read_chunk` / `read_table`.

A read first looks in the cache of the nodes holding the chunk (this node's first):
a hit is a file read, or a memory map for Arrow chunks, inside this process. A miss
goes straight to a MinIO server holding the chunk — this node's own copy when it has
one, else the owner, then the other replicas when a server is down — where the kernel
programs see and count it. No actor call and no central service sits on the read
path; a background thread sends prefetch hints (sequential readers) and, in
SIMULATED mode only, reports reads to the node's user-space counter.
"""
from __future__ import annotations

import collections
import copy
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import xxhash
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

from . import cache, config, credentials, erasure, lobster, reader_stats, registry, s3
from .bpf.events import key_hash
from .config import Paths
from .errors import FasterFSError
from .manifest import Manifest
from .reader_stats import BYTES_CACHE, BYTES_MINIO, DAMAGED, HITS, MISSES, PREFETCH
from .state import ClusterState, host_id


class Client:
    DOWN_S = 2.0  # how long a node that refused a connection is tried last

    def __init__(self, state: ClusterState, creds: credentials.Credentials, manifest: Manifest, cfg,
                 use_cache: bool = True, prefetch: bool = True, mark: int = 0):
        """mark: GETs over sockets with this SO_MARK, which the kernel programs do not count
        (repair and the scrub read through a client; their reads are no sign of heat)."""
        self.state, self.manifest = state, manifest
        self.paths = Paths(Path(state.root))
        self.verify = bool(cfg.client.verify_checksum)
        self.verify_cache = bool(cfg.cache.verify_reads)
        self.use_cache = use_cache
        p = cfg.cache.prefetch  # plain values: configuration lookups cost microseconds on the hit path
        self.prefetch_window = int(p.window) if p.enabled and prefetch else 0
        self.prefetch_trigger = int(p.trigger)
        self._s3 = {n.index: s3.client(n.endpoint, creds, cfg.client.connect_timeout_s, cfg.client.read_timeout_s)
                    for n in state.nodes}
        self._marked = {n.index: s3.MarkedGetter(n.endpoint, creds, mark, cfg.client.read_timeout_s)
                        for n in state.nodes} if mark else None
        self._creds, self._read_timeout = creds, cfg.client.read_timeout_s
        self._plain: dict[int, s3.MarkedGetter] = {}  # unmarked lean GETs (ranges), made when first needed
        self._here = host_id()
        self.local_node = self._local_node()
        # whose kernel counts a GET: the reader's host (kernel.watch=any, the lab) or the holder's
        watch = state.config.get("kernel", {}).get("watch")  # as the cluster's kernels were told
        self._counted_here = watch == "any" and self.local_node is not None
        self._unmarked = not mark  # marked reads (repair, scrub) are no sign of heat
        self._cache_dirs = {n.index: str(self.paths.cache_dir(n.index)) for n in state.nodes}
        self._bind(manifest)
        self._marks: dict[int, object] = {}
        self._stats: dict[int, reader_stats.ReaderStats] = {}
        self.served_by: collections.Counter = collections.Counter()  # node -> reads its MinIO answered
        self._refused: dict[int, float] = {}  # node -> until when it is tried last
        self.degraded_reads = 0  # erasure-coded chunks rebuilt with parity (a shard missing or bad)
        self.degraded_why: collections.deque[str] = collections.deque(maxlen=20)  # why: the latest shards failed
        self.peer_reads = 0      # chunks read from another host's cache, their holders down or slow
        self.peer_slower_ms = float(cfg.cache.peer_slower_ms)
        self._origin_ms: dict[int, float] = {}  # node -> moving average of a GET from its MinIO here
        self._shard_pool: ThreadPoolExecutor | None = None
        self._hints: queue.SimpleQueue | None = None
        self.hints_dropped = 0               # hints made while not connected to Ray
        self.hint_errors: list[str] = []     # the latest hints that failed, and why

    def _bind(self, manifest: Manifest) -> None:
        """Derived once per manifest, so a hit costs only the file read."""
        self.manifest = manifest
        self._sources = [self._order(c.nodes) for c in manifest.chunks]
        self._places = cache.places(manifest)  # a file's chunks are cached together, at its home
        self._caches = [self._cache_nodes([p.home] if p else c.nodes) for c, p in zip(manifest.chunks, self._places)]
        self._paths = {n: [str(cache.entry_path(d, c.key, p)) for c, p in zip(manifest.chunks, self._places)]
                       for n, d in self._cache_dirs.items()}
        self._key_hashes = [key_hash(f"/{manifest.bucket}/{c.key}") for c in manifest.chunks]
        self._bucket_hash = key_hash(f"/{manifest.bucket}")
        self._last_read, self._in_order, self._prefetched_to = None, 0, -1

    def sibling(self, manifest: Manifest) -> Client:
        """A client of another dataset or file of the namespace, sharing this one's connections,
        counters, stale marks and hint thread."""
        other = copy.copy(self)
        other._bind(manifest)
        return other

    def _local_node(self) -> int | None:
        """The node this process runs on, when it runs inside a Ray worker of the cluster."""
        try:
            import ray

            if not ray.is_initialized():
                return None
            node_id = ray.get_runtime_context().get_node_id()
        except Exception:
            return None
        return next((n.index for n in self.state.nodes if n.ray_node_id == node_id), None)

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
        here = [n for n in self._order(holders) if self.state.node(n).host_id == self._here]
        own = [] if self.local_node is None else [self.local_node]
        first, then = (own, here) if self._counted_here else (here, own)
        return first + [n for n in then if n not in first]

    def sources(self, i: int) -> list[int]:
        """Nodes to try for chunk i, in order: this node if it holds a copy, then the owner first."""
        self.manifest.chunk(i)  # names the valid range for a bad id
        return self._sources[i]

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
            got = cache.filled(path, places)
            if got is not None:
                inode, headers = got
                have = [(i, h.fetched_ns) for i, h in zip(ids, headers) if h is not None]
                return path, inode, [i for i, _ in have], min((f for _, f in have), default=0), node
        return None

    def mark_keys(self, ids) -> tuple[list[int], int]:
        """What the kernel's stale marks of chunks `ids` are kept under: their keys' hashes and
        the bucket's (a bucket-wide write marks the bucket)."""
        return [self._key_hashes[i] for i in ids], self._bucket_hash

    def cache_place(self, i: int) -> cache.Place | None:
        """Where chunk i is cached: in its file's entry (a stored file of several chunks), or None:
        in an entry of its own."""
        return self._places[i]

    def stats(self, node: int) -> reader_stats.ReaderStats:
        """Counters of reads served by `node`, kept where a StorageNode of this host sums them:
        that node's own directory when it is on this host, else this process' node's (a read
        across hosts counts as this host's reader's). A driver on a host without a
        StorageNode (the lab's head) has no one to count for it."""
        if node not in self._stats:
            home = node if self.state.node(node).host_id == self._here else self.local_node
            self._stats[node] = (reader_stats.ReaderStats(self.paths.reader_stats_dir(home)) if home is not None
                                 else reader_stats.UNCOUNTED)
        return self._stats[node]

    # -- reads ---------------------------------------------------------------------------

    def read_chunk(self, i: int) -> bytes:
        t = time.perf_counter()
        chunk = self.manifest.chunk(i)
        self._note_order(i)
        data = self._cache_hit(i, cache.read_entry) if self.use_cache else None
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
                    body = self._getter(node).get_object(self.manifest.bucket, chunk.key, start, stop)[0]
                except Exception as e:
                    self._note_failure(node, e)
                    continue
                if len(body) == min(stop, chunk.bytes) - start:
                    st = self.stats(node)
                    st.add(MISSES)
                    st.add(BYTES_MINIO, len(body))
                    self._report_read(node, f"/{self.manifest.bucket}/{chunk.key}")
                    return body
        return self.read_chunk(i)[start:stop]

    def _getter(self, node: int) -> s3.MarkedGetter:
        """Lean signed GETs to `node`'s MinIO, with this client's mark (none: counted as reads)."""
        if self._marked is not None:
            return self._marked[node]
        if node not in self._plain:
            n = self.state.node(node)
            self._plain[node] = s3.MarkedGetter(n.endpoint, self._creds, 0, self._read_timeout)
        return self._plain[node]

    def read_table(self, i: int) -> pl.DataFrame:
        """Chunk i as a DataFrame with LOBSTER column names; prices are integers (USD x 10000).
        A cached Arrow chunk is memory-mapped and handed to polars without a copy."""
        if self.manifest.format == "arrow" and self.use_cache:
            import pyarrow as pa

            t = time.perf_counter()
            chunk = self.manifest.chunk(i)
            self._note_order(i)
            buf = self._cache_hit(i, cache.map_entry)
            if buf is not None:
                table = pa.ipc.open_file(buf).read_all()
            else:
                table = pa.ipc.open_file(pa.py_buffer(self._read_minio(i, chunk))).read_all()
            self.stats(chunk.nodes[0]).latency(time.perf_counter() - t)
            return pl.from_arrow(table)
        return lobster.decode_chunk(self.read_chunk(i), self.manifest.format, self.manifest.level)

    def chunks_between(self, start: float, end: float) -> list[int]:
        """Ids of the chunks holding messages with start <= Time < end (seconds after midnight)."""
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (start, end)) or not start < end:
            raise FasterFSError(f"time range [{start!r}, {end!r}) of dataset {self.manifest.dataset}: give numbers "
                                "start < end, in seconds after midnight (LOBSTER's Time)")
        return [c.id for c in self.manifest.chunks if c.first_time < end and c.last_time >= start]

    def read_between(self, start: float, end: float) -> pl.DataFrame:
        """Every message with start <= Time < end and its order-book row, in order: the window a
        backtest replays. Reads only the chunks overlapping it, each through the cache like
        read_table, so a window replayed again is served from local disk once it is hot."""
        ids = self.chunks_between(start, end)
        if not ids:
            return pl.DataFrame(schema=lobster.schema(self.manifest.level))
        frame = pl.concat([self.read_table(i) for i in ids])
        return frame.filter((pl.col("Time") >= start) & (pl.col("Time") < end))

    def _cache_hit(self, i: int, lookup):
        """Chunk i from the first cache on this host that has a good, fresh entry, through
        `lookup` (cache.read_entry: bytes; cache.map_entry: a mapped buffer); else None."""
        for node in self._caches[i]:
            got = lookup(self.cache_path(node, i), self.verify_cache, lambda: self._stale_mark(node, i),
                         place=self._places[i])
            if got is cache.DAMAGED:
                self._damaged(node, i)
            elif got is not None and got is not cache.STALE:
                self._count_hit(node, len(got) if isinstance(got, bytes) else got.size)
                return got
        return None

    def open_cached(self, i: int, count: bool = True) -> tuple[int, cache.Header, str, int] | None:
        """A descriptor, header, path and owning node of a whole, fresh entry of chunk i in a
        cache on this host, or None. count=True makes it a read (a hit: counted, touched for
        the LRU); False only looks."""
        for node in self._caches[i] if self.use_cache else ():
            path = self.cache_path(node, i)
            got = cache.open_entry(path, lambda: self._stale_mark(node, i), self._places[i], touch=count)
            if got is not None:
                if count:
                    self._note_order(i)
                    self._count_hit(node, got[1].size)
                return (*got, path, node)
        return None

    def _stale_mark(self, node: int, i: int) -> int:
        """When the node's kernel last saw chunk i written (0: never, or no pinned marks); the
        pin is followed across StorageNode restarts."""
        if node not in self._marks:
            from .bpf.pinned import open_marks

            self._marks[node] = open_marks(str(self.paths.stale_pin(node)))
        marks = self._marks[node]
        # a bucket-wide write (DeleteObjects) marks "/bucket": it covers every key
        return marks.mark(self._key_hashes[i], self._bucket_hash)

    def _damaged(self, node: int, i: int) -> None:
        """The entry was dropped; this read goes to MinIO, and the node fetches a good copy."""
        self.stats(node).add(DAMAGED)
        self._hint(node, "heal", self.manifest.chunk(i).key)

    def _count_hit(self, node: int, size: int) -> None:
        st = self.stats(node)
        st.add(HITS)
        st.add(BYTES_CACHE, size)

    def _read_minio(self, i: int, chunk) -> bytes:
        """Chunk i from MinIO; when its holders are down, from a cache on another host (the
        peer tier): first if every holder refused lately, else once MinIO failed."""
        holders_down = all(self._down(n) for n in chunk.nodes)
        readers_of = chunk.nodes[:self.manifest.ec_data] if self.manifest.layout == "ec" else chunk.nodes
        if holders_down or self._slow(readers_of):
            data = self._read_peer(i, chunk)
            if data is not None:
                return data
        try:
            return self._read_shards(i, chunk) if self.manifest.layout == "ec" else self._read_replicas(i, chunk)
        except FasterFSError:
            data = None if holders_down else self._read_peer(i, chunk)
            if data is None:
                raise
            return data

    def _timed_get(self, node: int, key: str) -> dict:
        """A GET from `node`'s MinIO; its time feeds the node's moving average (`_slow`)."""
        t = time.perf_counter()
        if self._marked is not None:
            body, headers = self._marked[node].get_object(self.manifest.bucket, key)
            response = {"Body": body, "Metadata": {k.lower()[len("x-amz-meta-"):]: v for k, v in headers.items()
                                                   if k.lower().startswith("x-amz-meta-")}}
        else:
            response = self._s3[node].get_object(Bucket=self.manifest.bucket, Key=key)
            response["Body"] = response["Body"].read()
        ms = (time.perf_counter() - t) * 1e3
        self._origin_ms[node] = ms if node not in self._origin_ms else 0.7 * self._origin_ms[node] + 0.3 * ms
        return response

    def _slow(self, holders: list[int]) -> bool:
        """Every holder answered this reader slower than cache.peer_slower_ms of late."""
        return bool(self.peer_slower_ms) and all(self._origin_ms.get(n, 0.0) > self.peer_slower_ms for n in holders)

    def _read_peer(self, i: int, chunk) -> bytes | None:
        """Chunk i from the cache of a node that has it (any host; the StorageNodes keep the
        index), checked against the manifest; None without Ray or when no cache has it."""
        import ray

        from .state import actor_name

        if not ray.is_initialized():
            return None

        def ask(node: int, method: str, timeout: float):
            actor = ray.get_actor(actor_name(node), namespace=self.state.namespace)
            return ray.get(getattr(actor, method).remote(chunk.key), timeout=timeout)

        near = [self.local_node] if self.local_node is not None else []
        for node in near + [n.index for n in self.state.nodes if n.index not in near and not self._down(n.index)]:
            try:
                cached_on = ask(node, "cached_on", 5.0)
                break
            except Exception:  # that node is gone too: ask the next
                continue
        else:
            return None
        for node in cached_on:
            try:
                data = ask(node, "cache_read", 10.0)
            except Exception:
                continue
            if data is not None and len(data) == chunk.bytes and xxhash.xxh3_64_intdigest(data) == chunk.xxh3:
                self.peer_reads += 1
                self._count_hit(node, len(data))
                return data
        return None

    def _read_replicas(self, i: int, chunk) -> bytes:
        errors = []
        for node in sorted(self.sources(i), key=self._down):  # holders that refused lately, last
            try:
                response = self._timed_get(node, chunk.key)
                body = response["Body"]
            except Exception as e:  # node down or object missing: try the next holder
                self._note_failure(node, e)
                errors.append(f"node {node} ({self.state.node(node).endpoint}): {type(e).__name__}: {e}"[:300])
                continue
            # The object carries the checksum it was stored with; MinIO is the source of truth, so an
            # object rewritten by another tool (without one) is served as it now is.
            stored = response.get("Metadata", {}).get("xxh3")
            if self.verify and stored is not None and xxhash.xxh3_64_intdigest(body) != int(stored):
                errors.append(f"node {node}: {chunk.key} does not match its stored checksum")
                continue
            self.served_by[node] += 1
            st = self.stats(node)
            st.add(MISSES)
            st.add(BYTES_MINIO, len(body))
            self._report_read(node, f"/{self.manifest.bucket}/{chunk.key}")
            return body
        if errors and all("NoSuchKey" in e for e in errors):
            raise FasterFSError(f"chunk {i} ({chunk.key}) of generation {self.manifest.generation} is gone from every "
                                f"holder: dataset {self.manifest.dataset} was re-ingested more than ingest.keep_old_s "
                                "ago; connect() again to read the current generation")
        raise FasterFSError(f"chunk {i} ({chunk.key}) could not be read from any holder: " + "; ".join(errors))

    def _read_shards(self, i: int, chunk) -> bytes:
        """An erasure-coded chunk: its data shards fetched in parallel and joined; a shard that
        is missing, unreadable or fails its checksum is replaced by the next parity shard
        (a degraded read, decoded from any ec.data good shards)."""
        bucket = self.manifest.bucket

        def fetch(s: int) -> bytes:
            node, key = chunk.nodes[s], erasure.shard_key(chunk.key, s)
            try:
                body = self._timed_get(node, key)["Body"]
            except Exception as e:
                self._note_failure(node, e)
                raise
            self.served_by[node] += 1
            self.stats(node).add(BYTES_MINIO, len(body))
            self._report_read(node, f"/{bucket}/{key}")
            return body

        if self._shard_pool is None:
            self._shard_pool = ThreadPoolExecutor(8, thread_name_prefix="fasterfs-shards")
        data, degraded, why = erasure.gather(chunk, self.manifest.ec_data, self.manifest.ec_parity, fetch,
                                        self._shard_pool, lambda s: self._down(chunk.nodes[s]),
                                        f"chunk {i} ({chunk.key})")
        self.degraded_reads += degraded
        self.degraded_why.extend(why)
        self.stats(chunk.nodes[0]).add(MISSES)
        return data

    def avoid(self, nodes: set[int]) -> None:
        """Try these nodes last, for this client's life (known down: repair's survey)."""
        for node in nodes:
            self._refused[node] = float("inf")

    def _down(self, node: int) -> bool:
        """The node refused a connection within DOWN_S: read elsewhere first (a refused
        connection costs 0.1-0.5 s in botocore here)."""
        return self._refused.get(node, 0.0) > time.monotonic()

    def _note_failure(self, node: int, error: Exception) -> None:
        if isinstance(error, (EndpointConnectionError, ConnectTimeoutError)):
            self._refused[node] = time.monotonic() + self.DOWN_S

    # -- hints to the nodes, off the reader's thread ---------------------------------------

    def _note_order(self, i: int) -> None:
        """Sequential reader detection: after `trigger` in-order reads, prefetch a window ahead."""
        self._in_order = self._in_order + 1 if self._last_read is not None and i == self._last_read + 1 else 1
        self._last_read = i
        if not (self.use_cache and self.prefetch_window and self._in_order >= self.prefetch_trigger) \
                or self.manifest.layout == "ec":  # a node fills whole objects; an ec chunk is shards
            return
        if self._in_order == self.prefetch_trigger:
            self._prefetched_to = i  # a new sequential run
        ahead = list(range(max(i + 1, self._prefetched_to + 1), min(i + 1 + self.prefetch_window, len(self.manifest))))
        if not ahead:
            return
        self._prefetched_to = ahead[-1]
        by_node: dict[int, list[str]] = {}
        for j in ahead:
            by_node.setdefault(self.sources(j)[0], []).append(self.manifest.chunk(j).key)
        for node, keys in by_node.items():
            self.stats(node).add(PREFETCH, len(keys))
            self._hint(node, "prefetch", keys)

    def _report_read(self, node: int, path: str) -> None:
        """Tell the node whose kernel would have counted this GET, where that kernel cannot read
        it: SIMULATED mode, or MinIO over TLS (the request line is ciphertext to the kernel)."""
        counter = self.local_node if self._counted_here else node
        if self._unmarked and (self.state.tls_ca or self.state.node(counter).kernel_mode == "simulated"):
            self._hint(counter, "observe", "GET", path)

    def _hint(self, node: int, method: str, *args) -> None:
        if self._hints is None:
            self._hints = queue.SimpleQueue()
            threading.Thread(target=self._send_hints, name="fasterfs-hints", daemon=True).start()
        self._hints.put((node, method, args))

    def _send_hints(self) -> None:
        """Never joins or leaves Ray itself (that is the application's, on its own thread): a
        hint made while this process is not connected is counted as dropped."""
        import ray

        from .state import actor_name

        actors: dict = {}
        while True:
            node, method, args = self._hints.get()
            if not ray.is_initialized():
                self.hints_dropped += 1
                continue
            try:
                if node not in actors:
                    actors[node] = ray.get_actor(actor_name(node), namespace=self.state.namespace)
                getattr(actors[node], method).remote(*args)  # fire and forget
            except Exception as e:
                self.hint_errors.append(f"{method} to node {node}: {type(e).__name__}: {e}"[:200])
                del self.hint_errors[:-20]  # the latest few, for whoever asks
                actors.pop(node, None)  # the cluster restarted an actor: look it up again next time


def connect(root=None, overrides: Sequence[str] = (), use_cache: bool = True, dataset: str | None = None) -> Client:
    """A client of `dataset` (default: the one ingested last; or a file's path) in the running
    cluster, from any host: inside a Ray task or actor, the cluster it runs in; elsewhere
    the one at cluster.ray_address, or the one whose head state file is under `root`
    (default cluster.root). Everything it needs comes from the cluster's Registry.
    use_cache=False reads from MinIO only (baselines)."""
    cfg = config.load(overrides)
    state = registry.find(cfg, root)
    manifest = registry.fetch_manifest(state.name, dataset)
    if manifest is None:
        if dataset is None:
            raise FasterFSError(f"no dataset has been ingested into cluster {state.name!r}: run `fasterfs ingest`")
        raise FasterFSError(f"{dataset!r}: no such dataset or file in cluster {state.name!r} (`fasterfs ls`)")
    return Client(state, registry.fetch_credentials(state.name), manifest, cfg, use_cache)
