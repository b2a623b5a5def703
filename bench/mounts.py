"""The mounts the benchmarks read through: FasterFS's own, run by the benchmark's process as a
StorageNode runs one (with its read-ahead window), and its peers, s3fs-fuse (`-o use_cache`)
and rclone (`mount --vfs-cache-mode full`) of an object in a MinIO. Each is started by its
pid, stopped by that pid, and its CPU time (the whole process tree) can be read.

Peers get the MinIO keys in files of their own (0600, in the caller's directory), never on a
command line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fasterfs.core import config
from fasterfs.core.process import terminate
from fasterfs.node.mount_supervisor import is_mounted, set_read_ahead

TICK = os.sysconf("SC_CLK_TCK")


class Mount:
    """One mount at `point`, served by the process `proc` (and its children)."""

    def __init__(self, name: str, point: Path, proc: subprocess.Popen, cache_dir: Path | None = None):
        self.name, self.point, self.proc, self.cache_dir = name, point, proc, cache_dir

    def wait_up(self, timeout: float = 60.0) -> Mount:
        deadline = time.monotonic() + timeout
        while not is_mounted(str(self.point)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} mount at {self.point} did not come up")
            time.sleep(0.1)
        return self

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the mount's process and its descendants, so far."""
        return sum(_cpu_s(pid) for pid in _tree(self.proc.pid))

    def stop(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.point)], capture_output=True, timeout=30)
        terminate(self.proc.pid, proc=self.proc)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def hot_dataset(argv: list[str]):
    """The dataset ingested last, every chunk in a cache (emptied first, then `cache warm`, each
    at its home): a client of it, the StorageNode actors, and each chunk file's name in the
    namespace. Filled afresh because a file's pages read back from disk read slower than pages
    just written (README, the mount's per-file reads), and the local copies compared with them
    are written by the benchmark."""
    import ray

    import fasterfs
    from fasterfs.ops import cluster

    client = fasterfs.connect(overrides=argv)
    cluster.connect_ray(client.state)
    actors = cluster.storage_nodes(client.state)
    by_node: dict[int, list[str]] = {}
    for i in range(len(client.manifest)):
        by_node.setdefault(client.sources(i)[0], []).append(client.manifest.chunk(i).key)
    ray.get([a.cache_clear.remote() for a in actors])
    ray.get([actors[n].cache_warm.remote(keys) for n, keys in by_node.items()])
    return client, actors, [c.key.rsplit("/", 1)[-1] for c in client.manifest.chunks]


def fasterfs(point: Path, overrides: list[str]) -> Mount:
    """FasterFS's mount of the namespace."""
    point.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "fasterfs.read.mount", str(point), *overrides],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, FASTERFS_MOUNT_STATS=f"{point}.stats.json"))
    mount = Mount("fasterfs", point, proc).wait_up()
    set_read_ahead(str(point), int(config.load(overrides).mount.read_ahead_kb))  # as a StorageNode's mount has
    return mount


def _peer(name: str, point: Path, work: Path, secret: str, argv, env=lambda keys: {}) -> Mount:
    """A peer mount: `argv(cache_dir, keys_file)` started with its keys in a file of its own
    (`secret`, 0600) and a cache directory under `work`."""
    point.mkdir(parents=True, exist_ok=True)
    cache = work / f"{name}-cache"
    cache.mkdir(exist_ok=True)
    keys = work / f"{name}.keys"
    keys.touch(mode=0o600)
    keys.write_text(secret)
    proc = subprocess.Popen(argv(cache, keys), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=_peer_env(**env(keys)))
    return Mount(name, point, proc, cache).wait_up()


def s3fs(point: Path, endpoint: str, bucket: str, access: str, secret: str, work: Path) -> Mount:
    """s3fs-fuse over `bucket` with its disk cache on (use_cache), read-only."""
    return _peer("s3fs", point, work, f"{access}:{secret}\n", lambda cache, keys: [
        "s3fs", bucket, str(point), "-f", "-o", f"passwd_file={keys}", "-o", f"url={endpoint}",
        "-o", "use_path_request_style", "-o", f"use_cache={cache}", "-o", "ro", "-o", "max_stat_cache_size=100000"])


def rclone(point: Path, endpoint: str, bucket: str, access: str, secret: str, work: Path) -> Mount:
    """rclone's mount of `bucket` with its full VFS cache (what it reads it keeps on disk)."""
    return _peer("rclone", point, work,
                 f"[minio]\ntype = s3\nprovider = Minio\naccess_key_id = {access}\n"
                 f"secret_access_key = {secret}\nendpoint = {endpoint}\n",
                 lambda cache, keys: ["rclone", "mount", f"minio:{bucket}", str(point), "--read-only",
                                      "--vfs-cache-mode", "full", "--cache-dir", str(cache), "--dir-cache-time", "1h"],
                 env=lambda keys: {"RCLONE_CONFIG": str(keys)})


def _peer_env(**extra) -> dict:
    """This environment without AWS_*: FasterFS points AWS_CA_BUNDLE at its cluster CA, which the
    peers would try to load for a plain-HTTP MinIO (rclone refuses to start)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **extra}


def drop_page_cache() -> None:
    """Every clean page out of the kernel's page cache (MinIO's disk files, cache entries, the
    local copy alike): a cold read reads disks."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")
