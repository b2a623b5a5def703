"""Unmodified programs reading FasterFS, side by side in one run (issues 28 and 46): through
FasterFS's mount (its requests over io_uring where the kernel has it), the same mount through
/dev/fuse (mount.uring=false), the same mount with every miss read by its agent
(mount.native_fetch=false: the path before the daemon fetched misses itself), s3fs-fuse (`-o use_cache`) and rclone
(`mount --vfs-cache-mode full`) mounts of the same bytes in the same MinIO (node 0's), and from a
local copy on this disk.

1. fio (Debian's) on a file of bench.file_mb (1024) stored with `put` (and, for the peers, as
   one object), sequential 1 MiB and random 4 KiB (bounded in time):
   - cold: every cache emptied (FasterFS's, the peers' own) and the page cache dropped; the
     baseline is the client's own cold read of every chunk from MinIO, in the same run;
   - first read of cached bytes: FasterFS's caches filled (`cache warm`), the peers' by their
     cold read; the page cache dropped; against the local copy read after the same drop;
   - repeated: read again at once, against the local copy read again.
   Each figure is the median of bench.io_rounds (3) rounds of all of these; min and max are kept.
2. A file of bench.ec_mb (256) stored erasure-coded, read cold in order through both FasterFS
   mounts (the daemon joining data shards against the agent reading them).
3. `find` + `cat` of bench.small_files (10,000) files of about 4 KiB (a dataset of tiny
   chunks; the same files as objects for the peers), hot (the second pass), against a copy.
4. Each mount's CPU seconds (all its processes, from /proc) per GB read, per phase.

    python bench/mount_io.py [bench.file_mb=256] [bench.small_files=2000]   (on `fasterfs up`)

Writes mount_io.json to <output_dir>/bench-mount-io-<time>/ and prints a table.
"""
from __future__ import annotations

import collections
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mounts

import fasterfs
from fasterfs.control import credentials, registry, report, s3
from fasterfs.core import config
from fasterfs.core.config import Paths
from fasterfs.ops import cluster
from fasterfs.write.ingest import ingest, put, remove

FIO_RANDOM_S = 10      # each random-read run is bounded in time ...
FIO_RANDOM_BYTES = 64 << 20  # ... and in bytes
PEER_BUCKET = "ffs-bench-peers"
SMALL = "BENCH_SMALL"
AGENT_READS = "fasterfs, agent reads"
DEV_FUSE = "fasterfs, /dev/fuse"
ROW_BYTES = 290        # a synthetic LOBSTER row (message + 10-level book) in CSV, about


