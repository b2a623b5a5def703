"""A process started detached (a StorageNode's MinIO and mounts' agents): no child of its
starter and in a session of its own, as the kernel records it (so Ray's killing of a worker's
children and process group spares it), and stopped once the process it is tied to (the node's
raylet) ends."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

from fasterfs.core import process

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_a_detached_process_outlives_its_starter_and_ends_with_what_it_is_tied_to(tmp_path):
    tie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid = process.spawn_detached([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
                                     tmp_path / "out.log", dict(os.environ), tied_to=tie.pid)
        fields = _stat(pid)
        assert int(fields[1]) != os.getpid()  # its parent is not this process
        assert int(fields[3]) != os.getsid(0) and int(fields[2]) != os.getpgid(0)  # session, group of its own
        wait_until(lambda: (tmp_path / "out.log").read_text() == "up\n", 10, "its output in the log")
        assert process.running(pid)
        tie.kill()
        tie.wait()
        wait_until(lambda: not process.running(pid), 10, "the detached process stopped after its tie ended")
    finally:
        tie.kill()
        tie.wait()
