"""A rolling restart and a drain under readers (issue 66), on a lab of 4 storage hosts holding
`bench.restart_mb` of files (replicas=2, chunks of 4 MB), in one run:

- the read workload alone (each host reading the chunks whose first copy is on it, every chunk
  checked against its stored xxh3; no chunk made hot), its p99;
- `fasterfs nodes restart` (every StorageNode in turn) while the same workload reads: failed or
  wrong reads, p99 against the workload alone, total time and each node's;
- `fasterfs nodes drain 3` while the workload reads on the other hosts: time to drained, the
  redundancy of every chunk at each survey taken during it (a survey lists every MinIO: a chunk
  with fewer copies than replicas=2 is degraded), failed reads, p99 against the same readers
  reading just before it without moves. The drain's pace is repair.drain_mb_per_s (reads and
  writes of each node's moves).

    python bench/restart_drain.py [bench.restart_mb=1000] [bench.growth_window_s=20] [repair.drain_mb_per_s=200]

Writes restart-drain.json to <output_dir>/bench-restart-drain-<time>/. Its lab is its own, removed after.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from growth import begin_phase, fasterfs_cli, lab_down, lab_overrides, phase, phase_result

from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.node import repair_survey
from fasterfs.ops import cluster


def timed_cli(*args: str) -> tuple[str, float]:
    t = time.monotonic()
    return fasterfs_cli(*args), time.monotonic() - t


def main(argv: list[str]) -> dict:
    cfg = config.load(argv, lab=True)
    b = cfg.bench
    root = Path(tempfile.mkdtemp(prefix="ffs-restart-", dir="/var/tmp"))
    base = lab_overrides(root, "ffs-restart", 1, argv)
    window = float(b.growth_window_s)
    out: dict = {"lab": {k: cfg.lab[k] for k in ("profile", "disk_mbit", "link_mbit")}, "mb": b.restart_mb,
                 "window_s": window, "repair_mb_per_s": cfg.repair.mb_per_s,
                 "drain_mb_per_s": cfg.repair.drain_mb_per_s}
    try:  # an interrupted `lab up` (killed with its caller) leaves what `lab down` removes
        fasterfs_cli("lab", "up", "--nodes", "4", *base)
        state = cluster.ClusterState.load(root)
        cluster.connect_ray(state)
        names = []
        for k in range(max(2, int(b.restart_mb) // int(b.growth_file_mb))):
            (root / "src.bin").write_bytes(os.urandom(int(b.growth_file_mb) * 2**20))
            names.append(f"rd/f{k:03d}.bin")
            fasterfs_cli("put", str(root / "src.bin"), names[-1], "files.chunk_mb=4", "replicas=2", *base)
        (root / "src.bin").unlink()
        out["alone"] = phase(state, names, window)

        futures, began, busy = begin_phase(state, names, window)
        said, out["restart_s"] = timed_cli("nodes", "restart", *base)
        out["restart_said"] = said.strip().splitlines()
        out["during_restart"] = phase_result(futures, began, window, busy)
        if out["during_restart"]["wall_s"] < out["restart_s"]:
            out["during_restart"]["note"] = "the read window ended before the restarts did"

        creds = registry.fetch_credentials(state.name, "admin")
        surveys: list[dict] = []
        draining = threading.Event()

        def survey() -> None:
            while not draining.is_set():
                h = repair_survey.survey(cluster.ClusterState.load(root), creds, cfg.placement.load_slack)
                surveys.append({"t": time.monotonic(), "degraded": h.degraded_count, "lost": h.lost_count,
                                "chunks": h.chunks})
        looker = threading.Thread(target=survey, daemon=True)
        looker.start()
        readers = cluster.ClusterState.load(root)
        readers.nodes = [n for n in readers.nodes if n.index != 3]  # host 3 leaves: the others read
        out["alone_3"] = phase(readers, names, window)  # the drain's workload without the drain
        futures, began, busy = begin_phase(readers, names, window)
        said, out["drain_s"] = timed_cli("nodes", "drain", "3", *base)
        draining.set()
        looker.join(120)
        out["drain_said"] = said.strip().splitlines()[-1:]
        out["during_drain"] = phase_result(futures, began, window, busy)
        out["surveys"] = len(surveys)
        out["surveys_degraded_max"] = max((s["degraded"] + s["lost"] for s in surveys), default=None)
        out["after_drain"] = phase(cluster.ClusterState.load(root), names, window)
    finally:
        ray.shutdown()
        lab_down(base)
        shutil.rmtree(root)
    a = out["alone"]["p99_ms"]
    out["p99_restart_vs_alone"] = out["during_restart"]["p99_ms"] / a if a else None
    a3 = out["alone_3"]["p99_ms"]
    out["p99_drain_vs_alone"] = out["during_drain"]["p99_ms"] / a3 if a3 else None
    out["failed_reads"] = sum(out[k]["failed"] for k in ("alone", "during_restart", "during_drain", "after_drain"))
    d = report.run_dir(cfg, "bench-restart-drain")
    report.write_json(d, "restart-drain.json", out)
    print(out)
    print(f"report: {d / 'restart-drain.json'}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
