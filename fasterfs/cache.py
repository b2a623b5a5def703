"""The node-local chunk cache: one directory per node, bounded in bytes with LRU eviction.

Two sides use it. Readers (any process on the machine) look entries up with
`read_entry` / `map_entry`: a file read or memory map, no actor call, no socket.
The owner (the node's StorageNode, alone) writes, evicts and accounts with
`ChunkCache`, so capacity is counted in one place.

An entry is a file holding exactly the object's bytes, so it can be handed to the kernel as
it is (FUSE passthrough's backing file, a memory map); its 72-byte header (magic, size, xxh3
checksum, ETag, fill time, boot) is the file's extended attribute `user.fasterfs.entry`. It is
written to a temporary name with its header, fsynced, renamed into place and the directory
fsynced, so a reader sees a whole entry or none, also after a crash; a reader
that finds a bad header, a size that disagrees with the file, or (with verification) a
checksum mismatch drops the entry and reads from MinIO instead. Fill times are on the
kernel's clock (CLOCK_MONOTONIC, like the stale marks) and qualified by the boot they
were taken in: an entry from an earlier boot cannot be compared with this boot's marks,
so it is treated as stale. Readers touch an entry's mtime on a hit (at most every
TOUCH_EVERY_NS: the LRU needs no finer order, and the write is a reader's dearest step):
the owner evicts the oldest first.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import xxhash

from .errors import FasterFSError

log = logging.getLogger("fasterfs.cache")
MAGIC = b"FFSCACH3"
XATTR = "user.fasterfs.entry"  # where an entry's header lives: the file itself is the object's bytes
TOUCH_EVERY_NS = 1_000_000_000
HEADER = struct.Struct("<8sQQ32sQQ")  # magic, size, xxh3_64, etag, fetched_ns (CLOCK_MONOTONIC), boot
assert HEADER.size == 72
SUFFIX, TMP_PREFIX = ".chunk", ".fill-"
CLEAN = ".clean-shutdown"  # written by close(): without it, rebuild verifies every entry


def _boot_id() -> int:
    try:
        raw = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return 0
    return xxhash.xxh3_64_intdigest(raw.encode())


BOOT = _boot_id()


def entry_name(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + SUFFIX


@dataclass(frozen=True)
class Header:
    size: int
    checksum: int
    etag: str
    fetched_ns: int  # when the fill's GET began, on the kernel's clock: compared with stale marks
    boot: int        # the boot fetched_ns belongs to

    @classmethod
    def parse(cls, raw: bytes | None, file_size: int) -> "Header | None":
        """None unless `raw` is a header whose size agrees with the file's."""
        if raw is None or len(raw) != HEADER.size:
            return None
        magic, size, checksum, etag, filled, boot = HEADER.unpack(raw)
        if magic != MAGIC or size != file_size:
            return None
        return cls(size, checksum, etag.rstrip(b"\0").decode(errors="replace"), filled, boot)

    @classmethod
    def of(cls, fd: int, file_size: int) -> "Header | None":
        """The header of the entry open at `fd` (None: none, or not one of this format)."""
        try:
            return cls.parse(os.getxattr(fd, XATTR), file_size)
        except OSError:  # no such attribute: not a (whole) entry
            return None

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.size, self.checksum, self.etag.encode()[:32], self.fetched_ns, self.boot)


DAMAGED = "damaged"  # what read_entry/map_entry return for an entry they found bad and dropped
STALE = "stale"      # ... for an entry fetched before the kernel last saw its key written (dropped)


def _verdict(path: Path, fd: int, st: os.stat_result, header: Header | None, data, verify: bool,
             stale_mark: int, touch: bool = True) -> str | None:
    """None if the entry is good and fresh (then it is touched: LRU); else drop it, unless a
    fresh fill has already replaced it at `path`, and say why: STALE or DAMAGED."""
    if header is not None and (header.fetched_ns < stale_mark or header.boot != BOOT):
        verdict = STALE
    elif header is None or len(data) != header.size or (verify and xxhash.xxh3_64_intdigest(data) != header.checksum):
        log.warning("dropping damaged cache entry %s", path)
        verdict = DAMAGED
    else:
        if touch and time.time_ns() - st.st_mtime_ns >= TOUCH_EVERY_NS:
            os.utime(fd)
        return None
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except FileNotFoundError:
        pass
    return verdict


