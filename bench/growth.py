"""Demo B live (issue 66): a lab of 2 storage hosts serving a read workload, then 2 more hosts
added to the same running cluster in one step (`fasterfs lab add-host 2`), in one run:

- aggregate read MB/s before, while the data moves and after, each host reading the chunks
  whose first copy the namespace puts on it (locality, as Demo B), every chunk checked against
  its stored xxh3 by the reader, no chunk made hot (kernel.hot_threshold past any count: a
  fill would share the host's disk with the readers); the ratio after/before;
- failed reads (a chunk that does not come back whole and right fails its read) and read
  latency p99 during the moves against the same workload before; in each window, the reads
  another host's MinIO served, the reads over 1.5x the median (which host, when), and how busy
  the machine's cores were (every lab host shares them);
- bytes moved, against rendezvous' share (what placement over 4 nodes gives the new hosts);
  time from the `add-host` until nothing is left to move, against bytes / the pace;
- Demo B's separately built 4-host cluster (jobs/demo_b.py on a lab of its own) for comparison.

    python bench/growth.py [bench.growth_mb=2000] [bench.growth_window_s=20] [lab=laptops]

Writes growth.json to <output_dir>/bench-growth-<time>/. Its labs are its own, removed after.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fasterfs
from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.node import repair_survey
from fasterfs.ops import cluster

CLI = [sys.executable, "-m", "fasterfs.ui.cli"]


def fasterfs_cli(*args: str, timeout: float = 1800) -> str:
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"fasterfs {' '.join(args[:2])} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def lab_down(base: list[str]) -> None:
    """The bench's lab removed, whatever is left of it, without hiding why the run ended."""
    subprocess.run([*CLI, "lab", "down", *base], capture_output=True, timeout=600)


@ray.remote(num_cpus=0)
def read_window(root: str, names: list[str], ids: dict[str, list[int]], seconds: float, here: int) -> dict:
    """Read this host's chunks of `names` round and round for `seconds`: bytes, each read's
    latency, failures (a chunk not whole and right raises in read_chunk: xxh3 checked), and the
    reads another host's MinIO served (when in the window, how long)."""
    clients = {n: fasterfs.connect(root, ["client.hedge.enabled=false", "cache.prefetch.enabled=false"],
                                   dataset=n, use_cache=False) for n in names if ids.get(n)}
    work = [(n, i) for n in clients for i in ids[n]]
    got, lat, at, failed, remote = 0, [], [], [], []
    began = time.monotonic()
    end = began + seconds
    k = 0
    while work and time.monotonic() < end:
        name, i = work[k % len(work)]
        k += 1
        served = dict(clients[name].served_by)
        t = time.perf_counter()
        try:
            got += len(clients[name].read_chunk(i))
            lat.append(time.perf_counter() - t)
            at.append(round(time.monotonic() - began, 2))
        except Exception as e:
            failed.append(f"{name} chunk {i}: {e}"[:200])
        by = [n for n, c in clients[name].served_by.items() if c > served.get(n, 0)]
        if by and by != [here]:
            remote.append((round(time.monotonic() - began, 2), by, round(time.perf_counter() - t, 3)))
    return {"bytes": got, "latencies": lat, "failed": failed, "node": ray.get_runtime_context().get_node_id(),
            "remote": remote, "at": at, "here": here, "peer_reads": sum(c.peer_reads for c in clients.values())}


def phase(state, names: list[str], seconds: float) -> dict:
    """Every storage host reads its partition (the chunks whose first copy is on it) for `seconds`."""
    futures, began, busy = begin_phase(state, names, seconds)
    return phase_result(futures, began, seconds, busy)


