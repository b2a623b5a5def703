"""A cache entry: its format on disk, and the readers' side of the node cache.

Readers (any process on the machine) look entries up with `read_entry` / `open_entry` /
`map_entry`: a file read or memory map, no actor call, no socket. The owner (the node's
StorageNode, alone) writes, evicts and accounts with fasterfs.node.cache.ChunkCache.

An entry is a file holding exactly the object's bytes, so it can be handed to the kernel as
it is (FUSE passthrough's backing file, a memory map); its 72-byte header (magic, size, xxh3
checksum, ETag, fill time, boot) is the file's extended attribute `user.fasterfs.entry`. It is
written to a temporary name with its header and renamed into place, so a reader sees a whole
entry or none, also after the writer is killed (nothing is fsynced: after the machine's own
crash every entry is of an earlier boot, and dropped, so durability would buy nothing); a reader
that finds a bad header, a size that disagrees with the file, or (with verification) a
checksum mismatch drops the entry and reads from MinIO instead. Fill times are on the
kernel's clock (CLOCK_MONOTONIC, like the stale marks) and qualified by the boot they
were taken in: an entry from an earlier boot cannot be compared with this boot's marks,
so it is treated as stale. Readers touch an entry's mtime on a hit (at most every
TOUCH_EVERY_NS: the LRU needs no finer order, and the write is a reader's dearest step):
the owner evicts the oldest first.

A chunk of a stored file of several chunks (`places`) lives instead at its offset in the
file's one entry, `<name>.file` (sparse until filled), with its header in its slot of
`<name>.idx`: a file whose chunks are all cached is one local file of exactly its bytes,
which the mount hands to the kernel as a passthrough backing file. Its chunks are filled
one by one (bytes written before their slot, so a killed writer leaves whole chunks or
none) but touched, evicted and dropped as one: dropping any chunk unlinks the file entry,
so a reader that has it open keeps reading the bytes it opened (no hole is punched).
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..core.stamp import BOOT

log = logging.getLogger("fasterfs.read.cache_entry")
MAGIC = b"FFSCACH3"
XATTR = "user.fasterfs.entry"  # where an entry's header lives: the file itself is the object's bytes
TOUCH_EVERY_NS = 1_000_000_000
HEADER = struct.Struct("<8sQQ32sQQ")  # magic, size, xxh3_64, etag, fetched_ns (CLOCK_MONOTONIC), boot
assert HEADER.size == 72
SLOT = struct.Struct("<72sQ16s")  # a file entry's chunk: its header, offset in the file, entry name
SUFFIX, TMP_PREFIX = ".chunk", ".fill-"
FILE_SUFFIX, INDEX_SUFFIX = ".file", ".idx"


def entry_name(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + SUFFIX


@dataclass(frozen=True)
class Place:
    """Where a chunk of a stored file of several chunks is cached: in the file's entry."""
    unit: str       # the file entry's name, without suffix
    index: int      # the chunk's place in the file: its slot
    offset: int     # where its bytes start in the file
    size: int
    file_size: int
    home: int = 0   # the node whose cache holds the file where each node caches what its MinIO serves

    def paths(self, directory) -> tuple[Path, Path]:
        d = Path(directory)
        return d / (self.unit + FILE_SUFFIX), d / (self.unit + INDEX_SUFFIX)


def places(manifest) -> list[Place | None]:
    """Where each chunk of `manifest` is cached: in its file's entry for a stored file of
    several chunks (so the file can be opened by passthrough), else in an entry of its own."""
    if manifest.kind != "file" or len(manifest.chunks) < 2:
        return [None] * len(manifest.chunks)
    unit = hashlib.blake2b(f"file:{manifest.chunks[0].key}".encode(), digest_size=16).hexdigest()
    offsets = manifest.offsets()
    home = manifest.chunks[0].nodes[0]
    return [Place(unit, i, offsets[i], c.bytes, offsets[-1], home) for i, c in enumerate(manifest.chunks)]


def entry_path(directory, key: str, place: Place | None) -> Path:
    """The file holding the chunk's bytes: its own entry, or its file's."""
    return place.paths(directory)[0] if place else Path(directory) / entry_name(key)


