"""Demo B — add nodes, go faster: the same total volume read by 1, 2, 4 nodes, each reading
its own partition from its own MinIO (no cache), in Ray tasks pinned to that node.

For every N in demo_b.sweep the dataset is placed on the first N nodes; each node reads
its own chunks round and round until it has read total/N; all readers start together and
the wall clock runs from that start (a start line all readers reach once set up) to the
last finish. Speedup is T(1)/T(N), efficiency
speedup/N. With demo_b.replicated, the read-mostly layout (every node holds a full copy,
replicas = N) runs beside it. The report says which limit bound each run: the hosts'
bandwidth limits (on the lab), or this machine's CPU (a one-machine cluster shares it).

    python jobs/demo_b.py [overrides]          (on `fasterfs up` or on `fasterfs lab up`)
    ray job submit --address http://<head>:8265 --working-dir . -- python jobs/demo_b.py

Writes demo_b.json and demo_b.png to <output_dir>/demo_b-<time>/. Leaves the dataset
placed as the configuration says (it re-ingests at the end).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import ray

import fasterfs
from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.ops import cluster, job
from fasterfs.write.ingest import ingest


@ray.remote(num_cpus=0)
class StartLine:
    """Readers wait here until all have arrived (set up, connected), then go together."""

    def __init__(self, readers: int):
        import asyncio

        self.readers, self.arrived, self.all_in = readers, 0, asyncio.Event()

    async def arrive(self) -> float:
        self.arrived += 1
        if self.arrived == self.readers:
            self.go = time.time()
            self.all_in.set()
        await self.all_in.wait()
        return self.go


@ray.remote(num_cpus=1)
def read_partition(root: str, node: int, plan: list[int], line) -> dict:
    """Read `plan` (chunk ids) from this node's MinIO, checking every checksum. Unhedged: a
    hedge to another node's copy when this node's MinIO is merely busy (every core reading)
    would read from where the data is not, which is what this demo measures."""
    client = fasterfs.connect(root, ["client.hedge.enabled=false"], use_cache=False)
    go = ray.get(line.arrive.remote())
    start, busy0 = time.time(), cpu_busy()
    size = 0
    for i in plan:
        size += len(client.read_chunk(i))  # verified against the object's stored xxh3
    end, busy1 = time.time(), cpu_busy()
    remote = sum(n for k, n in client.served_by.items() if k != node)  # answered by another node's MinIO
    # CPU measured on this host, while it read (lab hosts on one machine share its kernel's count)
    return {"node": node, "ran_on": ray.get_runtime_context().get_node_id(), "bytes": size, "chunks": len(plan),
            "remote_reads": remote, "go": go, "start": start, "end": end,
            "cpu_busy": (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), "host_cores": os.cpu_count()}


def plan_reads(manifest, node: int, n: int, volume: int, replicated: bool) -> list[int]:
    """This node's chunks (its partition, or with a full copy its 1/N share), round and round
    until it has planned volume/N bytes."""
    mine = [c for c in manifest.chunks if (c.id % n == node if replicated else c.nodes[0] == node)]
    plan, planned = [], 0
    while planned < volume // n:
        c = mine[len(plan) % len(mine)]
        plan.append(c.id)
        planned += c.bytes
    return plan


def kernel_requests(state, n: int) -> list[int | None]:
    """Requests each node's kernel program has counted reaching its MinIO (None if simulated)."""
    snaps = ray.get([a.kernel_status.remote(0) for a in cluster.storage_nodes(state)[:n]])
    return [s["counters"].get("requests", 0) if s.get("mode") == "real" else None for s in snaps]


def cpu_busy() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def run_once(cfg, state, n: int, replicated: bool, volume: int) -> dict:
    overrides_replicas = n if replicated else 1
    manifest = ingest(config.as_cfg({**config.to_dict(cfg), "replicas": overrides_replicas}), nodes=n)
    plans = [plan_reads(manifest, k, n, volume, replicated) for k in range(n)]
    line = StartLine.remote(n)
    before = kernel_requests(state, n)
    futures = [read_partition.options(**cluster.on_node(state.nodes[k], f"demo_b.read[{n} nodes"))
               .remote(state.root, k, plans[k], line) for k in range(n)]
    results = ray.get(futures)
    served = [after - b for after, b in zip(kernel_requests(state, n), before)]
    go = results[0]["go"]
    wall = max(r["end"] for r in results) - go  # from the common start; a reader that starts late counts
    total = sum(r["bytes"] for r in results)
    for r, k in zip(results, range(n)):
        r["on_own_node"] = r["ran_on"] == state.nodes[k].ray_node_id
        r["planned_bytes"] = sum(manifest.chunk(i).bytes for i in plans[k])
        r["minio_requests"] = served[k]  # S3 requests the node's kernel program saw reach its MinIO
        r["mb_s"] = r["bytes"] / 1e6 / (r["end"] - r["start"])
    cpu = max(r["cpu_busy"] for r in results)  # the busiest host's own measurement
    return {"nodes": n, "layout": "replicated" if replicated else "partitioned", "wall_s": wall,
            "start_skew_s": max(r["start"] for r in results) - go,
            "bytes": total, "mb_s": total / 1e6 / wall, "cpu_busy": cpu, "per_node": results,
            "bound_by": bound_by(state, results, cpu)}


