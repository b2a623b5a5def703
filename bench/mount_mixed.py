"""Hot reads through the mount while others read cold (issue 46), side by side in one run:
bench.hot_files files of ~750 KB made hot (each a cache entry, opened by passthrough), each hot
read an open + read + close of one of them, timed:

1. alone;
2. beside 4 readers (dd, 1 MiB reads) streaming a local file of bench.file_mb from disk, the
   page cache dropped first: the CPU and disk contention alone (the control);
3. beside 4 readers streaming a cold file of the same size through the mount (a quarter
   each; a new file for each mount, so never cached), with the mount as it is configured
   (requests over io_uring where the kernel has it), with requests through /dev/fuse
   (mount.uring=false), and with mount.native_fetch=false (every miss read by the agent: the
   path before the daemon fetched).

p50, p99 and max of bench.hot_reads reads per phase, and the ratio of each p99 to the control's.

    python bench/mount_mixed.py [bench.file_mb=512] [bench.hot_reads=400]   (on `fasterfs up`)

Writes mount_mixed.json to <output_dir>/bench-mount-mixed-<time>/.
"""
from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mounts

from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.ops import cluster
from fasterfs.write.ingest import put, remove

READERS = 4
HOT_BYTES = 750_000
PREFIX = "bench-mixed"


def hot_reads(paths: list[Path], n: int, seed: int) -> list[float]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        p = rng.choice(paths)
        t = time.perf_counter()
        with open(p, "rb") as f:
            f.read()
        out.append(time.perf_counter() - t)
    return out


def summary(lat: list[float]) -> dict:
    s = sorted(lat)
    return {"p50_ms": statistics.median(s) * 1e3, "p99_ms": s[int(len(s) * 0.99) - 1] * 1e3, "max_ms": s[-1] * 1e3,
            "reads": len(s)}


def streaming(path: Path, size: int) -> list[subprocess.Popen]:
    """READERS dd processes, each reading its quarter of `path` in 1 MiB blocks."""
    part = size // READERS // 2**20
    return [subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=1M", f"skip={k * part}", f"count={part}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for k in range(READERS)]


def beside(readers: list[subprocess.Popen], paths: list[Path], n: int, seed: int) -> dict:
    """Hot reads while `readers` run (their time kept); the readers are waited for (bounded)."""
    t = time.perf_counter()
    lat = hot_reads(paths, n, seed)
    running = sum(r.poll() is None for r in readers)
    for r in readers:
        r.wait(timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"a reader (dd) failed with exit code {r.returncode}")
    return {**summary(lat), "readers_still_running_at_end": running, "readers_s": time.perf_counter() - t}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)
    size = int(cfg.bench.file_mb) * 2**20
    n = int(cfg.bench.hot_reads)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-mixed-", dir="/var/tmp"))
    own = [f"cluster.name={state.name}", f"cluster.root={state.root}", f"cluster.ray_address={state.ray_address}"]
    result: dict = {"file_mb": int(cfg.bench.file_mb), "hot_files": int(cfg.bench.hot_files), "readers": READERS,
                    "phases": {}}
    made: list[str] = []
    views: dict[str, mounts.Mount] = {}
    try:
        rng = np.random.default_rng(2)
        hot_names = []
        for k in range(int(cfg.bench.hot_files)):
            src = work / f"hot-{k}.bin"
            src.write_bytes(rng.bytes(HOT_BYTES))
            m = put(cfg, src, f"{PREFIX}/hot/{k}.bin", force=True)
            made.append(m.name)
            hot_names.append(m)
        local = work / "local.bin"
        with open(local, "wb") as f:
            for _ in range(size // 2**20):
                f.write(rng.bytes(2**20))
        views["native"] = mounts.fasterfs(work / "native", own)
        views["native, /dev/fuse"] = mounts.fasterfs(work / "dev-fuse", own + ["mount.uring=false"])
        views["agent reads"] = mounts.fasterfs(work / "agent", own + ["mount.native_fetch=false"])
        for m in hot_names:  # each cached at its home: opened by passthrough from the first open
            ray.get(actors[m.chunks[0].nodes[0]].cache_warm.remote([c.key for c in m.chunks]))
        report.wait_for_fills(actors, len(hot_names), timeout=120)
        hot = {name: [v.point / PREFIX / "hot" / f"{k}.bin" for k in range(len(hot_names))]
               for name, v in views.items()}
        for paths in hot.values():  # the first opens find them hot
            hot_reads(paths, 2 * len(paths), 0)

        phases = result["phases"]
        phases["alone"] = summary(hot_reads(hot["native"], n, 1))
        mounts.drop_page_cache()
        phases["beside 4 local readers (control)"] = beside(streaming(local, size), hot["native"], n, 2)
        for name, view in views.items():
            cold = put(cfg, local, f"{PREFIX}/cold-{name.replace(' ', '-')}.bin", force=True)
            made.append(cold.name)
            mounts.drop_page_cache()
            path = view.point / cold.name
            deadline = time.monotonic() + 10
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            phases[f"beside 4 cold readers through the mount ({name})"] = beside(
                streaming(path, size), hot[name], n, 3)
        control = phases["beside 4 local readers (control)"]["p99_ms"]
        result["p99_vs_control"] = {k: v["p99_ms"] / control for k, v in phases.items()}
        native = result["p99_vs_control"]["beside 4 cold readers through the mount (native)"]
        result["targets"] = {f"hot p99 beside cold readers <= 2x the control's ({native:.2f}x)": native <= 2}
    finally:
        for v in views.values():
            v.stop()
        for name in made:
            try:
                remove(cfg, name)
            except Exception as e:
                print(f"{name} not removed: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    out = report.run_dir(cfg, "bench-mount-mixed")
    report.write_json(out, "mount_mixed.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'mount_mixed.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