def begin_phase(state, names: list[str], seconds: float) -> tuple[list, float, float]:
    """The reads of `phase` begun (what else the caller does meanwhile is what they measure)."""
    manifests = {n: registry.fetch_manifest(state.name, n) for n in names}
    futures = []
    for node in state.nodes:
        ids = {n: [c.id for c in m.chunks if c.nodes[0] == node.index] for n, m in manifests.items()}
        futures.append(read_window.options(**cluster.on_node(node)).remote(state.root, names, ids, seconds,
                                                                          node.index))
    return futures, time.monotonic(), busy_cpu_s()


def busy_cpu_s() -> float:
    """CPU seconds the machine has spent busy (every host of the lab shares its cores)."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def phase_result(futures: list, began: float, seconds: float, busy0: float) -> dict:
    results = ray.get(futures)
    wall = time.monotonic() - began
    lat = sorted(x for r in results for x in r["latencies"])
    p50 = statistics.median(lat) if lat else 0.0
    return {"hosts": len(futures), "mb_s": sum(r["bytes"] for r in results) / 1e6 / seconds, "wall_s": wall,
            "cpu_busy": (busy_cpu_s() - busy0) / wall / os.cpu_count(),  # of the machine's cores
            "reads": len(lat), "failed": sum(len(r["failed"]) for r in results),
            "peer_reads": sum(r["peer_reads"] for r in results),
            "remote_reads": sum(len(r["remote"]) for r in results),
            "remote": [x for r in results for x in r["remote"]][:20],
            # reads over 1.5x the median: (host, s into the window, ms)
            "slow": sorted((r["here"], t, round(1000 * x)) for r in results for t, x in zip(r["at"], r["latencies"])
                           if x > 1.5 * p50)[:50],
            "failures": [f for r in results for f in r["failed"]][:5],
            "p50_ms": 1000 * p50 if lat else None,
            "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))] if lat else None}


def lab_overrides(root: Path, name: str, k: int, argv: list[str]) -> list[str]:
    """A bench lab's overrides: ports of its own (slot k) beside any other cluster on this machine
    (a user's, the suite's), and no chunk made hot: the reads measure the hosts' disks (a fill
    would share a disk with them)."""
    return [f"cluster.root={root}", f"cluster.name={name}", f"cluster.ray_port={6480 + k}",
            f"cluster.dashboard_port={8380 + k}",
            f"cluster.agent_port={23800 + 100 * k}", f"cluster.node_ports={40000 + 1000 * k}",
            f"dashboard.port={8480 + k}", "kernel.hot_threshold=1000000000", *argv]


def main(argv: list[str]) -> dict:
    cfg = config.load(argv, lab=True)
    b = cfg.bench
    root = Path(tempfile.mkdtemp(prefix="ffs-growth-", dir="/var/tmp"))
    base = lab_overrides(root, "ffs-growth", 0, argv)
    out: dict = {"lab": {k: cfg.lab[k] for k in ("profile", "disk_mbit", "link_mbit")}, "mb": b.growth_mb,
                 "window_s": b.growth_window_s, "repair_mb_per_s": cfg.repair.mb_per_s}
    try:  # an interrupted `lab up` (killed with its caller) leaves what `lab down` removes
        fasterfs_cli("lab", "up", "--nodes", "2", *base)
        state = cluster.ClusterState.load(root)
        cluster.connect_ray(state)
        files = max(2, int(b.growth_mb) // int(b.growth_file_mb))
        names = []
        for k in range(files):
            src = root / "src.bin"
            src.write_bytes(os.urandom(int(b.growth_file_mb) * 2**20))
            name = f"growth/f{k:03d}.bin"
            fasterfs_cli("put", str(src), name, "files.chunk_mb=4", *base)
            names.append(name)
        src.unlink()
        before_m = {n: registry.fetch_manifest(state.name, n) for n in names}
        out["before"] = phase(state, names, b.growth_window_s)
        began = time.monotonic()
        fasterfs_cli("lab", "add-host", "2", *base)  # in one step: each piece moves at most once
        out["add_s"] = time.monotonic() - began
        state = cluster.ClusterState.load(root)
        creds = registry.fetch_credentials(state.name, "admin")
        during = []
        while repair_survey.survey(state, creds, cfg.placement.load_slack).misplaced:
            during.append(phase(cluster.ClusterState.load(root), names, b.growth_window_s))
            if time.monotonic() - began > 3600:
                raise RuntimeError("the moves did not finish within an hour")
        out["moves_done_s"] = time.monotonic() - began
        out["during"] = during
        out["after"] = phase(state, names, b.growth_window_s)
        after_m = {n: registry.fetch_manifest(state.name, n) for n in names}
        moved = sum(c.bytes for n in names for c0, c in zip(before_m[n].chunks, after_m[n].chunks)
                    if c0.nodes != c.nodes)
        new = {n.index for n in state.nodes[2:]}
        share = sum(c.bytes for n in names for c in after_m[n].chunks if c.nodes[0] in new)
        total = sum(c.bytes for m in after_m.values() for c in m.chunks)
        out.update(bytes_total=total, bytes_moved=moved, rendezvous_share=share,
                   moved_vs_share=moved / share if share else None,
                   # what bounds the moves' time: the 2 new writers' repair pace, the 2 old hosts' links
                   pace_bound_s=moved / 1e6 / (cfg.repair.mb_per_s * 2) if cfg.repair.mb_per_s else None,
                   link_bound_s=moved * 8 / 1e6 / (cfg.lab.link_mbit * 2) if cfg.lab.link_mbit else None)
    finally:
        ray.shutdown()
        lab_down(base)
        shutil.rmtree(root)  # its hosts' disks: the next lab is built anew
    print("grown:", {k: out.get(k) for k in ("before", "after", "moves_done_s", "bytes_moved", "rendezvous_share")},
          flush=True)
    # Demo B's 4 hosts built as such, for the same reads
    root.mkdir()
    try:  # an interrupted `lab up` (killed with its caller) leaves what `lab down` removes
        fasterfs_cli("lab", "up", "--nodes", "4", *base)
        state = cluster.ClusterState.load(root)
        cluster.connect_ray(state)
        names = []
        for k in range(files):
            (root / "src.bin").write_bytes(os.urandom(int(b.growth_file_mb) * 2**20))
            fasterfs_cli("put", str(root / "src.bin"), f"growth/f{k:03d}.bin", "files.chunk_mb=4", *base)
            names.append(f"growth/f{k:03d}.bin")
        out["built_4"] = phase(state, names, b.growth_window_s)
    finally:
        ray.shutdown()
        lab_down(base)
        shutil.rmtree(root)
    out["after_vs_before"] = out["after"]["mb_s"] / out["before"]["mb_s"]
    out["after_vs_built_4"] = out["after"]["mb_s"] / out["built_4"]["mb_s"]
    worst = max((p["p99_ms"] for p in out["during"] if p["p99_ms"]), default=None)
    out["p99_during_vs_before"] = worst / out["before"]["p99_ms"] if worst and out["before"]["p99_ms"] else None
    out["remote_reads_during"] = sum(p["remote_reads"] for p in out["during"])
    worst_window = max(out["during"], key=lambda p: p["p99_ms"] or 0, default=None)
    if worst_window:  # when in that window its slow reads came, and how busy the machine was
        times = [t for _, t, _ in worst_window["slow"]] or [0.0]
        out["worst_during"] = {"p99_ms": worst_window["p99_ms"], "cpu_busy": worst_window["cpu_busy"],
                               "slow_reads": len(worst_window["slow"]), "slow_from_s": min(times),
                               "slow_to_s": max(times), "remote_reads": worst_window["remote_reads"]}
    out["failed_reads"] = out["before"]["failed"] + sum(p["failed"] for p in out["during"]) + out["after"]["failed"]
    d = report.run_dir(cfg, "bench-growth")
    report.write_json(d, "growth.json", out)
    print({k: v for k, v in out.items() if k not in ("during",)})
    print(f"report: {d / 'growth.json'}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
