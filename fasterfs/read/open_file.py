"""OpenFile: one open file of the namespace, read by byte range through its Client (this host's
cache first, else a holder's MinIO), with a few chunks at hand and read-ahead shed while the
CPUs are contended (CpuPressure)."""
from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from ..core.errors import FasterFSError
from ..core.namespace import Entry
from .client import Client


class CpuPressure:
    """Whether this machine's CPUs are contended: the kernel's pressure stall figure (the share
    of the last 10 s in which some runnable task waited for a CPU, /proc/pressure/cpu), read at
    most once a second. Read-ahead is shed while it is above `limit` percent: on a busy machine
    loading chunks nobody asked for yet takes CPU from the reads that were asked for (WFS Ultra's
    load-adaptive prefetch); without PSI it is never shed."""

    def __init__(self, limit: float = 50.0, path: str = "/proc/pressure/cpu", clock=time.monotonic):
        self.limit, self.path, self.clock = limit, path, clock
        self._at, self._busy = -1.0, False

    def busy(self) -> bool:
        now = self.clock()
        if now - self._at >= 1.0:
            self._at = now
            try:
                with open(self.path) as f:
                    some = f.readline().split()  # some avg10=.. avg60=.. avg300=.. total=..
                self._busy = float(some[1].split("=")[1]) > self.limit
            except (OSError, IndexError, ValueError):
                self._busy = False
        return self._busy


