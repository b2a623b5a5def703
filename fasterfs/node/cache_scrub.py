"""A node cache's scrub (ChunkCache.scrub): entries' checksums verified, the damaged ones dropped,
in budgeted rounds that go on where the last stopped."""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ..read.cache_entry import DAMAGED, STALE, Place, read_entry

# What verifying an entry costs beyond its bytes (an open, its header, its inode: ~60 us of CPU
# and several disk reads each, measured on 200,000 entries of 512 B), counted against the scrub's
# budget as this many bytes, so a cache of many small entries stays within its share too.
SCRUB_ENTRY_MIN = 128 << 10


class CacheScrub:
    """The scrub of one cache, through its owner: `order()` (under `lock`): every entry, what
    readers keep first; `entry(name)` (under `lock`): its file, place and size, or None when it
    is gone or being written; `drop(names)`: remove them. Counts into the cache's `counters`."""

    def __init__(self, lock: threading.Lock, order: Callable[[], list[str]],
                 entry: Callable[[str], tuple[Path, Place | None, int] | None],
                 drop: Callable[[list[str]], int], counters: dict[str, int]):
        self._lock, self._order, self._entry, self._drop, self.counters = lock, order, entry, drop, counters
        self._todo: list[str] = []  # entries the budgeted scrub has still to verify, last first

    def scrub(self, budget_bytes: int | None = None) -> int:
        """Verify entries' checksums and drop the damaged ones; returns how many were dropped.
        With a budget, a round verifies about that many bytes (an entry smaller than
        SCRUB_ENTRY_MIN counted as that much) and the next goes on where it stopped, what readers
        keep (the main queue) first; without, every entry now."""
        with self._lock:
            if budget_bytes is None or not self._todo:
                self._todo = self._order()  # popped from the end
            todo = self._todo if budget_bytes is not None else self._todo[:]
            if budget_bytes is None:
                self._todo = []
        dropped, spent, charged = 0, 0, 0
        while todo and (budget_bytes is None or charged < budget_bytes):
            name = todo.pop()
            with self._lock:
                found = self._entry(name)
            if found is None:
                continue
            path, place, size = found
            spent += size
            charged += max(size, SCRUB_ENTRY_MIN)
            if read_entry(path, verify=True, touch=False, place=place) in (DAMAGED, STALE):
                self._drop([name])
                dropped += 1
        self.counters["scrubs"] += 1
        self.counters["scrub_bytes"] += spent
        self.counters["scrub_dropped"] += dropped
        return dropped
