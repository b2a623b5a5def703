"""What listing every bucket costs the users beside it, on a running cluster at whatever size
its namespace has: one more `put` of a 4 KiB file (median of bench.listing_puts) alone, then
while every bucket is listed whole at once (one ListObjectsV2 listing each, as the repair
leader's survey and each node's object count did), then while they are walked as the
StorageNodes now walk them (bucket_walk: in slices, resting so that listing takes at most
minio.list_share of the time). Start the cluster with a small minio.list_share (0.01) so that its
own listings stay out of the figures, and give this bench the share to measure.
For each listing: its seconds and keys, and its MinIOs' CPU seconds during it and in the 30 s
after it (MinIO's own walk runs on past a listing's last page), read from /proc, so run it on
the host of the MinIOs (a one-host cluster).

    python bench/listing_cost.py [cluster.root=...] [minio.list_share=0.25] [bench.listing_puts=20]

Leaves the files it stored under bench-listing-<time>/ (`fasterfs rm` or `fasterfs down`).
Writes listing_cost.json to <output_dir>/bench-listing-<time>/ and prints a table.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ray

from fasterfs.control import registry, report, s3
from fasterfs.core import config
from fasterfs.ops import cluster
from fasterfs.write import bucket_walk, ingest

AFTER_S = 30  # MinIO's CPU counted this long after a listing's last page


def minio_cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the MinIO processes have used, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def listing(state, creds, share: float | None, max_s: float) -> dict:
    """Every node's bucket listed at once, whole (share None) or walked (bucket_walk); keys
    counted, stopped after max_s."""
    keys, stopped = {}, threading.Event()
    deadline = time.monotonic() + max_s

    def one(node) -> None:
        getter = s3.MarkedGetter(node.endpoint, creds, state.settings.fill_mark, timeout=60.0)
        n = 0
        try:
            bucket = state.settings.bucket
            for _ in getter.list(bucket) if share is None else bucket_walk.walk(getter, bucket, share):
                n += 1
                if time.monotonic() > deadline:
                    stopped.set()
                    break
        finally:
            keys[node.index] = n
            getter.close()
    began = time.monotonic()
    threads = [threading.Thread(target=one, args=(node,)) for node in state.nodes]
    for t in threads:
        t.start()
    return {"threads": threads, "began": began, "keys": keys, "stopped": stopped}


def puts(cfg, one: Path, dest: str, n: int, until=lambda: True) -> list[float]:
    """At least n puts one after another, and on while `until()` says so."""
    took: list[float] = []
    while len(took) < n or not until():
        t = time.perf_counter()
        ingest.put(cfg, one, f"{dest}/{len(took)}")
        took.append(time.perf_counter() - t)
    return took


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    creds = registry.fetch_credentials(state.name, "admin")
    n, max_s, share = int(cfg.bench.listing_puts), float(cfg.bench.listing_max_s), float(cfg.minio.list_share)
    rows = ray.get([a.status.remote(max_age_s=1e9) for a in cluster.storage_nodes(state)], timeout=60)
    pids = [r["minio_pid"] for r in rows]
    tag = time.strftime("bench-listing-%Y%m%dT%H%M%S")
    result: dict = {"names": registry.names_count(state.name), "nodes": len(state.nodes), "list_share": share,
                    "conditions": {}}
    with tempfile.TemporaryDirectory() as work:
        one = Path(work) / "one.bin"
        one.write_bytes(os.urandom(4096))
        ingest.put(cfg, one, f"{tag}/warm-up")  # the first connects to Ray
        for name, how in (("alone", "alone"), ("listed whole", None), (f"walked, list_share {share:g}", share)):
            cpu0 = minio_cpu_s(pids)
            if how == "alone":
                took = puts(cfg, one, f"{tag}/alone", n)
                row = {"cpu_s": minio_cpu_s(pids) - cpu0}
            else:
                run = listing(state, creds, how, max_s)
                took = puts(cfg, one, f"{tag}/{how or 'whole'}", n,
                            until=lambda threads=run["threads"]: not any(t.is_alive() for t in threads))
                for t in run["threads"]:
                    t.join()
                seconds, cpu1 = time.monotonic() - run["began"], minio_cpu_s(pids)
                time.sleep(AFTER_S)
                keys = sum(run["keys"].values())
                row = {"seconds": seconds, "keys": keys, "stopped_at_max_s": run["stopped"].is_set(),
                       "keys_per_s": keys / seconds, "cpu_s": cpu1 - cpu0, "cpu_s_after": minio_cpu_s(pids) - cpu1,
                       "cpu_share": (cpu1 - cpu0) / seconds}
            row.update(puts=len(took), put_ms=statistics.median(took) * 1e3,
                       put_p90_ms=statistics.quantiles(took, n=10)[-1] * 1e3)
            result["conditions"][name] = row
            print(f"{name}: put {row['put_ms']:.1f} ms (p90 {row['put_p90_ms']:.1f}) over {len(took)}; "
                  + (f"{row['keys']:,} keys in {row['seconds']:.0f} s, MinIOs' CPU {row['cpu_s']:.0f} s "
                     f"({row['cpu_share']:.2f} cores) and {row['cpu_s_after']:.0f} s in the {AFTER_S} s after"
                     if how != "alone" else f"MinIOs' CPU {row['cpu_s']:.1f} s"), flush=True)
    alone = result["conditions"]["alone"]["put_ms"]
    for row in result["conditions"].values():
        row["put_vs_alone"] = row["put_ms"] / alone
    out = report.write_json(report.run_dir(cfg, "bench-listing"), "listing_cost.json", result)
    print(json.dumps({"report": str(out), "put_vs_alone": {k: round(v["put_vs_alone"], 2)
                                                           for k, v in result["conditions"].items()}}))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
