"""A process started detached (a StorageNode's MinIO and mounts' agents): no child of its
starter and in a session of its own, as the kernel records it (so Ray's killing of a worker's
children and process group spares it), and alive after its starter has gone."""
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


def test_a_detached_process_is_no_child_of_its_starter_and_outlives_it(tmp_path):
    code = ("import os, sys; from fasterfs.core import process; from pathlib import Path; "
            "print(process.spawn_detached([sys.executable, '-c', 'print(\\'up\\', flush=True); "
            "import time; time.sleep(60)'], Path(sys.argv[1]), dict(os.environ)))")
    starter = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.log")], capture_output=True, text=True,
                             timeout=30, check=True)  # it has exited: what it started lives on
    pid = int(starter.stdout)
    try:
        fields = _stat(pid)
        assert int(fields[1]) != os.getpid()  # its parent is not this process (nor its starter, gone)
        assert int(fields[3]) != os.getsid(0) and int(fields[2]) != os.getpgid(0)  # session, group of its own
        wait_until(lambda: (tmp_path / "out.log").read_text() == "up\n", 10, "its output in the log")
        assert process.running(pid)
    finally:
        process.terminate(pid, 5)
    assert not process.running(pid)
