"""Starting a process that outlives its starter, and stopping a process FasterFS started, by its
PID (never by name)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def terminate(pid: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM, then SIGKILL after `timeout`; reaps our own child."""
    terminate_all([pid], timeout)
    if proc is not None:
        proc.wait()


def terminate_all(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM to every one at once, then SIGKILL to those still running after `timeout`: they
    stop side by side (a Ray node takes seconds to stop its processes; one after the other, the
    seconds add up)."""
    left = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            left.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if running(pid)]
        if left:
            time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def spawn_detached(argv: list[str], log_path: Path, env: dict) -> int:
    """Start `argv` in a session of its own and as no child of this process, its output appended
    to `log_path`, and return its pid: it outlives this process however that ends (Ray kills a
    worker's children and its process group with the worker; a server one StorageNode hands to
    the next must be neither): a shell in a new session starts it in the background and exits."""
    out = subprocess.run(["sh", "-c", 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!', "sh", str(log_path),
                          *argv], env=env, capture_output=True, text=True, check=True, timeout=30,
                         start_new_session=True)
    return int(out.stdout)


def running(pid: int | None) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    return pid is not None and pid > 0 and Path(f"/proc/{pid}").exists() and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """Exited and waiting to be reaped: its main thread a zombie and no other thread left (a
    process whose other threads are still exiting holds its sockets and files)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
                and len(os.listdir(f"/proc/{pid}/task")) <= 1)
    except OSError:
        return True
