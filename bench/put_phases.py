"""Where one more `put` spends its time, on a running cluster (`fasterfs up`) at whatever size its
namespace has: bench.put_phases_n puts of a 4 KiB file, each phase timed by wrapping the functions
`ingest.put` calls (the Registry's, the S3 clients', storing, publishing, the clean-up after),
median per put. Run it at a small namespace and again at a large one to see which phase grows.

    python bench/put_phases.py [cluster.root=...] [bench.put_phases_n=10]

Leaves the files it stored under bench-put-phases-<time>/ (`fasterfs rm` or `fasterfs down`).
Writes put_phases.json to <output_dir>/bench-put-phases-<time>/ and prints a table.
"""
from __future__ import annotations

import collections
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fasterfs.control import registry, report, s3
from fasterfs.core import config
from fasterfs.write import ingest

PHASES = [(registry, ["find", "fetch_manifest", "conflict", "fetch_credentials", "publish_manifest", "generations",
                      "expired", "expired_pieces"]),
          (s3, ["client"]), (ingest, ["store_chunk", "_delete_objects", "collect_garbage"])]


def timed(took: dict[str, list[float]]) -> list:
    """Wrap every phase's function to record its seconds in `took`; returns what to restore."""
    undo = []
    for module, names in PHASES:
        for name in names:
            fn = getattr(module, name)

            @functools.wraps(fn)
            def wrapper(*args, _fn=fn, _name=name, **kwargs):
                began = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    took[_name].append(time.perf_counter() - began)
            setattr(module, name, wrapper)
            undo.append((module, name, fn))
    return undo


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    n = int(cfg.bench.put_phases_n)
    tag = time.strftime("bench-put-phases-%Y%m%dT%H%M%S")
    took: dict[str, list[float]] = collections.defaultdict(list)
    totals = []
    with tempfile.TemporaryDirectory() as work:
        one = Path(work) / "one.bin"
        one.write_bytes(os.urandom(4096))
        ingest.put(cfg, one, f"{tag}/warm-up")  # the first connects to Ray
        undo = timed(took)
        try:
            for i in range(n):
                began = time.perf_counter()
                ingest.put(cfg, one, f"{tag}/{i}")
                totals.append(time.perf_counter() - began)
        finally:
            for module, name, fn in undo:
                setattr(module, name, fn)
    result = {"names": registry.names_count(registry.find(cfg).name), "puts": n,
              "put_ms": statistics.median(totals) * 1e3,
              "phases": {name: {"calls_per_put": len(ts) / n, "median_ms": statistics.median(ts) * 1e3,
                                "ms_per_put": sum(ts) / n * 1e3} for name, ts in took.items()}}
    out = report.write_json(report.run_dir(cfg, "bench-put-phases"), "put_phases.json", result)
    print(f"one more put at {result['names']:,} names: {result['put_ms']:.1f} ms (median of {n})")
    print(f"{'phase':<18} {'calls/put':>9} {'median ms':>10} {'ms/put':>8}")
    for name, ph in result["phases"].items():
        print(f"{name:<18} {ph['calls_per_put']:>9.1f} {ph['median_ms']:>10.2f} {ph['ms_per_put']:>8.2f}")
    print(json.dumps({"report": str(out)}))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
