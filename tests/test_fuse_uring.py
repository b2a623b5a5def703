"""The kernel's FUSE-over-io_uring switch is the host's: mounts that want it say so by their
process ids, and it goes back to what it was once none is left (the live mount over io_uring is
tested in tests/test_mount.py). Here against a stand-in parameter file, so that the suite never
flips the real one under mounts that use it."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from fasterfs.read import fuse_uring

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


@pytest.fixture
def switch(tmp_path, monkeypatch):
    param = tmp_path / "enable_uring"
    param.write_text("N\n")
    monkeypatch.setattr(fuse_uring, "PARAM", param)
    monkeypatch.setattr(fuse_uring, "USERS", tmp_path / "users")
    return param


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_switch_stays_on_while_a_mount_needs_it_and_goes_back_after_the_last(switch):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert fuse_uring.enable(alive.pid) and switch.read_text() == "Y"
        assert fuse_uring.enable(dead_pid()) and switch.read_text() == "Y"  # on already: nothing to remember
        fuse_uring.release(None)  # `down`: the dead mount is forgotten, the live one keeps it on
        assert switch.read_text() == "Y"
        assert sorted(p.name for p in fuse_uring.USERS.iterdir() if p.name.isdigit()) == [str(alive.pid)]
        fuse_uring.release(alive.pid)
        assert switch.read_text().strip() == "N"  # as it was before the first mount
        assert not (fuse_uring.USERS / fuse_uring.BEFORE).exists()
    finally:
        alive.kill()
        alive.wait()


def test_a_switch_found_on_is_left_on(switch):
    switch.write_text("Y\n")
    assert fuse_uring.enable(123456789)
    fuse_uring.release(123456789)
    assert switch.read_text().strip() == "Y"


def test_a_kernel_without_it_is_said_and_the_mount_uses_dev_fuse(switch, caplog):
    caplog.set_level(logging.INFO, logger=fuse_uring.__name__)
    switch.unlink()
    assert not fuse_uring.enable(1)
    assert "no FUSE over io_uring" in caplog.text
