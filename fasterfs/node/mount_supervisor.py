"""A host's FUSE mounts, owned by its StorageNode: checked before mounting, their daemons
started and restarted when they die or hang (the dead mount point is detached first, so no
"Transport endpoint is not connected" stays behind), and unmounted when the node stops.

A mount is hung when its counters file has not been written for `hung_s`: the agent asks its
daemon for them every half second and writes the answer, so the file's age is how long ago the
two last spoke (a daemon stuck, or an agent whose reader or whose watch stopped).

The mounts a node serves are recorded beside its data, so the next incarnation of the node takes
over the daemons the last one left: one that still serves its mount (a restart, `fasterfs nodes
restart`) serves on, its readers never see it stop; one that does not is stopped and mounted again.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..core import process
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write_json, log_tail, read_json
from ..core.process import terminate

log = logging.getLogger("fasterfs.read.mount")


def is_mounted(path: str) -> bool:
    """Whether `path` is a mount point (a dead FUSE mount counts: stat fails with ENOTCONN)."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].replace("\\040", " ") == real for line in f)


def set_read_ahead(mount_point: str, kb: int) -> None:
    """The kernel reads ahead 128 KiB on a FUSE mount by default: a request per 128 KiB
    through the daemon. Chunks are MiBs; a larger window measured 1.7x the first read of
    cached chunks (README)."""
    dev = os.stat(mount_point).st_dev
    knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    try:
        knob.write_text(str(kb))
    except OSError as e:
        log.warning("could not set %s to %d (reads stay at the kernel's window): %s", knob, kb, e)


def _detach(path: str) -> None:
    subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, timeout=30)


def _answers(path: str) -> bool:
    """Whether the mount at `path` is there and its daemon answers a stat of its root."""
    try:
        return is_mounted(path) and os.path.isdir(path)
    except OSError:
        return False


