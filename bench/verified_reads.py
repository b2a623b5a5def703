"""What checking cached bytes costs, path by path, side by side in one run, and how long a rotten
cache entry can be served through the mount's passthrough (the one path left unchecked per read).

Paths, each reading every chunk file of the dataset ingested last, hot (every chunk cached):
the client's hit unchecked (the default) and checked (`cache.verify_reads=true`); the namespace's
reads (what the mount's agent, fasterfs:// and `cat` use), which check each chunk against the
manifest once per open; the same descriptor read unchecked, as those reads were before; the
native mount (passthrough: the kernel reads the entry). Rounds interleave the paths.

Then the window: a byte of one hot file's cache entry is flipped, and the file is read through
the mount every 0.1 s until it reads right again (the owner's scrub found the entry rotten and
dropped it, and the next open went to the agent, which checks). Bounded: two scrub intervals
plus a minute.

    python bench/verified_reads.py            (on `fasterfs up` with a dataset ingested)
    python bench/verified_reads.py bench.mount_rounds=9
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mounts

import fasterfs
from fasterfs import cluster, config, report
from fasterfs.reader import Namespace


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    rounds = int(cfg.bench.mount_rounds)
    client = fasterfs.connect(overrides=argv)
    checked = fasterfs.connect(overrides=argv + ["cache.verify_reads=true"])
    state, m = client.state, client.manifest
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)
    ids = list(range(len(m)))
    by_node: dict[int, list[str]] = {}
    for i in ids:
        by_node.setdefault(client.sources(i)[0], []).append(m.chunk(i).key)
    ray.get([actors[n].cache_warm.remote(keys) for n, keys in by_node.items()])
    names = [m.chunk(i).key.rsplit("/", 1)[-1] for i in ids]
    ns = Namespace(cfg)
    expected = [fasterfs.connect(overrides=argv, use_cache=False).read_chunk(i) for i in ids]
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-verify-", dir=state.root))
    overrides = [f"cluster.name={state.name}", f"cluster.root={state.root}", f"cluster.ray_address={state.ray_address}"]
    mount = mounts.fasterfs(work / "mnt", overrides)
    scrub_s = float(state.config["cache"]["scrub_interval_s"])
    try:
        files = [mount.point / m.name / "chunks" / name for name in names]

        def through_mount(k):
            with open(files[k], "rb") as f:
                return f.read()

        def descriptor_unchecked(k):  # OpenFile's cached read as it was: fresh, size, no checksum
            fd, header, _, _ = client.open_cached(ids[k], verify=False)
            try:
                place = client.cache_place(ids[k])
                return os.pread(fd, header.size, place.offset if place else 0)
            finally:
                os.close(fd)
        paths = {"client hit, unchecked": lambda k: client.read_chunk(ids[k]),
                 "client hit, checked": lambda k: checked.read_chunk(ids[k]),
                 "namespace read, checked": lambda k: ns.cat(f"{m.name}/chunks/{names[k]}"),
                 "descriptor read, unchecked": descriptor_unchecked,
                 "mount (passthrough)": through_mount}
        for name, read in paths.items():  # twice each: the mount declares files hot at the first
            for k in range(len(ids)):
                assert read(k) == expected[k], f"{name}: chunk {ids[k]} differs"
                read(k)
        lat: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, read in paths.items():
                lat[name] += report.timed(read, range(len(ids)))

        # the window: rot under a hot file, read through the mount until it reads right
        k = 0
        entry = Path(client.cache_path(client.sources(ids[k])[0], ids[k]))
        raw = bytearray(entry.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        with open(entry, "r+b") as f:  # in place: the same inode the daemon holds as the backing
            f.seek(len(raw) // 2)
            f.write(raw[len(raw) // 2:len(raw) // 2 + 1])
        flipped, wrong, window = time.monotonic(), 0, None
        while time.monotonic() - flipped < 2 * scrub_s + 60:
            if through_mount(k) == expected[k]:
                window = time.monotonic() - flipped
                break
            wrong += 1
            time.sleep(0.1)
    finally:
        mount.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    stats = {name: report.quantiles(xs) for name, xs in lat.items()}
    result = {"dataset": m.name, "files": len(ids), "file_bytes_avg": m.total_bytes / len(ids), "rounds": rounds,
              "paths": stats, "scrub_interval_s": scrub_s, "rot_window_s": window, "rotten_reads_in_window": wrong}
    console = report.console()
    console.print(f"hot whole-chunk reads, {len(ids)} files of {report.fmt_bytes(result['file_bytes_avg'])}, "
                  f"{rounds} rounds")
    for name, s in stats.items():
        console.print(f"  {name:28s} p50 {s['p50_ms']:7.3f} ms  p95 {s['p95_ms']:7.3f} ms")
    p50 = {name: s["p50_ms"] for name, s in stats.items()}
    console.print(f"  checking costs: client hit {p50['client hit, checked'] / p50['client hit, unchecked']:.2f}x, "
                  f"namespace read {p50['namespace read, checked'] / p50['descriptor read, unchecked']:.2f}x")
    after = f"{window:.1f} s" if window is not None else "never (bound reached)"
    console.print(f"  rot under a hot passthrough file: served rotten by {wrong} reads, right again after {after} "
                  f"(scrub every {scrub_s:.0f} s)")
    out = report.run_dir(cfg, "bench_verified_reads")
    report.write_json(out, "verified_reads.json", result)
    console.print(f"output: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