def fio(path: Path, rw: str, bs: str) -> dict:
    """One fio job reading `path`: sequential reads the whole file once; random is bounded."""
    args = ["fio", "--name=ffs", f"--filename={path}", "--readonly", f"--rw={rw}", f"--bs={bs}",
            "--ioengine=psync", "--numjobs=1", "--output-format=json", "--invalidate=0"]
    if rw == "randread":
        args += [f"--runtime={FIO_RANDOM_S}", f"--io_size={FIO_RANDOM_BYTES}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"fio on {path} failed: {out.stderr[-500:]}")
    job = json.loads(out.stdout)["jobs"][0]["read"]
    return {"mb_s": job["bw_bytes"] / 1e6, "bytes": job["io_bytes"]}


def find_cat(directory: Path) -> dict:
    """`find DIR -type f -exec cat {} +` to /dev/null: seconds, and how many files."""
    t = time.perf_counter()
    files = subprocess.run(["find", str(directory), "-type", "f"], capture_output=True, text=True,
                           check=True, timeout=600).stdout.split()
    subprocess.run(["xargs", "-0", "cat"], input="\0".join(files), stdout=subprocess.DEVNULL, text=True,
                   check=True, timeout=600)
    return {"s": time.perf_counter() - t, "files": len(files)}


class Run:
    """One benchmark run: the cluster, the work directory, the mounts and every figure."""

    def __init__(self, argv: list[str]):
        self.argv, self.cfg = argv, config.load(argv)
        self.state = registry.find(self.cfg)
        cluster.connect_ray(self.state)
        self.actors = cluster.storage_nodes(self.state)
        self.work = Path(tempfile.mkdtemp(prefix="ffs-bench-io-", dir="/var/tmp"))
        self.keys = credentials.load(Paths(Path(self.state.root)).credentials_file).admin
        self.endpoint = self.state.nodes[0].endpoint
        self.mounts: dict[str, mounts.Mount] = {}
        self.capacities: list[int] = []
        self._cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
        self.result: dict = {"file_mb": int(self.cfg.bench.file_mb), "chunk_mb": self.cfg.files.chunk_mb,
                             "nodes": len(self.state.nodes), "fio": {}, "fio_min_max": {}, "cpu_s_per_gb": {}}

    def start_mounts(self) -> None:
        own = [f"cluster.name={self.state.name}", f"cluster.root={self.state.root}",
               f"cluster.ray_address={self.state.ray_address}"]
        # the same mount with every miss read by its agent (the path before the daemon fetched), and
        # with its requests through /dev/fuse instead of io_uring
        self.own = {"fasterfs": own, AGENT_READS: own + ["mount.native_fetch=false"],
                    DEV_FUSE: own + ["mount.uring=false"]}
        for name, overrides in self.own.items():
            self.mounts[name] = mounts.fasterfs(self.work / name.replace(", ", "-").replace(" ", "-"), overrides)
        peer = (self.endpoint, PEER_BUCKET, self.keys.access_key, self.keys.secret_key, self.work)
        self.mounts["s3fs"] = mounts.s3fs(self.work / "s3fs", *peer)
        self.mounts["rclone"] = mounts.rclone(self.work / "rclone", *peer)

    def restart_peers_empty(self) -> None:
        """The peers' caches emptied: each is stopped, its cache directory wiped, started again."""
        for name, start in (("s3fs", mounts.s3fs), ("rclone", mounts.rclone)):
            old = self.mounts[name]
            old.stop()
            shutil.rmtree(old.cache_dir, ignore_errors=True)
            self.mounts[name] = start(old.point, self.endpoint, PEER_BUCKET, self.keys.access_key,
                                      self.keys.secret_key, self.work)

    def clear_fasterfs(self, name: str) -> None:
        """Every cache emptied, again after fills of the last read had time to land; the mount
        `name` started anew (what its daemon keeps for random readers goes with it)."""
        ray.get([a.cache_clear.remote() for a in self.actors])
        old = self.mounts[name]
        old.stop()
        self.mounts[name] = mounts.fasterfs(old.point, self.own[name])
        time.sleep(2)
        ray.get([a.cache_clear.remote() for a in self.actors])

    def warm_fasterfs(self, manifest) -> None:
        ray.get(self.actors[0].cache_warm.remote([c.key for c in manifest.chunks]))  # each filled at its home
        report.wait_for_fills(self.actors, len(manifest), timeout=600)

    def measured(self, name: str, phase: str, fn) -> dict:
        """fn() -> {"bytes": ...}; the mount's CPU seconds are added up per phase."""
        mount = self.mounts.get(name)
        before = mount.cpu_s() if mount else 0.0
        row = fn()
        if mount:
            self._cpu[(name, phase)][0] += mount.cpu_s() - before
            self._cpu[(name, phase)][1] += row["bytes"]
        return row

    def room_for(self, nbytes: int) -> None:
        """Caches large enough for `nbytes` (a 1 GiB file does not fit cache.capacity_mb=1024,
        which counts decimal MB); close() gives back the capacities they had."""
        rows = ray.get([a.cache_status.remote() for a in self.actors])
        self.capacities = [r["capacity"] for r in rows]
        ray.get([a.cache_resize.remote(max(c, 2 * nbytes)) for a, c in zip(self.actors, self.capacities)])

    def big_file(self) -> None:
        size_mb = int(self.cfg.bench.file_mb)
        self.room_for(size_mb * 2**20)
        local = self.work / "local.bin"
        rng = np.random.default_rng(1)
        with open(local, "wb") as f:
            for _ in range(size_mb):
                f.write(rng.bytes(2**20))
        manifest = put(self.cfg, local, "bench/file.bin", force=True)
        admin = s3.client(self.endpoint, self.keys)
        admin.create_bucket(Bucket=PEER_BUCKET)
        admin.upload_file(str(local), PEER_BUCKET, "bench/file.bin")
        self.start_mounts()
        paths = {name: m.point / "bench" / "file.bin" for name, m in self.mounts.items()}

        client = fasterfs.connect(overrides=self.argv, use_cache=False, dataset="bench/file.bin")
        mounts.drop_page_cache()
        t = time.perf_counter()
        for i in range(len(manifest)):
            client.read_chunk(i)
        self.result["client_cold_mb_s"] = local.stat().st_size / 1e6 / (time.perf_counter() - t)

        for rw, bs in (("read", "1M"), ("randread", "4k")):
            runs: dict[str, list[float]] = collections.defaultdict(list)
            for _ in range(int(self.cfg.bench.io_rounds)):
                mounts.drop_page_cache()
                runs["local: cold"].append(fio(local, rw, bs)["mb_s"])
                runs["local: repeated"].append(fio(local, rw, bs)["mb_s"])
                self.restart_peers_empty()
                for name, path in paths.items():
                    if name.startswith("fasterfs"):  # each FasterFS mount's cold read makes chunks hot
                        self.clear_fasterfs(name)
                    mounts.drop_page_cache()
                    got = self.measured(name, f"{rw} cold", lambda path=path, rw=rw, bs=bs: fio(path, rw, bs))
                    runs[f"{name}: cold"].append(got["mb_s"])
                self.warm_fasterfs(manifest)
                for name, path in paths.items():
                    mounts.drop_page_cache()
                    for phase in ("first read of cached", "repeated"):
                        got = self.measured(name, f"{rw} {phase}", lambda path=path, rw=rw, bs=bs: fio(path, rw, bs))
                        runs[f"{name}: {phase}"].append(got["mb_s"])
            key = f"{rw} {bs}"
            self.result["fio"][key] = {k: round(statistics.median(v), 1) for k, v in runs.items()}
            self.result["fio_min_max"][key] = {k: [round(min(v), 1), round(max(v), 1)] for k, v in runs.items()}
        seq, rnd = self.result["fio"]["read 1M"], self.result["fio"]["randread 4k"]
        self.result["ratios"] = {
            "sequential first read of cached / local cold": seq["fasterfs: first read of cached"] / seq["local: cold"],
            "sequential repeated / local repeated": seq["fasterfs: repeated"] / seq["local: repeated"],
            "sequential cold / client cold": seq["fasterfs: cold"] / self.result["client_cold_mb_s"],
            "random 4k cold MB/s": rnd["fasterfs: cold"],
            "sequential cold / agent reads cold": seq["fasterfs: cold"] / seq[f"{AGENT_READS}: cold"],
            "sequential cold / best peer cold": seq["fasterfs: cold"] / max(seq["s3fs: cold"], seq["rclone: cold"]),
            "random 4k cold / best peer cold": rnd["fasterfs: cold"] / max(rnd["s3fs: cold"], rnd["rclone: cold"]),
        }
        remove(self.cfg, "bench/file.bin")

    def ec_file(self) -> None:
        """A file of bench.ec_mb stored erasure-coded (one parity shard, data shards on the other
        nodes), read cold in order through both FasterFS mounts: the daemon joining data shards
        itself against its agent reading them, each the median of bench.io_rounds."""
        size_mb = int(self.cfg.bench.ec_mb)
        if not size_mb:
            return
        data = max(1, len(self.state.nodes) - 1)
        local = self.work / "ec.bin"
        local.write_bytes(np.random.default_rng(2).bytes(size_mb << 20))
        put(config.load(self.argv + ["layout=ec", f"ec.data={data}", "ec.parity=1"]), local, "bench/ec.bin",
            force=True)
        rows = {}
        for name in self.own:
            runs = []
            for _ in range(int(self.cfg.bench.io_rounds)):
                self.clear_fasterfs(name)
                mounts.drop_page_cache()
                path = self.mounts[name].point / "bench" / "ec.bin"
                runs.append(self.measured(name, "ec read cold", lambda path=path: fio(path, "read", "1M"))["mb_s"])
            rows[name] = round(statistics.median(runs), 1)
        self.result["ec_cold"] = {"file_mb": size_mb, "layout": f"ec={data}+1", "mb_s": rows}
        remove(self.cfg, "bench/ec.bin")

    def small_files(self) -> None:
        n = int(self.cfg.bench.small_files)
        rows_per_chunk = max(1, 4096 // ROW_BYTES)
        m = ingest(config.load(self.argv + ["data=synthetic", f"data.name={SMALL}", f"data.rows={n * rows_per_chunk}",
                                            f"data.rows_per_chunk={rows_per_chunk}"]))
        client = fasterfs.connect(overrides=self.argv, dataset=SMALL)
        local = self.work / "small"
        (local / SMALL / "chunks").mkdir(parents=True)
        admin = s3.client(self.endpoint, self.keys)

        def copy(i):
            name = f"{SMALL}/chunks/{m.chunk(i).key.rsplit('/', 1)[-1]}"
            data = client.read_chunk(i)
            (local / name).write_bytes(data)
            admin.put_object(Bucket=PEER_BUCKET, Key=name, Body=data)
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(copy, range(len(m))))
        self.warm_fasterfs(m)
        self.restart_peers_empty()  # they listed the bucket before these objects were there
        roots = {"local": local / SMALL / "chunks",
                 **{name: mnt.point / SMALL / "chunks" for name, mnt in self.mounts.items()}}
        out = {}
        for name, root in roots.items():
            find_cat(root)  # the first pass fills the peers' caches and the kernel's dentries
            out[name] = self.measured(name, "small files hot",
                                      lambda root=root: {**find_cat(root), "bytes": m.total_bytes})
            if out[name]["files"] != len(m):
                raise RuntimeError(f"{name}: find saw {out[name]['files']} files, the dataset has {len(m)}")
        self.result["small_files"] = {"files": len(m), "bytes_avg": m.total_bytes / len(m),
                                      "seconds": {k: round(v["s"], 3) for k, v in out.items()},
                                      "vs_local": {k: round(v["s"] / out["local"]["s"], 2) for k, v in out.items()}}
        remove(self.cfg, SMALL)

    def close(self) -> None:
        for mount in self.mounts.values():
            mount.stop()
        if self.capacities:
            ray.get([a.cache_resize.remote(c) for a, c in zip(self.actors, self.capacities)])
        try:
            admin = s3.client(self.endpoint, self.keys)
            for page in admin.get_paginator("list_objects_v2").paginate(Bucket=PEER_BUCKET):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                for k in range(0, len(keys), 1000):
                    admin.delete_objects(Bucket=PEER_BUCKET, Delete={"Objects": keys[k:k + 1000]})
            admin.delete_bucket(Bucket=PEER_BUCKET)
        except Exception as e:
            print(f"bench bucket {PEER_BUCKET} on {self.endpoint} not removed: {e}", file=sys.stderr)
        shutil.rmtree(self.work, ignore_errors=True)


def main(argv: list[str]) -> dict:
    run = Run(argv)
    try:
        run.big_file()
        run.ec_file()
        run.small_files()
    finally:
        run.close()
    result = run.result
    for (name, phase), (cpu, nbytes) in run._cpu.items():
        result["cpu_s_per_gb"].setdefault(name, {})[phase] = round(cpu / max(nbytes, 1) * 1e9, 2)
    out = report.run_dir(run.cfg, "bench-mount-io")
    report.write_json(out, "mount_io.json", result)
    console = report.console()
    for test, rows in result["fio"].items():
        console.print(f"fio {test}, MB/s, median of {run.cfg.bench.io_rounds} (min-max):")
        for k, v in rows.items():
            lo, hi = result["fio_min_max"][test][k]
            console.print(f"  {k:34s} {v:9.1f}  ({lo:.1f}-{hi:.1f})")
    console.print(f"client's own cold read: {result['client_cold_mb_s']:.1f} MB/s")
    for k, v in result["ratios"].items():
        console.print(f"  {k}: {v:.2f}")
    if "ec_cold" in result:
        ec = result["ec_cold"]
        console.print(f"erasure-coded ({ec['layout']}) {ec['file_mb']} MiB, sequential 1 MiB cold, MB/s: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in ec["mb_s"].items()))
    sf = result["small_files"]
    console.print(f"find + cat of {sf['files']} files of {report.fmt_bytes(sf['bytes_avg'])}, hot: "
                  + ", ".join(f"{k} {s:.2f} s ({sf['vs_local'][k]:.2f}x)" for k, s in sf["seconds"].items()))
    console.print("CPU seconds per GB read: " + json.dumps(result["cpu_s_per_gb"]))
    console.print(f"output: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
