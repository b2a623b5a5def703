"""A StorageNode's start against the namespace it takes in (issue 44), at a small and a large
size side by side: for each of bench.node_start_small and bench.node_start_files, a 2-node cluster
of its own (`fasterfs up` at a root under /var/tmp) is started empty and stopped, its store
(SQLite, the default engine) filled with that many one-chunk file names in batches of 1,000 (as
bench/namespace_store.py writes them: the names alone, their objects never written, so the repair
leader is off), and started again. Timed: `fasterfs up` over the filled store end to end; each
node's `started` phases (cache_s: the namespace fetched, decoded and indexed, the cache checked)
and resident memory (/proc of the actor PIDs `status` reports); a driver's fetch of the whole
namespace (`registry.fetch_manifests`, the call a starting node makes). The names the Registry
counts are checked against the store's rows, read with sqlite3.

    python bench/node_start.py [bench.node_start_files=1000000] [cluster.first_address=127.0.3.2 ...
                                (beside another cluster: where its own listens, as bench/scan.py)]

Writes node_start.json to <output_dir>/bench-node-start-<time>/.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from namespace_store import BATCH, batch
from scan import fasterfs, placed

from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.meta import NamespaceStore, open_engine
from fasterfs.ops import cluster


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def one_size(work: Path, files: int, where: list[str]) -> dict:
    root = work / f"cluster-{files}"
    own = [f"cluster.root={root}", "nodes=2", "repair.auto=false", "dashboard.enabled=false",
           "cluster.name=ffs-node-start", "cluster.start_timeout_s=600", *where]
    fasterfs("up", *own)
    fasterfs("down", *own)
    store = NamespaceStore(open_engine("sqlite", root), "ffs-node-start", lambda method, arg: [])
    t = time.perf_counter()
    for start in range(0, files, BATCH):
        store.publish_batch(batch(start, "g1")[:files - start])
    fill_s = time.perf_counter() - t
    store.engine.close()
    with sqlite3.connect(root / "namespace.sqlite") as db:
        rows = db.execute("SELECT count(*) FROM names").fetchone()[0]
    t = time.perf_counter()
    fasterfs("up", *own)
    up_s = time.perf_counter() - t
    try:
        cfg = config.load(own)
        deadline = time.monotonic() + 300
        while True:  # a node busy surveying a million names may miss status's 30 s: ask again
            state, statuses = cluster.status(cfg)
            if all("actor_pid" in s for s in statuses) or time.monotonic() > deadline:
                break
        counted = registry.names_count(state.name)
        t = time.perf_counter()
        _, manifests = registry.fetch_manifests(state.name)
        fetch_s = time.perf_counter() - t
        nodes = [{"index": s["index"], "started": s["started"], "rss_bytes": rss(s["actor_pid"])} for s in statuses]
        return {"files": files, "store_rows": rows, "registry_names": counted, "fetched_names": len(manifests),
                "fill_s": fill_s, "up_s": up_s, "fetch_whole_s": fetch_s, "nodes": nodes,
                "rss_bytes_per_file": [n["rss_bytes"] / max(files, 1) for n in nodes]}
    finally:
        ray.shutdown()
        fasterfs("down", *own)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    if cfg.cluster.namespace_store != "sqlite":
        raise SystemExit("bench/node_start.py fills the default store (cluster.namespace_store=sqlite) only")
    sizes = [int(cfg.bench.node_start_small), int(cfg.bench.node_start_files)]
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-node-start-", dir="/var/tmp"))
    try:
        runs = [one_size(work, n, placed(argv)) for n in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    small, large = runs
    result = {"runs": runs, "default_start_timeout_s": cfg.cluster.start_timeout_s, "targets": {
        f"`fasterfs up` at {large['files']:,} names within the default cluster.start_timeout_s "
        f"({large['up_s']:.0f} s)": large["up_s"] <= cfg.cluster.start_timeout_s}}
    out = report.write_json(report.run_dir(cfg, "bench-node-start"), "node_start.json", result)

    def row(label: str, a: float, b: float, fmt: str = ",.2f") -> None:
        print(f"{label:<34} {a:>12{fmt}} {b:>12{fmt}}")

    row("names", small["files"], large["files"], ",")
    row("names the Registry counts", small["registry_names"], large["registry_names"], ",")
    row("fasterfs up (s)", small["up_s"], large["up_s"])
    for i, (a, b) in enumerate(zip(small["nodes"], large["nodes"])):
        for phase in a["started"]:
            row(f"node {i} started: {phase}", a["started"][phase], b["started"][phase])
        row(f"node {i} resident memory (MB)", a["rss_bytes"] / 1e6, b["rss_bytes"] / 1e6, ",.0f")
    row("a driver fetching it whole (s)", small["fetch_whole_s"], large["fetch_whole_s"])
    print(json.dumps({"targets": result["targets"], "report": str(out)}, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
