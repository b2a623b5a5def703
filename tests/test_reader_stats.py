"""Readers' counters on a disk that is full: a reader goes on reading, its reads uncounted.

A real ext4 image, loop-mounted (root), filled to its last block; the reader is a separate
process so that a SIGBUS (what a store into a mapped hole on a full disk is) shows as its exit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fasterfs.hosts import lab_disks

COUNT_IN = """
import sys
from pathlib import Path
from fasterfs.read import reader_stats
stats = reader_stats.for_process(Path(sys.argv[1]))
for _ in range(1000):
    stats.add(reader_stats.HITS)
print(type(stats).__name__)
"""


@pytest.fixture
def full_disk(tmp_path):
    """An ext4 disk of its own with no block left for a new file, even one the kernel would
    take from its own reserve; its directory `readers/` made before it filled."""
    disks, mounted = lab_disks.prepare(tmp_path, ["full"], 16)
    disk = disks[0]
    try:
        (disk / "readers").mkdir()
        lab_disks.fill(disk)
        for n in range(100_000):  # the last blocks, one small file each, until the disk refuses
            fd = os.open(disk / f"last-{n}", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, 4096)
            except OSError:
                break
            finally:
                os.close(fd)
        yield disk
    finally:
        lab_disks.release(mounted)


def _count(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", COUNT_IN, str(directory)], capture_output=True, text=True,
                          timeout=60)


def test_a_reader_whose_disk_is_full_reads_on_uncounted(full_disk):
    # the positive control: what the file system says of a new file now
    fd = os.open(full_disk / "probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="No space left"):
            os.posix_fallocate(fd, 0, 4096)
    finally:
        os.close(fd)
    done = _count(full_disk / "readers")
    assert done.returncode == 0, (-done.returncode == signal.SIGBUS, done.stderr[-2000:])
    assert done.stdout.split() == ["Uncounted"]
    assert "readers" in done.stderr and "No space left" in done.stderr  # the log says where and why
    assert list((full_disk / "readers").iterdir()) == []  # no file left half-made


def test_a_reader_counts_where_the_disk_has_room(tmp_path):
    done = _count(tmp_path)
    assert done.returncode == 0, done.stderr
    files = list(tmp_path.glob("*.stats"))
    assert len(files) == 1
    # the counter as the file holds it, read with the standard library: the first field, little-endian
    assert int.from_bytes(files[0].read_bytes()[:8], "little") == 1000