def _ours(pid: int) -> bool:
    try:
        return b"fasterfs.read.mount" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class _Agent:
    """A mount's agent, no child of this process (it outlives the node's incarnation that
    started it), supervised by its pid as a child would be."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        return None if _ours(self.pid) and process.running(self.pid) else 0


class Mounts:
    def __init__(self, record: Path, log_dir: Path, daemon_overrides: list[str], read_ahead_kb: int = 4096,
                 timeout: float = 60, hung_s: float = 60):
        self.record, self.log_dir, self.overrides, self.timeout = record, log_dir, daemon_overrides, timeout
        self.read_ahead_kb, self.hung_s = read_ahead_kb, hung_s
        self._procs: dict[str, _Agent] = {}
        self._mounted_at: dict[str, float] = {}  # path -> when its daemon mounted it
        self._lock = threading.RLock()  # the supervisor thread and the actor's calls
        self.stopped = False
        self.restarts = 0

    def adopt(self) -> list[str]:
        """What an earlier incarnation of this node served: a daemon still serving its mount
        (its agent running, the mount answering) is taken over as it is; the others are
        stopped and mounted again."""
        with self._lock:
            old = read_json(self.record, "mount record") if self.record.exists() else {}
            again = []
            for path, pid in old.items():
                if _ours(pid) and process.running(pid) and _answers(path):
                    self._procs[path] = _Agent(pid)
                    self._mounted_at[path] = time.time()
                    continue
                if _ours(pid):
                    terminate(pid)
                if is_mounted(path):
                    _detach(path)
                again.append(path)
            self._save()
        back = list(self._procs)
        for path in again:
            try:
                self.mount(path)  # takes the lock
                back.append(path)
            except FasterFSError as e:
                log.error("could not mount %s again: %s", path, e)
        return back

    def _save(self) -> None:
        atomic_write_json(self.record, {p: proc.pid for p, proc in self._procs.items()})

    def check(self, path: str) -> str:
        real = os.path.realpath(path)
        if not os.path.isabs(path):
            raise FasterFSError(f"mount point {path}: give an absolute path")
        if real in self._procs or is_mounted(real):
            raise FasterFSError(f"mount point {path} is already mounted (`fasterfs umount {path}` first)")
        if not os.path.isdir(real):
            raise FasterFSError(f"mount point {path} does not exist or is not a directory on host "
                                f"{os.uname().nodename}: create it first (mkdir -p {path})")
        if os.listdir(real):
            raise FasterFSError(f"mount point {path} is not empty: mounting would hide its files")
        return real

    def mount(self, path: str) -> str:
        with self._lock:
            if self.stopped:
                raise FasterFSError(f"mount point {path}: this node is stopping")
            return self._mount(path)

    def _mount(self, path: str) -> str:
        real = self.check(path)
        log_file = self.log_dir / f"mount-{self._slug(real)}.log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._stats_file(real).unlink(missing_ok=True)
        proc = _Agent(process.spawn_detached(
            [sys.executable, "-m", "fasterfs.read.mount", real, *self.overrides], log_file,
            agent_env(self._stats_file(real))))
        deadline = time.monotonic() + self.timeout
        while not is_mounted(real):
            if proc.poll() is not None or time.monotonic() > deadline:
                terminate(proc.pid)
                raise FasterFSError(f"the FUSE daemon for {path} did not mount it (see {log_file}):\n"
                                    f"{log_tail(log_file)}")
            time.sleep(0.1)
        self._procs[real] = proc
        self._mounted_at[real] = time.time()
        self._save()
        set_read_ahead(real, self.read_ahead_kb)
        return real

    @staticmethod
    def _slug(real: str) -> str:
        return real.strip("/").replace("/", "_") or "root"

    def _stats_file(self, real: str) -> Path:
        """Where the mount's agent writes its daemon's counters (what passthrough hides from it)."""
        return self.log_dir / f"mount-{self._slug(real)}.stats.json"

    def unmount(self, path: str) -> bool:
        with self._lock:
            return self._unmount(path)

    def _unmount(self, path: str) -> bool:
        real = os.path.realpath(path)
        proc = self._procs.pop(real, None)
        if proc is None:
            return False
        r = subprocess.run(["fusermount3", "-u", real], capture_output=True, timeout=30)
        if r.returncode != 0:  # busy: detach now, the kernel lets go when the last user does
            _detach(real)
        terminate(proc.pid)
        self._save()
        return True

    def unmount_all(self) -> int:
        """The node stops: every mount goes, and none is mounted again."""
        with self._lock:
            self.stopped = True
            n = sum(self._unmount(p) for p in list(self._procs))
            self.record.unlink(missing_ok=True)
            return n

    def supervise(self) -> None:
        """Called periodically: a daemon that died or hung is replaced, its mount point cleaned first."""
        with self._lock:
            if not self.stopped:
                self._replace_dead()

    def silent_s(self, path: str) -> float:
        """Seconds since the mount's agent and daemon last spoke (its counters file written),
        or since it was mounted if they have not yet."""
        try:
            heard = self._stats_file(path).stat().st_mtime
        except FileNotFoundError:
            heard = 0.0
        return time.time() - max(heard, self._mounted_at.get(path, 0.0))

    def _replace_dead(self) -> None:
        for path, proc in list(self._procs.items()):
            if proc.poll() is None:
                silent = self.silent_s(path)
                if silent <= self.hung_s:
                    continue
                log.warning("the mount of %s has been silent for %.0f s (mount.hung_s=%s): agent %d stopped, "
                            "mounting again", path, silent, self.hung_s, proc.pid)
                terminate(proc.pid, timeout=2)  # its daemon follows it (PR_SET_PDEATHSIG)
            else:
                log.warning("FUSE daemon of %s exited; mounting again", path)
            del self._procs[path]
            _detach(path)
            self.restarts += 1
            try:
                self._mount(path)
            except FasterFSError as e:
                log.error("%s", e)
                self._save()

    def status(self) -> list[dict]:
        """Each mount: its daemon's PID, whether the daemon runs and whether the kernel still has
        the mount (read from the mount table: a hung daemon cannot hang this)."""
        with self._lock:
            procs = list(self._procs.items())
        out = []
        for path, proc in procs:
            alive = proc.poll() is None
            try:
                daemon = read_json(self._stats_file(path), "mount statistics")
            except (OSError, FasterFSError, ValueError):
                daemon = None  # not written yet
            out.append({"path": path, "pid": proc.pid, "alive": alive, "healthy": alive and is_mounted(path),
                        "daemon": daemon})
        return out


def mount_counts(daemon: dict | None) -> str:
    """What a mount's native daemon counted. Reads of passthrough opens reach no process: the
    kernel reads the cache entry itself, so neither this, the kernel's GET counts nor the
    cache's hit counters see them; only their opens are counted."""
    if not daemon:
        return "(no counters written yet)"
    why = ("" if daemon.get("passthrough_enabled")
           else "; passthrough OFF: the kernel refused it, every read goes through the agent")
    return (f"opens by passthrough {daemon['passthrough_opens']:,} (their reads unseen by any counter), "
            f"through the agent {daemon['agent_opens']:,} ({daemon['reads_forwarded']:,} reads forwarded, "
            f"{daemon.get('reads_cached', 0):,} read from the cache and "
            f"{daemon.get('fetch', {}).get('reads', 0):,} from MinIO by the daemon); requests through "
            f"{'io_uring, a queue per CPU' if daemon.get('uring') else '/dev/fuse'}{why}")


def agent_env(stats_file: Path) -> dict[str, str]:
    """A mount agent's environment: where it writes its daemon's counters; and never Ray's
    auto-connect: a Ray call its threads make while it is not joined (started while the head was
    away, or leaving) would join the latest Ray cluster on the machine, another cluster's (seen:
    an agent beside a test's own Ray); it fails instead."""
    return dict(os.environ, FASTERFS_MOUNT_STATS=str(stats_file), RAY_ENABLE_AUTO_CONNECT="0")


def daemon_overrides(cfg) -> list[str]:
    """What a FUSE daemon on this host needs to find its cluster (its facts then come from the
    Registry): named explicitly, root included, so it never takes the token of another cluster
    under the default root. Called inside the cluster's Ray (a StorageNode)."""
    import ray

    m = cfg.mount
    return [f"cluster.name={cfg.cluster.name}", f"cluster.root={cfg.cluster.root}",
            f"cluster.ray_address={ray.get_runtime_context().gcs_address}",
            f"mount.allow_other={str(m.allow_other).lower()}", f"mount.uid={m.uid}", f"mount.gid={m.gid}",
            f"mount.file_mode='{m.file_mode}'", f"mount.dir_mode='{m.dir_mode}'",
            f"mount.warm_entries={int(m.warm_entries)}", f"mount.max_entries={int(m.max_entries)}",
            f"mount.sweep_mb={int(m.sweep_mb)}"]
