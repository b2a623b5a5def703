"""A node cache's entry files as their owner (fasterfs.node.cache's ChunkCache) handles them: a
whole entry written, a chunk's slot in a file entry written, their ETags read back, and the cache
directory's file system checked for the extended attributes entries keep their headers in. The
entry format is fasterfs.read.cache_entry's."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

from ..core.errors import FasterFSError
from ..read.cache_entry import HEADER, SLOT, SUFFIX, TMP_PREFIX, XATTR, Header, Place, read_slot


def _name_bytes(name: str) -> bytes:
    return bytes.fromhex(name.removesuffix(SUFFIX))


def check_xattrs(directory: Path) -> None:
    """Entries keep their headers in an extended attribute: a file system that cannot
    (some network file systems) is named now, not at the first fill."""
    probe = directory / f"{TMP_PREFIX}probe.{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            os.setxattr(f.fileno(), XATTR, bytes(HEADER.size))
    except OSError as e:
        raise FasterFSError(f"cache directory {directory}: its file system does not keep user extended "
                            f"attributes ({e.strerror}); put cluster.root on ext4, xfs, btrfs or tmpfs") from None
    finally:
        probe.unlink(missing_ok=True)


def write_entry(directory: Path, name: str, data: bytes, header: bytes) -> None:
    tmp = directory / f"{TMP_PREFIX}{name}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.setxattr(f.fileno(), XATTR, header)
        # whole before visible; not fsynced: a process that dies leaves the page cache whole,
        # and after the machine's own crash every entry is of an earlier boot, dropped
        os.replace(tmp, directory / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_slot(directory: Path, name: str, place: Place, data: bytes, header: bytes,
               unit_lock: threading.Lock) -> None:
    """The chunk's bytes at its offset in the file entry, written before its slot says so.
    A new file entry is made whole-sized under a temporary name and renamed into place after
    any old index is gone, so no slot ever describes another file's bytes. `unit_lock`: the
    file entry's (one writer at a time)."""
    path, index = place.paths(directory)
    with unit_lock:
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
            tmp = directory / f"{TMP_PREFIX}{place.unit}.{os.getpid()}.{threading.get_ident()}"
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


def etags_of(entries: Iterable[tuple[str, Path, Place | None]]) -> dict[str, str]:
    """Entry name -> the ETag its header records, for each (name, its file, its place in a file
    entry or None) still readable (one gone meanwhile is left out)."""
    out = {}
    for name, path, place in entries:
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
