"""A real team's data, measured side by side in one run (on `fasterfs up`):

1. `put -r` of bench.bulk_files files of 4 KiB (directories of 1,000) against plain parallel
   boto3 PUTs of the same files, one object per copy the cluster's layout keeps, to the same
   MinIO servers: files/s, and the cost per file of the first and the last tenth.
2. What one more file costs as the namespace grows: a `put`, a reader's `Namespace()` and a
   lookup, the Registry's and each StorageNode's memory, the store's disk, at the start
   (the namespace as found), right after the load, once node 0's repair leader has checked
   the load (its check of every new file competes with the put), and once its survey that
   follows (a listing of every object) has ended: the target is taken there, all three shown.
3. Through the mount (node 0), started anew with a namespace of ~1,000 files (one directory
   stored before the load) and again after the load: its start, `stat` of paths not seen
   before, `ls -l` of a 1,000-entry directory, `find` over every entry against a local
   `find` over the same tree.
4. `import` from a second MinIO standing for the team's store (bench.import_files files of
   bench.import_kb KiB) against a plain parallel copy with boto3 (GET there, PUT here).

    python bench/bulk_load.py bench.bulk_files=100000 [overrides]
    python bench/bulk_load.py bench.bulk_files=1000000 bench.boto3_files=100000 bench.import_files=0

Leaves what it stored under bench-bulk-<time>/ in the namespace (`fasterfs down` removes all).
Writes bulk_load.json to <output_dir>/bench-bulk-load-<time>/.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fasterfs.control import credentials, registry, report, s3
from fasterfs.core import config
from fasterfs.core.placement import chunk_homes
from fasterfs.node.minio_server import MinioServer
from fasterfs.ops import cluster
from fasterfs.read.reader import Namespace
from fasterfs.write import bulk_load, ingest

THREADS = 16


def make_tree(root: Path, files: int, size: int = 4096) -> list[str]:
    rels = [f"d{i // 1000:04d}/f{i % 1000:04d}.bin" for i in range(files)]
    for d in {r.split("/")[0] for r in rels}:
        (root / d).mkdir(parents=True, exist_ok=True)
    for r in rels:
        (root / r).write_bytes(os.urandom(size))
    return rels


def actor_rss(state, class_name: str) -> dict[str, int]:
    """Resident bytes of each live actor of a class (by the kernel's VmRSS of its worker)."""
    from ray.util.state import list_actors

    out = {}
    alive = [("class_name", "=", class_name), ("state", "=", "ALIVE")]
    for a in list_actors(address=state.dashboard_url, filters=alive):
        try:
            status = Path(f"/proc/{a.pid}/status").read_text()
            out[a.name or a.actor_id] = int(next(line.split()[1] for line in status.splitlines()
                                                 if line.startswith("VmRSS"))) * 1024
        except (OSError, StopIteration):
            pass
    return out


def costs(cfg, state, argv: list[str], tag: str, work: Path) -> dict:
    """What one more file costs now: put (median of 10), Namespace() and a lookup (median of 5)."""
    one = work / "one.bin"
    one.write_bytes(os.urandom(4096))
    puts = []
    for i in range(10):
        t = time.perf_counter()
        ingest.put(cfg, one, f"{tag}-single/{i}")
        puts.append(time.perf_counter() - t)
    connects, lookups = [], []
    for _ in range(5):
        t = time.perf_counter()
        ns = Namespace(cfg)
        connects.append(time.perf_counter() - t)
        t = time.perf_counter()
        ns.lookup(f"{tag}-single/3")
        lookups.append(time.perf_counter() - t)
        ns.close()
    db = Path(state.root) / "namespace.sqlite"
    return {"names": registry.names_count(state.name),
            "put_s": statistics.median(puts), "namespace_connect_s": statistics.median(connects),
            "lookup_s": statistics.median(lookups),
            "store_disk_bytes": sum(p.stat().st_size for p in db.parent.glob(db.name + "*")),
            "registry_rss": actor_rss(state, "Registry"),
            "storage_node_rss": actor_rss(state, "StorageNode")}


def leader_caught_up(state, version: int | None, since: float, timeout: float) -> float | None:
    """Seconds until node 0's repair leader has looked at the namespace at `version` (checked the
    changes, or surveyed after `since`; version None: surveyed after `since`); None: not within
    `timeout`. One more put measured before that competes with the leader's check of every file
    just loaded; before its survey that follows, with the listing of every object."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        r = ray.get(cluster.storage_nodes(state)[0].status.remote(max_age_s=60))["redundancy"] or {}
        checked = version is not None and (r.get("changes_checked") or {}).get("version", 0) >= version
        if checked or r.get("time", 0) > since:
            return time.monotonic() - began
        time.sleep(2)
    return None


def boto3_baseline(state, creds, cfg, src: Path, rels: list[str], prefix: str) -> float:
    """Seconds to PUT every file, one object per copy, where the cluster's placement puts it."""
    clients = {n.index: s3.client(n.endpoint, creds, pool=THREADS) for n in state.nodes}
    nodes = [n.index for n in state.nodes]

    def one(rel: str) -> list[tuple[int, str]]:
        body = (src / rel).read_bytes()
        homes = chunk_homes(rel, 1, nodes, cfg.replicas, cfg.placement.load_slack)[0]
        for node in homes:
            clients[node].put_object(Bucket=state.settings.bucket, Key=f"{prefix}/{rel}", Body=body)
        return [(node, f"{prefix}/{rel}") for node in homes]

    t = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        stored = [p for ps in pool.map(one, rels) for p in ps]
    seconds = time.perf_counter() - t
    with ThreadPoolExecutor(THREADS) as pool:  # not timed: the baseline's objects go
        list(pool.map(lambda p: clients[p[0]].delete_object(Bucket=state.settings.bucket, Key=p[1]), stored))
    return seconds


def through_mount(state, point: Path, dest: str, rels: list[str], src: Path) -> dict:
    """The mount started anew (timed), then what a user does first with a namespace: stat
    files not seen before (half while the agent still lists the tree to the daemon, half once
    it has), `ls -l` a directory, `find` over `dest`."""
    actors = cluster.storage_nodes(state)
    began = time.time()
    t = time.perf_counter()
    ray.get(actors[0].mount.remote(str(point)))
    mounted_s = time.perf_counter() - t
    try:
        picks = random.Random(1).sample(rels, min(300, len(rels)))

        def stat_ms(paths: list[str]) -> list[float]:
            out = []
            for rel in paths:
                t = time.perf_counter()
                os.stat(point / dest / rel)
                out.append((time.perf_counter() - t) * 1e3)
            return sorted(out)
        early = stat_ms(picks[:len(picks) // 2])
        warm_s = warmed(state, point, began)
        late = stat_ms(picks[len(picks) // 2:])
        directory = point / dest / rels[-1].split("/")[0]
        t = time.perf_counter()
        listed = subprocess.run(["ls", "-l", str(directory)], capture_output=True, check=True)
        ls_s = time.perf_counter() - t
        t = time.perf_counter()
        found = subprocess.run(["find", str(point / dest)], capture_output=True, check=True)
        find_s = time.perf_counter() - t
        t = time.perf_counter()
        local = subprocess.run(["find", str(src)], capture_output=True, check=True)
        local_s = time.perf_counter() - t
        return {"names": registry.names_count(state.name), "mount_s": mounted_s,
                "stat_unseen_while_warming_p50_ms": statistics.median(early),
                "tree_sent_s": warm_s,
                "stat_unseen_p50_ms": statistics.median(late), "stat_unseen_p99_ms": late[int(len(late) * 0.99) - 1],
                "ls_l_1000_ms": ls_s * 1e3, "ls_l_lines": len(listed.stdout.splitlines()),
                "find_s": find_s, "find_entries": len(found.stdout.splitlines()),
                "local_find_s": local_s, "local_find_entries": len(local.stdout.splitlines()),
                "find_vs_local": find_s / local_s}
    finally:
        ray.get(actors[0].umount.remote(str(point)))


def warmed(state, point: Path, since: float, timeout: float = 900) -> float:
    """Seconds from `since` until the mount's agent said it had sent the daemon its tree
    (mount.warm_entries; its log line), or None if it never did within `timeout`."""
    log_file = max(Path(state.root, "logs").glob(f"mount-*{point.name}.log"), key=lambda p: p.stat().st_mtime)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log_file.read_text(errors="replace").splitlines()
        said = [ln for ln in lines if "sent the daemon" in ln]
        if said and time.mktime(time.strptime(said[-1][:19], "%Y-%m-%d %H:%M:%S")) >= int(since):
            return time.time() - since
        time.sleep(0.2)
    return None


def import_side_by_side(cfg, state, work: Path, files: int, kb: int, dest: str) -> dict:
    """A second MinIO holds the team's data; boto3 copies it, then `import` does."""
    team_creds = credentials.create(work / "team-credentials.json").admin
    team = MinioServer(config.minio_binary(cfg), "127.0.9.2", 9470, 9471, work / "team-minio", work / "team.log",
                       team_creds)
    team.start(30)
    try:
        src = s3.client(team.endpoint, team_creds, pool=THREADS)
        src.create_bucket(Bucket="team")
        keys = [f"taq/d{i // 1000:03d}/k{i:06d}.bin" for i in range(files)]
        body = os.urandom(kb * 1024)
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda k: src.put_object(Bucket="team", Key=k, Body=body), keys))
        total = files * kb * 1024
        admin = registry.fetch_credentials(state.name, "admin")
        dst = {n.index: s3.client(n.endpoint, admin, pool=THREADS) for n in state.nodes}
        nodes = [n.index for n in state.nodes]

        def copy(key: str) -> None:
            data = src.get_object(Bucket="team", Key=key)["Body"].read()
            for node in chunk_homes(key, 1, nodes, cfg.replicas, cfg.placement.load_slack)[0]:
                dst[node].put_object(Bucket=state.settings.bucket, Key=f"bench-copy/{key}", Body=data)
        t = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(copy, keys))
        boto3_s = time.perf_counter() - t
        keys_file = work / "team-keys.json"
        keys_file.write_text(json.dumps({"access_key": team_creds.access_key, "secret_key": team_creds.secret_key}))
        keys_file.chmod(0o600)
        source = bulk_load.S3Prefix("s3://team/taq/", team.endpoint, bulk_load.source_credentials(str(keys_file)))
        done = bulk_load.load(cfg, source, dest, remote=True)
        return {"files": files, "kb": kb, "boto3_copy_MB_s": total / boto3_s / 1e6,
                "import_MB_s": total / done.seconds / 1e6, "import_vs_boto3": boto3_s / done.seconds,
                "import_phases_s": done.phases, "imported": done.stored}
    finally:
        team.stop()


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    n = int(cfg.bench.bulk_files)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-bulk-", dir="/var/tmp"))
    dest = time.strftime("bench-bulk-%Y%m%dT%H%M%S")
    result: dict = {"files": n, "nodes": len(state.nodes), "replicas": cfg.replicas, "targets": {}}
    try:
        src = work / "src"
        t = time.perf_counter()
        rels = make_tree(src, n)
        result["make_tree_s"] = time.perf_counter() - t
        admin = registry.fetch_credentials(state.name, "admin")
        sample = rels[:int(cfg.bench.boto3_files) or n]  # a million PUTs more would only say the same
        result["boto3_files"] = len(sample)
        result["boto3_files_per_s"] = len(sample) / boto3_baseline(state, admin, cfg, src, sample,
                                                                    f"bench-boto3-{dest}")
        result["before"] = costs(cfg, state, argv, f"{dest}-before", work)
        point = work / "mnt"
        point.mkdir()
        small = work / "small"
        small_rels = make_tree(small, 1000)
        bulk_load.load(cfg, bulk_load.LocalTree(small), f"{dest}-small")
        result["mount_small"] = through_mount(state, point, f"{dest}-small", small_rels, small)

        marks: list[tuple[float, int]] = []
        began = time.perf_counter()

        def stored(files: int, total: int, size: int) -> None:
            """Each batch's time kept; every tenth of the load said on stderr (a run stopped
            before its end leaves its figures so far)."""
            marks.append((time.perf_counter() - began, files))
            if len(marks) > 1 and marks[-2][1] * 10 // total < files * 10 // total:
                back = next((m for m in reversed(marks) if m[1] <= files - total // 10), (0.0, 0))
                print(f"put -r: {files} of {total} files in {marks[-1][0]:.0f} s; the last tenth "
                      f"{(marks[-1][0] - back[0]) / max(1, files - back[1]) * 1e3:.2f} ms per file",
                      file=sys.stderr, flush=True)
        done = bulk_load.load(cfg, bulk_load.LocalTree(src), dest, progress=stored)
        result["put_r"] = {"seconds": done.seconds, "files_per_s": n / done.seconds, "batches": done.batches,
                           "phases_s": done.phases}
        tenth = max(1, n // 10)
        first = next(t for t, f in marks if f >= tenth)
        last = marks[-1][0] - next(t for t, f in marks if f >= n - tenth)
        result["put_r"]["first_tenth_ms_per_file"] = first / tenth * 1e3
        result["put_r"]["last_tenth_ms_per_file"] = last / tenth * 1e3
        loaded, version = time.time(), registry.namespace_version(state.name)
        result["after_right_away"] = costs(cfg, state, argv, f"{dest}-right-away", work)
        result["leader_checked_load_s"] = leader_caught_up(state, version, loaded, timeout=1200)
        result["after"] = costs(cfg, state, argv, f"{dest}-after", work)
        result["leader_surveyed_s"] = leader_caught_up(state, None, time.time(), timeout=1800)
        result["settled"] = costs(cfg, state, argv, f"{dest}-settled", work)
        grown = result["after"]["names"] - result["before"]["names"]
        result["per_file"] = {
            "store_disk_bytes": (result["after"]["store_disk_bytes"] - result["before"]["store_disk_bytes"]) / grown,
            "registry_rss_bytes": (sum(result["after"]["registry_rss"].values())
                                   - sum(result["before"]["registry_rss"].values())) / grown,
            "storage_node_rss_bytes": {k: (v - result["before"]["storage_node_rss"].get(k, 0)) / grown
                                       for k, v in result["after"]["storage_node_rss"].items()}}
        ratio = result["put_r"]["files_per_s"] / result["boto3_files_per_s"]
        result["put_r_vs_boto3"] = ratio
        growth = result["put_r"]["last_tenth_ms_per_file"] / result["put_r"]["first_tenth_ms_per_file"]
        result["targets"][f"put -r >= 0.5x boto3 ({ratio:.2f}x)"] = ratio >= 0.5
        result["targets"][f"last tenth <= 1.2x the first per file ({growth:.2f}x)"] = growth <= 1.2
        put_growth = result["settled"]["put_s"] / result["before"]["put_s"]
        result["targets"][f"one more put at {result['settled']['names']} names <= 1.2x at "
                          f"{result['before']['names']} once the leader has surveyed the load ({put_growth:.2f}x; "
                          f"{result['after_right_away']['put_s'] / result['before']['put_s']:.2f}x while it still "
                          f"checked the load, {result['after']['put_s'] / result['before']['put_s']:.2f}x after "
                          "its check, before its survey)"] = put_growth <= 1.2
        connect = result["after"]["namespace_connect_s"]
        result["targets"][f"Namespace() <= 0.2 s ({connect:.3f} s)"] = connect <= 0.2

        try:
            result["mount"] = mount = through_mount(state, point, dest, rels, src)
        except Exception as e:
            result["mount"] = {"error": f"{type(e).__name__}: {e}"}
            raise
        result["targets"][f"stat unseen p50 <= 1 ms ({mount['stat_unseen_p50_ms']:.3f})"] = \
            mount["stat_unseen_p50_ms"] <= 1
        result["targets"][f"ls -l of 1,000 <= 50 ms ({mount['ls_l_1000_ms']:.1f})"] = mount["ls_l_1000_ms"] <= 50
        result["targets"][f"find <= 5x local ({mount['find_vs_local']:.2f}x)"] = mount["find_vs_local"] <= 5
        small = result["mount_small"]
        result["mount_at_names"] = {k: {"small": small[k], "large": mount[k]} for k in (
            "names", "mount_s", "tree_sent_s", "stat_unseen_while_warming_p50_ms", "stat_unseen_p50_ms",
            "stat_unseen_p99_ms", "ls_l_1000_ms", "find_vs_local")}

        if int(cfg.bench.import_files):
            result["import"] = import_side_by_side(cfg, state, work, int(cfg.bench.import_files),
                                                   int(cfg.bench.import_kb), f"{dest}-import")
    finally:  # a run stopped part way keeps its figures so far
        shutil.rmtree(work, ignore_errors=True)
        out = report.run_dir(cfg, "bench-bulk-load")
        report.write_json(out, "bulk_load.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'bulk_load.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
