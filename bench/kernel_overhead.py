"""What the kernel programs cost: MinIO GET throughput and latency with the TC and
SOCK_OPS programs attached versus detached, interleaved round by round in one run,
plus nanoseconds per program run from kernel.bpf_stats_enabled.

    .venv/bin/python bench/kernel_overhead.py [--rounds 20] [--gets 60] [--size-mb 1.4]

Runs its own MinIO on 127.0.5.2 inside a cgroup of its own (which this process joins
for the run, so its client sockets meet the SOCK_OPS program), and removes all of it
at the end. Target: at most 3% throughput cost and under 1 µs per packet.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fasterfs import bpf
from fasterfs.bpf import tc
from fasterfs.control import credentials, report, s3
from fasterfs.core import config
from fasterfs.core.cgroup import ProjectCgroup, own_cgroup
from fasterfs.node.minio_server import MinioServer

ADDRESS, PORT = "127.0.5.2", 9400


def prog_stats(fd: int) -> tuple[int, int]:
    prog_id = next(line.split()[1] for line in open(f"/proc/self/fdinfo/{fd}") if line.startswith("prog_id"))
    shown = json.loads(subprocess.run(["bpftool", "prog", "show", "id", prog_id, "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    return shown.get("run_cnt", 0), shown.get("run_time_ns", 0)


def one_round(endpoint, creds, bucket, keys, gets) -> dict:
    client = s3.client(endpoint, creds)  # fresh connections: SOCK_OPS acts when they are established
    lat, size = [], 0
    start = time.perf_counter()
    for i in range(gets):
        t = time.perf_counter()
        size += len(client.get_object(Bucket=bucket, Key=keys[i % len(keys)])["Body"].read())
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return {"mb_s": size / wall / 1e6, "p50_ms": statistics.median(lat) * 1e3}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--gets", type=int, default=60)
    p.add_argument("--size-mb", type=float, default=1.4)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if bpf.unavailable_reason():
        sys.exit(f"kernel_overhead: real eBPF is needed: {bpf.unavailable_reason()}")
    cfg = config.load(args.overrides)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-"))
    creds = credentials.create(work / "credentials.json").admin
    cgroup = ProjectCgroup.create("bench-kernel-overhead", work)
    home = own_cgroup(allow_root=True)  # to return to before the cgroup is removed
    server = MinioServer(config.minio_binary(cfg), ADDRESS, PORT, PORT + 1, work / "minio", work / "minio.log", creds)
    programs = bpf.load("real", cfg.kernel.hot_threshold, 0, cfg.kernel.delack_max_us)
    sysctl = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = sysctl.read_text().strip()
    results = {"with": [], "without": []}
    try:
        (cgroup.path / "cgroup.procs").write_text(str(os.getpid()))  # this process joins for the run
        server.start(30)
        client = s3.client(server.endpoint, creds)
        client.create_bucket(Bucket="bench")
        body = os.urandom(int(args.size_mb * 1e6))
        keys = [f"obj-{i:03d}" for i in range(20)]
        for k in keys:
            client.put_object(Bucket="bench", Key=k, Body=body)
        programs.watch(ADDRESS, PORT)
        sysctl.write_text("1")
        runs0 = prog_stats(programs.tc_fns["egress"].fd)
        for r in range(args.rounds):
            order = ("with", "without") if r % 2 == 0 else ("without", "with")  # interleaved, alternating
            for side in order:
                if side == "with":
                    programs.attach_tc("lo", "ffs:bench:0")
                    programs.attach_sockops(str(cgroup.path))
                results[side].append(one_round(server.endpoint, creds, "bench", keys, args.gets))
                if side == "with":
                    programs.close_attachments()
        runs1 = prog_stats(programs.tc_fns["egress"].fd)
        sock_runs = prog_stats(programs.sockops_fn.fd)
        snap = programs.snapshot()
    finally:
        sysctl.write_text(stats_before)
        if home is not None:
            (home / "cgroup.procs").write_text(str(os.getpid()))
        programs.close()
        server.stop()
        cgroup.remove()
        tc.remove("lo", "ffs:bench:")
    med = {side: {m: statistics.median(r[m] for r in rounds) for m in ("mb_s", "p50_ms")}
           for side, rounds in results.items()}
    n_runs, ns = runs1[0] - runs0[0], runs1[1] - runs0[1]
    result = {
        "rounds": args.rounds, "gets_per_round": args.gets, "object_mb": args.size_mb,
        "median": med,
        "throughput_ratio_with_over_without": med["with"]["mb_s"] / med["without"]["mb_s"],
        "throughput_cost_pct": 100 * (1 - med["with"]["mb_s"] / med["without"]["mb_s"]),
        "p50_ratio_with_over_without": med["with"]["p50_ms"] / med["without"]["p50_ms"],
        "tc_program_runs": n_runs, "tc_ns_per_run": ns / n_runs if n_runs else None,
        "sockops_runs": sock_runs[0], "sockops_ns_per_run": sock_runs[1] / sock_runs[0] if sock_runs[0] else None,
        "kernel_counters": snap["counters"], "sockops": snap["sockops"],
        "rounds_detail": results,
    }
    out = report.write_json(report.run_dir(cfg, "kernel-overhead"), "kernel_overhead.json", result)
    print(f"MinIO GETs of {args.size_mb} MB, {args.rounds} interleaved rounds x {args.gets}:")
    for side in ("without", "with"):
        print(f"  programs {side:8s}: {med[side]['mb_s']:7.1f} MB/s   p50 {med[side]['p50_ms']:.3f} ms")
    print(f"  throughput cost: {result['throughput_cost_pct']:+.2f}%   "
          f"p50 ratio: {result['p50_ratio_with_over_without']:.3f}")
    print(f"  TC program: {n_runs} runs, {result['tc_ns_per_run']:.0f} ns per run (bpf_stats)")
    if sock_runs[0]:
        print(f"  SOCK_OPS program: {sock_runs[0]} runs, {result['sockops_ns_per_run']:.0f} ns per run")
    print(f"report: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
