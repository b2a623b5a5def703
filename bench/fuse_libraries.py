"""mfusepy or pyfuse3 for the mount: the same read-only file system (one file, served from a
local file by descriptor) in each library, measured side by side in one run.

    pip install pyfuse3          # needs Debian's libfuse3-dev and pkg-config to build
    python bench/fuse_libraries.py [size_mb=256]

Per library: sequential 1 MiB reads of the whole file (dd, page cache dropped by each open),
random 4 KiB reads (bounded count), and open+read+close of a 64 KiB file (the per-request cost
a reader of many small chunk files pays). mfusepy reads into libfuse's buffer (as
fasterfs.mount does); pyfuse3 returns bytes (its API).
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIG, SMALL = "big.bin", "small.bin"


def serve_mfusepy(mountpoint: str, files: dict[str, str]) -> None:
    import mfusepy

    class Ops(mfusepy.Operations):
        use_ns = True

        def getattr(self, path, fh=None):
            name = path.strip("/")
            if not name:
                return {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
            if name not in files:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": os.path.getsize(files[name])}

        def readdir(self, path, fh):
            return [".", ".."] + list(files)

        def open(self, path, fi):
            fi.fh = os.open(files[path.strip("/")], os.O_RDONLY)
            fi.keep_cache = 0
            return 0

        def read(self, path, size, offset, fi):
            return os.pread(fi.fh, size, offset)

        def release(self, path, fi):
            os.close(fi.fh)
            return 0

    class FUSE(mfusepy.FUSE):
        def read(self, path, buf, size, offset, fip):
            view = memoryview((ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value)).cast("B")
            return os.preadv(fip.contents.fh, [view], offset)

    FUSE(Ops(), mountpoint, raw_fi=True, foreground=True, nothreads=False, ro=True)


def serve_pyfuse3(mountpoint: str, files: dict[str, str]) -> None:
    import pyfuse3
    import trio

    names = list(files)
    inodes = {pyfuse3.ROOT_INODE + 1 + k: n for k, n in enumerate(names)}

    class Ops(pyfuse3.Operations):
        async def getattr(self, inode, ctx=None):
            e = pyfuse3.EntryAttributes()
            e.st_ino = inode
            if inode == pyfuse3.ROOT_INODE:
                e.st_mode, e.st_size = stat.S_IFDIR | 0o555, 0
            else:
                e.st_mode, e.st_size = stat.S_IFREG | 0o444, os.path.getsize(files[inodes[inode]])
            e.attr_timeout = e.entry_timeout = 1.0
            return e

        async def lookup(self, parent, name, ctx=None):
            for inode, n in inodes.items():
                if n == name.decode():
                    return await self.getattr(inode)
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            for inode, n in inodes.items():
                if inode > start_id and not pyfuse3.readdir_reply(token, n.encode(), await self.getattr(inode), inode):
                    return

        async def open(self, inode, flags, ctx):
            return pyfuse3.FileInfo(fh=os.open(files[inodes[inode]], os.O_RDONLY), keep_cache=False)

        async def read(self, fh, off, size):
            return os.pread(fh, size, off)

        async def release(self, fh):
            os.close(fh)

    options = set(pyfuse3.default_options) | {"ro", "fsname=bench"}
    pyfuse3.init(Ops(), mountpoint, options)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


def measure(mountpoint: Path, size: int) -> dict:
    dev = os.stat(mountpoint).st_dev
    Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb").write_text("4096")
    out = {}
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(["dd", f"if={mountpoint / BIG}", "of=/dev/null", "bs=1M"], capture_output=True, check=True)
        runs.append(size / 1e6 / (time.perf_counter() - t))
    out["sequential 1 MiB, MB/s (best of 3)"] = max(runs)
    rng = random.Random(1)
    fd = os.open(mountpoint / BIG, os.O_RDONLY)
    try:
        n, t = 3000, time.perf_counter()
        for _ in range(n):
            os.pread(fd, 4096, rng.randrange(size // 4096) * 4096)
        out["random 4 KiB, reads/s"] = n / (time.perf_counter() - t)
    finally:
        os.close(fd)
    n, t = 1000, time.perf_counter()
    for _ in range(n):
        with open(mountpoint / SMALL, "rb") as f:
            f.read()
    out["open+read+close 64 KiB, µs each"] = (time.perf_counter() - t) / n * 1e6
    return out


def main(argv: list[str]) -> dict:
    size = int(dict(a.split("=") for a in argv).get("size_mb", 256)) * 2**20
    work = Path(tempfile.mkdtemp(prefix="ffs-fuselib-", dir="/var/tmp"))
    files = {BIG: str(work / BIG), SMALL: str(work / SMALL)}
    Path(files[BIG]).write_bytes(os.urandom(size))
    Path(files[SMALL]).write_bytes(os.urandom(65536))
    results = {}
    for lib in ("mfusepy", "pyfuse3"):
        point = work / f"mnt-{lib}"
        point.mkdir()
        proc = subprocess.Popen([sys.executable, __file__, "--serve", lib, str(point), json.dumps(files)])
        try:
            deadline = time.monotonic() + 30
            while not os.path.ismount(point):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{lib} did not mount")
                time.sleep(0.05)
            results[lib] = measure(point, size)
        finally:
            subprocess.run(["fusermount3", "-u", str(point)], capture_output=True)
            proc.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        (serve_mfusepy if sys.argv[2] == "mfusepy" else serve_pyfuse3)(sys.argv[3], json.loads(sys.argv[4]))
    else:
        main(sys.argv[1:])
