"""The head's disk lost, on a cluster of its own: every name a `put -r` had acknowledged is held
on each storage host's disk (read there with the standard library's sqlite3), and `up` on the
blank head takes the names and keys back from the hosts; every file then reads as its source.
Without a copy anywhere, `up` refuses to start an empty namespace over the stored objects."""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cluster_overrides

from fasterfs import cluster, config
from fasterfs.errors import FasterFSError
from fasterfs.meta.replica import FILE as REPLICA_FILE
from fasterfs.reader import Namespace

CLI = str(Path(sys.executable).parent / "fasterfs")


def tree(root: Path, files: int) -> dict[str, bytes]:
    rng = __import__("random").Random(63)
    out = {f"d{i % 4}/f{i:03d}.bin": rng.randbytes(rng.randrange(1, 40_000)) for i in range(files)}
    for rel, data in out.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return out


def replica_names(path: Path) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {n for (n,) in db.execute("SELECT name FROM names")}
    finally:
        db.close()


def lose_the_heads_disk(root: Path, away: Path) -> list[str]:
    """Everything under the root that is not a storage node's directory, moved away."""
    away.mkdir()
    moved = sorted(p.name for p in root.iterdir() if not p.name.startswith("node-"))
    for name in moved:
        shutil.move(str(root / name), str(away / name))
    return moved


@pytest.fixture
def own(tmp_path_factory):
    root = Path(str(tmp_path_factory.mktemp("hl"))[:60])
    overrides = cluster_overrides(root, "127.0.6.2", 5, nodes=2) + ["dashboard.enabled=false", "replicas=2"]
    yield root, overrides
    try:
        cluster.down(config.load(overrides))
    except FasterFSError:
        pass  # already down (or never up)


def test_a_head_that_lost_its_disk_takes_every_name_back_from_the_hosts(own, tmp_path):
    root, overrides = own
    files = tree(tmp_path / "src", 40)
    cluster.up(config.load(overrides))
    out = subprocess.run([CLI, "put", "-r", str(tmp_path / "src"), "team/", "files.batch_files=10"] + overrides,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    wanted = {f"team/{rel}" for rel in files}
    for node in (0, 1):  # acknowledged: on each host's disk, as another reader of the file finds it
        assert replica_names(root / f"node-{node}" / REPLICA_FILE) == wanted
    cluster.down(config.load(overrides))

    moved = lose_the_heads_disk(root, tmp_path / "away")
    assert "namespace.sqlite" in moved and "credentials.json" in moved
    state = cluster.up(config.load(overrides))
    assert state.recovered is not None and state.recovered["namespace"]["names"] == len(files)
    assert state.recovered["keys"].endswith("cluster-keys.json")
    ns = Namespace(config.load(overrides))
    for rel, data in files.items():
        assert ns.cat(f"team/{rel}") == data, rel
    # the recovered head takes writes again, held on the hosts as before
    (tmp_path / "late.bin").write_bytes(b"after the head came back")
    out = subprocess.run([CLI, "put", str(tmp_path / "late.bin"), "team/late.bin"] + overrides,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "team/late.bin" in replica_names(root / "node-1" / REPLICA_FILE)

    # no copy of the names anywhere, the objects still stored: refused, naming them, nothing left running
    cluster.down(config.load(overrides))
    lose_the_heads_disk(root, tmp_path / "away2")
    for node in (0, 1):
        for f in (root / f"node-{node}").glob(REPLICA_FILE + "*"):
            f.unlink()
    with pytest.raises(FasterFSError, match=r"no host holds a replica of it, yet .*node-0.* hold objects"):
        cluster.up(config.load(overrides))
    assert not (root / "cluster.json").exists()
