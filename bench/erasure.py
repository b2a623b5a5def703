"""Erasure coding against replicas, measured side by side in one run on a running cluster
(`fasterfs up nodes=4`, or the lab: `fasterfs lab up --nodes 6`):

1. encode and decode GB/s on one core (4 MiB chunks, ec.data + ec.parity of the config);
2. storage overhead per layout: bytes in every MinIO / source bytes, for one file stored
   with layout=ec and with replicas=2;
3. read p50 per chunk with the cache off: healthy, and with node 1's MinIO stopped
   (degraded: its shards rebuilt from parity; replicas: the other copy);
4. repair MB/s (unbounded): node 1's pieces rebuilt on the other nodes while it is down,
   then moved home when it is back.

    python bench/erasure.py [ec.data=2 ec.parity=1] [bench.file_mb=128] [overrides]

Writes erasure.json to <output_dir>/bench-erasure-<time>/.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fasterfs
from fasterfs.control import registry, report, s3
from fasterfs.core import config, erasure
from fasterfs.core.manifest import object_prefix
from fasterfs.node import repair
from fasterfs.ops import cluster
from fasterfs.write.ingest import put, remove


def per_core_gb_s(fn, data_bytes: int, seconds: float = 2.0) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n * data_bytes / (time.perf_counter() - t0) / 1e9


def stored_bytes(state, creds, bucket: str, prefix: str) -> int:
    total = 0
    for n in state.nodes:
        for page in s3.client(n.endpoint, creds).get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                                          Prefix=prefix):
            total += sum(o["Size"] for o in page.get("Contents", []))
    return total


def p50_ms(name: str, overrides: list[str]) -> tuple[float, int]:
    client = fasterfs.connect(overrides=overrides, dataset=name, use_cache=False)
    lat = []
    for i in range(len(client)):
        t = time.perf_counter()
        client.read_chunk(i)
        lat.append((time.perf_counter() - t) * 1e3)
    return statistics.median(lat), client.degraded_reads


def _repair(argv, state, creds, name: str) -> dict:
    manifest = registry.fetch_manifest(state.name, name)
    out = repair.run(config.load(argv + ["repair.mb_per_s=0"]), state, creds, only={name: set(range(len(manifest)))})
    return {"chunks": out.repaired, "pieces": out.pieces_written, "mb": out.bytes_written / 1e6,
            "seconds": out.seconds, "mb_per_s": out.mb_per_s, "failed": len(out.failed)}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    k, m = int(cfg.ec.data), int(cfg.ec.parity)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)
    creds = registry.fetch_credentials(state.name, "admin")
    size = int(cfg.bench.file_mb) * 2**20
    result: dict = {"ec": f"{k}+{m}", "nodes": len(state.nodes), "file_mb": cfg.bench.file_mb,
                    "chunk_mb": cfg.files.chunk_mb}

    chunk = os.urandom(int(cfg.files.chunk_mb * 2**20))
    shards = erasure.encode(chunk, k, m)
    survivors = {i: shards[i] for i in range(m, k + m)}  # the first m shards lost: parity has to work
    result["encode_gb_s_per_core"] = per_core_gb_s(lambda: erasure.encode(chunk, k, m), len(chunk))
    result["decode_gb_s_per_core"] = per_core_gb_s(lambda: erasure.decode(survivors, k, m, "bench"), len(chunk))

    layouts = {"ec": ["layout=ec", f"ec.data={k}", f"ec.parity={m}"], "replicas=2": ["layout=replicas", "replicas=2"]}
    with tempfile.NamedTemporaryFile(dir="/var/tmp", prefix="ffs-bench-ec-") as src:
        src.write(os.urandom(size))
        src.flush()
        names = {label: f"bench/erasure-{label}.bin" for label in layouts}
        try:
            for label, extra in layouts.items():
                manifest = put(config.load(argv + extra), src.name, names[label], force=True)
                prefix = f"{object_prefix(names[label], 'file')}{manifest.generation}/"
                result.setdefault("overhead", {})[label] = stored_bytes(state, creds, manifest.bucket, prefix) / size
            for label in layouts:
                result.setdefault("read_p50_ms", {})[f"{label} healthy"] = p50_ms(names[label], argv)[0]
            ray.get(actors[1].hold_minio.remote())
            try:
                for label in layouts:
                    p50, degraded = p50_ms(names[label], argv)
                    result["read_p50_ms"][f"{label} node 1 down"] = p50
                    result.setdefault("degraded_reads", {})[label] = degraded
                for label in layouts:  # node 1's pieces rebuilt on the others, unbounded
                    result.setdefault("repair", {})[label] = _repair(argv, state, creds, names[label])
            finally:
                ray.get(actors[1].release_minio.remote())
            for label in layouts:  # node 1 is back: its pieces move home
                result.setdefault("move_home", {})[label] = _repair(argv, state, creds, names[label])
        finally:
            for name in names.values():
                try:
                    remove(cfg, name)
                except Exception:
                    pass
    p50 = result["read_p50_ms"]
    result["degraded / healthy (ec)"] = p50["ec node 1 down"] / p50["ec healthy"]
    result["targets"] = {"degraded read <= 3x healthy": result["degraded / healthy (ec)"] <= 3}
    out = report.run_dir(cfg, "bench-erasure")
    report.write_json(out, "erasure.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'erasure.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
