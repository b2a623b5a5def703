"""A node cache's eviction queues (fasterfs.node.cache's ChunkCache holds one, under its lock).

Eviction is S3-FIFO (Yang et al., SOSP '23), so that a scan does not push out what is re-read:
a new entry waits in a small probationary queue (a tenth of the capacity); leaving it, an entry
read since its fill moves to the main queue, one that was not goes, its name kept a while in a
ghost queue (filled again soon, it goes straight to main). Main is a CLOCK: an entry read since
it was last looked at goes round again. Reads happen in other processes and in the kernel
(passthrough), which touch the entry's mtime (at most once a second): the owner looks at one
entry's mtime only when that entry reaches a queue's head, so each operation costs O(1) amortised
whatever the cache holds (`cache.policy=lru`: one CLOCK queue, plain LRU's approximation, for
comparison).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

SMALL_SHARE = 0.1  # of the capacity: S3-FIFO's probationary queue


class EvictionQueues:
    """The queues, by unit (an entry, or a file entry whole): unit -> its file's mtime when last
    looked at; a later mtime means a reader touched it since. `mtime(unit)`: the unit's file's
    mtime now (-1 if gone); `busy(unit)`: whether a fill of it is under way (never evicted);
    `counters`: the cache's, where promotions and ghost hits are counted."""

    def __init__(self, policy: str, counters: dict[str, int], mtime: Callable[[str], int],
                 busy: Callable[[str], bool]):
        self.policy, self.counters, self._mtime, self._busy = policy, counters, mtime, busy
        self._small: OrderedDict[str, int] = OrderedDict()
        self._main: OrderedDict[str, int] = OrderedDict()
        self._ghost: OrderedDict[str, None] = OrderedDict()  # units evicted from small unread
        self._unit_bytes: dict[str, int] = {}
        self._small_bytes = 0

    def __contains__(self, unit: str) -> bool:
        return unit in self._unit_bytes

    def clear(self) -> None:
        """Empty the queues (not the ghost: names a rebuild finds again are not new)."""
        self._small.clear()
        self._main.clear()
        self._unit_bytes.clear()
        self._small_bytes = 0

    def sort_main(self) -> None:
        """What was read last goes last: sorted once, at the start."""
        for unit in sorted(self._main, key=self._main.__getitem__):
            self._main.move_to_end(unit)

    def kept_first(self) -> list[str]:
        """Every queued unit, what readers keep (main) first, the newest of each queue first."""
        return [*reversed(self._main), *reversed(self._small)]

    def add(self, unit: str, size: int, fill: bool = False) -> None:
        """`unit` takes `size` more bytes; queued if new to the cache: a fill's in the small queue
        (or main, its name a ghost's), what a rebuild finds in main."""
        if unit not in self._unit_bytes:
            self._unit_bytes[unit] = 0
            if unit in self._ghost:
                del self._ghost[unit]
                self.counters["ghost_hits"] += 1
                self._main[unit] = -1
            elif fill and self.policy == "s3fifo":
                self._small[unit] = -1
            else:
                self._main[unit] = -1 if fill else self._mtime(unit)
        self._unit_bytes[unit] += size
        if unit in self._small:
            self._small_bytes += size

    def take(self, unit: str, size: int) -> None:
        """`unit` holds `size` bytes fewer."""
        self._unit_bytes[unit] -= size
        if unit in self._small:
            self._small_bytes -= size

    def drop(self, unit: str) -> None:
        """The unit's last entry went: out of the queues."""
        del self._unit_bytes[unit]
        self._small.pop(unit, None)
        self._main.pop(unit, None)

    def looked(self, unit: str) -> None:
        for q in (self._small, self._main):
            if unit in q:
                q[unit] = self._mtime(unit)

    def victims(self, capacity: int, keep: str | None = None) -> Iterator[str]:
        """The units to evict, in S3-FIFO's order (above), for as long as the caller takes them;
        a unit being written never, nor `keep` (the file entry being filled). The caller evicts
        each before taking the next (its removal takes it out of the queues). Each unit looked at
        is read once (its mtime) and either goes or moves on: a unit read since it was last looked
        at is looked at again only after every other."""
        turns = 2 * (len(self._small) + len(self._main)) + 2  # enough to see every unit twice
        while turns > 0:
            turns -= 1
            from_small = bool(self._small) and (not self._main or self._small_bytes > capacity * SMALL_SHARE)
            q = self._small if from_small else self._main
            if not q:
                return
            unit, seen = q.popitem(last=False)
            if unit == keep or self._busy(unit):
                q[unit] = seen  # another turn
                continue
            now = self._mtime(unit)
            if now > seen and now != -1 and seen != -1:  # read since it was last looked at
                if from_small:
                    self._small_bytes -= self._unit_bytes[unit]
                    self.counters["promoted"] += 1
                self._main[unit] = now
                continue
            q[unit] = seen  # back in place for the caller's removal to take out
            if from_small:  # remembered before it goes (its going changes neither ghost nor main)
                self._ghost[unit] = None
                while len(self._ghost) > max(1000, len(self._main)):
                    self._ghost.popitem(last=False)
            yield unit
