"""Stopping a process FasterFS started, by its PID (never by name)."""
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


def running(pid: int | None) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    return pid is not None and pid > 0 and Path(f"/proc/{pid}").exists() and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