@dataclass(frozen=True)
class Header:
    size: int
    checksum: int
    etag: str
    fetched_ns: int  # when the fill's GET began, on the kernel's clock: compared with stale marks
    boot: int        # the boot fetched_ns belongs to

    @classmethod
    def parse(cls, raw: bytes | None, file_size: int) -> Header | None:
        """None unless `raw` is a header whose size agrees with the file's."""
        if raw is None or len(raw) != HEADER.size:
            return None
        magic, size, checksum, etag, filled, boot = HEADER.unpack(raw)
        if magic != MAGIC or size != file_size:
            return None
        return cls(size, checksum, etag.rstrip(b"\0").decode(errors="replace"), filled, boot)

    @classmethod
    def of(cls, fd: int, file_size: int) -> Header | None:
        """The header of the entry open at `fd` (None: none, or not one of this format)."""
        try:
            return cls.parse(os.getxattr(fd, XATTR), file_size)
        except OSError:  # no such attribute: not a (whole) entry
            return None

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.size, self.checksum, self.etag.encode()[:32], self.fetched_ns, self.boot)


def read_slot(path: Path, place: Place) -> tuple[Header | None, bytes] | None:
    """The header in `place`'s slot of the file entry at `path` (None if it does not describe
    the place) and the entry name it was filled under (16 raw bytes); None if the slot was
    never filled."""
    try:
        fd = os.open(path.with_suffix(INDEX_SUFFIX), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = os.pread(fd, SLOT.size, place.index * SLOT.size)
    finally:
        os.close(fd)
    if len(raw) != SLOT.size or not raw.startswith(MAGIC):
        return None
    head, offset, name = SLOT.unpack(raw)
    return (Header.parse(head, place.size) if offset == place.offset else None), name


def _open(path: Path, place: Place | None) -> tuple[int, os.stat_result, Header | None] | None:
    """A descriptor of the file holding the chunk, its stat and the chunk's header (None: not
    a whole entry); None if there is no such file, or no filled slot for the chunk in it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if place is None:
        return fd, st, Header.of(fd, st.st_size)
    slot = read_slot(Path(path), place)
    if slot is None:
        os.close(fd)
        return None
    return fd, st, slot[0] if st.st_size == place.file_size else None


def fetched_ns(path: Path, place: Place | None) -> int | None:
    """When the chunk's bytes at `path` were fetched (CLOCK_MONOTONIC, this boot's); None if there
    is no entry, or it is of another boot."""
    got = _open(path, place)
    if got is None:
        return None
    os.close(got[0])
    header = got[2]
    return header.fetched_ns if header is not None and header.boot == BOOT else None


def filled(path, places: list[Place]) -> tuple[int, list[Header | None]] | None:
    """The inode of the file entry at `path` and, for each of `places` (chunks of its file),
    the header of its filled slot of this boot (None: not filled); None if there is no entry,
    or it was replaced while we looked (one read of the index for them all)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        try:
            raw = Path(path).with_suffix(INDEX_SUFFIX).read_bytes()
        except FileNotFoundError:
            raw = b""
    finally:
        os.close(fd)
    try:
        if os.stat(path).st_ino != st.st_ino:
            return None  # a new file entry took its place: its index may be the one just read
    except FileNotFoundError:
        return None
    out: list[Header | None] = []
    for p in places:
        slot = raw[p.index * SLOT.size:(p.index + 1) * SLOT.size]
        header = None
        if st.st_size == p.file_size and len(slot) == SLOT.size and slot.startswith(MAGIC):
            head, offset, _ = SLOT.unpack(slot)
            header = Header.parse(head, p.size) if offset == p.offset else None
        out.append(header if header is not None and header.boot == BOOT else None)
    return st.st_ino, out


