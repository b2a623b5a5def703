"""The lab's head powered off (every process of it killed at once) while readers on every
storage host read through the mount and through `fasterfs.read.reader.Namespace`, each read checked
against its source read with the standard library; powered on again after a while, it adopts the
hosts that ran on, and takes writes again. The lab is conftest's lab3."""
from __future__ import annotations

import contextlib
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
READ_S = 240  # the readers' bound: they are told to stop once each has read after the put


def per_reader(log: str, hosts: int) -> list[int]:
    """How many reads each reader of `log` has logged."""
    reads = checked_reader.reads(log, hosts)
    return [sum(r["reader"] == i for r in reads) for i in range(hosts)]


def test_the_head_powered_off_then_on_and_no_read_on_any_host_failed(lab3):
    state, overrides = lab3
    src = Path(tempfile.mkdtemp(prefix="ffs-head-", dir="/var/tmp"))  # every host sees /var/tmp (not /tmp)
    point = f"{state.root}/mnt-head"
    logs = {"namespace": str(src) + "-ns-", "mount": str(src) + "-mnt-"}
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
        for dest, log in (("headloss/", logs["namespace"]), (f"{point}/headloss/", logs["mount"])):
            started = subprocess.run([sys.executable, str(READER), json.dumps([overrides, hosts, str(src), dest, log,
                                                                               READ_S])],
                                     capture_output=True, text=True, timeout=300)
            assert started.returncode == 0, started.stderr[-3000:]
        leave()  # this process, a driver on the head's Ray node, is not there when the head goes
        wait_until(lambda: all(min(per_reader(log, len(hosts))) > 0 for log in logs.values()), 60,
                   "a read by every reader before the head goes")
        off = subprocess.run([FFS, "lab", "power-off", "head", *overrides], capture_output=True, text=True,
                             timeout=120)
        assert off.returncode == 0, off.stdout + off.stderr
        assert not cluster.is_ray_start(state.head_pid)
        at_off = {log: per_reader(log, len(hosts)) for log in logs.values()}
        time.sleep(AWAY_S)
        # every reader read whole files while the head was off: one begun and ended in the absence
        at_on = {log: per_reader(log, len(hosts)) for log in logs.values()}
        assert all(a > b + 1 for log in logs.values() for a, b in zip(at_on[log], at_off[log])), (at_off, at_on)
        on = subprocess.run([FFS, "lab", "power-on", "head", *overrides], capture_output=True, text=True, timeout=300)
        assert on.returncode == 0, on.stdout + on.stderr
        assert "kept running [0, 1, 2]" in on.stdout, on.stdout
        (src.parent / f"{src.name}-late.bin").write_bytes(b"after the head came back")
        put = subprocess.run([FFS, "put", str(src.parent / f"{src.name}-late.bin"), "headloss-late.bin", *overrides],
                             capture_output=True, text=True, timeout=120)
        assert put.returncode == 0, put.stdout + put.stderr
        # every reader reads on after the put was acknowledged (a read begun after it), then stops
        at_put = {log: per_reader(log, len(hosts)) for log in logs.values()}
        wait_until(lambda: all(a > b + 1 for log in logs.values() for a, b in zip(per_reader(log, len(hosts)),
                                                                                   at_put[log])),
                   60, "a read by every reader after the put")
        for log in logs.values():
            checked_reader.stop(log)
        wait_until(lambda: all(checked_reader.ended(log, len(hosts)) for log in logs.values()), 60,
                   "the readers to end")
        for how, log in logs.items():
            reads = checked_reader.reads(log, len(hosts))
            bad = [r for r in reads if r["got"] != "ok"]
            assert not bad, (how, bad[:5])
            for i in range(len(hosts)):  # every host's reader read through the absence
                mine = [r for r in reads if r["reader"] == i]
                if how == "namespace":
                    assert any(r["head"] == "away" for r in mine), (how, i)
    finally:
        for log in logs.values():  # readers started stop within a read (on a failure too), before their files go
            checked_reader.stop(log)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: all(checked_reader.ended(log, len(state.nodes)) for log in logs.values()
                                   if Path(log + "0.jsonl").exists()), 60, "the readers to end")
        state = cluster.ClusterState.load(Path(state.root))
        cluster.connect_ray(state)  # the lab's other tests find this process connected, as the fixture left it
        subprocess.run([FFS, "umount", point, *overrides], capture_output=True, text=True, timeout=300)
        shutil.rmtree(src, ignore_errors=True)
        for leftover in src.parent.glob(f"{src.name}-*"):
            leftover.unlink()
        wait_until(lambda: all(cluster.is_ray_start(n.ray_pid) for n in state.nodes), 5, "the hosts' Ray nodes")
