"""FUSE over io_uring, the kernel's side: the `fuse` module offers it only while its parameter
`enable_uring` is set (off by default, read at each mount's INIT and at each ring command), and
the parameter is the host's, not a mount's. A mount that wants it sets it and says so with a
file named by its process id under /run/fasterfs/fuse-uring/; whoever turned it on remembers
the value before, and the last mount to go (or `down`, for mounts that died) puts it back.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

PARAM = Path("/sys/module/fuse/parameters/enable_uring")
USERS = Path("/run/fasterfs/fuse-uring")
BEFORE = "before"  # in USERS: the parameter's value before a mount turned it on


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    USERS.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(USERS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def enable(pid: int | None = None) -> bool:
    """Turn FUSE over io_uring on for mount process `pid` (this one by default); False when this
    kernel has none (no CONFIG_FUSE_IO_URING) or it cannot be set (not root): the mount then
    uses /dev/fuse."""
    if not PARAM.exists():
        log.info("this kernel has no FUSE over io_uring (%s): the mount uses /dev/fuse", PARAM)
        return False
    pid = os.getpid() if pid is None else pid
    try:
        with _locked():
            now = PARAM.read_text().strip()
            if now != "Y":
                (USERS / BEFORE).write_text(now)
                PARAM.write_text("Y")
            (USERS / str(pid)).touch()
    except OSError as e:
        log.warning("cannot turn on FUSE over io_uring (%s: %s): the mount uses /dev/fuse", PARAM, e)
        return False
    return True


def release(pid: int | None = None) -> None:
    """Mount process `pid` no longer needs io_uring (None: only forget mounts that died). Once
    no live mount needs it, the parameter goes back to what it was before one turned it on."""
    if not USERS.is_dir():
        return
    try:
        with _locked():
            if pid is not None:
                (USERS / str(pid)).unlink(missing_ok=True)
            users = [p for p in USERS.iterdir() if p.name.isdigit()]
            for p in users:
                if not _alive(int(p.name)):
                    p.unlink(missing_ok=True)
            before = USERS / BEFORE
            if before.exists() and not any(p.exists() for p in users):
                PARAM.write_text(before.read_text())
                before.unlink()
    except OSError as e:  # not root: the switch and its users are root's
        log.warning("cannot put back FUSE over io_uring's switch (%s): %s", PARAM, e)
