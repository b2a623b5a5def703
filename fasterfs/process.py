"""Stopping a process FasterFS started, by its PID (never by name)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def terminate(pid: int, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM, then SIGKILL after `timeout`; reaps our own child."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait()


def running(pid: int | None) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie waiting to be reaped)."""
    return pid is not None and pid > 0 and Path(f"/proc/{pid}").exists() and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
