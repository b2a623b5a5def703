"""The mount's former daemon, all in Python (mfusepy: ctypes over Debian's libfuse3, a thread
per request), kept to measure the native one against (`mount.engine=python`,
bench/mount.py) until the native mount wins everywhere.

Reads take the client's path: this host's cache, else a holder's MinIO. An open keeps the
file's pages (`keep_cache`) only when every chunk of the file is in this host's disk cache and
was already so, as the same copies, at the previous open; otherwise the pages are dropped at
open, so reads reach the daemon and are counted, and a rewritten chunk or a replaced dataset is
never served from old pages to a new open.
"""
from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import stat
import threading

import mfusepy

from .namespace import Entry
from .reader import Namespace, OpenFile

log = logging.getLogger("fasterfs.mount")


class Operations(mfusepy.Operations):
    use_ns = True  # times in nanoseconds

    def __init__(self, ns: Namespace):
        self.ns = ns
        self._files: dict[int, OpenFile] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.uid, self.gid = os.getuid(), os.getgid()

    def _entry(self, path: str) -> Entry:
        try:
            return self.ns.lookup(path)
        except FileNotFoundError:
            raise mfusepy.FuseOSError(errno.ENOENT) from None

    def getattr(self, path, fh=None):
        entry = self._entry(path)
        t = int(entry.mtime * 1e9)
        mode = (stat.S_IFDIR | 0o555) if entry.is_dir else (stat.S_IFREG | 0o444)
        return {"st_mode": mode, "st_nlink": 2 if entry.is_dir else 1, "st_size": entry.size,
                "st_uid": self.uid, "st_gid": self.gid, "st_atime": t, "st_mtime": t, "st_ctime": t,
                "st_blocks": (entry.size + 511) // 512}

    def readdir(self, path, fh):
        try:
            children = self.ns.listdir(path)
        except FileNotFoundError:
            raise mfusepy.FuseOSError(errno.ENOENT) from None
        except NotADirectoryError:
            raise mfusepy.FuseOSError(errno.ENOTDIR) from None
        return [".", ".."] + [e.path.rsplit("/", 1)[-1] for e in children]

    def open(self, path, fi):
        if fi.flags & os.O_ACCMODE != os.O_RDONLY:
            raise mfusepy.FuseOSError(errno.EROFS)
        entry = self._entry(path)
        if entry.is_dir:
            raise mfusepy.FuseOSError(errno.EISDIR)
        fi.keep_cache = int(self.ns.may_keep_pages(entry))
        with self._lock:
            fh = next(self._ids)
            self._files[fh] = self.ns.open_entry(entry)
        fi.fh = fh
        return 0

    def read_into(self, path, fh: int, buf: memoryview, offset: int) -> int:
        f = self._files.get(fh)
        if f is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        try:
            return f.read_into(offset, buf)
        except Exception as e:  # holders down, generation gone: the application gets EIO, the log says why
            log.error("read of %s at %d+%d failed: %s", path, offset, len(buf), e)
            raise mfusepy.FuseOSError(errno.EIO) from None

    def read(self, path, size, offset, fi):
        """Registers the read operation with libfuse (_FUSE.read calls read_into instead)."""
        buf = bytearray(size)
        return bytes(buf[:self.read_into(path, fi.fh, memoryview(buf), offset)])

    def release(self, path, fi):
        with self._lock:
            f = self._files.pop(fi.fh, None)
        if f is not None:
            f.close()
        return 0

    def statfs(self, path):
        tree = self.ns.refresh()
        total = sum(m.total_bytes for m in tree.manifests.values())
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": (total + 4095) // 4096, "f_bfree": 0,
                "f_bavail": 0, "f_files": sum(len(m.chunks) for m in tree.manifests.values()), "f_ffree": 0,
                "f_namemax": 255}


class _FUSE(mfusepy.FUSE):
    """Reads go straight into libfuse's buffer (mfusepy would copy a returned bytes object)."""

    def read(self, path, buf, size, offset, fip):
        view = memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value)).cast("B")
        return self.operations.read_into(None if path is None else path.decode(self.encoding, self.errors),
                                         fip.contents.fh, view, offset)


def serve(mountpoint: str, ns: Namespace) -> None:
    log.info("serving namespace version %d of cluster %s at %s", ns.version, ns.state.name, mountpoint)
    _FUSE(Operations(ns), mountpoint, raw_fi=True, foreground=True, nothreads=False, ro=True,
                 fsname="fasterfs", default_permissions=True, allow_other=True,
                 attr_timeout=1.0, entry_timeout=1.0)


