"""The kernel's record of writes (the `stale_keys` map): when each key was last written, as the TC
program saw MinIO accept it or another host's kernel told, and the suspect mark (the bucket's own
key) for writes no one can name. Pinned in the host's bpffs, where every reader looks its key up
before serving a cached copy (fasterfs.bpf.pinned)."""
from __future__ import annotations

import contextlib
import ctypes as ct
import os
import threading
import time

from . import events as ev


class WriteMarks:
    def __init__(self, bpf, suspect_key: int):
        self.table, self.counters = bpf[b"stale_keys"], bpf[b"counters"]
        # The suspect key is in the map from the start, so marking it succeeds however full it is.
        self.suspect_key = suspect_key
        self.table[ct.c_uint64(suspect_key)] = ct.c_uint64(0)
        self._suspected = 0  # suspect marks made from user space (mark_suspect)
        self._lock = threading.Lock()
        self.pinned: str | None = None

    def mark_stale(self, key: int) -> None:
        """Record a write of `key` seen by another host's kernel, as if this one had seen it
        (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns and of cache fills). A full map marks the
        suspect key instead, as the kernel does."""
        try:
            self.table[ct.c_uint64(key)] = ct.c_uint64(time.monotonic_ns())
        except Exception:  # E2BIG: full
            self.mark_suspect()

    def mark_suspect(self) -> None:
        """Every entry fetched before now is suspect until `clear_suspect` (a write this host
        cannot name: a peer's multi-object delete or lost event)."""
        with self._lock:
            self._suspected += 1
            self.table[ct.c_uint64(self.suspect_key)] = ct.c_uint64(time.monotonic_ns())

    def suspect_mark(self) -> int:
        return self.table[ct.c_uint64(self.suspect_key)].value

    def suspect_seq(self) -> int:
        """Moves before every suspect mark, the kernel's and user space's alike."""
        return self.counters[ct.c_int(ev.COUNTERS.index("suspect_marks"))].value + self._suspected

    def clear_suspect(self, seq: int) -> bool:
        """Entries were checked after `seq` was read: clear the suspect mark, unless a new one was
        made since (then it is put back, for another check). Returns whether it is clear."""
        self.table[ct.c_uint64(self.suspect_key)] = ct.c_uint64(0)
        if self.suspect_seq() == seq:
            return True
        self.table[ct.c_uint64(self.suspect_key)] = ct.c_uint64(time.monotonic_ns())
        return False

    def sweep_marks(self, older_than_ns: int) -> int:
        """Remove marks made before `older_than_ns` (CLOCK_MONOTONIC): acted on, or covered by a
        suspect mark and its check. Batched: a full map of 65,536 is two system calls each way.
        Returns how many went."""
        old = [k for k, v in self.table.items_lookup_batch()
               if k != self.suspect_key and 0 < v < older_than_ns]
        if old:
            self.table.items_delete_batch((self.table.Key * len(old))(*old))
        return len(old)

    def marks_held(self) -> int:
        return sum(1 for _ in self.table.items_lookup_batch())

    def pin_stale_marks(self, path: str) -> None:
        """Let readers in any process see the marks (fasterfs.bpf.pinned)."""
        from .pinned import pin

        pin(self.table.map_fd, path)
        self.pinned = path

    def unpin(self) -> None:
        if self.pinned:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pinned)
            self.pinned = None


class NoWriteMarks:
    """The simulated kernel's: no map, so nothing is pinned; the STALE callback alone drops an
    entry, and a peer's bucket-wide write is checked entry by entry all the same."""
    pinned = None

    def mark_stale(self, key: int) -> None:
        pass

    def mark_suspect(self) -> None:
        pass

    def suspect_mark(self) -> int:
        return 0

    def suspect_seq(self) -> int:
        return 0

    def clear_suspect(self, seq: int) -> bool:
        return True

    def sweep_marks(self, older_than_ns: int) -> int:
        return 0

    def marks_held(self) -> int:
        return 0

    def pin_stale_marks(self, path: str) -> None:
        pass

    def unpin(self) -> None:
        pass
