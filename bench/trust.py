"""What FasterFS trusts, measured on a running cluster: what checking cached bytes costs, path by
path, side by side in one run; what unauthenticated requests and a multi-object delete do to the
caches; how long a rotten cache entry can be served through the mount's passthrough (the one
path left unchecked per read).

Paths, each reading every chunk file of the dataset ingested last, hot (every chunk cached):
the client's hit unchecked (the default) and checked (`cache.verify_reads=true`); the namespace's
reads (what the mount's agent, fasterfs:// and `cat` use), which check each chunk against the
manifest once per open; the same descriptor read unchecked, as those reads were before; the
native mount (passthrough: the kernel reads the entry). Rounds interleave the paths.

Then, as the unprivileged user, an unauthenticated POST to the bucket and GETs (entries before
and 3 s after); a multi-object delete of a scratch object (a write whose keys the kernel cannot see): the
entries before and after, and how long until every node had checked its entries. Then the
window: a byte of one hot file's cache entry is flipped, and the file is read through
the mount every 0.1 s until it reads right again (the owner's scrub found the entry rotten and
dropped it, and the next open went to the agent, which checks). Bounded: two scrub intervals
plus a minute.

    python bench/trust.py            (on `fasterfs up` with a dataset ingested)
    python bench/trust.py bench.mount_rounds=9
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
from fasterfs.control import registry, report, s3
from fasterfs.core import config
from fasterfs.read.reader import Namespace


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    rounds = int(cfg.bench.mount_rounds)
    client, actors, names = mounts.hot_dataset(argv)
    state, m = client.state, client.manifest
    ids = list(range(len(m)))
    checked = fasterfs.connect(overrides=argv + ["cache.verify_reads=true"])
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

        # unauthenticated requests, as the unprivileged user: a POST to the bucket, GETs of a cold chunk
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
        host, port = state.nodes[0].endpoint.split("//")[1].split(":")
        send = ("import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); "
                "s.sendall(sys.argv[3].encode()); print(s.recv(4096).split(b'\\r\\n')[0].decode())")
        entries = lambda: sum(r["entries"] for r in ray.get([a.cache_status.remote() for a in actors]))  # noqa: E731
        before = entries()
        answers = [subprocess.run([*nobody, send, host, port, request], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
                   for request in [f"POST /{m.bucket} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"] +
                   [f"GET /{m.bucket}/unauthenticated/{k} HTTP/1.1\r\nHost: x\r\n\r\n" for k in range(3)]]
        time.sleep(3)
        hostile = {"entries_before": before, "entries_after_3_s": entries(), "minio_answered": answers}

        # a write nobody can name (a multi-object delete of a scratch object): every node checks
        # every entry against MinIO; how long that took, and that the dataset's entries stayed
        entries_before = sum(r["entries"] for r in ray.get([a.cache_status.remote() for a in actors]))
        checks_before = [r["suspect_checks"]["checks"] for r in ray.get([a.cache_status.remote() for a in actors])]
        writer = s3.client(state.nodes[0].endpoint, registry.fetch_credentials(state.name, "admin"))
        writer.put_object(Bucket=m.bucket, Key="bench/scratch", Body=b"x")
        began = time.monotonic()
        writer.delete_objects(Bucket=m.bucket, Delete={"Objects": [{"Key": "bench/scratch"}]})
        while time.monotonic() - began < 60:
            rows = ray.get([a.cache_status.remote() for a in actors])
            if all(r["suspect_checks"]["checks"] > c for r, c in zip(rows, checks_before)):
                break
            time.sleep(0.05)
        delete_check = {"entries_before": entries_before, "entries_after": sum(r["entries"] for r in rows),
                        "seconds_until_checked": round(time.monotonic() - began, 3),
                        "check_s_per_node": [r["suspect_checks"]["last_check_s"] for r in rows]}

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
              "paths": stats, "unauthenticated_as_nobody": hostile, "multi_object_delete": delete_check,
              "scrub_interval_s": scrub_s, "rot_window_s": window, "rotten_reads_in_window": wrong}
    console = report.console()
    console.print(f"hot whole-chunk reads, {len(ids)} files of {report.fmt_bytes(result['file_bytes_avg'])}, "
                  f"{rounds} rounds")
    for name, s in stats.items():
        console.print(f"  {name:28s} p50 {s['p50_ms']:7.3f} ms  p95 {s['p95_ms']:7.3f} ms")
    p50 = {name: s["p50_ms"] for name, s in stats.items()}
    console.print(f"  checking costs: client hit {p50['client hit, checked'] / p50['client hit, unchecked']:.2f}x, "
                  f"namespace read {p50['namespace read, checked'] / p50['descriptor read, unchecked']:.2f}x")
    after = f"{window:.1f} s" if window is not None else "never (bound reached)"
    console.print(f"  unauthenticated POST and GETs as nobody (MinIO: {sorted(set(hostile['minio_answered']))}): "
                  f"{hostile['entries_before']} entries before, {hostile['entries_after_3_s']} 3 s after")
    console.print(f"  a multi-object delete: {delete_check['entries_before']} entries before, "
                  f"{delete_check['entries_after']} after; every node checked within "
                  f"{delete_check['seconds_until_checked']:.2f} s (checks {delete_check['check_s_per_node']} s)")
    console.print(f"  rot under a hot passthrough file: served rotten by {wrong} reads, right again after {after} "
                  f"(scrub every {scrub_s:.0f} s)")
    out = report.run_dir(cfg, "bench_trust")
    report.write_json(out, "trust.json", result)
    console.print(f"output: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
