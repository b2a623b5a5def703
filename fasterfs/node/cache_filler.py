"""CacheFiller: fills a node's cache when the kernel says a chunk is hot, prefetches
ahead of sequential readers, and keeps stale data out.

Fills run on a small thread pool, never on a reader's thread. Their GETs go through
`MarkedGetter`, so the kernel does not count them as reads. A STALE mark (the kernel
saw a PUT or DELETE of the key) drops the entry at once and bumps the key's stale
sequence, so a fill that raced with the write throws its bytes away instead of
caching the old version. Prefetches back off when the fill queue is long.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ..control.s3 import MarkedGetter
from .cache import ChunkCache

log = logging.getLogger("fasterfs.node.cache_filler")


class CacheFiller:
    def __init__(self, cache: ChunkCache, getter_for: Callable[[str], MarkedGetter], bucket: str, threads: int = 2,
                 max_queue: int = 16):
        self.cache, self.getter_for, self.bucket, self.max_queue = cache, getter_for, bucket, max_queue
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cache-fill")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self._stale_seq: collections.Counter = collections.Counter()
        self.counters: collections.Counter[str] = collections.Counter()

    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def request(self, key: str, reason: str) -> Future | None:
        """Queue a fill (reason: hot, prefetch or warm); None if cached, queued, or shed."""
        with self._lock:
            if key in self._inflight:
                return self._inflight[key]
            if self.cache.contains(key):
                return None
            if reason == "prefetch" and len(self._inflight) >= self.max_queue:
                self.counters["prefetch_shed"] += 1  # under load: the reader's own GETs come first
                return None
            future = self._pool.submit(self._fill, key, reason, self._stale_seq.get(key, 0))
            self._inflight[key] = future
            self.counters[f"{reason}_requested"] += 1
        return future

    def _fill(self, key: str, reason: str, seq: int) -> bool:
        try:
            fetched = time.monotonic_ns()  # before the GET: a write after this makes the bytes stale
            data, etag = self.getter_for(key).get(self.bucket, key)
            with self._lock:
                if self._stale_seq.get(key, 0) != seq:  # written while we fetched: these bytes may be old
                    self.counters["fills_discarded_stale"] += 1
                    return False
            stored = self.cache.put(key, data, etag, fetched)
            with self._lock:
                if self._stale_seq.get(key, 0) != seq:
                    self.cache.remove(key)
                    self.counters["fills_discarded_stale"] += 1
                    return False
            if stored:
                with self._lock:
                    self.counters[f"{reason}_fills"] += 1
            return stored
        except Exception as e:
            with self._lock:
                self.counters["fill_errors"] += 1
            log.warning("fill of %s failed: %s", key, e)
            return False
        finally:
            with self._lock:
                self._inflight.pop(key, None)
                self._stale_seq.pop(key, None)  # only fills in flight need it: bounded by them

    def mark_stale(self, key: str) -> None:
        with self._lock:
            if key in self._inflight:
                self._stale_seq[key] += 1
        if self.cache.remove(key):
            with self._lock:
                self.counters["stale_dropped"] += 1

    def cancel_all(self) -> int:
        """Drop every fill queued or under way (the cache is being emptied: the heat that asked
        for them is of the epoch ending). Running ones finish but throw their bytes away."""
        with self._lock:
            for key, future in list(self._inflight.items()):
                if future.cancel():
                    del self._inflight[key]  # never runs, so never pops itself
                else:
                    self._stale_seq[key] += 1
            return len(self._inflight)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