def bound_by(state, results, cpu: float) -> str:
    """Which limit the measurements point at (never assumed)."""
    lab = state.lab or {}
    if lab.get("disk_mbit"):
        limit = lab["disk_mbit"] / 8
        slowest = min(r["mb_s"] for r in results)
        if slowest >= 0.8 * limit:
            return (f"per-host disk limit (tbf {lab['disk_mbit']} Mbit/s = {limit:.1f} MB/s; "
                    f"slowest node {slowest:.1f} MB/s)")
    if cpu >= 0.85:
        cores = max(r["host_cores"] for r in results)
        return f"CPU: the busiest host's {cores} cores were {cpu:.0%} busy"
    return f"neither bandwidth nor CPU saturated ({cpu:.0%} CPU busy): per-request latency"


def chart(runs: list[dict], path: Path) -> None:
    part = [r for r in runs if r["layout"] == "partitioned"]
    xs = [r["nodes"] for r in part]
    base = part[0]["wall_s"] * part[0]["nodes"] if part else 1
    fig, (a1, a2) = report.figure(1, 2, figsize=(11, 4))
    a1.plot(xs, [base / r["wall_s"] for r in part], "o-", label="measured speedup T(1)/T(N)")
    a1.plot(xs, xs, "--", color="#888", label="ideal")
    a1.set_xlabel("nodes")
    a1.set_ylabel("speedup")
    a1.set_xticks(xs)
    a1.legend()
    labels = [f"{r['nodes']} {r['layout'][:4]}" for r in runs]
    a2.bar(labels, [r["mb_s"] for r in runs], color=["#06c" if r["layout"] == "partitioned" else "#c60" for r in runs])
    a2.set_ylabel("aggregate MB/s")
    fig.suptitle("Demo B: same total volume, more nodes (measured in one run)")
    report.save_figure(fig, path)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    volume = int(cfg.demo_b.total_mb * 1e6)
    sweep = [n for n in cfg.demo_b.sweep if n <= len(state.nodes)]
    runs = []
    try:
        for n in sweep:
            runs.append(run_once(cfg, state, n, False, volume))
        if cfg.demo_b.replicated and sweep and sweep[-1] > 1:
            runs.append(run_once(cfg, state, sweep[-1], True, volume))
    finally:
        ingest(cfg)  # the dataset as the configuration places it
    t1 = next((r["wall_s"] for r in runs if r["nodes"] == 1 and r["layout"] == "partitioned"), None)
    for r in runs:
        r["speedup"] = t1 / r["wall_s"] if t1 else None
        r["efficiency"] = r["speedup"] / r["nodes"] if t1 else None
    lab = state.lab
    result = {"total_mb": cfg.demo_b.total_mb, "cluster": "lab" if lab else "local (one machine, loopback)",
              "lab_profile": lab and {k: lab[k] for k in ("profile", "disk_mbit", "link_mbit")}, "runs": runs,
              "all_tasks_on_their_nodes": all(p["on_own_node"] for r in runs for p in r["per_node"]),
              "remote_reads": sum(p["remote_reads"] for r in runs for p in r["per_node"])}
    result["headline"] = {f"{r['nodes']} node{'s' if r['nodes'] > 1 else ''} {r['layout']}":
                          f"{r['mb_s']:.0f} MB/s" + (f" ({r['speedup']:.2f}x)" if r["speedup"] else "") for r in runs}
    result["figures"] = {f"{r['nodes']} nodes {r['layout']} (MB/s)": r["mb_s"] for r in runs}
    out = report.run_dir(cfg, "demo_b")
    report.write_json(out, "demo_b.json", result)
    chart(runs, out / "demo_b.png")

    from rich.table import Table

    where = f"lab, profile {lab['profile']}" if lab else "one machine, loopback, no limits"
    table = Table(title=f"Demo B: {cfg.demo_b.total_mb} MB read in total ({where})")
    for col in ("nodes", "layout", "wall s", "MB/s", "per node MB/s", "speedup", "efficiency", "bound by"):
        table.add_column(col)
    for r in runs:
        table.add_row(str(r["nodes"]), r["layout"], f"{r['wall_s']:.2f}", f"{r['mb_s']:.1f}",
                      ", ".join(f"{p['mb_s']:.1f}" for p in r["per_node"]),
                      f"{r['speedup']:.2f}" if r["speedup"] else "-",
                      f"{r['efficiency']:.0%}" if r["efficiency"] else "-", r["bound_by"])
    console = report.console()
    console.print(table)
    console.print(f"  every task ran on the node holding its chunks: {result['all_tasks_on_their_nodes']}; "
                  f"reads that left their node: {result['remote_reads']}")
    console.print(f"report: {out / 'demo_b.json'}, chart: {out / 'demo_b.png'}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "demo_b")