def remove_file(path: Path) -> None:
    """Unlink an entry's file, and a file entry's index after it (a reader that opened the
    file then finds no slot: a miss)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    if path.suffix == FILE_SUFFIX:
        path.with_suffix(INDEX_SUFFIX).unlink(missing_ok=True)


def unlink_entry(path: Path, fd: int) -> None:
    """Drop the entry at `path` if it is still the file open at `fd`: a fresh fill may have
    replaced it."""
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            remove_file(path)
    except FileNotFoundError:
        pass


DAMAGED = "damaged"  # what read_entry/map_entry return for an entry they found bad and dropped
STALE = "stale"      # ... for an entry fetched before the kernel last saw its key written (dropped)
SUSPECT = "suspect"  # ... for one fetched before a write nobody could name: kept for its owner to check


def _touch(fd: int, st: os.stat_result) -> None:
    """A hit moves the entry up the LRU order; at most once per TOUCH_EVERY_NS."""
    if time.time_ns() - st.st_mtime_ns >= TOUCH_EVERY_NS:
        os.utime(fd)


# A stale mark, (its key's mark, the bucket's suspect mark), or how to look it up (only once an
# entry is there).
Mark = int | tuple[int, int] | Callable[[], "int | tuple[int, int]"]


def _stale(header: Header, stale_mark: Mark) -> str | None:
    """STALE if fetched before the kernel's last write of its key, or in another boot; SUSPECT if
    fetched before the bucket's suspect mark; else None."""
    if header.boot != BOOT:
        return STALE
    mark = stale_mark() if callable(stale_mark) else stale_mark
    written, suspect = mark if isinstance(mark, tuple) else (mark, 0)
    if header.fetched_ns < written:
        return STALE
    return SUSPECT if header.fetched_ns < suspect else None


def _verdict(path: Path, fd: int, st: os.stat_result, header: Header | None, data, verify: bool,
             stale_mark: Mark, touch: bool = True) -> str | None:
    """None if the entry is good and fresh (then it is touched: LRU); else say why: STALE or
    DAMAGED (dropped, unless a fresh fill has already replaced it at `path`), or SUSPECT (kept)."""
    verdict = _stale(header, stale_mark) if header is not None else None
    if verdict == SUSPECT:
        return verdict
    if verdict is None and (header is None or len(data) != header.size
                            or (verify and xxhash.xxh3_64_intdigest(data) != header.checksum)):
        log.warning("dropping damaged cache entry %s", path)
        verdict = DAMAGED
    if verdict is None:
        if touch:
            _touch(fd, st)
        return None
    unlink_entry(path, fd)
    return verdict


def read_entry(path: Path, verify: bool = True, stale_mark: Mark = 0, touch: bool = True,
               place: Place | None = None) -> bytes | str | None:
    """An entry's bytes (`place`: a chunk's in a file entry at `path`); None if absent; DAMAGED
    if it was bad, STALE if fetched before `stale_mark` (the kernel's last write of the key) or
    in another boot — either way it is now dropped; SUSPECT (kept) if fetched before the
    bucket's suspect mark. touch=False leaves the LRU order alone (the owner's scrub)."""
    got = _open(path, place)
    if got is None:
        return None
    fd, st, header = got
    try:
        data = os.pread(fd, header.size, place.offset if place else 0) if header else b""
        return _verdict(path, fd, st, header, data, verify, stale_mark, touch) or data
    finally:
        os.close(fd)


def open_entry(path, stale_mark: Mark = 0, place: Place | None = None,
               touch: bool = False) -> tuple[int, Header] | None:
    """A descriptor of the file (the caller closes it) and the header of a whole, fresh entry
    at `path`; None if there is none. Nothing is dropped; touch=True counts it as a hit."""
    got = _open(Path(path), place)
    if got is None:
        return None
    fd, st, header = got
    if header is None or _stale(header, stale_mark):
        os.close(fd)
        return None
    if touch:
        _touch(fd, st)
    return fd, header


def map_entry(path: Path, verify: bool = True, stale_mark: Mark = 0, place: Place | None = None):
    """An entry's bytes as a read-only pyarrow buffer over a memory map of the file (no copy);
    None, DAMAGED, STALE or SUSPECT as for read_entry."""
    import mmap

    import pyarrow as pa

    if place is not None and place.offset % mmap.ALLOCATIONGRANULARITY:
        return read_entry(path, verify, stale_mark, place=place)
    got = _open(path, place)
    if got is None:
        return None
    fd, st, header = got
    try:
        offset = place.offset if place else 0
        mapped = mmap.mmap(fd, header.size, prot=mmap.PROT_READ, offset=offset) if header and header.size else b""
        data = pa.py_buffer(mapped) if header else b""  # the buffer keeps the map alive
        return _verdict(path, fd, st, header, memoryview(data) if header else data, verify, stale_mark) or data
    finally:
        os.close(fd)
