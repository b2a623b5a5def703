"""The cluster's own cgroup v2: every process FasterFS starts (Ray nodes, and through
them the workers, actors and MinIO servers) lives in it.

That gives `down` an exact list of what the project started, without looking
processes up by name, and gives the kernel issue's SOCK_OPS program a scope that
touches nothing else on the machine. Hosts with only cgroup v1 get a cgroup2
hierarchy mounted under the cluster root, unmounted again on removal.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .errors import FasterFSError


def own_cgroup(allow_root: bool = False) -> Path | None:
    """The cgroup v2 directory this process lives in, or None (no cgroup2, or the root
    unless allow_root)."""
    mount = cgroup2_mount()
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if mount is None or rel is None or (rel == "/" and not allow_root):
        return None
    return mount / rel.lstrip("/")


def cgroup2_mount() -> Path | None:
    """An existing cgroup2 mount point, if the host has one."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    except OSError:
        pass
    return None


class ProjectCgroup:
    """A child cgroup named after the cluster; `path` is None where cgroup v2 is unavailable."""

    def __init__(self, path: Path | None, mounted_at: Path | None = None):
        self.path, self.mounted_at = path, mounted_at

    @classmethod
    def create(cls, name: str, root: Path) -> ProjectCgroup:
        base, mounted = cgroup2_mount(), None
        if base is None:
            mnt = root / "cgroup2"
            mnt.mkdir(parents=True, exist_ok=True)
            if subprocess.run(["mount", "-t", "cgroup2", "none", str(mnt)], capture_output=True).returncode == 0:
                base = mounted = mnt
        if base is None:
            return cls(None)
        path = base / f"fasterfs-{name}"
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            raise FasterFSError(f"cannot create cgroup {path}: {e.strerror} (FasterFS runs as root)") from None
        return cls(path, mounted)

    def to_dict(self) -> dict:
        return {"path": str(self.path) if self.path else None,
                "mounted_at": str(self.mounted_at) if self.mounted_at else None}

    @classmethod
    def from_dict(cls, d: dict) -> ProjectCgroup:
        return cls(Path(d["path"]) if d.get("path") else None, Path(d["mounted_at"]) if d.get("mounted_at") else None)

    def spawn(self, args: list[str], log_path: Path, env: dict | None = None,
              child: str | None = None) -> subprocess.Popen:
        """Start a process inside the cgroup (or its `child` cgroup), in a session of its own.

        A small shell writes its own PID into cgroup.procs and then execs the command, so
        the process and all it forks land in the cgroup. (A Python preexec_fn would run in a
        fork of this multi-threaded process, where it can deadlock on a lock another thread
        held at fork time.)"""
        if self.path:
            target = self.path / child if child else self.path
            target.mkdir(exist_ok=True)
            args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(target / "cgroup.procs"), *args]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)

    def pids(self, child: str | None = None) -> list[int]:
        """Every process in the cgroup (or its `child` cgroup) and the cgroups below."""
        top = self.path / child if self.path and child else self.path
        if not top or not top.exists():
            return []
        pids = []
        for directory, _, _ in os.walk(top):
            try:
                pids += [int(p) for p in Path(directory, "cgroup.procs").read_text().split()]
            except OSError:
                pass  # removed while we walked
        return pids

    def kill_all(self, timeout: float = 10.0, child: str | None = None) -> int:
        """SIGKILL whatever is left in the cgroup (or its `child` cgroup); returns how many
        processes that was."""
        left = self.pids(child)
        if not left or self.path is None:  # (no cgroup: pids() found none)
            return 0
        kill_file = (self.path / child if child else self.path) / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
        else:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        while self.pids(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(left)

    def remove(self) -> None:
        if self.path and self.path.exists():
            self.kill_all()
            # children first; the kernel frees a cgroup a moment after its last process
            for directory in sorted((Path(d) for d, _, _ in os.walk(self.path)), key=lambda p: -len(p.parts)):
                for _attempt in range(50):
                    try:
                        directory.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)
                else:
                    raise FasterFSError(f"cgroup {directory} could not be removed")
        if self.mounted_at:
            subprocess.run(["umount", str(self.mounted_at)], capture_output=True)
            try:
                self.mounted_at.rmdir()
            except OSError:
                pass
