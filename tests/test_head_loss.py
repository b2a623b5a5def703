"""The head lost twice on a cluster of its own. Its GCS killed: readers on a storage host read
on and `up` adopts the nodes that outlived it. Then its disk lost: every name a `put -r` had
acknowledged is held on each storage host's disk (read there with the standard library's
sqlite3), and `up` on the blank head takes the names and keys back from the hosts; every file then
reads as its source. Without a copy anywhere, `up` refuses to start an empty namespace over the
stored objects."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cluster_overrides, mounts_under, wait_until

from fasterfs.control.state import leave
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.meta.replica import FILE as REPLICA_FILE
from fasterfs.ops import cluster
from fasterfs.read.reader import Namespace

CLI = str(Path(sys.executable).parent / "fasterfs")
READER = Path(__file__).resolve().parents[1] / "bench" / "checked_reader.py"
sys.path.insert(0, str(READER.parent))
import checked_reader  # noqa: E402  (bench/: the readers' own script)


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
    assert not mounts_under(str(root)), "a mount (bpffs, cgroup2) of the cluster is left"


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def read_count(logs: str) -> int:
    return len(checked_reader.reads(logs, 1))


@pytest.mark.timeout(600)  # two outages of the head, each with `up` again: 150 s under CI
def test_the_head_gone_its_gcs_then_its_disk_and_no_name_or_read_is_lost(own, tmp_path):
    """One cluster, two losses of its head. Its GCS killed: readers on a storage host go on,
    commands read from the host's copy of the names, `up` adopts the nodes that outlived it, and a
    load cut by the loss shows whole batches only. Then its disk lost: every name acknowledged
    is on each host's disk (read there with sqlite3), and `up` on the blank head takes the names
    and keys back from the hosts; without a copy anywhere, `up` refuses."""
    root, overrides = own
    files = tree(tmp_path / "src", 40)
    state = cluster.up(config.load(overrides))
    out = subprocess.run([CLI, "put", "-r", str(tmp_path / "src"), "team/", "files.batch_files=10"] + overrides,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for node in (0, 1):  # acknowledged: on each host's disk, as another reader of the file finds it
        assert replica_names(root / f"node-{node}" / REPLICA_FILE) == {f"team/{rel}" for rel in files}
    node1 = next(n for n in state.nodes if n.address != state.head_address)
    logs = str(tmp_path / "reads-")
    args = json.dumps([overrides, [node1.ray_node_id], str(tmp_path / "src"), "team/", logs, 240])
    started = subprocess.run([sys.executable, str(READER), args], capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    leave()  # this process is no driver of the head's node when it goes
    # a load of many batches under way when the head goes: seen begun on node 1's disk, not yet done
    bulk = {f"d{i % 5}/b{i:04d}": i.to_bytes(4, "big") * (1 + i % 300) for i in range(600)}
    for rel, data in bulk.items():
        (tmp_path / "bulk" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "bulk" / rel).write_bytes(data)
    load = subprocess.Popen([CLI, "put", "-r", str(tmp_path / "bulk"), "bulk/", "files.batch_files=50",
                             "files.threads=1"] + overrides, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    replica = root / "node-1" / REPLICA_FILE
    deadline = time.monotonic() + 120
    while not any(n.startswith("bulk/") for n in replica_names(replica)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert load.poll() is None, load.communicate()[0]
    gcs = [p for p in children(state.head_ray_pid) if Path(f"/proc/{p}/comm").read_text().strip() == "gcs_server"]
    assert len(gcs) == 1
    os.kill(gcs[0], signal.SIGKILL)  # the head's GCS, and with it the head's Ray node, gone at once
    killed = time.monotonic()
    # commands started while the head is away read from this host's copy of the names
    src = tmp_path / "src"
    for rel in ("d0/f000.bin", "d3/f011.bin"):
        cat = subprocess.run([CLI, "cat", f"team/{rel}"] + overrides, capture_output=True, timeout=60)
        assert cat.returncode == 0 and cat.stdout == (src / rel).read_bytes(), cat.stderr[-2000:]
    assert b"nothing answers there" in cat.stderr and b"namespace copy" in cat.stderr, cat.stderr[-2000:]
    ls = subprocess.run([CLI, "ls", "team/d1"] + overrides, capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0, ls.stderr[-2000:]
    assert sorted(line.split()[-1] for line in ls.stdout.splitlines()) == \
        sorted(f"team/d1/{p.name}" for p in (src / "d1").iterdir())
    # a client connected while the head is away: this host's copy names the file, the keys' copy reads it
    code = ("import sys, fasterfs; c = fasterfs.connect(overrides=sys.argv[1:], dataset='team/d0/f000.bin'); "
            "sys.stdout.buffer.write(c.read_chunk(0))")
    got = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True, timeout=60)
    assert got.returncode == 0 and got.stdout == (src / "d0/f000.bin").read_bytes(), got.stderr[-2000:]
    print(f"cat, ls and connect() while the head was away: {time.monotonic() - killed:.1f} s")
    wait_until(lambda: any(r["head"] == "away" for r in checked_reader.reads(logs, 1)), 60,
               "a read on node 1 that found the head away")
    back = subprocess.run([CLI, "up"] + overrides, capture_output=True, text=True, timeout=300)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "started again beside nodes that outlived it: kept running [1]" in back.stdout, back.stdout
    (tmp_path / "late.bin").write_bytes(b"written once the head is back")
    put = subprocess.run([CLI, "put", str(tmp_path / "late.bin"), "team/late.bin"] + overrides,
                         capture_output=True, text=True, timeout=120)
    assert put.returncode == 0, put.stdout + put.stderr
    accepted_s = time.monotonic() - killed
    at_put = read_count(logs)
    wait_until(lambda: read_count(logs) > at_put + 1, 60, "a read begun after the put")  # and after the absence
    checked_reader.stop(logs)
    wait_until(lambda: checked_reader.ended(logs, 1), 60, "the reader to end")
    reads = checked_reader.reads(logs, 1)
    bad = [r for r in reads if r["got"] != "ok"]
    assert not bad, bad[:5]
    away = [r for r in reads if r["head"] == "away"]
    assert away and len(reads) > at_put + 1  # read through the absence, and after it
    print(f"reads {len(reads)}, {len(away)} while the head was away, the slowest {max(r['s'] for r in reads)} s; "
          f"first accepted put {accepted_s:.1f} s after the kill")

    # the load cut by the head's loss (node 0's MinIO went with it): it fails saying so, whole batches
    # only are named (on both hosts' disks alike), each as its source; run again, it completes
    said = load.communicate(timeout=300)[0]
    assert load.returncode == 1 and "fasterfs put: error:" in said, said[-2000:]
    print(f"the load cut by the head's loss: {said.strip().splitlines()[-1]}")
    ns = Namespace(config.load(overrides))
    named = {n for n in replica_names(replica) if n.startswith("bulk/")}
    assert 0 < len(named) < len(bulk) and len(named) % 50 == 0, len(named)
    assert {n for n in replica_names(root / "node-0" / REPLICA_FILE) if n.startswith("bulk/")} == named
    for name in sorted(named)[::37]:
        assert ns.cat(name) == bulk[name[len("bulk/"):]], name
    again = subprocess.run([CLI, "put", "-r", str(tmp_path / "bulk"), "bulk/"] + overrides,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {n for n in replica_names(replica) if n.startswith("bulk/")} == {f"bulk/{rel}" for rel in bulk}
    ns = Namespace(config.load(overrides))
    for rel in sorted(bulk)[::29]:
        assert ns.cat(f"bulk/{rel}") == bulk[rel], rel
    named = replica_names(replica)

    # the head's disk lost: `up` on the blank head takes every name and the keys back from the hosts
    cluster.down(config.load(overrides))
    moved = lose_the_heads_disk(root, tmp_path / "away")
    assert "namespace.sqlite" in moved and "credentials.json" in moved
    state = cluster.up(config.load(overrides))
    assert state.recovered is not None and state.recovered["namespace"]["names"] == len(named)
    assert state.recovered["keys"].endswith("cluster-keys.json")
    ns = Namespace(config.load(overrides))
    for rel, data in files.items():
        assert ns.cat(f"team/{rel}") == data, rel
    for rel in sorted(bulk)[::41]:
        assert ns.cat(f"bulk/{rel}") == bulk[rel], rel
    # the recovered head takes writes again, held on the hosts as before
    (tmp_path / "later.bin").write_bytes(b"after the head came back blank")
    out = subprocess.run([CLI, "put", str(tmp_path / "later.bin"), "team/later.bin"] + overrides,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "team/later.bin" in replica_names(root / "node-1" / REPLICA_FILE)

    # no copy of the names anywhere, the objects still stored: refused, naming them, nothing left running
    cluster.down(config.load(overrides))
    lose_the_heads_disk(root, tmp_path / "away2")
    for node in (0, 1):
        for f in (root / f"node-{node}").glob(REPLICA_FILE + "*"):
            f.unlink()
    with pytest.raises(FasterFSError, match=r"no host holds a replica of it, yet .*node-0.* hold objects"):
        cluster.up(config.load(overrides))
    assert not (root / "cluster.json").exists()
