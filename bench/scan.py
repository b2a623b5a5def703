"""Scan resistance on a real cluster (issue 47), S3-FIFO against plain LRU in one run: for each
`cache.policy`, a one-node cluster of its own (`fasterfs up nodes=1`, cache.capacity_mb =
bench.scan_cache_mb, the real kernel) holds a hot file of 5 % of the cache and a scan file of 10x
the cache. A reader (`Namespace.cat`, as `fasterfs cat` reads) reads the hot file until the kernel
has made it hot and it is cached, then the scan file twice in order (so each of its chunks becomes
hot and is filled, pushing through the cache), re-reading the hot file every 1.5x the cache of
scan. Before each re-read, whether the hot file is in the cache is found on disk by its bytes (the
cache directory's files compared with the source, read with the standard library). The hot
file's hit ratio is those found over the re-reads.

Then past the kernel's counting map: a one-node cluster whose map holds kernel.count_keys=64 keys
reads a file of 3x that many 1 MiB chunks twice in order, with the second chance (kernel.seen_bits,
its default) and without it (0). Between a chunk's two GETs the map has let its count go; the
chunks cached after the second pass are found on disk (each chunk's bytes at its place in the
file's cache entry, read with the standard library), beside the kernel's own counters.

    python bench/scan.py [bench.scan_cache_mb=64] [cluster.first_address=127.0.3.2 minio.port=... (beside
                                                    another cluster: where its own clusters listen)]

Writes scan.json to <output_dir>/bench-scan-<time>/ (of the configuration's cluster.root).
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

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fasterfs.control import report
from fasterfs.control.node_directory import actor_name
from fasterfs.core import config
from fasterfs.core.config import Paths
from fasterfs.read.reader import Namespace

TARGET = 0.9
MB = 1_000_000  # cache.capacity_mb counts decimal MB


def fasterfs(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fasterfs.ui.cli", *args], check=True, capture_output=True, timeout=600)


def cached_here(cache_dir: Path, data: bytes) -> bool:
    """Whether a file of the cache directory holds exactly `data` (read with the standard library)."""
    for entry in os.scandir(cache_dir):
        if entry.is_file() and entry.stat().st_size == len(data) and Path(entry.path).read_bytes() == data:
            return True
    return False


# where the bench's clusters listen, from its own overrides (beside another cluster: other addresses)
PLACE = ("cluster.first_address", "cluster.ray_port", "cluster.dashboard_port", "cluster.client_port",
         "cluster.agent_port", "cluster.node_ports", "minio.port", "minio.console_port")


def placed(argv: list[str]) -> list[str]:
    return [a for a in argv if a.split("=", 1)[0] in PLACE]


def one_policy(policy: str, work: Path, cache_mb: int, hot: Path, scan: Path, where: list[str]) -> dict:
    root = work / f"cluster-{policy}"
    own = [f"cluster.root={root}", "nodes=1", f"cache.capacity_mb={cache_mb}", f"cache.policy={policy}",
           "kernel.mode=real", "dashboard.enabled=false", "cluster.name=ffs-scan", *where]
    fasterfs("up", *own)
    try:
        fasterfs("put", str(hot), "scan/hot.bin", *own)
        fasterfs("put", str(scan), "scan/scan.bin", *own)
        ns = Namespace(config.load(own))
        cache_dir = Paths(root).cache_dir(0)
        hot_bytes = hot.read_bytes()
        deadline = time.monotonic() + 60
        while not cached_here(cache_dir, hot_bytes):  # read until the kernel made it hot and it landed
            if time.monotonic() > deadline:
                raise RuntimeError(f"{policy}: the hot file was never cached")
            assert ns.cat("scan/hot.bin") == hot_bytes
            time.sleep(0.2)
        size, every, step = scan.stat().st_size, int(1.5 * cache_mb * MB), 4 << 20
        found, next_reread, t = [], every, time.perf_counter()
        for n in range(2):
            for pos in range(0, size, step):
                ns.cat("scan/scan.bin", pos, min(pos + step, size))
                if n * size + pos + step >= next_reread:
                    found.append(cached_here(cache_dir, hot_bytes))
                    assert ns.cat("scan/hot.bin") == hot_bytes
                    next_reread += every
        return {"policy": policy, "rereads": len(found), "hot_found": sum(found), "hit_ratio": sum(found) / len(found),
                "found": found, "scan_s": time.perf_counter() - t}
    finally:
        ray.shutdown()  # this process's link to the cluster, before the cluster goes
        fasterfs("down", *own)


PAST_KEYS = 64  # the counting map's smallest size (config.py)


def chunks_cached(cache_dir: Path, data: bytes, chunk: int) -> int:
    """How many of `data`'s chunks a cache entry of its size holds at their places (a chunk not
    filled reads as zeros there), read with the standard library."""
    best = 0
    for entry in os.scandir(cache_dir):
        if entry.is_file() and entry.stat().st_size == len(data):
            with open(entry.path, "rb") as f:
                best = max(best, sum(f.read(chunk) == data[at:at + chunk] for at in range(0, len(data), chunk)))
    return best


def past_map(work: Path, scan: Path, second_chance: bool, where: list[str]) -> dict:
    """A file of 3x the map's keys in chunks, read twice in order on a cluster of its own."""
    root = work / f"cluster-past-{second_chance}"
    own = [f"cluster.root={root}", "nodes=1", "cache.capacity_mb=1000", "kernel.mode=real",
           "dashboard.enabled=false", "cluster.name=ffs-scan", f"kernel.count_keys={PAST_KEYS}",
           "files.chunk_mb=1", *([] if second_chance else ["kernel.seen_bits=0"]), *where]
    fasterfs("up", *own)
    try:
        fasterfs("put", str(scan), "past/scan.bin", *own)
        ns = Namespace(config.load(own))
        data, step = scan.read_bytes(), 1 << 20
        t = time.perf_counter()
        for _ in range(2):
            for pos in range(0, len(data), step):
                assert ns.cat("past/scan.bin", pos, min(pos + step, len(data))) == data[pos:pos + step]
        time.sleep(3)  # the last fills land
        actor = ray.get_actor(actor_name(0), namespace=ns.state.ray_namespace)
        kernel = ray.get(actor.kernel_status.remote())
        return {"second_chance": second_chance, "chunks": -(-len(data) // step), "map_keys": PAST_KEYS,
                "chunks_cached": chunks_cached(Paths(root).cache_dir(0), data, step),
                "hot_events": kernel["counters"]["hot_events"], "key_counts": kernel["key_counts"],
                "read_s": time.perf_counter() - t}
    finally:
        ray.shutdown()
        fasterfs("down", *own)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    cache_mb = int(cfg.bench.scan_cache_mb)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-scan-", dir="/var/tmp"))
    hot, scan = work / "hot.bin", work / "scan.bin"
    hot_bytes = int(0.05 * cache_mb * MB)
    hot.write_bytes(os.urandom(hot_bytes))
    with open(scan, "wb") as f:
        for _ in range(10 * cache_mb):
            f.write(os.urandom(MB))
    past = work / "past.bin"
    past.write_bytes(os.urandom(3 * PAST_KEYS << 20))
    try:
        rows = [one_policy(p, work, cache_mb, hot, scan, placed(argv)) for p in ("s3fifo", "lru")]
        beyond = [past_map(work, past, chance, placed(argv)) for chance in (True, False)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fifo, lru = rows[0]["hit_ratio"], rows[1]["hit_ratio"]
    chance, none = beyond
    result = {"cache_mb": cache_mb, "hot_bytes": hot_bytes, "scan_bytes": 10 * cache_mb * MB, "rows": rows,
              "past_map": beyond,
              "targets": {f"S3-FIFO hot hit ratio {fifo:.0%} >= {TARGET:.0%} (LRU beside it: {lru:.0%})":
                          fifo >= TARGET,
                          f"a scan of {chance['chunks']} chunks past a map of {PAST_KEYS}: "
                          f"{chance['chunks_cached']} cached with the second chance (without: {none['chunks_cached']})":
                          chance["chunks_cached"] >= 0.9 * chance["chunks"]}}
    out = report.write_json(report.run_dir(cfg, "bench-scan"), "scan.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