def read_entry(path: Path, verify: bool = True, stale_mark: int = 0, touch: bool = True) -> bytes | str | None:
    """An entry's bytes; None if absent; DAMAGED if it was bad, STALE if fetched before
    `stale_mark` (the kernel's last write of the key) or in another boot — either way it is
    now dropped. touch=False leaves the LRU order alone (the owner's scrub)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        header = Header.of(fd, st.st_size)
        data = os.pread(fd, header.size, 0) if header else b""
        return _verdict(path, fd, st, header, data, verify, stale_mark, touch) or data
    finally:
        os.close(fd)


def open_entry(path, stale_mark: int = 0) -> tuple[int, Header] | None:
    """A descriptor (the caller closes it) and the header of a whole, fresh entry at `path`;
    None if there is none. Nothing is dropped or touched."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    header = Header.of(fd, os.fstat(fd).st_size)
    if header is None or header.fetched_ns < stale_mark or header.boot != BOOT:
        os.close(fd)
        return None
    return fd, header


def map_entry(path: Path, verify: bool = True, stale_mark: int = 0):
    """An entry's bytes as a read-only pyarrow buffer over a memory map of the file (no copy);
    None, DAMAGED or STALE as for read_entry."""
    import mmap

    import pyarrow as pa

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        header = Header.of(fd, st.st_size)
        mapped = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ) if header and st.st_size else b""
        data = pa.py_buffer(mapped) if header else b""  # the buffer keeps the map alive
        return _verdict(path, fd, st, header, memoryview(data) if header else data, verify, stale_mark) or data
    finally:
        os.close(fd)


