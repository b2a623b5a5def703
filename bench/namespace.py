"""Unmodified readers of FasterFS, measured side by side in one run (on `fasterfs up`):

1. fio (Debian's) on a file stored with `put` (bench.file_mb, default 1024), read through the
   FUSE mount, against the same file on local disk: sequential 1 MiB and random 4 KiB reads;
   cold (caches cleared), first read of cached chunks, repeated read. Baseline for cold:
   the client's own read of every chunk from MinIO, in the same run.
2. pandas.read_csv of the whole dataset through the mount and through fasterfs://, hot,
   against the same bytes as a local file.
3. Ray Data: rows/s reading the dataset with the node-1 readers only vs all nodes, and the
   share of rows read on the node holding them.

    python bench/namespace.py [bench.file_mb=256] [overrides]

Writes namespace.json to <output_dir>/bench-namespace-<time>/.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fasterfs  # noqa: E402
from fasterfs import cluster, config, registry, report  # noqa: E402
from fasterfs.ingest import put, remove  # noqa: E402

FIO_RUNTIME_S = 15  # each random-read run is bounded in time


def fio(path: Path, rw: str, bs: str, size: int) -> float:
    """MB/s of one fio job reading `path` (sequential: the whole file once; random: bounded)."""
    args = ["fio", "--name=ffs", f"--filename={path}", "--readonly", f"--rw={rw}", f"--bs={bs}",
            "--ioengine=psync", "--numjobs=1", f"--size={size}", "--output-format=json", "--invalidate=0"]
    if rw == "randread":
        args += [f"--runtime={FIO_RUNTIME_S}", "--time_based=0", f"--io_size={min(size, 256 * 2**20)}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"fio on {path} failed: {out.stderr[-500:]}")
    job = json.loads(out.stdout)["jobs"][0]["read"]
    return job["bw_bytes"] / 1e6


def drop_page_cache(path: Path) -> None:
    """The local baseline's cold case: its pages out of the page cache (fadvise DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    size_mb = int(cfg.bench.file_mb)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-", dir="/var/tmp"))
    point = work / "mnt"
    point.mkdir()
    result: dict = {"file_mb": size_mb, "chunk_mb": cfg.files.chunk_mb, "nodes": len(state.nodes)}
    try:
        local = work / "local.bin"
        rng = np.random.default_rng(1)
        with open(local, "wb") as f:
            for _ in range(size_mb):
                f.write(rng.bytes(2**20))
        size = local.stat().st_size
        manifest = put(cfg, local, "bench/file.bin", force=True)
        ray.get(actors[0].mount.remote(str(point)))
        mounted = point / "bench" / "file.bin"

        # the client's own cold read from MinIO: the baseline for the mount's cold read
        client = fasterfs.connect(overrides=argv, use_cache=False, dataset="bench/file.bin")
        t = time.perf_counter()
        for i in range(len(manifest)):
            client.read_chunk(i)
        client_mb_s = size / 1e6 / (time.perf_counter() - t)

        fio_rows = {}
        for rw, bs in (("read", "1M"), ("randread", "4k")):
            row = {}
            drop_page_cache(local)
            row["local cold"] = fio(local, rw, bs, size)
            row["local repeated"] = fio(local, rw, bs, size)
            ray.get([a.cache_clear.remote() for a in actors])
            row["mount cold"] = fio(mounted, rw, bs, size)
            ray.get([a.cache_warm.remote([c.key for c in manifest.chunks if c.nodes[0] == k])
                     for k, a in enumerate(actors)])
            report.wait_for_fills(actors, len(manifest), timeout=300)
            row["mount first read of cached chunks"] = fio(mounted, rw, bs, size)
            row["mount repeated"] = fio(mounted, rw, bs, size)
            fio_rows[f"{rw} {bs}"] = row
        result["fio_mb_s"] = fio_rows
        result["client_cold_mb_s"] = client_mb_s
        seq = fio_rows["read 1M"]
        result["targets"] = {
            "first read of cached chunks >= 1 GB/s": seq["mount first read of cached chunks"] >= 1000,
            "repeated read >= 0.8x local file": seq["mount repeated"] >= 0.8 * seq["local repeated"],
            "cold >= 0.8x the client's read from MinIO": seq["mount cold"] >= 0.8 * client_mb_s,
        }

        # pandas over the whole dataset, hot
        import pandas as pd

        data = fasterfs.connect(overrides=argv)
        ds = data.manifest
        csv_local = work / f"{ds.name}.csv"
        csv_local.write_bytes(b"".join(data.read_chunk(i) for i in range(len(ds))))
        ray.get([a.cache_warm.remote([c.key for c in ds.chunks if c.nodes[0] == k]) for k, a in enumerate(actors)])
        report.wait_for_fills(actors, len(ds), timeout=120)

        def best_of(fn, n=3):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                frame = fn()
                times.append(time.perf_counter() - t)
            assert len(frame) == ds.rows
            return min(times)
        pandas = {"local file": best_of(lambda: pd.read_csv(csv_local, header=None)),
                  "mount": best_of(lambda: pd.read_csv(point / ds.name / f"{ds.name}.csv", header=None)),
                  "fasterfs://": best_of(lambda: pd.read_csv(f"fasterfs://{ds.name}/{ds.name}.csv", header=None,
                                                             storage_options={"overrides": list(argv)}))}
        result["pandas_s"] = pandas
        result["targets"]["pandas through the mount, hot <= 1.2x local"] = pandas["mount"] <= 1.2 * pandas["local file"]
        result["targets"]["pandas through fasterfs://, hot <= 1.2x local"] = \
            pandas["fasterfs://"] <= 1.2 * pandas["local file"]

        # Ray Data: node 0's readers alone, then every node's
        rows = {}
        for label, nodes in (("1 node", [state.nodes[0].index]), (f"{len(state.nodes)} nodes", None)):
            fasterfs.data.read(ds.name, argv, nodes=nodes).count()  # workers started, caches as they are
            t = time.perf_counter()
            frame = fasterfs.data.read(ds.name, argv, nodes=nodes, with_node=True).to_pandas()
            wall = time.perf_counter() - t
            rows[label] = {"rows": len(frame), "rows_per_s": len(frame) / wall,
                           "share_on_holder": float((frame["_read_on"] == frame["_holder"]).mean())}
        result["ray_data"] = rows
    finally:
        try:
            ray.get(actors[0].umount.remote(str(point)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
            try:
                remove(cfg, "bench/file.bin")
            except Exception:
                pass
    out = report.run_dir(cfg, "bench-namespace")
    report.write_json(out, "namespace.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'namespace.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
