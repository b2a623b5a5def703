"""The kernel's stale marks, read from any process through a pinned BPF map.

The TC program records, per key hash, when it last saw a PUT or DELETE. The owning
StorageNode pins that map in the cluster's bpffs; a reader looks a key up on each cache
hit (one bpf() system call) and treats an entry filled before the mark as stale. This
closes the gap between the write and the STALE event reaching user space.
"""
from __future__ import annotations

import ctypes as ct
import os
import subprocess
import time
from pathlib import Path

from .libbpf import lib as _libbpf

_ready = False


def _lib():
    global _ready
    lib = _libbpf()
    if not _ready:
        lib.bpf_obj_pin.argtypes = [ct.c_int, ct.c_char_p]
        lib.bpf_obj_get.argtypes = [ct.c_char_p]
        lib.bpf_map_lookup_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
        _ready = True
    return lib


def pin(map_fd: int, path: str) -> None:
    try:
        os.unlink(path)  # left by a crashed earlier owner
    except FileNotFoundError:
        pass
    if _lib().bpf_obj_pin(map_fd, path.encode()) != 0:
        err = ct.get_errno()
        raise OSError(err, f"pinning BPF map at {path}: {os.strerror(err)}")


class StaleMarks:
    """Read side of a pinned stale_keys map; `mark(key)` is 0 when the key was never written."""

    def __init__(self, path: str):
        self.fd = _lib().bpf_obj_get(path.encode())
        if self.fd < 0:
            raise OSError(ct.get_errno(), f"opening pinned BPF map {path}")
        self._key, self._value = ct.c_uint64(), ct.c_uint64()
        self._kp, self._vp = ct.byref(self._key), ct.byref(self._value)

    def mark(self, key: int) -> int:
        self._key.value = key
        return self._value.value if _lib().bpf_map_lookup_elem(self.fd, self._kp, self._vp) == 0 else 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


UNREADABLE = (1 << 64) - 1  # the mark of what cannot be read: newer than every fetch


class FollowedMarks:
    """The marks pinned at `path`, followed across re-pins: a restarted StorageNode pins a new
    map there, so at most once a second the pin is looked at again (a stat) and reopened if
    it is another map, or if it could not be opened the last time. Where there is nothing to
    read: 0 if the node keeps no marks (simulated mode), else (`required`) UNREADABLE, so
    nothing is trusted that the marks cannot vouch for (the node restarting, or a reader not
    allowed to read them)."""

    RECHECK_S = 1.0

    def __init__(self, path: str, required: bool = True):
        self.path, self.required = path, required
        self._marks: StaleMarks | None = None
        self._ino: int | None = None
        self._checked = float("-inf")

    def _follow(self) -> StaleMarks | None:
        now = time.monotonic()
        if now - self._checked >= self.RECHECK_S:
            self._checked = now
            try:
                ino = os.stat(self.path).st_ino
            except OSError:  # absent, or a directory this reader may not look into
                ino = None
            if ino != self._ino:
                if self._marks is not None:
                    self._marks.close()
                try:
                    self._marks = StaleMarks(self.path) if ino is not None else None
                except OSError:  # this pin unopened (out of fds for a moment): tried again at the next look
                    self._marks, ino = None, None
                self._ino = ino
        return self._marks

    def marks(self, key: int, *suspect: int) -> tuple[int, int]:
        """(the latest write of `key`, the latest suspect mark of `suspect`: the bucket's), with
        one look at the pin and one lookup per key."""
        marks = self._follow()
        if marks is None:
            return (UNREADABLE, UNREADABLE) if self.required else (0, 0)
        return marks.mark(key), max((marks.mark(k) for k in suspect), default=0)


def open_marks(path: str, required: bool = True) -> FollowedMarks:
    return FollowedMarks(path, required)


def mounted(path: str | os.PathLike) -> bool:
    try:
        return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())
    except OSError:
        return False


def mount_bpffs(path: str | os.PathLike) -> bool:
    """Mount a bpffs of the cluster's own at `path` (in this process' mount namespace: a
    host's own). Returns whether this call mounted it; raises when it cannot."""
    if mounted(path):
        return False
    Path(path).mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        if mounted(path):  # a sibling StorageNode of a one-machine cluster won the race
            return False
        raise OSError(f"mount -t bpf at {path}: {done.stderr.strip() or done.returncode}")
    return True


def unmount_bpffs(path: str | os.PathLike) -> bool:
    """Unmount and remove it; returns whether it is gone. Every bpffs stacked there goes: two
    StorageNodes of a one-machine cluster starting at once may each have mounted one."""
    if not mounted(path):
        return False
    for _ in range(16):  # bounded: a umount that fails leaves the path mounted, said by the result
        if not mounted(path) or subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            break
    try:
        Path(path).rmdir()
    except OSError:
        pass
    return not mounted(path)