class ChunkCache:
    """The owner's side: fills, eviction, capacity. Never exceeds `capacity` bytes on disk."""

    def __init__(self, directory: Path, capacity: int, on_evict: Callable[[str], None] | None = None):
        # on_evict(entry name): lets the owner reset the kernel's count for the key
        self.dir, self.capacity, self.on_evict = Path(directory), capacity, on_evict
        self.dir.mkdir(parents=True, exist_ok=True)
        self._check_xattrs()
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}   # entry name -> bytes on disk (or reserved for a fill)
        self._writing: set[str] = set()    # fills under way: never evicted, cancelled instead
        self._cancelled: set[str] = set()  # removed while being written: deleted when the write ends
        self.used = 0
        self.counters = {"fills": 0, "fill_bytes": 0, "evictions": 0, "evicted_bytes": 0, "removed": 0,
                         "too_large": 0, "rebuilt_entries": 0, "stray_temp_removed": 0, "invalid_removed": 0,
                         "scrubs": 0, "scrub_dropped": 0, "no_room": 0,
                         "foreign_files": 0, "changed_at_source": 0}
        self.rebuild()

    def path(self, key: str) -> Path:
        return self.dir / entry_name(key)

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
        """Index what is on disk: keep valid entries of this boot, remove temp files and the
        rest. After an unclean stop (no CLEAN marker) every entry's checksum is verified:
        a crash must not leave a damaged entry to be served."""
        clean = self.dir / CLEAN
        verify = not clean.exists()
        clean.unlink(missing_ok=True)
        with self._lock:
            self._sizes.clear()
            self.used = 0
            for f in self.dir.iterdir():
                if f.name.startswith(TMP_PREFIX):
                    f.unlink(missing_ok=True)
                    self.counters["stray_temp_removed"] += 1
                    continue
                if not f.name.endswith(SUFFIX):
                    log.warning("cache directory %s: ignoring %s, which is not a cache entry", self.dir, f.name)
                    self.counters["foreign_files"] += 1
                    continue
                try:
                    with open(f, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        header = Header.of(fh.fileno(), size)
                        damaged = header is not None and verify and \
                            xxhash.xxh3_64_intdigest(fh.read(header.size)) != header.checksum
                except OSError:
                    continue
                if header is None or damaged or header.boot != BOOT:
                    f.unlink(missing_ok=True)
                    self.counters["invalid_removed"] += 1
                    continue
                self._sizes[f.name] = size
                self.used += size
                self.counters["rebuilt_entries"] += 1
            self._evict_to(self.capacity)

    def resize(self, capacity: int) -> None:
        """Change the capacity; shrinking evicts at once."""
        with self._lock:
            self.capacity = capacity
            self._evict_to(capacity)

    def scrub(self) -> int:
        """Verify every entry's checksum; drop the damaged ones. Returns how many were dropped."""
        with self._lock:
            names = list(self._sizes)
        dropped = 0
        for name in names:
            if read_entry(self.dir / name, verify=True, touch=False) in (DAMAGED, STALE):
                with self._lock:
                    if name not in self._writing:  # a refill under way keeps its reservation
                        self._forget(name)
                dropped += 1
        self.counters["scrubs"] += 1
        self.counters["scrub_dropped"] += dropped
        return dropped

    def contains(self, key: str) -> bool:
        name = entry_name(key)
        with self._lock:
            if name in self._writing:  # a fill under way holds its reservation: not cached yet
                return False
            if name in self._sizes and (self.dir / name).exists():
                return True
            if name in self._sizes:  # a reader dropped it as damaged
                self.used -= self._sizes.pop(name)
            return False

    def names(self) -> frozenset[str]:
        """The entries readable now (not those being written)."""
        with self._lock:
            return frozenset(n for n in self._sizes if n not in self._writing)

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
            if name in self._writing:
                return False  # another fill of the same key is under way
            self._forget(name)
            self._evict_to(self.capacity - need)
            if self.used + need > self.capacity:  # the rest is being written: no room now
                self.counters["no_room"] += 1
                return False
            self._sizes[name] = need  # reserved before the write, so concurrent fills cannot overshoot
            self.used += need
            self._writing.add(name)
        tmp = self.dir / f"{TMP_PREFIX}{name}.{os.getpid()}.{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.setxattr(f.fileno(), XATTR, header)
                os.fsync(f.fileno())  # durable before visible: a crash leaves no entry or a whole one
            os.replace(tmp, self.dir / name)
            self._sync_dir()
        except BaseException:
            tmp.unlink(missing_ok=True)
            with self._lock:
                self._writing.discard(name)
                self._cancelled.discard(name)
                self._forget(name)
            raise
        with self._lock:
            self._writing.discard(name)
            if name in self._cancelled:  # removed (stale, cleared) while we wrote: only now is the room free
                self._cancelled.discard(name)
                (self.dir / name).unlink(missing_ok=True)
                self._forget(name)
                return False
        self.counters["fills"] += 1
        self.counters["fill_bytes"] += len(data)
        return True

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """A clean stop: the next rebuild may trust sizes instead of verifying every entry."""
        with self._lock:
            if not self._writing:
                (self.dir / CLEAN).touch()

    def etags(self) -> dict[str, str]:
        """Entry name -> the ETag of the object it was filled from, for every entry on disk."""
        with self._lock:
            names = [n for n in self._sizes if n not in self._writing]
        out = {}
        for name in names:
            try:
                with open(self.dir / name, "rb") as fh:
                    header = Header.of(fh.fileno(), os.fstat(fh.fileno()).st_size)
            except OSError:
                continue
            if header is not None:
                out[name] = header.etag
        return out

    def drop_changed(self, names) -> int:
        """Drop entries whose object has changed at its source since they were filled."""
        doomed = set(names)
        dropped = self._drop(lambda n: n in doomed)
        self.counters["changed_at_source"] += dropped
        return dropped

    def retain(self, keys) -> int:
        """Drop every entry whose key is not in `keys` (a replaced generation's chunks)."""
        keep = {entry_name(k) for k in keys}
        return self._drop(lambda name: name not in keep)

    def remove(self, key: str) -> bool:
        name = entry_name(key)
        return self._drop(lambda n: n == name) > 0

    def clear(self) -> int:
        return self._drop(lambda name: True)

    def _drop(self, doomed: Callable[[str], bool]) -> int:
        """Remove the entries `doomed` names. A fill under way is cancelled but keeps its
        reservation until its write ends: its bytes are on disk until then."""
        with self._lock:
            names = [n for n in self._sizes if doomed(n)]
            for name in names:
                if name in self._writing:
                    self._cancelled.add(name)
                else:
                    self._forget(name)
        for name in names:
            if name not in self._cancelled:
                (self.dir / name).unlink(missing_ok=True)
        self.counters["removed"] += len(names)
        return len(names)

    def _forget(self, name: str) -> bool:
        size = self._sizes.pop(name, None)
        if size is not None:
            self.used -= size
        return size is not None

    def _evict_to(self, limit: int) -> None:
        """Evict least recently used entries (oldest mtime; readers touch on hit) until used <= limit."""
        if self.used <= limit:
            return
        ages = []
        for name in self._sizes:
            if name in self._writing:
                continue
            try:
                ages.append((os.stat(self.dir / name).st_mtime_ns, name))
            except FileNotFoundError:
                ages.append((0, name))  # dropped by a reader: forget it first
        for _, name in sorted(ages):
            if self.used <= limit:
                break
            size = self._sizes.pop(name)
            self.used -= size
            (self.dir / name).unlink(missing_ok=True)
            self.counters["evictions"] += 1
            self.counters["evicted_bytes"] += size
            if self.on_evict:
                self.on_evict(name)

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._sizes), "bytes": self.used, "capacity": self.capacity, **self.counters}
