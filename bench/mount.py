"""Unmodified readers on hot data, side by side in one run: per-file open().read() of every chunk
file of the dataset ingested last, through the mount (passthrough for hot files; its requests
over io_uring where the kernel has it, beside a second mount with mount.uring=false), with the
client's `read_chunk`, from MinIO direct, and from a local copy of the same bytes (the floor).
Every chunk is in the caches (`cache warm`) and read through each path twice before the timed
rounds; rounds interleave the paths so the machine's drift falls on all of them.

    python bench/mount.py                  (on `fasterfs up` with a dataset ingested)
    python bench/mount.py bench.mount_rounds=9

Writes mount.json into the run's output directory; prints p50/p95 per path and each p50 against
the local copy's.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mounts

import fasterfs
from fasterfs.control import report
from fasterfs.core import config


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    rounds = int(cfg.bench.mount_rounds)
    client, _, names = mounts.hot_dataset(argv)
    state, m = client.state, client.manifest
    ids = list(range(len(m)))
    cold = fasterfs.connect(overrides=argv, use_cache=False)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-mount-", dir=state.root))
    local = work / "local"
    copies = local / m.name / "chunks"  # laid out as in the mounts
    copies.mkdir(parents=True)
    for i, name in zip(ids, names):
        (copies / name).write_bytes(cold.read_chunk(i))
    overrides = [f"cluster.name={state.name}", f"cluster.root={state.root}", f"cluster.ray_address={state.ray_address}",
                 *argv]  # mount.* overrides reach the mounts
    mount = mounts.fasterfs(work / "mnt", overrides)  # requests over io_uring where the kernel has it
    dev_fuse = mounts.fasterfs(work / "mnt-dev-fuse", [*overrides, "mount.uring=false"])
    try:
        def reader(directory: Path):
            files = [directory / m.name / "chunks" / name for name in names]

            def read(k):
                with open(files[k], "rb") as f:
                    return f.read()
            return read
        paths = {"local copy": reader(local), "native mount": reader(mount.point),
                 "native, /dev/fuse": reader(dev_fuse.point),
                 "client read_chunk": lambda k: client.read_chunk(ids[k]),
                 "MinIO direct": lambda k: cold.read_chunk(ids[k])}
        for name, read in paths.items():  # twice each: the native mount declares files hot at the first
            for k in range(len(ids)):
                assert read(k) == (copies / names[k]).read_bytes(), f"{name}: chunk {ids[k]} differs"
                read(k)
        lat: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, read in paths.items():
                lat[name] += report.timed(read, range(len(ids)))
        time.sleep(2)  # the agent writes its daemon's counters every second
        counts = {"native": json.loads(Path(f"{mount.point}.stats.json").read_text()),
                  "/dev/fuse": json.loads(Path(f"{dev_fuse.point}.stats.json").read_text())}
    finally:
        mount.stop()
        dev_fuse.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    stats = {name: report.quantiles(xs) for name, xs in lat.items()}
    floor = stats["local copy"]["p50_ms"]
    vs_local = {name: s["p50_ms"] / floor for name, s in stats.items()}
    result = {"dataset": m.name, "files": len(ids), "file_bytes_avg": m.total_bytes / len(ids), "rounds": rounds,
              "paths": stats, "p50_vs_local": vs_local,
              "native_vs_minio_x_faster": stats["MinIO direct"]["p50_ms"] / stats["native mount"]["p50_ms"],
              "native_daemon": counts.get("native"), "dev_fuse_daemon": counts.get("/dev/fuse")}
    console = report.console()
    console.print(f"per-file open().read(), hot, {len(ids)} files of {report.fmt_bytes(result['file_bytes_avg'])}, "
                  f"{rounds} rounds")
    for name, s in stats.items():
        console.print(f"  {name:18s} p50 {s['p50_ms']:7.3f} ms  p95 {s['p95_ms']:7.3f} ms  "
                      f"{vs_local[name]:5.2f}x local")
    uring = {name: c["uring"] for name, c in counts.items()}
    console.print(f"  native mount vs MinIO direct: {result['native_vs_minio_x_faster']:.1f}x faster; "
                  f"requests through io_uring: {uring}")
    console.print(f"  native daemon: {counts.get('native')}")
    out = report.run_dir(cfg, "bench_mount")
    report.write_json(out, "mount.json", result)
    console.print(f"output: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
