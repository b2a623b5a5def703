"""A lab host's private disk: a directory under <cluster.root>/lab-disks/, or, with
lab.disk_mb, an ext4 file system of that size in an image file there (loop-mounted on the
directory), so that a host's disk can fill up on its own (`fasterfs lab fill`) without
filling this machine's. Images outlive the lab: node ids follow the disks."""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from ..core.errors import FasterFSError

BASE = "lab-disks"  # under the cluster root: the hosts' disks, one directory each
FILLER = ".lab-fill"  # the file that fills a host's disk; `heal` removes it


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FasterFSError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def prepare(base: Path, names: list[str], size_mb: int | None) -> tuple[list[Path], list[str]]:
    """The disks' directories in host order (created if new) and the image mounts made for
    them (to undo with `release`)."""
    paths = [base / str(n) for n in names]
    mounted: list[str] = []
    try:
        for p in paths:
            p.mkdir(parents=True, exist_ok=True)
            if not size_mb:
                continue
            image = p.with_suffix(".img")
            if not image.exists():
                with open(image, "wb") as f:
                    f.truncate(int(size_mb) * 2**20)
                _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
            if not is_mounted(p):
                _run("mount", "-o", "loop", str(image), str(p))
                mounted.append(str(p))
    except BaseException:
        release(mounted)
        raise
    return paths, mounted


def release(mounted: list[str]) -> int:
    """Unmount the image disks (their loop devices go with them); the images stay."""
    done = 0
    for p in mounted:
        if is_mounted(Path(p)):
            _run("umount", p)
            done += 1
    return done


def fill(disk: Path, leave_mb: float = 0) -> int:
    """Fill `disk` until `leave_mb` MB are free (a file of zeros, allocated, not written);
    returns its size. Only an image disk can fill: a directory shares this machine's disk."""
    if not is_mounted(disk):
        raise FasterFSError(f"lab disk {disk} is a directory on this machine's disk: start the lab with "
                            "lab.disk_mb=N to give each host a disk of its own that can fill up")
    filler = disk / FILLER
    st = os.statvfs(disk)
    size = max(0, st.f_bavail * st.f_frsize + (filler.stat().st_size if filler.exists() else 0)
               - int(leave_mb * 2**20))
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 0)
        for _ in range(256):  # free space counts blocks the file system's own metadata will take
            try:
                if size:
                    os.posix_fallocate(fd, 0, size)
                break
            except OSError as e:
                if e.errno != errno.ENOSPC or size < 2**20:
                    raise
                os.ftruncate(fd, 0)
                size -= 2**20
    except OSError as e:
        os.close(fd)
        filler.unlink(missing_ok=True)
        raise FasterFSError(f"cannot fill lab disk {disk}: {e.strerror}") from None
    os.close(fd)
    return size


def unfill(disk: Path) -> bool:
    filler = disk / FILLER
    if filler.exists():
        filler.unlink()
        return True
    return False
