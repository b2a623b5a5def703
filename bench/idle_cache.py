"""A node's cache at rest (issue 47): a full ChunkCache of bench.idle_entries entries (of
bench.cache_entry_bytes, on the disk cluster.root is on), nothing read, its background work run
for bench.idle_seconds exactly as a StorageNode schedules it: the scrub every
cache.scrub_interval_s with its budget (interval x cache.scrub_mb_per_s), and the peer tier's
share every second (a cache that does not change tells nothing). Measured from the process:
CPU seconds per second (of one core), and bytes read from the disk (/proc/self/io, the page cache
dropped first) per second against the scrub's configured share. Also the restart: a new ChunkCache
over the same directory after a clean stop.

What this leaves out: the StorageNode's other loops (MinIO's supervisor and scrub, the repair
leader, status), which do not grow with the cache's entries; not measured here.

    python bench/idle_cache.py [bench.idle_entries=200000] [bench.idle_seconds=60]

Writes idle_cache.json to <output_dir>/bench-idle-cache-<time>/.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache_ops import filled
from mounts import drop_page_cache

from fasterfs.control import report
from fasterfs.core import config
from fasterfs.node.cache import ChunkCache
from fasterfs.node.peer_tier import PeerTier

CPU_TARGET = 0.02  # of one core


def disk_read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    b, c = cfg.bench, cfg.cache
    n, size, seconds = int(b.idle_entries), int(b.cache_entry_bytes), float(b.idle_seconds)
    root = Path(cfg.cluster.root)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-idle-", dir=root))
    try:
        t = time.perf_counter()
        cache = filled(work / "cache", n, size, c.policy)
        made_s = time.perf_counter() - t
        cache.close()
        t = time.perf_counter()
        cache = ChunkCache(work / "cache", capacity=n * size, policy=c.policy)  # a restart, after a clean stop
        restart_s = time.perf_counter() - t
        assert cache.stats()["entries"] == n, cache.stats()
        told: list = []
        tier = PeerTier(0, cache, lambda news, to: told.append(news))
        tier.share()  # the start: everything told once
        told.clear()
        budget = int(c.scrub_interval_s * c.scrub_mb_per_s * 1e6)
        drop_page_cache()
        cpu0, disk0, t0 = time.process_time(), disk_read_bytes(), time.monotonic()
        next_scrub = t0  # a round at once, then every interval: whole rounds in the window
        while (now := time.monotonic()) < t0 + seconds:
            tier.share()
            if c.scrub_interval_s and now >= next_scrub:
                cache.scrub(budget)
                next_scrub += float(c.scrub_interval_s)
            time.sleep(1.0)
        wall = time.monotonic() - t0
        cpu, disk = time.process_time() - cpu0, disk_read_bytes() - disk0
        result = {"entries": n, "entry_bytes": size, "seconds": wall, "made_s": made_s, "restart_s": restart_s,
                  "cpu_per_s": cpu / wall, "disk_read_bytes_per_s": disk / wall,
                  "scrub_share_bytes_per_s": c.scrub_mb_per_s * 1e6, "scrub_rounds": cache.counters["scrubs"],
                  "scrub_bytes": cache.counters["scrub_bytes"], "peer_messages": len(told)}
        result["targets"] = {
            f"CPU {result['cpu_per_s']:.4f} of a core <= {CPU_TARGET}": result["cpu_per_s"] <= CPU_TARGET,
            f"disk reads {disk / wall:,.0f} B/s <= the scrub's share {c.scrub_mb_per_s * 1e6:,.0f} B/s":
                disk / wall <= c.scrub_mb_per_s * 1e6}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = report.write_json(report.run_dir(cfg, "bench-idle-cache"), "idle_cache.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
