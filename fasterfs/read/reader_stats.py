"""Per-process read counters, shared through small memory-mapped files.

Cache hits happen inside readers' processes, which never call the StorageNode. Each
reader process keeps one file per node under that node's cache directory and bumps
plain counters in it (an mmap write, tens of nanoseconds); the node sums the files,
and folds in those of processes that have exited.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import uuid
from pathlib import Path

from ..core.fsutil import atomic_write

COUNTERS = ("hits", "misses", "bytes_from_cache", "bytes_from_minio", "damaged_dropped", "prefetch_requests")
# readers' own read latency (cache or MinIO, as the application sees it): log2 buckets of µs,
# slot s holding 2^(s-1) <= µs < 2^s (as the kernel's histogram), the last open-ended
LATENCY_SLOTS = 24
FIELDS = COUNTERS + tuple(f"latency_us_log2_{s}" for s in range(LATENCY_SLOTS))
_FMT = struct.Struct("<" + "Q" * len(FIELDS))
RETIRED = "retired.stats"
log = logging.getLogger(__name__)


class ReaderStats:
    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.stats"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # blocks taken now, where a full disk is an error: a store into a mapped hole that the
            # disk cannot back kills the process (SIGBUS), and a reader must outlive a full disk
            os.posix_fallocate(fd, 0, _FMT.size)
            self._mm = mmap.mmap(fd, _FMT.size)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._values = [0] * len(FIELDS)

    def add(self, field: int, n: int = 1) -> None:
        self._values[field] += n
        struct.pack_into("<Q", self._mm, 8 * field, self._values[field])

    def latency(self, seconds: float) -> None:
        self.add(len(COUNTERS) + min(int(seconds * 1e6).bit_length(), LATENCY_SLOTS - 1))


class Uncounted:
    def add(self, field: int, n: int = 1) -> None:
        pass

    def latency(self, seconds: float) -> None:
        pass


UNCOUNTED = Uncounted()  # reads of a process with no StorageNode on its host

_open: dict[tuple[int, Path], ReaderStats | Uncounted] = {}


def for_process(directory: Path) -> ReaderStats | Uncounted:
    """This process' counters in `directory`: one file per process, however many clients it
    opens (a new one if that was removed with its cluster); uncounted (said in the log) when
    the directory's disk cannot take the file."""
    key = (os.getpid(), directory)  # a forked child counts in a file of its own
    held = _open.get(key)
    if not isinstance(held, ReaderStats) or not held.path.exists():  # a full disk is tried again
        try:
            _open[key] = ReaderStats(directory)
        except OSError as e:
            log.warning("reads of this process go uncounted: no counters file in %s (%s)", directory, e.strerror)
            _open[key] = UNCOUNTED
    return _open[key]


HITS, MISSES, BYTES_CACHE, BYTES_MINIO, DAMAGED_ENTRIES, PREFETCH = range(len(COUNTERS))  # indices of COUNTERS


def _read(path: Path) -> list[int]:
    try:
        raw = path.read_bytes()
    except OSError:
        return [0] * len(FIELDS)
    return list(_FMT.unpack(raw)) if len(raw) == _FMT.size else [0] * len(FIELDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def collect(directory: Path) -> dict[str, int]:
    """Totals over every reader, past and present. Only the node's owner calls this: it
    folds the files of exited processes into one retired total."""
    totals = _read(directory / RETIRED) if (directory / RETIRED).exists() else [0] * len(FIELDS)
    retired = list(totals)
    if directory.exists():
        for f in directory.glob("*-*.stats"):
            values = _read(f)
            totals = [a + b for a, b in zip(totals, values)]
            if not _alive(int(f.name.split("-")[0])):
                retired = [a + b for a, b in zip(retired, values)]
                atomic_write(directory / RETIRED, _FMT.pack(*retired))
                f.unlink(missing_ok=True)
    return dict(zip(FIELDS, totals))


def reset(directory: Path) -> None:
    (directory / RETIRED).unlink(missing_ok=True)
