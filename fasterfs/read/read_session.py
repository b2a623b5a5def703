"""ReadSession: what every reader of one process shares about a cluster, whichever dataset or file
it reads: connections to each node's MinIO, which nodes refused lately, how fast each answers,
the kernels' stale marks, the read counters the StorageNodes sum, and the one thread that sends
hints (prefetch, heal, observe) to the StorageNodes off the readers' threads.

A Client (fasterfs.read.client) is one manifest read through a session: `Client(session, manifest)`;
every client of a session shares exactly this state and nothing else.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TypeVar

from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from ..control import credentials, s3
from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState, host_id
from ..core.config import Paths
from ..core.errors import FasterFSError
from . import reader_stats
from .reader_stats import BYTES_CACHE, HITS

T = TypeVar("T")


class NodeGone(ConnectionError):
    """A piece's node is not part of the cluster any more: as a machine that is down."""


class RottenCopy(FasterFSError):
    """A copy whose bytes do not match the checksum stored with it."""


def unavailable(error: BaseException) -> bool:
    """Whether `error` says this copy could not serve the read: its node could not be reached or
    did not answer in time (down, cut off, hung, gone, starting up), or the copy is rotten (its
    checksum, or MinIO's own bitrot check: a 503 SlowDownRead) - as opposed to a bug or a missing
    object."""
    import urllib3
    from botocore.exceptions import ClientError, IncompleteReadError, ResponseStreamingError

    if isinstance(error, ClientError):
        return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 503
    if isinstance(error, s3.ServerError):
        return error.status == 503
    return isinstance(error, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, NodeGone, RottenCopy,
                              ResponseStreamingError, IncompleteReadError,  # its server died mid-answer
                              ConnectionError, TimeoutError, urllib3.exceptions.HTTPError))


class NoGoodCopy(FasterFSError):
    """A chunk none of whose copies could serve it at once (each down, cut off, hung, gone or rotten)."""

    def __init__(self, message: str, nodes: list[int]):
        super().__init__(message)
        self.nodes = nodes


class ReadFailed(Exception):
    """No node asked gave a good answer: each one's error, by node."""

    def __init__(self, errors: dict[int, BaseException]):
        super().__init__("; ".join(f"node {n}: {type(e).__name__}: {e}"[:300] for n, e in errors.items()))
        self.errors = errors


