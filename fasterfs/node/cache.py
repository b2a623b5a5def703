"""The node-local chunk cache, owner's side: one directory per node, bounded in bytes. Only the
node's StorageNode writes, evicts and accounts (capacity is counted in one place); the entry
format and the readers' lookups are fasterfs.read.cache_entry.

Eviction is S3-FIFO (Yang et al., SOSP '23), so that a scan does not push out what is re-read:
its queues are fasterfs.node.cache_queues; the entry files' writing is fasterfs.node.cache_files,
the scrub fasterfs.node.cache_scrub, what peers see of the cache fasterfs.node.cache_readable.
Removals name their entries: a write of a key not cached costs a dict lookup.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import xxhash

from ..core.config import CACHE_POLICIES
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write
from ..read.cache_entry import BOOT, Header, Place, entry_name, entry_path, fetched_ns, read_entry, remove_file
from .cache_files import check_xattrs, etags_of, write_entry, write_slot
from .cache_queues import EvictionQueues
from .cache_readable import ReadableEntries
from .cache_recovery import scan
from .cache_scrub import CacheScrub
from .change_log import ChangeLog

log = logging.getLogger("fasterfs.node.cache")

CLEAN = ".clean-shutdown"  # written by close(): without it, rebuild verifies every entry


def kept_capacity(path: Path, restarted: bool, configured: int) -> int:
    """The capacity a node's cache starts with: the configured one; after a crash, the one set at
    run time (`keep_capacity`) if any, so a restarted node does not grow its cache back behind the
    operator's back. A new start forgets the run-time one."""
    if not restarted:
        path.unlink(missing_ok=True)
    elif path.exists():
        try:
            return int(path.read_text())
        except (OSError, ValueError) as e:  # torn or edited by hand: the configured capacity, said so
            log.warning("cache capacity file %s is unreadable (%s): using the configured %d bytes", path, e,
                        configured)
    return configured


def keep_capacity(path: Path, capacity: int) -> None:
    atomic_write(path, str(int(capacity)).encode())


