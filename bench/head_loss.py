"""The head's loss, measured (issue 63), on clusters of their own at roots under /var/tmp:

1. durability's cost (`fasterfs up`: the head is node 0's machine): `put -r` of
   bench.head_loss_put_files files of 1-8 KiB and single `put`s (their median latency), with
   cluster.durable_copies=2 (every change fsynced on a storage host before it is acknowledged)
   and =1 (the head's store alone), alternating, in one run;
2. a lab of 3 storage hosts and a head of its own: the head powered off (`fasterfs lab power-off
   head`) under readers on every host, through the mount and through a Namespace
   (bench/checked_reader.py, every read checked against its source), and on again after
   bench.head_loss_outage_s: reads failed or wrong, the slowest, time from `power-on` to the
   first accepted `put`;
3. the head's disk lost (`fasterfs up`, down, then everything under the root but the storage
   nodes' directories moved away) at bench.head_loss_files names stored by `put -r` (1,000
   sampled files read back and compared) and at bench.head_loss_large names written into the
   store directly (as bench/node_start.py: names alone): `fasterfs up`'s recovery time, the
   names back (counted by the Registry, beside sqlite3's count of a replica), the first accepted
   `put` after.

    python bench/head_loss.py [bench.head_loss_parts=[lab]] [bench.head_loss_outage_s=600]

Writes head_loss.json to <output_dir>/bench-head-loss-<time>/.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import checked_reader
from namespace_store import BATCH, batch
from scan import placed

from fasterfs.control import registry, report
from fasterfs.control.state import ClusterState, leave
from fasterfs.core import config
from fasterfs.meta import NamespaceStore, open_engine
from fasterfs.meta.replica import FILE as REPLICA_FILE
from fasterfs.ops import lab
from fasterfs.read.reader import Namespace

CLI = [sys.executable, "-m", "fasterfs.ui.cli"]


def run(*args: str, timeout: float = 3600) -> float:
    """A `fasterfs` command, its wall time; its output with the error if it fails."""
    t = time.perf_counter()
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"fasterfs {args[0]} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return time.perf_counter() - t


def tree(root: Path, files: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(files):
        p = root / f"d{i // 1000:03d}" / f"f{i:07d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(1024, 8192)))


def lose_heads_disk(root: Path, away: Path) -> None:
    away.mkdir()
    for p in root.iterdir():
        if not p.name.startswith("node-"):
            shutil.move(str(p), str(away / p.name))


def first_put(own: list[str], work: Path) -> float:
    f = work / "after.bin"
    f.write_bytes(os.urandom(1000))
    return run("put", str(f), f"after/{time.time_ns()}.bin", *own)


def durability(work: Path, where: list[str], files: int, rounds: int = 2) -> list[dict]:
    src = work / "put-src"
    tree(src, files, 1)
    one = work / "one.bin"
    one.write_bytes(os.urandom(4096))
    out = []
    for r in range(rounds):
        for copies in (2, 1) if r % 2 == 0 else (1, 2):
            own = [f"cluster.root={work / f'dur-{r}-{copies}'}", "nodes=2", "replicas=2", "dashboard.enabled=false",
                   "cluster.name=ffs-head-loss", f"cluster.durable_copies={copies}", *where]
            run("up", *own)
            try:
                put_r = run("put", "-r", str(src), "bulk/", *own)
                single = [run("put", str(one), f"one/{i}.bin", *own) for i in range(10)]
            finally:
                run("down", *own)
            out.append({"durable_copies": copies, "round": r, "put_r_files_per_s": files / put_r,
                        "put_median_s": statistics.median(single)})
    return out


def head_powered_off(work: Path, where: list[str], files: int, outage_s: float) -> dict:
    """A lab of 3 storage hosts and a head of its own (`lab=unlimited`); the files stored with
    `put -r` and mounted on every host; readers on every host through the mount and through a
    Namespace; the head powered off for `outage_s`, then on."""
    root = work / "lab"
    src = Path(tempfile.mkdtemp(prefix="ffs-bench-head-", dir="/var/tmp"))  # every lab host sees /var/tmp
    tree(src, files, 2)
    own = [f"cluster.root={root}", "lab=unlimited", "lab.subnet=198.18.9", "cluster.name=ffs-head-loss", *where]
    run("lab", "up", "--nodes", "3", *own)
    point = f"{root}/mnt"
    try:
        run("put", "-r", str(src), "team/", *own)
        state = ClusterState.load(root)
        for n in state.nodes:
            subprocess.run(lab.exec_args(state, n.index, ["mkdir", "-p", point]), check=True, timeout=120)
        run("mount", point, *own)
        hosts = [n.ray_node_id for n in state.nodes]
        seconds = outage_s + 60
        logs = {"namespace": str(work / "ns-"), "mount": str(work / "mnt-")}
        for dest, log in (("team/", logs["namespace"]), (f"{point}/team/", logs["mount"])):
            subprocess.run([sys.executable, str(Path(__file__).parent / "checked_reader.py"),
                            json.dumps([own, hosts, str(src), dest, log, seconds])], check=True, timeout=300)
        time.sleep(5)
        run("lab", "power-off", "head", *own)
        off = time.monotonic()
        time.sleep(outage_s)
        began = time.monotonic()
        up_s = run("lab", "power-on", "head", *own)
        put_s = first_put(own, work)
        to_put = time.monotonic() - began
        time.sleep(max(0.0, seconds + 5 - (time.monotonic() - off)))
        out = {"files": files, "outage_s": outage_s, "hosts": len(hosts), "power_on_s": up_s,
               "power_on_to_first_put_s": to_put, "put_s": put_s}
        run("umount", point, *own)
        # then lost with its disk: a blank head takes the names and keys back from the hosts
        names_before = registry.names_count(Namespace(config.load(own)).state.name)
        leave()
        run("lab", "power-off", "head", *own)
        began = time.monotonic()
        out["blank_power_on_s"] = run("lab", "power-on", "head", "--empty", *own)
        first_put(own, work)
        out["blank_power_on_to_first_put_s"] = time.monotonic() - began
        ns = Namespace(config.load(own))
        out["blank_names_before"], out["blank_names_back"] = names_before, registry.names_count(ns.state.name) - 1
        paths = sorted(p for p in src.rglob("*") if p.is_file())
        out["blank_sampled"] = len(paths)
        out["blank_wrong"] = sum(ns.cat("team/" + str(p.relative_to(src))) != p.read_bytes() for p in paths)
        for how, log in logs.items():  # (their logs, written before the blank head restarted the hosts)
            reads = checked_reader.reads(log, len(hosts))
            bad = [r for r in reads if r["got"] != "ok"]
            out[how] = {"reads": len(reads), "failed_or_wrong": len(bad), "examples": bad[:3],
                        "slowest_read_s": max(r["s"] for r in reads),
                        "p99_read_s": statistics.quantiles([r["s"] for r in reads], n=100)[98],
                        "reads_while_head_away": sum(r["head"] == "away" for r in reads)}
        return out
    finally:
        leave()
        subprocess.run([*CLI, "lab", "down", *own], capture_output=True, timeout=600)
        shutil.rmtree(src, ignore_errors=True)


def head_disk(work: Path, where: list[str], files: int, via_put: bool) -> dict:
    root = work / f"disk-{files}"
    own = [f"cluster.root={root}", "nodes=2", "replicas=2", "dashboard.enabled=false", "cluster.name=ffs-head-loss",
           "repair.auto=false", "cluster.start_timeout_s=900", *where]
    src = work / f"disk-src-{files}"
    load: dict = {}
    run("up", *own)
    if via_put:
        tree(src, files, 3)
        load["put_r_s"] = run("put", "-r", str(src), "team/", *own)
    else:  # the names alone, into the head's store; the nodes take them whole as they start
        run("down", *own)
        store = NamespaceStore(open_engine("sqlite", root), "ffs-head-loss", lambda method, arg: [])
        t = time.perf_counter()
        for start in range(0, files, BATCH):
            store.publish_batch(batch(start, "g1")[:files - start])
        load["fill_s"] = time.perf_counter() - t
        store.engine.close()
        load["up_taking_them_s"] = run("up", *own)
    run("down", *own)
    with sqlite3.connect(root / "node-1" / REPLICA_FILE) as db:
        replica_rows = db.execute("SELECT count(*) FROM names").fetchone()[0]
    lose_heads_disk(root, work / f"away-{files}")
    try:
        began = time.monotonic()
        up_s = run("up", *own)
        put_s = first_put(own, work)
        to_put = time.monotonic() - began
        state = ClusterState.load(root)
        ns = Namespace(config.load(own))
        names = registry.names_count(ns.state.name) - 1  # but the put after
        sampled = wrong = 0
        if via_put:
            paths = sorted(p for p in src.rglob("*") if p.is_file())
            for p in random.Random(4).sample(paths, min(1000, len(paths))):
                sampled += 1
                wrong += ns.cat("team/" + str(p.relative_to(src))) != p.read_bytes()
        return {"files": files, "via": "put -r" if via_put else "the store directly", **load,
                "replica_rows": replica_rows, "names_back": names, "recovered": state.recovered and
                {k: v for k, v in state.recovered.items() if k != "found"}, "up_s": up_s,
                "up_to_first_put_s": to_put, "put_s": put_s, "sampled": sampled, "wrong": wrong}
    finally:
        leave()
        run("down", *own)


def durability_targets(d: list[dict]) -> dict[str, bool]:
    with_, without = ([r for r in d if r["durable_copies"] == c] for c in (2, 1))
    ratio = statistics.median(r["put_r_files_per_s"] for r in with_) / \
        statistics.median(r["put_r_files_per_s"] for r in without)
    latency = statistics.median(r["put_median_s"] for r in without) / \
        statistics.median(r["put_median_s"] for r in with_)
    return {f"put -r files/s with durability / without >= 0.8 ({ratio:.2f})": ratio >= 0.8,
            f"one put's speed with durability / without >= 0.8 ({latency:.2f})": latency >= 0.8}


def lab_targets(g: dict) -> dict[str, bool]:
    bad = g["namespace"]["failed_or_wrong"] + g["mount"]["failed_or_wrong"]
    reads = g["namespace"]["reads"] + g["mount"]["reads"]
    return {
        f"head powered off {g['outage_s']:.0f} s: 0 failed, 0 wrong reads on the hosts ({bad} of {reads})": bad == 0,
        f"head powered on: to the first accepted put <= 30 s ({g['power_on_to_first_put_s']:.1f} s)":
            g["power_on_to_first_put_s"] <= 30,
        f"lab head back blank: every name back ({g['blank_names_back']:,} of {g['blank_names_before']:,}), every "
        f"file equal ({g['blank_sampled'] - g['blank_wrong']} of {g['blank_sampled']})":
            g["blank_names_back"] == g["blank_names_before"] and g["blank_wrong"] == 0,
        f"lab head back blank: to the first accepted put <= 120 s ({g['blank_power_on_to_first_put_s']:.1f} s)":
            g["blank_power_on_to_first_put_s"] <= 120}


def disk_targets(runs: list[dict]) -> dict[str, bool]:
    small = runs[0]
    return {
        f"head's disk lost: every name back ({small['names_back']:,} of {small['files']:,}), sampled files equal "
        f"({small['sampled'] - small['wrong']} of {small['sampled']})":
            small["names_back"] == small["files"] and small["wrong"] == 0,
        f"head's disk lost: up to the first accepted put <= 120 s ({small['up_to_first_put_s']:.1f} s)":
            small["up_to_first_put_s"] <= 120}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    b = cfg.bench
    where = placed(argv)
    parts = {"durability": (lambda w: durability(w, where, int(b.head_loss_put_files)), durability_targets),
             "lab": (lambda w: head_powered_off(w, where, 200, float(b.head_loss_outage_s)), lab_targets),
             "disk": (lambda w: [head_disk(w, where, int(b.head_loss_files), True),
                                 head_disk(w, where, int(b.head_loss_large), False)], disk_targets)}
    unknown = set(b.head_loss_parts) - set(parts)
    if unknown:
        raise SystemExit(f"option bench.head_loss_parts: {sorted(unknown)} are not among {sorted(parts)}")
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-head-loss-", dir="/var/tmp"))
    result: dict = {"targets": {}}
    try:
        for name in b.head_loss_parts:
            measure, targets = parts[name]
            result[name] = measure(work)
            result["targets"].update(targets(result[name]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = report.write_json(report.run_dir(cfg, "bench-head-loss"), "head_loss.json", result)
    print(json.dumps(result, indent=1, default=str))
    print(json.dumps({"targets": result["targets"], "report": str(out)}, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
