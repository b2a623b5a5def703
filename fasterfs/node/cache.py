"""The node-local chunk cache, owner's side: one directory per node, bounded in bytes. Only the
node's StorageNode writes, evicts and accounts (capacity is counted in one place); the entry
format and the readers' lookups are fasterfs.read.cache_entry.

Eviction is S3-FIFO (Yang et al., SOSP '23), so that a scan does not push out what is re-read:
a new entry waits in a small probationary queue (a tenth of the capacity); leaving it, an entry
read since its fill moves to the main queue, one that was not goes, its name kept a while in a
ghost queue (filled again soon, it goes straight to main). Main is a CLOCK: an entry read since
it was last looked at goes round again. Reads happen in other processes and in the kernel
(passthrough), which touch the entry's mtime (at most once a second): the owner looks at one
entry's mtime only when that entry reaches a queue's head, so each operation costs O(1) amortised
whatever the cache holds (`cache.policy=lru`: one CLOCK queue, plain LRU's approximation, for
comparison). Removals name their entries: a write of a key not cached costs a dict lookup.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import xxhash

from ..core.config import CACHE_POLICIES
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write
from ..read.cache_entry import (
    BOOT,
    DAMAGED,
    HEADER,
    SLOT,
    STALE,
    SUFFIX,
    TMP_PREFIX,
    XATTR,
    Header,
    Place,
    entry_name,
    entry_path,
    fetched_ns,
    read_entry,
    read_slot,
    remove_file,
)
from .cache_recovery import scan
from .change_log import ChangeLog

log = logging.getLogger("fasterfs.node.cache")

CLEAN = ".clean-shutdown"  # written by close(): without it, rebuild verifies every entry
SMALL_SHARE = 0.1  # of the capacity: S3-FIFO's probationary queue
# What verifying an entry costs beyond its bytes (an open, its header, its inode: ~60 us of CPU
# and several disk reads each, measured on 200,000 entries of 512 B), counted against the scrub's
# budget as this many bytes, so a cache of many small entries stays within its share too.
SCRUB_ENTRY_MIN = 128 << 10

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


def _name_bytes(name: str) -> bytes:
    return bytes.fromhex(name.removesuffix(SUFFIX))


class ChunkCache:
    """The owner's side: fills, eviction, capacity. Never exceeds `capacity` bytes on disk.
    Entries are named per chunk (entry_name of its key); a file entry is one unit of several."""

    def __init__(self, directory: Path, capacity: int, on_evict: Callable[[str], None] | None = None,
                 policy: str = "s3fifo"):
        # on_evict(entry name): lets the owner reset the kernel's count for the key
        if policy not in CACHE_POLICIES:
            raise FasterFSError(f"option cache.policy={policy!r}: one of {', '.join(CACHE_POLICIES)}")
        self.dir, self.capacity, self.on_evict, self.policy = Path(directory), capacity, on_evict, policy
        self.dir.mkdir(parents=True, exist_ok=True)
        self._check_xattrs()
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}   # entry name -> bytes on disk (or reserved for a fill)
        self._places: dict[str, Place] = {}  # entry name -> its place, for chunks in file entries
        self._units: dict[str, set[str]] = {}  # file entry -> the names of its chunks
        self._layout: Mapping[str, Place] = {}  # key -> place, for the keys set_places names
        self._unit_locks = [threading.Lock() for _ in range(16)]  # one writer per file entry at a time
        self._writing: set[str] = set()    # fills under way: never evicted, cancelled instead
        self._cancelled: set[str] = set()  # removed while being written: deleted when the write ends
        # the eviction queues, by unit (an entry, or a file entry whole): unit -> its file's mtime
        # when last looked at; a later mtime means a reader touched it since
        self._small: OrderedDict[str, int] = OrderedDict()
        self._main: OrderedDict[str, int] = OrderedDict()
        self._ghost: OrderedDict[str, None] = OrderedDict()  # units evicted from small unread
        self._unit_bytes: dict[str, int] = {}
        self._small_bytes = 0
        self._scrub_todo: list[str] = []  # entries the budgeted scrub has still to verify, last first
        self.changes = ChangeLog()  # what became readable or went, for peers told in deltas
        self.used = 0
        self.counters = {"fills": 0, "fill_bytes": 0, "evictions": 0, "evicted_bytes": 0, "removed": 0,
                         "too_large": 0, "rebuilt_entries": 0, "stray_temp_removed": 0, "invalid_removed": 0,
                         "scrubs": 0, "scrub_bytes": 0, "scrub_dropped": 0, "no_room": 0,
                         "promoted": 0, "ghost_hits": 0,
                         "foreign_files": 0, "changed_at_source": 0}
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

    def _check_xattrs(self) -> None:
        """Entries keep their headers in an extended attribute: a file system that cannot
        (some network file systems) is named now, not at the first fill."""
        probe = self.dir / f"{TMP_PREFIX}probe.{os.getpid()}"
        try:
            with open(probe, "wb") as f:
                os.setxattr(f.fileno(), XATTR, bytes(HEADER.size))
        except OSError as e:
            raise FasterFSError(f"cache directory {self.dir}: its file system does not keep user extended "
                                f"attributes ({e.strerror}); put cluster.root on ext4, xfs, btrfs or tmpfs") from None
        finally:
            probe.unlink(missing_ok=True)

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
            self._small.clear()
            self._main.clear()
            self._unit_bytes.clear()
            self._small_bytes = self.used = 0
            for name, size in found.sizes.items():
                self._sizes[name] = size
                self._account(name, size)
            # what was read last goes last: sorted once, at the start
            for unit in sorted(self._main, key=self._main.__getitem__):
                self._main.move_to_end(unit)
            for counter, n in found.counts.items():
                self.counters[counter] += n
            self._evict_to(self.capacity)

    def resize(self, capacity: int) -> None:
        """Change the capacity; shrinking evicts at once."""
        with self._lock:
            self.capacity = capacity
            self._evict_to(capacity)

    def scrub(self, budget_bytes: int | None = None) -> int:
        """Verify entries' checksums and drop the damaged ones; returns how many were dropped.
        With a budget, a round verifies about that many bytes (an entry smaller than
        SCRUB_ENTRY_MIN counted as that much) and the next goes on where it stopped, what readers
        keep (the main queue) first; without, every entry now."""
        with self._lock:
            if budget_bytes is None or not self._scrub_todo:
                self._scrub_todo = [n for unit in (*reversed(self._main), *reversed(self._small))
                                    for n in self._units.get(unit, (unit,))]  # popped from the end
            todo = self._scrub_todo if budget_bytes is not None else self._scrub_todo[:]
            if budget_bytes is None:
                self._scrub_todo = []
        dropped, spent, charged = 0, 0, 0
        while todo and (budget_bytes is None or charged < budget_bytes):
            name = todo.pop()
            with self._lock:
                if name not in self._sizes or name in self._writing:
                    continue
                path, place, size = self._file(name), self._places.get(name), self._sizes[name]
            spent += size
            charged += max(size, SCRUB_ENTRY_MIN)
            if read_entry(path, verify=True, touch=False, place=place) in (DAMAGED, STALE):
                self._drop([name])
                dropped += 1
        self.counters["scrubs"] += 1
        self.counters["scrub_bytes"] += spent
        self.counters["scrub_dropped"] += dropped
        return dropped

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

    @property
    def epoch(self) -> str:
        return self.changes.epoch

    def snapshot(self) -> tuple[int, frozenset[str]]:
        """The version and the entries readable at it."""
        with self._lock:
            return self.changes.version, self._readable()

    def _readable(self) -> frozenset[str]:
        return frozenset(n for n in self._sizes if n not in self._writing)

    def changes_since(self, version: int) -> tuple[int, list[str], list[str]] | None:
        """(version now, entries readable since `version`, entries gone since), or None when the
        log no longer reaches back that far: take a `snapshot`."""
        with self._lock:
            return self.changes.since(version)

    def holds(self, name: str) -> bool:
        """Whether entry `name` is readable now (not being written); O(1)."""
        with self._lock:
            return name in self._sizes and name not in self._writing

    def names(self) -> frozenset[str]:
        """The entries readable now (not those being written)."""
        with self._lock:
            return self._readable()

    def newest(self, limit: int) -> list[str]:
        """At most `limit` readable entries, the latest admitted first (a cost of `limit`, not
        of the cache)."""
        with self._lock:
            return list(itertools.islice((n for n in reversed(self._sizes) if n not in self._writing), limit))

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
                self._write_entry(name, data, header)
            else:
                self._write_slot(name, place, data, header)
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

    def _write_entry(self, name: str, data: bytes, header: bytes) -> None:
        tmp = self.dir / f"{TMP_PREFIX}{name}.{os.getpid()}.{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.setxattr(f.fileno(), XATTR, header)
            # whole before visible; not fsynced: a process that dies leaves the page cache whole,
            # and after the machine's own crash every entry is of an earlier boot, dropped
            os.replace(tmp, self.dir / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _write_slot(self, name: str, place: Place, data: bytes, header: bytes) -> None:
        """The chunk's bytes at its offset in the file entry, written before its slot says so.
        A new file entry is made whole-sized under a temporary name and renamed into place after
        any old index is gone, so no slot ever describes another file's bytes."""
        path, index = place.paths(self.dir)
        with self._unit_locks[hash(place.unit) % len(self._unit_locks)]:
            fd: int | None
            try:
                fd = os.open(path, os.O_RDWR)
                if os.fstat(fd).st_size != place.file_size:  # a leftover of another shape
                    os.close(fd)
                    fd = None
            except FileNotFoundError:
                fd = None
            if fd is None:
                index.unlink(missing_ok=True)
                tmp = self.dir / f"{TMP_PREFIX}{place.unit}.{os.getpid()}.{threading.get_ident()}"
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(fd, place.file_size)  # sparse: only filled chunks take room
                os.replace(tmp, path)
            try:
                os.pwrite(fd, data, place.offset)
            finally:
                os.close(fd)
            fd = os.open(index, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, SLOT.pack(header, place.offset, _name_bytes(name)), place.index * SLOT.size)
            finally:
                os.close(fd)

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
        out = {}
        for name, path, place in names:
            try:
                if place is not None:
                    header = (read_slot(path, place) or (None, b""))[0]
                else:
                    with open(path, "rb") as fh:
                        header = Header.of(fh.fileno(), os.fstat(fh.fileno()).st_size)
            except OSError:
                continue
            if header is not None:
                out[name] = header.etag
        return out

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
        queued if new to the cache: a fill's in the small queue (or main, its name a ghost's),
        what a rebuild finds in main."""
        self.used += size
        unit = self._unit(name)
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

    def _forget(self, name: str) -> bool:
        size = self._sizes.pop(name, None)
        if size is not None and name not in self._writing:  # a fill's reservation was never readable
            self._logged(name, False)
        unit = self._unit(name)
        if size is not None:
            self.used -= size
            self._unit_bytes[unit] -= size
            if unit in self._small:
                self._small_bytes -= size
        place = self._places.pop(name, None)
        if place is not None:
            members = self._units.get(place.unit, set())
            members.discard(name)
            if not members:
                self._units.pop(place.unit, None)
        if unit not in self._units and unit in self._unit_bytes and (place is not None or size is not None):
            del self._unit_bytes[unit]  # the unit's last entry: out of the queues
            self._small.pop(unit, None)
            self._main.pop(unit, None)
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
        for q in (self._small, self._main):
            if unit in q:
                q[unit] = self._mtime(unit)

    def _busy(self, unit: str) -> bool:
        return any(n in self._writing for n in self._units.get(unit, (unit,)))

    def _evict_to(self, limit: int, keep: str | None = None) -> None:
        """Evict until used <= limit (S3-FIFO, above); a file entry goes whole, and none being
        written. `keep`: the file entry being filled. Each unit looked at is read once (its mtime)
        and either goes or moves on: a unit read since it was last looked at is looked at again
        only after every other."""
        turns = 2 * (len(self._small) + len(self._main)) + 2  # enough to see every unit twice
        while self.used > limit and turns > 0:
            turns -= 1
            from_small = bool(self._small) and (not self._main or self._small_bytes > self.capacity * SMALL_SHARE)
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
            q[unit] = seen  # back in place for _forget to take out
            self._evict(unit)
            if from_small:
                self._ghost[unit] = None
                while len(self._ghost) > max(1000, len(self._main)):
                    self._ghost.popitem(last=False)

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
