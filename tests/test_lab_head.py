"""The lab's head powered off (every process of it killed at once) while readers on every
storage host read through the mount and through `fasterfs.read.reader.Namespace`, each read checked
against its source read with the standard library; powered on again after a while, it adopts the
hosts that ran on, and takes writes again. The lab is conftest's lab3."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import wait_until
from lab_hosts import PROJECT, on_host

from fasterfs.control.state import leave
from fasterfs.ops import cluster

FFS = str(PROJECT / ".venv/bin/fasterfs")
READER = PROJECT / "bench" / "checked_reader.py"
sys.path.insert(0, str(READER.parent))
import checked_reader  # noqa: E402  (bench/: the readers' own script)

AWAY_S = 12  # the head powered off this long (4x the readers' head_timeout_s)
READ_S = 36  # each reader reads this long from its start: past the power-on (~13 s) and the put


def test_the_head_powered_off_then_on_and_no_read_on_any_host_failed(lab3):
    state, overrides = lab3
    src = Path(tempfile.mkdtemp(prefix="ffs-head-", dir="/var/tmp"))  # every host sees /var/tmp (not /tmp)
    point = f"{state.root}/mnt-head"
    try:
        rng = random.Random(63)
        for i in range(24):
            (src / f"d{i % 3}").mkdir(exist_ok=True)
            (src / f"d{i % 3}/f{i:02d}.bin").write_bytes(rng.randbytes(rng.randrange(1, 300_000)))
        out = subprocess.run([FFS, "put", "-r", str(src), "headloss/", *overrides], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        for n in state.nodes:
            assert on_host(state, n.index, "mkdir", "-p", point).returncode == 0
        out = subprocess.run([FFS, "mount", point, *overrides], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        hosts = [n.ray_node_id for n in state.nodes]
        logs = {"namespace": str(src) + "-ns-", "mount": str(src) + "-mnt-"}
        for dest, log in (("headloss/", logs["namespace"]), (f"{point}/headloss/", logs["mount"])):
            started = subprocess.run([sys.executable, str(READER), json.dumps([overrides, hosts, str(src), dest, log,
                                                                               READ_S])],
                                     capture_output=True, text=True, timeout=300)
            assert started.returncode == 0, started.stderr[-3000:]
        leave()  # this process, a driver on the head's Ray node, is not there when the head goes
        time.sleep(3)
        off = subprocess.run([FFS, "lab", "power-off", "head", *overrides], capture_output=True, text=True,
                             timeout=120)
        assert off.returncode == 0, off.stdout + off.stderr
        began = time.monotonic()
        assert not cluster.is_ray_start(state.head_pid)
        time.sleep(AWAY_S)
        on = subprocess.run([FFS, "lab", "power-on", "head", *overrides], capture_output=True, text=True, timeout=300)
        assert on.returncode == 0, on.stdout + on.stderr
        assert "kept running [0, 1, 2]" in on.stdout, on.stdout
        (src.parent / f"{src.name}-late.bin").write_bytes(b"after the head came back")
        put = subprocess.run([FFS, "put", str(src.parent / f"{src.name}-late.bin"), "headloss-late.bin", *overrides],
                             capture_output=True, text=True, timeout=120)
        assert put.returncode == 0, put.stdout + put.stderr
        time.sleep(max(0.0, READ_S + 5 - (time.monotonic() - began)))
        for how, log in logs.items():
            reads = checked_reader.reads(log, len(hosts))
            bad = [r for r in reads if r["got"] != "ok"]
            assert not bad, (how, bad[:5])
            for i in range(len(hosts)):  # every host's reader read through the absence
                mine = [r for r in reads if r["reader"] == i]
                assert max(r["t"] for r in mine) > READ_S - 5, (how, i)
                if how == "namespace":
                    assert any(r["head"] == "away" for r in mine), (how, i)
    finally:
        state = cluster.ClusterState.load(Path(state.root))
        cluster.connect_ray(state)  # the lab's other tests find this process connected, as the fixture left it
        subprocess.run([FFS, "umount", point, *overrides], capture_output=True, text=True, timeout=300)
        shutil.rmtree(src, ignore_errors=True)
        for leftover in src.parent.glob(f"{src.name}-*"):
            leftover.unlink()
        wait_until(lambda: all(cluster.is_ray_start(n.ray_pid) for n in state.nodes), 5, "the hosts' Ray nodes")