class OpenFile:
    """One open file: reads byte ranges. A chunk found in this host's cache is read from its
    entry file by descriptor (checked, fresh and against the manifest's checksum, once, when the
    file first touches the chunk; an open file keeps the copy it started on); a chunk read from
    MinIO is read whole (one GET, counted by the kernel) and kept. A few chunks stay at hand for reads that jump about.

    Reading ahead: when the file's reads move on to the next chunk, the following
    `read_ahead` chunks are loaded on `pool`'s threads, so a sequential reader's next GET
    overlaps its copy of this one (requests of the mount's threads never wait on another
    chunk's GET: each chunk has its own future); not while the CPUs are contended (`pressure`).
    A small read elsewhere than where the last one ended (a random reader's) of a chunk neither
    at hand nor cached fetches only its range."""

    KEEP = 8  # chunks at hand per open file (descriptors or bytes); fetched bytes: read_ahead + 4
    RANGE_MAX = 32 * 1024  # a read this small, not where the last one ended, of a chunk neither
    # at hand nor cached here, fetches its range only (a random reader's; a sequential reader's
    # requests are larger and contiguous, and get the whole chunk)

    def __init__(self, entry: Entry, client: Client, read_ahead: int = 0, pool: ThreadPoolExecutor | None = None,
                 pressure: CpuPressure | None = None):
        self.entry, self.client = entry, client
        self.read_ahead = read_ahead if pool is not None else 0
        self._pool, self._pressure = pool, pressure
        self._lock = threading.Lock()
        self._at_hand: collections.OrderedDict[int, _Slot] = collections.OrderedDict()
        self._last = -1  # the chunk most recently moved on to
        self._next = 0   # where the last read ended

    def read(self, offset: int, length: int) -> bytes:
        """The bytes at [offset, offset+length)."""
        if offset < 0 or length < 0:
            raise FasterFSError(f"{self.entry.path}: bad range offset={offset} length={length}")
        buf = bytearray(max(0, min(length, self.entry.size - offset)))
        del buf[self.read_into(offset, memoryview(buf)):]
        return bytes(buf)

    def read_into(self, offset: int, buf: memoryview) -> int:
        """Fill `buf` with the bytes at `offset`; returns how many (fewer at the end of the file)."""
        if offset < 0:
            raise FasterFSError(f"{self.entry.path}: bad offset {offset}")
        random, self._next = offset != self._next and len(buf) <= self.RANGE_MAX, offset + len(buf)
        pos = 0
        for i, start, stop in self.entry.spans(offset, len(buf)):
            loaded = None
            if random and (part := self._range(i, start, stop)) is not None:
                if isinstance(part, bytes):
                    buf[pos:pos + len(part)] = part
                    pos += len(part)
                    continue
                loaded = part  # cached after all: its descriptor serves this read and the next
            slot = self._acquire(i, loaded)
            try:
                src = slot.future.result()
                if isinstance(src, tuple):  # (descriptor, where the chunk starts in that file)
                    got = os.preadv(src[0], [buf[pos:pos + stop - start]], src[1] + start)
                    if got != stop - start:
                        raise FasterFSError(f"{self.entry.path}: cache entry of chunk {self.entry.chunk_ids[i]} "
                                            "shorter than its header says")
                else:
                    buf[pos:pos + stop - start] = memoryview(src)[start:stop]
            finally:
                with self._lock:
                    slot.users -= 1
            pos += stop - start
        return pos

    def _range(self, i: int, start: int, stop: int) -> bytes | tuple | None:
        """Chunk i's bytes [start, stop) by a ranged GET if it is neither at hand nor cached here;
        None if at hand; if cached, what `_load` would have made of it (one look, not two)."""
        with self._lock:
            if i in self._at_hand:
                return None
        chunk = self.entry.chunk_ids[i]
        return self._cached(chunk) or self.client.read_range(chunk, start, stop)

    def _cached(self, chunk: int) -> tuple[int, int] | None:
        """The chunk's descriptor (a hit, counted) and where it starts in that file, if cached here
        and its bytes are the manifest's: these reads copy the bytes anyway, so they are checked
        (once per open file and chunk)."""
        got = self.client.open_cached(chunk, verify=True)
        if got is None:
            return None
        place = self.client.cache_place(chunk)
        return got[0], place.offset if place else 0

    def _acquire(self, i: int, loaded: tuple | None = None) -> _Slot:
        """Chunk i's slot, in use by the caller until it lowers `users` (a slot in use is never
        released); loaded by this thread if nobody has started it (`loaded`: already opened)."""
        with self._lock:
            slot = self._at_hand.get(i)
            mine = slot is None
            if slot is None:
                slot = self._at_hand[i] = _Slot()
            else:
                self._at_hand.move_to_end(i)
            slot.users += 1
            ahead = []
            # moving on in order: load the next ones
            if i == self._last + 1 and not (self._pressure and self._pressure.busy()):
                for j in range(i + 1, min(i + 1 + self.read_ahead, len(self.entry.chunk_ids))):
                    if j not in self._at_hand:
                        ahead.append((j, self._at_hand.setdefault(j, _Slot())))
            if i > self._last or mine:
                self._last = i
            self._trim()
        for j, later in ahead:
            assert self._pool is not None  # read_ahead is 0 without a pool: nothing is loaded ahead
            self._pool.submit(self._load, later, j)
        if mine and loaded is not None:
            slot.future.set_result(loaded)
        elif mine:
            self._load(slot, i)
        elif loaded is not None:
            os.close(loaded[0])  # another read got there first
        return slot

    def _load(self, slot: _Slot, i: int) -> None:
        """Cached here: a descriptor, checked once per open file; else the holder's MinIO,
        one GET (counted by the kernel). A failure is the reader's to see, once: the slot
        goes, so a later read tries again."""
        try:
            chunk = self.entry.chunk_ids[i]
            slot.future.set_result(self._cached(chunk) or self.client.read_chunk(chunk))
        except BaseException as e:
            slot.future.set_exception(e)
            with self._lock:
                if self._at_hand.get(i) is slot:
                    del self._at_hand[i]

    def _trim(self) -> None:
        """The least recently used slots not in use go: beyond KEEP, or fetched bytes beyond
        read_ahead + 4 (a slot still loading counts as bytes; the kernel's
        read-ahead of a sequential reader spans up to 3 chunks: fewer would fetch some twice)."""
        while True:
            idle = [k for k, s in self._at_hand.items() if s.users == 0]
            heavy = [k for k in idle if self._at_hand[k].heavy()]
            if len(self._at_hand) > self.KEEP and idle:
                victim = idle[0]
            elif sum(s.heavy() for s in self._at_hand.values()) > self.read_ahead + 4 and heavy:
                victim = heavy[0]
            else:
                return
            self._at_hand.pop(victim).future.add_done_callback(_release)

    def close(self) -> None:
        with self._lock:
            for slot in self._at_hand.values():
                slot.future.add_done_callback(_release)
            self._at_hand.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _Slot:
    """A chunk of an open file: a future of (descriptor, offset of the chunk in its file) or of
    its bytes, and how many reads use it."""
    __slots__ = ("future", "users")

    def __init__(self) -> None:
        self.future: Future = Future()
        self.users = 0

    def heavy(self) -> bool:
        """Holds (or is loading) a chunk's bytes in memory, rather than a descriptor."""
        f = self.future
        return not f.done() or (f.exception() is None and isinstance(f.result(), bytes))


def _release(future: Future) -> None:
    if future.exception() is None and isinstance(future.result(), tuple):
        os.close(future.result()[0])