class ReadSession:
    DOWN_S = 2.0  # how long a node that refused a connection is tried last
    HINT_ERRORS = 20

    def __init__(self, state: ClusterState, creds: credentials.Credentials, cfg, use_cache: bool = True,
                 prefetch: bool = True, mark: int = 0):
        """mark: GETs over sockets with this SO_MARK, which the kernel programs do not count
        (repair and the scrub read through a session; their reads are no sign of heat)."""
        self.state, self.creds = state.trust(), creds
        self.paths = Paths(Path(state.root))
        # plain values: configuration lookups cost microseconds on the hit path
        self.verify = bool(cfg.client.verify_checksum)
        self.verify_cache = bool(cfg.cache.verify_reads)
        self.use_cache = use_cache
        p = cfg.cache.prefetch
        self.prefetch_window = int(p.window) if p.enabled and prefetch else 0
        self.prefetch_trigger = int(p.trigger)
        self.peer_slower_ms = float(cfg.cache.peer_slower_ms)
        self.read_timeout_s = cfg.client.read_timeout_s
        h = cfg.client.hedge
        self.hedge, self.hedge_factor = bool(h.enabled), float(h.factor)
        self.hedge_min_ms, self.hedge_first_ms = float(h.min_ms), float(h.first_ms)
        self.mark = mark
        self._s3 = {n.index: s3.client(n.endpoint, creds, cfg.client.connect_timeout_s, self.read_timeout_s)
                    for n in state.nodes}
        # lean signed GETs with this session's mark (none: counted as reads)
        self.getter = s3.MarkedPool(creds, mark, lambda node: state.node(node).endpoint, self.read_timeout_s)
        self.here = host_id()
        self.nodes = NodeDirectory(state.ray_namespace)
        self.local_node = self._local_node()
        # whose kernel counts a GET: the reader's host (kernel.watch=any, the lab) or the holder's
        self.counted_here = state.settings.watch == "any" and self.local_node is not None
        self.cache_dirs = {n.index: str(self.paths.cache_dir(n.index)) for n in state.nodes}
        self._marks: dict[int, object] = {}
        self._stats: dict[int, reader_stats.ReaderStats | reader_stats.Uncounted] = {}
        self._refused: dict[int, float] = {}  # node -> until when it is tried last
        self._origin_ms: dict[int, float] = {}  # node -> moving average of a GET from its MinIO here
        self._peer_ms: float | None = None      # moving average of a chunk read from another host's cache
        self._out: dict[int, dict[object, float]] = {}  # node -> when each GET to it still out began
        self.served_by: collections.Counter = collections.Counter()  # node -> reads its MinIO answered
        self.degraded_reads = 0  # erasure-coded chunks rebuilt with parity (a shard missing or bad)
        self.degraded_why: collections.deque[str] = collections.deque(maxlen=20)  # the latest shards that failed
        self.peer_reads = 0      # chunks read from another host's cache, their holders down or slow
        self.hints_dropped = 0   # hints made while not connected to Ray
        self.hint_errors: list[str] = []  # the latest hints that failed, and why
        self._shard_pool: ThreadPoolExecutor | None = None
        self._hints: queue.SimpleQueue | None = None
        self._lock = threading.Lock()

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

    # -- connections -----------------------------------------------------------------------

    def timed_get(self, node: int, bucket: str, key: str) -> tuple[bytes, dict[str, str]]:
        """A whole object from `node`'s MinIO and its user metadata; the time feeds the node's
        moving average (`slow`)."""
        if node not in self._s3:
            raise NodeGone(f"node {node} is not part of cluster {self.state.name!r} now (its nodes are "
                           f"{sorted(self._s3)}): read as down")
        t = time.perf_counter()
        token = object()
        with self._lock:
            self._out.setdefault(node, {})[token] = time.monotonic()
        try:
            if self.mark:
                body, headers = self.getter(node).get_object(bucket, key)
                meta = {k.lower()[len("x-amz-meta-"):]: v for k, v in headers.items()
                        if k.lower().startswith("x-amz-meta-")}
            else:
                response = self._s3[node].get_object(Bucket=bucket, Key=key)
                body, meta = response["Body"].read(), response.get("Metadata", {})
        finally:
            with self._lock:
                del self._out[node][token]
        ms = (time.perf_counter() - t) * 1e3
        self._origin_ms[node] = ms if node not in self._origin_ms else 0.7 * self._origin_ms[node] + 0.3 * ms
        return body, meta

    def hedge_s(self, node: int) -> float:
        """How long a GET to `node` may go unanswered before the same piece is asked of another
        copy: hedge.factor x its moving average here (else the other nodes'), at least
        hedge.min_ms; hedge.first_ms before any GET was timed."""
        known = self._origin_ms.get(node)
        if known is None and self._origin_ms:
            known = sum(self._origin_ms.values()) / len(self._origin_ms)
        ms = self.hedge_first_ms if known is None else max(self.hedge_min_ms, self.hedge_factor * known)
        return ms / 1e3

    def first_answer(self, nodes: list[int], get: Callable[[int], T]) -> tuple[int, T]:
        """get(node) of the first node; the next node is asked as well when those asked have
        failed or stayed silent for the hedge budget (a hung or slow host: Dean and Barroso's
        hedged requests), and the first good answer wins. A node silent now (`silent`) is
        tried last, and never as a hedge: only once every other has failed (a hung node holds
        a pool thread per request until its timeout; hedging to it again and again would fill
        the pool and queue every read behind it). Raises ReadFailed naming every node's error
        when none answers."""
        errors: dict[int, BaseException] = {}
        if len(nodes) == 1 or not self.hedge:  # nothing to hedge with: no thread hop
            for node in nodes:
                try:
                    return node, get(node)
                except Exception as e:
                    self.note_failure(node, e)
                    errors[node] = e
            raise ReadFailed(errors)
        pool = self.shard_pool()
        waiting: list[int] = list(nodes)
        running: dict[Future[T], int] = {}
        while waiting or running:
            if waiting and not running:
                node = waiting.pop(0)
                running[pool.submit(get, node)] = node
            spares = [n for n in waiting if not self.down(n)]  # what a hedge may ask
            done, _ = wait(running, timeout=self.hedge_s(node) if spares else None, return_when=FIRST_COMPLETED)
            if not done:  # silent for its budget: ask the next copy too
                node = spares[0]
                waiting.remove(node)
                running[pool.submit(get, node)] = node
                continue
            for f in done:
                asked = running.pop(f)
                error = f.exception()
                if error is None:
                    return asked, f.result()
                self.note_failure(asked, error)
                errors[asked] = error
        raise ReadFailed(errors)

    def silent(self, node: int) -> bool:
        """A GET of this process to `node` has been out longer than its hedge budget: the node
        is hung or very slow now (until that GET ends, answered or timed out)."""
        with self._lock:
            out = min(self._out.get(node, {}).values(), default=None)
        return out is not None and time.monotonic() - out > self.hedge_s(node)

    def shard_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._shard_pool is None:
                self._shard_pool = ThreadPoolExecutor(16, thread_name_prefix="fasterfs-shards")
            return self._shard_pool

    # -- which nodes to try first ------------------------------------------------------------

    def avoid(self, nodes: set[int]) -> None:
        """Try these nodes last, for this session's life (known down: repair's survey)."""
        for node in nodes:
            self._refused[node] = float("inf")

    def where(self, node: int) -> str:
        """`node`'s MinIO endpoint, for errors (or that it is not in the cluster now)."""
        return self.state.node(node).endpoint if node in self._s3 else "not part of the cluster now"

    def down(self, node: int) -> bool:
        """The node refused a connection within DOWN_S (a refused connection costs 0.1-0.5 s in
        botocore here) or is silent now: read elsewhere first. A node the data was stored on
        that is not part of the cluster now (brought up with fewer machines) is down for good."""
        return node not in self._s3 or self._refused.get(node, 0.0) > time.monotonic() or self.silent(node)

    def note_failure(self, node: int, error: BaseException) -> None:
        import urllib3

        if isinstance(error, (EndpointConnectionError, ConnectTimeoutError)):
            self._refused[node] = time.monotonic() + self.DOWN_S
        elif isinstance(error, (ReadTimeoutError, urllib3.exceptions.ReadTimeoutError)):
            # hung: tried last (its only copies: the peer caches first) for as long as a GET could hang
            self._refused[node] = time.monotonic() + self.read_timeout_s

    def slow(self, holders: list[int]) -> bool:
        """Every holder answered this process slower than cache.peer_slower_ms of late, and the
        peer tier faster than they did (prefer_peer)."""
        return prefer_peer([self._origin_ms.get(n, 0.0) for n in holders], self._peer_ms, self.peer_slower_ms)

    def note_peer(self, ms: float) -> None:
        """A chunk came from another host's cache in `ms`."""
        self._peer_ms = ms if self._peer_ms is None else 0.7 * self._peer_ms + 0.3 * ms

    # -- counters and marks ------------------------------------------------------------------

    def stats(self, node: int) -> reader_stats.ReaderStats | reader_stats.Uncounted:
        """Counters of reads served by `node`, kept where a StorageNode of this host sums them:
        that node's own directory when it is on this host, else this process' node's (a read
        across hosts counts as this host's reader's). A driver on a host without a
        StorageNode (the lab's head) has no one to count for it."""
        if node not in self._stats:
            here = node in self._s3 and self.state.node(node).host_id == self.here
            home = node if here else self.local_node
            self._stats[node] = (reader_stats.for_process(self.paths.reader_stats_dir(home)) if home is not None
                                 else reader_stats.UNCOUNTED)
        return self._stats[node]

    def count_hit(self, node: int, size: int) -> None:
        st = self.stats(node)
        st.add(HITS)
        st.add(BYTES_CACHE, size)

    def marks(self, node: int):
        """The stale marks `node`'s kernel pinned on this host; followed across its restarts."""
        if node not in self._marks:
            from ..bpf.pinned import open_marks

            kept = self.state.node(node).kernel_mode == "real"  # simulated mode keeps none to read
            self._marks[node] = open_marks(str(self.paths.stale_pin(node)), required=kept)
        return self._marks[node]

    # -- hints to the nodes, off the reader's thread ---------------------------------------

    def report_read(self, node: int, path: str) -> None:
        """Tell the node whose kernel would have counted this GET, where that kernel cannot read
        it: SIMULATED mode, or MinIO over TLS (the request line is ciphertext to the kernel)."""
        counter = self.local_node if self.counted_here else node
        if not self.mark and counter is not None and (
                self.state.tls_ca or self.state.node(counter).kernel_mode == "simulated"):
            self.hint(counter, "observe", "GET", path)

    def hint(self, node: int, method: str, *args) -> None:
        with self._lock:
            if self._hints is None:
                self._hints = queue.SimpleQueue()
                threading.Thread(target=self._send_hints, args=(self._hints,), name="fasterfs-hints",
                                 daemon=True).start()
        self._hints.put((node, method, args))

    def _send_hints(self, hints: queue.SimpleQueue) -> None:
        """Never joins or leaves Ray itself (that is the application's, on its own thread): a
        hint made while this process is not connected is counted as dropped."""
        import ray

        while True:
            node, method, args = hints.get()
            if not ray.is_initialized():
                self.hints_dropped += 1
                continue
            try:
                getattr(self.nodes.require(node), method).remote(*args)  # fire and forget
            except Exception as e:
                self.hint_errors.append(f"{method} to node {node}: {type(e).__name__}: {e}"[:200])
                del self.hint_errors[:-self.HINT_ERRORS]  # the latest few, for whoever asks
                self.nodes.forget(node)  # the cluster restarted an actor: look it up again next time

    def ask(self, node: int, method: str, *args, timeout: float):
        """A StorageNode's answer to one call (the peer tier's), or the error."""
        import ray

        return ray.get(getattr(self.nodes.require(node), method).remote(*args), timeout=timeout)


def prefer_peer(holder_ms: list[float], peer_ms: float | None, slower_ms: float) -> bool:
    """Whether a chunk is asked of the peer tier before its holders: every holder slower than
    `slower_ms` of late (0: never), and the peer tier faster than the fastest of them — or not
    timed yet, tried once to learn. A holder merely busy (its disk shared with a fill) is not
    left for a peer behind a slower link (the lab's laptops: a third of the disk's rate), as
    after a cluster grows, when the old hosts still cache the chunks that moved away."""
    if not slower_ms or not holder_ms or min(holder_ms) <= slower_ms:
        return False
    return peer_ms is None or peer_ms < min(holder_ms)

