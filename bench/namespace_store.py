"""The namespace store alone (fasterfs.meta on cluster.namespace_store's engine, as the Registry
holds it; for redis a server started here, as `up` starts it), at the sizes
a team's data reaches: bench.store_files names (default 1,000,000) published in batches of 1,000
files of one 4 KiB chunk (keys as `put -r` makes them), no Ray, no MinIO. Side by side at a small
and the full size: a batch's publish, one more file's publish, a lookup by path, a
1,000-entry listing, the changes of one batch, and the store's disk and this process's memory
per file.

    python bench/namespace_store.py [bench.store_files=1000000] [cluster.namespace_store=redis]

Writes namespace_store.json to <output_dir>/bench-namespace-store-<time>/.
"""
from __future__ import annotations

import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fasterfs.control import report
from fasterfs.core import config, process
from fasterfs.core.manifest import ChunkInfo, Manifest, object_prefix
from fasterfs.meta import NamespaceStore, open_engine
from fasterfs.meta.redis_server import RedisServer

BATCH = 1000


def manifest(name: str, generation: str) -> Manifest:
    key = f"{object_prefix(name, 'file')}{generation}/part-00000"
    return Manifest(name, "bytes", 0, 0, 0, 1, 2, "fasterfs", generation,
                    [ChunkInfo(0, key, [hash(name) % 2], 4096, 0, 0, 0.0, 0.0, hash(key) & (2**63 - 1))], kind="file")


def batch(start: int, generation: str) -> list[tuple[Manifest, str]]:
    """Files start..start+BATCH-1, directories of 1,000 (five years of 500 symbols, say)."""
    out = []
    for i in range(start, start + BATCH):
        name = f"taq/y{i // 250_000}/s{i // 1000 % 250:03d}/d{i % 1000:04d}.parquet"
        out.append((manifest(name, generation), object_prefix(name, "file")))
    return out


def disk(work: Path) -> int:
    """Bytes the store keeps on disk (SQLite's file and WAL; Redis's append-only files)."""
    return sum(p.stat().st_size for p in work.rglob("*") if p.is_file() and p.suffix != ".log")


def rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def probe(store: NamespaceStore, files: int) -> dict:
    """What one more operation costs at this size (medians)."""
    publish, lookup, listing, changes = [], [], [], []
    for k in range(20):
        name = f"probe/{files}/{k}.bin"
        t = time.perf_counter()
        store.publish(manifest(name, "g1"), object_prefix(name, "file"))
        publish.append(time.perf_counter() - t)
    for k in range(200):
        i = (k * 7919) % files
        t = time.perf_counter()
        store.resolve(f"taq/y{i // 250_000}/s{i // 1000 % 250:03d}/d{i % 1000:04d}.parquet")
        lookup.append(time.perf_counter() - t)
    for k in range(10):
        i = (k * 104729) % files
        t = time.perf_counter()
        got = store.listdir(f"taq/y{i // 250_000}/s{i // 1000 % 250:03d}")
        listing.append(time.perf_counter() - t)
        assert got is not None and len(got.names) == 1000
    before = store.version
    store.publish_batch(batch(10**9, "g2"))
    for _ in range(5):
        t = time.perf_counter()
        got_changes = store.changes(before)
        changes.append(time.perf_counter() - t)
        assert got_changes is not None and len(got_changes.names) == BATCH
    return {"files": files, "publish_one_ms": statistics.median(publish) * 1e3,
            "resolve_us": statistics.median(lookup) * 1e6, "listdir_1000_ms": statistics.median(listing) * 1e3,
            "changes_of_a_batch_ms": statistics.median(changes) * 1e3}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    total = int(cfg.bench.store_files)
    small = min(10_000, total)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-store-", dir="/var/tmp"))
    engine = cfg.cluster.namespace_store
    result: dict = {"engine": engine, "batch": BATCH, "targets": {}}
    server = RedisServer(work).start(30) if engine == "redis" else None
    try:
        store = NamespaceStore(open_engine(engine, work), "bench", lambda method, arg: [])
        rss0 = rss()
        batch_s: list[float] = []
        at_small: dict = {}
        for start in range(0, total, BATCH):
            t = time.perf_counter()
            store.publish_batch(batch(start, "g1"))
            batch_s.append(time.perf_counter() - t)
            if start + BATCH == small:
                at_small = probe(store, small)
                at_small["disk_bytes_per_file"] = disk(work) / small
        at_full = probe(store, total)
        at_full["disk_bytes_per_file"] = disk(work) / total
        if server is not None:
            info = store.engine.r.info("memory")  # type: ignore[attr-defined]
            result["redis_used_memory_bytes_per_file"] = info["used_memory"] / total
        result.update(small=at_small, full=at_full, disk_bytes=disk(work),
                      peak_rss_growth_bytes_per_file=(rss() - rss0) / total,
                      first_batches_ms=statistics.median(batch_s[:10]) * 1e3,
                      last_batches_ms=statistics.median(batch_s[-10:]) * 1e3,
                      load_s=sum(batch_s), files_per_s=total / sum(batch_s))
        for what in ("publish_one_ms", "resolve_us", "listdir_1000_ms", "changes_of_a_batch_ms"):
            ratio = at_full[what] / at_small[what]
            result["targets"][f"{what} at {total} <= 1.2x at {small} ({ratio:.2f}x)"] = ratio <= 1.2
        ratio = result["last_batches_ms"] / result["first_batches_ms"]
        result["targets"][f"the last batches <= 1.2x the first ({ratio:.2f}x)"] = ratio <= 1.2
        store.engine.close()
    finally:
        if server is not None:
            process.terminate(server)
        shutil.rmtree(work, ignore_errors=True)
    out = report.run_dir(cfg, "bench-namespace-store")
    report.write_json(out, "namespace_store.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'namespace_store.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
