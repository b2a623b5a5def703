"""What a clean-up costs per object deleted, on a running cluster (`fasterfs up`): the objects of
replaced generations and retired pieces, which writes and repair delete once ingest.keep_old_s
has passed. bench.clean_up_objects one-byte objects on node 0's MinIO (this host's), deleted
three ways side by side, each after its own fill: boto3 one DELETE a key (the former clean-up, the
baseline), a signed DELETE a key (the clean-up of another host's MinIO), and DeleteObjects a
thousand keys a request over sockets the kernel skips (the clean-up of this host's MinIO). Per
key: this process's CPU, the wall time, and MinIO's own CPU (/proc); every key gone by boto3's
listing afterwards.

    python bench/clean_up.py [cluster.root=...] [bench.clean_up_objects=10000]

Writes clean_up.json to <output_dir>/bench-clean-up-<time>/ and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ray

from fasterfs.control import registry, report, s3
from fasterfs.core import config
from fasterfs.ops import cluster


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    n = int(cfg.bench.clean_up_objects)
    state = registry.find(cfg)
    creds = registry.fetch_credentials(state.name, "admin")
    node = state.nodes[0]
    bucket = state.settings.bucket
    minio_pid = ray.get(cluster.storage_nodes(state)[0].status.remote())["minio_pid"]
    boto = s3.client(node.endpoint, creds)

    def boto3_one_a_key(prefix: str) -> None:
        for page in boto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                boto.delete_object(Bucket=bucket, Key=o["Key"])

    def getter_delete(mark: int):
        def run(prefix: str) -> None:
            getter = s3.MarkedGetter(node.endpoint, creds, mark)
            missed = getter.delete(bucket, [key for key, _ in getter.list(bucket, prefix)])
            assert not missed, missed[:3]
        return run

    ways = {"boto3": boto3_one_a_key, "signed": getter_delete(0), "batch": getter_delete(state.settings.fill_mark)}
    tag = time.strftime("bench-clean-up-%Y%m%dT%H%M%S")
    result: dict = {"objects": n, "ways": {}}
    with ThreadPoolExecutor(8) as pool:
        for way, delete in ways.items():
            prefix = f"{tag}/{way}/"
            list(pool.map(lambda key: boto.put_object(Bucket=bucket, Key=key, Body=b"x"),
                          [f"{prefix}{i:07d}" for i in range(n)]))
            cpu, wall, minio = time.process_time(), time.perf_counter(), process_cpu_s(minio_pid)
            delete(prefix)
            cpu, wall, minio = time.process_time() - cpu, time.perf_counter() - wall, process_cpu_s(minio_pid) - minio
            left = boto.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0)
            assert left == 0, f"{way}: {left} objects left under {prefix}"
            result["ways"][way] = {"cpu_ms_per_key": cpu / n * 1e3, "wall_ms_per_key": wall / n * 1e3,
                                   "minio_cpu_ms_per_key": minio / n * 1e3}
    base = result["ways"]["boto3"]
    for way in result["ways"].values():
        way["cpu_x"] = base["cpu_ms_per_key"] / way["cpu_ms_per_key"]
        way["wall_x"] = base["wall_ms_per_key"] / way["wall_ms_per_key"]
        way["minio_x"] = base["minio_cpu_ms_per_key"] / max(way["minio_cpu_ms_per_key"], 1e-9)
    out = report.write_json(report.run_dir(cfg, "bench-clean-up"), "clean_up.json", result)
    print(f"deleting {n:,} objects from this host's MinIO, per key:")
    print(f"{'way':<8} {'CPU ms':>8} {'wall ms':>8} {'MinIO CPU ms':>13}")
    for way, r in result["ways"].items():
        print(f"{way:<8} {r['cpu_ms_per_key']:>8.3f} {r['wall_ms_per_key']:>8.3f} {r['minio_cpu_ms_per_key']:>13.3f}")
    print(json.dumps({"report": str(out)}))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