class ChunkCache(ReadableEntries):
    """The owner's side: fills, eviction, capacity. Never exceeds `capacity` bytes on disk.
    Entries are named per chunk (entry_name of its key); a file entry is one unit of several."""

    def __init__(self, directory: Path, capacity: int, on_evict: Callable[[str], None] | None = None,
                 policy: str = "s3fifo"):
        # on_evict(entry name): lets the owner reset the kernel's count for the key
        if policy not in CACHE_POLICIES:
            raise FasterFSError(f"option cache.policy={policy!r}: one of {', '.join(CACHE_POLICIES)}")
        self.dir, self.capacity, self.on_evict, self.policy = Path(directory), capacity, on_evict, policy
        self.dir.mkdir(parents=True, exist_ok=True)
        check_xattrs(self.dir)
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}   # entry name -> bytes on disk (or reserved for a fill)
        self._places: dict[str, Place] = {}  # entry name -> its place, for chunks in file entries
        self._units: dict[str, set[str]] = {}  # file entry -> the names of its chunks
        self._layout: Mapping[str, Place] = {}  # key -> place, for the keys set_places names
        self._unit_locks = [threading.Lock() for _ in range(16)]  # one writer per file entry at a time
        self._writing: set[str] = set()    # fills under way: never evicted, cancelled instead
        self._cancelled: set[str] = set()  # removed while being written: deleted when the write ends
        self.changes = ChangeLog()  # what became readable or went, for peers told in deltas
        self.used = 0
        self.counters = {"fills": 0, "fill_bytes": 0, "evictions": 0, "evicted_bytes": 0, "removed": 0,
                         "too_large": 0, "rebuilt_entries": 0, "stray_temp_removed": 0, "invalid_removed": 0,
                         "scrubs": 0, "scrub_bytes": 0, "scrub_dropped": 0, "no_room": 0,
                         "promoted": 0, "ghost_hits": 0,
                         "foreign_files": 0, "changed_at_source": 0}
        self._queues = EvictionQueues(policy, self.counters, self._mtime, self._busy)  # by unit
        self._scrub = CacheScrub(self._lock, self._scrub_order, self._scrub_entry, self._drop, self.counters)
        self.rebuild()

    def set_places(self, layout: Mapping[str, Place]) -> None:
        """Which keys are chunks of files of several chunks, and where (from `places`; kept as
        given, so not changed by the caller afterwards: the NodeIndex's is immutable)."""
        with self._lock:
            self._layout = layout

    def path(self, key: str) -> Path:
        return entry_path(self.dir, key, self._layout.get(key))

    def fetched_ns(self, key: str) -> int | None:
        """When the key's cached bytes were fetched (cache_entry.fetched_ns)."""
        place = self._layout.get(key)
        return fetched_ns(entry_path(self.dir, key, place), place)

    def read(self, key: str, verify: bool = True) -> bytes | str | None:
        """The key's cached bytes, as read_entry gives them (not touched: the owner is no reader)."""
        place = self._layout.get(key)
        return read_entry(entry_path(self.dir, key, place), verify, touch=False, place=place)

    def _file(self, name: str) -> Path:
        place = self._places.get(name)
        return place.paths(self.dir)[0] if place else self.dir / name

    def _unit(self, name: str) -> str:
        place = self._places.get(name)
        return place.unit if place else name

    def rebuild(self) -> None:
        """Index what is on disk (fasterfs.node.cache_recovery): keep valid entries of this boot,
        remove temp files and the rest. After an unclean stop (no CLEAN marker) every entry's
        checksum is verified: a crash must not leave a damaged entry to be served."""
        clean = self.dir / CLEAN
        verify = not clean.exists()
        clean.unlink(missing_ok=True)
        with self._lock:
            found = scan(self.dir, verify)
            self._sizes, self._places, self._units = {}, found.places, found.units
            self._queues.clear()
            self.used = 0
            for name, size in found.sizes.items():
                self._sizes[name] = size
                self._account(name, size)
            self._queues.sort_main()
            for counter, n in found.counts.items():
                self.counters[counter] += n
            self._evict_to(self.capacity)

    def resize(self, capacity: int) -> None:
        """Change the capacity; shrinking evicts at once."""
        with self._lock:
            self.capacity = capacity
            self._evict_to(capacity)

    def scrub(self, budget_bytes: int | None = None) -> int:
        """Verify entries' checksums and drop the damaged ones; returns how many were dropped
        (fasterfs.node.cache_scrub: with a budget, in rounds, what readers keep first)."""
        return self._scrub.scrub(budget_bytes)

    def _scrub_order(self) -> list[str]:
        return [n for unit in self._queues.kept_first() for n in self._units.get(unit, (unit,))]

    def _scrub_entry(self, name: str) -> tuple[Path, Place | None, int] | None:
        if name not in self._sizes or name in self._writing:
            return None
        return self._file(name), self._places.get(name), self._sizes[name]

    def contains(self, key: str) -> bool:
        name = entry_name(key)
        with self._lock:
            if name in self._writing:  # a fill under way holds its reservation: not cached yet
                return False
            if name in self._sizes and self._file(name).exists():
                return True
            if name in self._sizes:  # a reader dropped it as damaged
                for n in self._members(name):
                    self._forget(n)
            return False

    def _logged(self, name: str, readable: bool) -> None:
        self.changes.record(name, readable)

    def put(self, key: str, data: bytes, etag: str = "", fetched_ns: int | None = None) -> bool:
        """Store an entry atomically, evicting the least recently used to make room.
        `fetched_ns` is when the GET for `data` began (time.monotonic_ns())."""
        need = len(data)
        if need > self.capacity:
            self.counters["too_large"] += 1
            return False
        name = entry_name(key)
        header = Header(len(data), xxhash.xxh3_64_intdigest(data), etag,
                        time.monotonic_ns() if fetched_ns is None else fetched_ns, BOOT).pack()
        with self._lock:
            place = self._layout.get(key)
            if place is not None and place.size != need:
                raise FasterFSError(f"chunk {key}: {need} bytes, its manifest says {place.size}")
            if name in self._writing:
                return False  # another fill of the same key is under way
            self._forget(name)  # a refill: the rest of its file entry stays
            self._evict_to(self.capacity - need, keep=place.unit if place else None)
            if self.used + need > self.capacity:  # the rest is being written: no room now
                self.counters["no_room"] += 1
                return False
            self._sizes[name] = need  # reserved before the write, so concurrent fills cannot overshoot
            if place is not None:
                self._places[name] = place
                self._units.setdefault(place.unit, set()).add(name)
            self._account(name, need, fill=True)
            self._writing.add(name)
        try:
            if place is None:
                write_entry(self.dir, name, data, header)
            else:
                write_slot(self.dir, name, place, data, header,
                           self._unit_locks[hash(place.unit) % len(self._unit_locks)])
        except BaseException:
            with self._lock:
                self._writing.discard(name)
                self._cancelled.discard(name)
                self._forget(name)
            raise
        with self._lock:
            self._writing.discard(name)
            if name in self._cancelled:  # removed (stale, cleared) while we wrote: only now is the room free
                self._cancelled.discard(name)
                remove_file(self._file(name))
                self._forget(name)
                return False
            self._looked(self._unit(name))  # a read from now on is one since the fill
            self._logged(name, True)
        self.counters["fills"] += 1
        self.counters["fill_bytes"] += len(data)
        return True

    def close(self) -> None:
        """A clean stop: the next rebuild may trust sizes instead of verifying every entry."""
        with self._lock:
            if not self._writing:
                (self.dir / CLEAN).touch()

    def etags(self, only: Iterable[str] | None = None) -> dict[str, str]:
        """Entry name -> the ETag of the object it was filled from, for every entry on disk (or
        those of `only` that are)."""
        with self._lock:
            wanted = self._sizes if only is None else [n for n in only if n in self._sizes]
            names = [(n, self._file(n), self._places.get(n)) for n in wanted if n not in self._writing]
        return etags_of(names)

    def drop_changed(self, names) -> int:
        """Drop entries whose object has changed at its source since they were filled."""
        dropped = self._drop(names)
        self.counters["changed_at_source"] += dropped
        return dropped

    def retain(self, keys) -> int:
        """Drop every entry whose key is not in `keys` (at a start: what no current manifest names)."""
        keep = {entry_name(k) for k in keys}
        with self._lock:
            doomed = [n for n in self._sizes if n not in keep]
        return self._drop(doomed)

    def forget(self, keys: list[str]) -> int:
        """Drop the entries of these keys (a replaced generation's chunks): what they cost, not the cache."""
        return self._drop([entry_name(k) for k in keys])

    def remove(self, key: str) -> bool:
        return self._drop([entry_name(key)]) > 0

    def clear(self) -> int:
        with self._lock:
            everything = list(self._sizes)
        return self._drop(everything)

    def _drop(self, doomed: Iterable[str]) -> int:
        """Remove these entries (names not cached are ignored, at the cost of a lookup), with every
        chunk of their file entries (those go as evicted ones do: on_evict). A fill under way is
        cancelled but keeps its reservation until its write ends: its bytes are on disk until then."""
        with self._lock:
            doomed = {n for n in doomed if n in self._sizes}
            names = sorted({m for n in doomed for m in self._members(n)})
            paths = {self._file(n) for n in names}
            for name in names:
                if name in self._writing:
                    self._cancelled.add(name)
                else:
                    self._forget(name)
        for path in paths:
            remove_file(path)
        for name in names:  # chunks that went with their file entry may become hot again
            if name not in doomed and self.on_evict:
                self.on_evict(name)
        self.counters["removed"] += len(names)
        return len(names)

    # -- the queues ----------------------------------------------------------------------------

    def _account(self, name: str, size: int, fill: bool = False) -> None:
        """Entry `name` takes `size` bytes (on disk, or reserved by a fill): counted, and its unit
        queued if new to the cache (EvictionQueues.add)."""
        self.used += size
        self._queues.add(self._unit(name), size, fill)

    def _forget(self, name: str) -> bool:
        size = self._sizes.pop(name, None)
        if size is not None and name not in self._writing:  # a fill's reservation was never readable
            self._logged(name, False)
        unit = self._unit(name)
        if size is not None:
            self.used -= size
            self._queues.take(unit, size)
        place = self._places.pop(name, None)
        if place is not None:
            members = self._units.get(place.unit, set())
            members.discard(name)
            if not members:
                self._units.pop(place.unit, None)
        if unit not in self._units and unit in self._queues and (place is not None or size is not None):
            self._queues.drop(unit)  # the unit's last entry: out of the queues
        return size is not None

    def _members(self, name: str) -> list[str]:
        """The names that go with `name`: its file entry's chunks, or itself."""
        place = self._places.get(name)
        return list(self._units.get(place.unit, ())) if place else [name]

    def _unit_file(self, unit: str) -> Path:
        members = self._units.get(unit)
        return self._file(next(iter(members))) if members else self.dir / unit

    def _mtime(self, unit: str) -> int:
        """The unit's file's mtime (readers touch it on a hit); -1 if gone (a reader dropped it)."""
        try:
            return os.stat(self._unit_file(unit)).st_mtime_ns
        except FileNotFoundError:
            return -1

    def _looked(self, unit: str) -> None:
        self._queues.looked(unit)

    def _busy(self, unit: str) -> bool:
        return any(n in self._writing for n in self._units.get(unit, (unit,)))

    def _evict_to(self, limit: int, keep: str | None = None) -> None:
        """Evict until used <= limit (S3-FIFO: EvictionQueues.victims); a file entry goes whole,
        and none being written. `keep`: the file entry being filled."""
        if self.used <= limit:
            return
        for unit in self._queues.victims(self.capacity, keep):
            self._evict(unit)
            if self.used <= limit:
                return

    def _evict(self, unit: str) -> None:
        path = self._unit_file(unit)
        for victim in list(self._units.get(unit, (unit,))):
            size = self._sizes.get(victim, 0)
            self._forget(victim)
            self.counters["evictions"] += 1
            self.counters["evicted_bytes"] += size
            if self.on_evict:
                self.on_evict(victim)
        remove_file(path)

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._sizes), "bytes": self.used, "capacity": self.capacity, **self.counters}
