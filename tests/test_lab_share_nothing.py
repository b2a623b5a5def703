"""The share-nothing lab (conftest's lab3, three hosts): no host sees another's files; the
cluster's facts reach every host through Ray; data read across hosts is right and cached on
the reader's host; a write from anywhere invalidates every host's cache; any host can drive;
the mount on every host; erasure coding, the peer tier and repair across hosts; the jobs. Each
test stores what it reads; the expected bytes are what it stored or the source files."""
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import ray
from conftest import (
    data_overrides,
    load_job,
    mounts_under,
    source_csv,
    source_pnls,
    submit_job,
    task_ids,
    tasks_ray_recorded,
    wait_until,
)
from lab_hosts import (
    PROJECT,
    SUBNET,
    check_file,
    chunk_xxh3,
    in_ns,
    on_host,
    put_blob,
    read_file,
    read_ids,
    read_once,
    read_slow,
    read_twice,
)
from xxhash import xxh3_64_intdigest as xxh3

from fasterfs.control import auth, registry, s3
from fasterfs.core import config, erasure
from fasterfs.hosts import ray_nodes
from fasterfs.node import repair_survey
from fasterfs.ops import cluster, lab
from fasterfs.write.ingest import ingest

SMALL_BACKTEST = ["backtest.windows=2", "backtest.window_min=5", "backtest.params=[[2,5],[3,8]]"]


@pytest.fixture(scope="module")
def sample(lab3):
    """The LOBSTER sample ingested from the head (replicas=1 over the three hosts)."""
    return ingest(config.load(lab3[1] + data_overrides()))


def lab_procs(netns: str) -> list[str]:
    """The pids running in a lab host's network namespace, as `ip netns pids` lists them."""
    return subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout.split()


@ray.remote(num_cpus=0)
def _look_around(root: str, index: int) -> dict:
    """What a process on host `index` sees of the cluster's files, and which mount namespace it is in."""
    import os

    return {"node_id": ray.get_runtime_context().get_node_id(), "mnt": os.readlink("/proc/self/ns/mnt"),
            "root": sorted(os.listdir(root)), "ray_dir": os.path.isdir(ray_nodes.ray_temp_dir(root, index))}


def test_each_host_has_its_network_kernel_and_files_of_its_own(lab3):
    state, overrides = lab3
    cfg = config.load(overrides)
    assert [n.address for n in state.nodes] == [f"{SUBNET}.{10 + i}" for i in range(3)]
    assert state.head_address == f"{SUBNET}.1"
    for n in state.nodes:
        assert n.netns and n.kernel_mode == "real" and n.disk
        qdiscs = in_ns(n.netns, "tc", "qdisc", "show")
        assert "tbf" in qdiscs and "dev lab0" in qdiscs
        assert f"{n.address}:{cfg.minio.port}" in in_ns(n.netns, "ss", "-ltn")  # MinIO on the host's address
        filters = in_ns(n.netns, "tc", "filter", "show", "dev", "lab0", "ingress") + \
            in_ns(n.netns, "tc", "filter", "show", "dev", "lab0", "egress") + \
            in_ns(n.netns, "tc", "filter", "show", "dev", "lo", "egress")
        for name in ("lo:egress", "lab0:egress", "lab0:ingress"):  # its own kernel state, on its own host
            assert f"ffs:{state.name}:{n.index}:{name}" in filters
    assert len({n.host_id for n in state.nodes}) == 3
    # no host process can see another host's cluster root (nor the head's)
    seen = ray.get([_look_around.options(**cluster.on_node(n)).remote(state.root, n.index) for n in state.nodes])
    head_mnt = os.readlink("/proc/self/ns/mnt")
    assert len({s["mnt"] for s in seen} | {head_mnt}) == 4, "every host has a mount namespace of its own"
    for n, s in zip(state.nodes, seen):
        assert s["node_id"] == n.ray_node_id
        nodes_seen = [d for d in s["root"] if d.startswith("node-")]
        assert nodes_seen == [f"node-{n.index}"], f"host {n.address} sees {s['root']}"
        assert not {"cluster.json", "credentials.json", "manifest.json", "lab-disks"} & set(s["root"])
        assert s["ray_dir"]  # its own Ray session directory, on its own /tmp
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    for n in state.nodes:  # and from a shell on the host, as a user would look (`fasterfs lab exec`)
        out = subprocess.run([ffs, "lab", "exec", str(n.index), *overrides, "--", "ls", "-a", state.root],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        listing = out.stdout.split()
        assert f"node-{n.index}" in listing and "credentials.json" not in listing
        assert not [d for d in listing if d.startswith("node-") and d != f"node-{n.index}"]


def test_reads_across_hosts_are_right_and_cached_on_the_readers_host(lab3, sample):
    """Chunks held by host 1, read on host 0: host 0's kernel sees the GETs leave it on lab0 and
    makes them hot there (host 1's ingress counts none); host 0 caches them and serves them."""
    state, _ = lab3
    manifest = sample
    remote = [c.id for c in manifest.chunks if c.nodes == [1]][-3:]
    actors = cluster.storage_nodes(state)
    before = ray.get([a.kernel_status.remote() for a in actors])
    misses0 = ray.get(actors[0].cache_status.remote())["readers"]
    on0 = cluster.on_node(state.node(0))
    node_id, got = ray.get(read_ids.options(**on0).remote(state.root, remote + remote))
    assert node_id == state.node(0).ray_node_id
    rows = config.load(lab3[1] + data_overrides()).data.rows_per_chunk
    expected = {i: xxh3(source_csv(i * rows, rows)) for i in remote}  # the source files' rows (gzip)
    assert [h for h, _ in got] == [expected[i] for i in remote + remote]
    assert all(src == 1 for _, src in got)
    kernel = ray.get([a.kernel_status.remote() for a in actors])
    hot = [k["counters"].get("hot_events", 0) - b["counters"].get("hot_events", 0) for k, b in zip(kernel, before)]
    assert hot[0] == len(remote) and hot[1] == 0  # seen leaving host 0; host 1's ingress counts no GETs
    wait_until(lambda: all(ray.get(actors[0].cache_contains.remote(manifest.chunk(i).key)) for i in remote), 30,
               "host 0's fills")
    _, again = ray.get(read_ids.options(**on0).remote(state.root, remote))
    assert [h for h, _ in again] == [expected[i] for i in remote]
    # readers' statistics are summed by their own host's StorageNode: 6 misses, then 3 hits
    readers0 = ray.get(actors[0].cache_status.remote())["readers"]
    assert (readers0["misses"] - misses0["misses"], readers0["hits"] - misses0["hits"]) == (2 * len(remote),
                                                                                           len(remote))


def test_a_write_from_anywhere_invalidates_every_host(lab3):
    """A chunk cached on all three hosts, overwritten from the head (a fourth machine with no
    StorageNode): no host serves the old bytes afterwards, and each heard of the write during the
    PUT or within a second after it, as the README says (the figures printed)."""
    state, overrides = lab3
    _, manifest = put_blob(state, overrides, "team/x.bin", 3)
    x = manifest.chunks[1]
    actors = cluster.storage_nodes(state)
    for n in state.nodes:
        ray.get(read_ids.options(**cluster.on_node(n)).remote(state.root, [x.id, x.id], manifest.name))
    wait_until(lambda: all(ray.get(a.cache_contains.remote(x.key)) for a in actors), 30, "X cached on 3 hosts")
    # a write goes to the hosts caching its key as the writer's host last heard (a second after
    # a fill), or once it hears of it: here each heard already, so each is told within a second
    wait_until(lambda: all(sorted(ray.get(a.cached_on.remote(x.key))) == [0, 1, 2] for a in actors), 10,
               "each host's view of the others' caches")
    creds = registry.fetch_credentials(state.name, "admin")
    new = b"new bytes of chunk X\n" * 1000
    holder = s3.client(state.node(x.nodes[0]).endpoint, creds)
    t_put = time.time()
    holder.put_object(Bucket=manifest.bucket, Key=x.key, Body=new)
    t_done = time.time()
    got = ray.get([read_ids.options(**cluster.on_node(n)).remote(state.root, [x.id], manifest.name)
                   for n in state.nodes])
    assert [g[0][0] for _, g in got] == [xxh3(new)] * 3, "a host served the old bytes after the overwrite"
    heard = ray.get([a.cache_status.remote() for a in actors])
    lag = [round((r["last_invalidation"] - t_done) * 1e3, 1) for r in heard]
    print(f"invalidation after the PUT returned (ms, per host): {lag}; PUT took {(t_done - t_put) * 1e3:.1f} ms")
    for row in heard:  # same machine clock: each host heard of it during the PUT or just after
        assert row["last_invalidation"] is not None and t_put <= row["last_invalidation"] <= t_done + 1.0, lag


def test_any_host_can_drive(lab3, sample):
    """The CLI and a job from a shell on host 2, given only the Ray address; the job's report,
    written on host 2, is served by the head's dashboard, which sees every host."""
    state, overrides = lab3
    address = [f"cluster.ray_address={state.ray_address}"]
    out = on_host(state, 2, str(PROJECT / ".venv/bin/fasterfs"), "status", *overrides, *address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(n.address in out.stdout for n in state.nodes)
    job = on_host(state, 2, str(PROJECT / ".venv/bin/python"), "jobs/readback.py", *overrides, *address)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    outputs = Path(state.config["output_dir"])
    runs = [d for d in outputs.iterdir() if d.name.startswith("readback-")] if outputs.is_dir() else []
    assert runs and json.loads((runs[-1] / "readback.json").read_text())["chunks"] == len(sample)

    def dashboard(path):  # on the bridge, not loopback: the dashboard wants the cluster's token
        token = auth.read(auth.token_file(state.root))
        request = urllib.request.Request(state.web_url + path, headers={"Authorization": f"Bearer {token}"})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())
    snap = dashboard("/api/snapshot")
    assert [(n["index"], n["status"]["healthy"], n["kernel"]["mode"]) for n in snap["nodes"]] == \
        [(n.index, True, "real") for n in state.nodes]
    assert runs[-1].name in [r["run"] for r in dashboard("/api/runs")]


def test_the_mount_on_every_host(lab3):
    """`fasterfs mount` from the head mounts on every host (each in its own mount namespace);
    `cat` from a shell on each host gives the stored bytes; the head has no mount."""
    state, overrides = lab3
    blob, _ = put_blob(state, overrides, "team/m.bin", 3)
    point = f"{state.root}/mnt"
    for n in state.nodes:
        assert on_host(state, n.index, "mkdir", "-p", point).returncode == 0
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    out = subprocess.run([ffs, "mount", point, *overrides], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "on 3 hosts" in out.stdout, out.stdout + out.stderr
    try:
        for n in state.nodes:
            raw = subprocess.run(lab.exec_args(state, n.index, ["cat", f"{point}/team/m.bin"]), capture_output=True,
                                 timeout=180, cwd=PROJECT)
            assert raw.returncode == 0 and raw.stdout == blob, raw.stderr[-500:]
        assert not [m for m in mounts_under(state.root) if m.endswith("/mnt")]  # the head has no StorageNode
    finally:
        subprocess.run([ffs, "umount", point, *overrides], capture_output=True, text=True, timeout=300)


def test_erasure_coding_the_peer_tier_and_the_scrub_across_hosts(lab3):
    """2 data + 1 parity shards on the 3 hosts: read on host 0 while healthy, with host 1's MinIO
    down, and with a shard turned to garbage on host 2 (its host's scrub finds and rewrites it);
    a chunk made hot on host 0 stays readable with 2 of its 3 shards' hosts down: from host 0's
    cache on host 0, through the peer tier on host 1."""
    state, overrides = lab3
    blob, ec = put_blob(state, overrides, "team/blob.bin", 6, "layout=ec", "ec.data=2", "ec.parity=1")
    assert (ec.layout, ec.ec_data, ec.ec_parity, len(ec)) == ("ec", 2, 1, 6)
    assert all(sorted(c.nodes) == [0, 1, 2] and len(c.shards) == 3 for c in ec.chunks)
    creds = registry.fetch_credentials(state.name, "admin")
    stored = sum(o["Size"] for n in state.nodes for o in s3.client(n.endpoint, creds).list_objects_v2(
        Bucket=ec.bucket, Prefix=ec.chunks[0].key.rsplit("/", 1)[0]).get("Contents", []))
    assert 1.5 <= stored / len(blob) < 1.6  # 3 shards of half a chunk each (+ 80-byte shard headers)
    actors = cluster.storage_nodes(state)
    on0 = cluster.on_node(state.node(0))
    check_file(on0, "team/blob.bin", xxh3(blob), 0)
    ray.get(actors[1].hold_minio.remote())
    try:
        needs_parity = sum(1 in c.nodes[:2] for c in ec.chunks)  # host 1 held a data shard of these
        check_file(on0, "team/blob.bin", xxh3(blob), needs_parity)
    finally:
        ray.get(actors[1].release_minio.remote())
    bad = ec.chunks[2]
    s3.client(state.node(bad.nodes[0]).endpoint, creds).put_object(
        Bucket=ec.bucket, Key=erasure.shard_key(bad.key, 0), Body=os.urandom(len(blob) // 10))
    check_file(on0, "team/blob.bin", xxh3(blob), 1)
    found = ray.get(actors[bad.nodes[0]].scrub_minio.remote())  # that host's scrub finds it and rewrites it
    assert erasure.shard_key(bad.key, 0) in found["bad"] and found["repaired"] >= 1
    check_file(on0, "team/blob.bin", xxh3(blob), 0)
    hot = ec.chunks[3]
    assert ray.get(read_twice.options(**on0).remote("team/blob.bin", hot.id)) == chunk_xxh3(blob, hot.id)
    assert wait_until(lambda: ray.get(actors[0].cache_contains.remote(hot.key)), 15, "shards made a chunk hot")
    assert wait_until(lambda: ray.get(actors[1].cached_on.remote(hot.key)) == [0], 15, "cache index shared")
    ray.get([actors[i].hold_minio.remote() for i in (1, 2)])
    try:
        assert ray.get(read_once.options(**on0).remote("team/blob.bin", hot.id)) == (chunk_xxh3(blob, hot.id), 0)
        on1 = cluster.on_node(state.node(1))
        assert ray.get(read_once.options(**on1).remote("team/blob.bin", hot.id)) == (chunk_xxh3(blob, hot.id), 1)
    finally:
        ray.get([actors[i].release_minio.remote() for i in (1, 2)])


def test_the_jobs_on_share_nothing_hosts(lab3, sample):
    """Demo B, the backtest (each window's P&L against a plain loop over the source files' rows)
    and GraySort submitted with `ray job submit` to the lab's head."""
    state, overrides = lab3
    reads = {k: [("name", "=", f"demo_b.read[3 nodes @ node {k}]")] for k in range(3)}
    earlier = {k: task_ids(state, f) for k, f in reads.items()}  # an earlier run's tasks are not this one's
    demo_b = load_job("demo_b").main(overrides + data_overrides() + ["demo_b.total_mb=12", "demo_b.sweep=[1,3]",
                                                                     "demo_b.replicated=false"])
    assert all(0 <= p["cpu_busy"] <= 1 and p["host_cores"] >= 1 for r in demo_b["runs"] for p in r["per_node"])
    for k in range(3):  # where each read task ran, as Ray recorded it
        ran = tasks_ray_recorded(state, reads[k], excluding=earlier[k])
        assert ran and {t.node_id for t in ran} == {state.node(k).ray_node_id}
    backtest = load_job("backtest").main(overrides + SMALL_BACKTEST)
    runs = zip(*(backtest["modes"][m]["runs"] for m in ("MinIO direct", "FasterFS")))
    for (rows, expected), (a, b) in zip(source_pnls(backtest["windows"], backtest["params"]), runs):
        assert a["rows"] == b["rows"] == rows > 0 and a["pnl"] == b["pnl"]
        assert a["pnl"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert backtest["modes"]["FasterFS"]["cache_hits"] > 0  # replays served from the hosts' own caches
    sort = submit_job(state, "graysort", overrides + ["graysort.size=3MB", "graysort.reference_mb=1"])
    assert sort["records"] == 30_000 and sort["reference"]["cores"] >= 1


def test_a_host_dies_and_comes_back_empty(lab3):
    """Host 2 powered off (`fasterfs lab power-off 2`: every process of it killed at once): its
    chunks cached on another host stay readable (the peer tier), `fasterfs repair` puts its pieces
    on the other hosts and names what only it held; back with an empty disk (`fasterfs lab
    power-on 2 --empty`), it is refilled and every piece moved home. (Last: it loses the single
    copies on host 2.)"""
    state, overrides = lab3
    cfg = config.load(overrides)
    blob, one = put_blob(state, overrides, "team/one.bin", 6)
    src = Path(state.root) / "team_one.bin.src"
    from fasterfs.write.ingest import put

    two = put(config.load(overrides + ["replicas=2", "files.chunk_mb=1"]), src, "team/two.bin")
    actors = cluster.storage_nodes(state)
    on0, on1 = cluster.on_node(state.node(0)), cluster.on_node(state.node(1))
    only2 = next(c for c in one.chunks if c.nodes == [2])
    assert ray.get(read_twice.options(**on0).remote("team/one.bin", only2.id)) == chunk_xxh3(blob, only2.id)
    assert wait_until(lambda: ray.get(actors[0].cache_contains.remote(only2.key)), 15, "hot chunk cached on host 0")
    assert wait_until(lambda: ray.get(actors[1].cached_on.remote(only2.key)) == [0], 15, "cache index shared")
    # a holder slower than cache.peer_slower_ms: the peer first
    assert ray.get(read_slow.options(**on1).remote("team/one.bin", only2.id)) == (chunk_xxh3(blob, only2.id), 1, 1)
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    out = subprocess.run([ffs, "lab", "power-off", "2", *overrides], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "lab host 2 powered off" in out.stdout, out.stdout + out.stderr
    off = time.time()
    try:
        assert not lab_procs(state.node(2).netns)  # nothing of it runs
        assert ray.get(read_once.options(**on1).remote("team/one.bin", only2.id)) == (chunk_xxh3(blob, only2.id), 1)
        out = subprocess.run([ffs, "repair", *overrides], capture_output=True, text=True, timeout=300)
        said = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == 1 and "LOST" in said and "team/one.bin" in said, said
        moved = registry.fetch_manifest(state.name, "team/two.bin")
        assert all(sorted(c.nodes) == [0, 1] for c in moved.chunks)  # host 2's copies now on the others
        assert ray.get(read_file.options(**on0).remote("team/two.bin"))[0] == xxh3(blob)
    finally:  # back with an empty disk
        out = subprocess.run([ffs, "lab", "power-on", "2", "--empty", *overrides], capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 0 and "lab host 2 back with a blank disk" in " ".join(out.stdout.split()), \
        out.stdout + out.stderr
    creds = registry.fetch_credentials(state.name, "admin")
    node2 = s3.client(state.node(2).endpoint, creds)

    def held() -> dict:  # what host 2's MinIO lists, by its own account: key -> when it was written
        return {o["Key"]: o["LastModified"].timestamp() for page in node2.get_paginator("list_objects_v2").paginate(
            Bucket=two.bucket, Prefix="files/") for o in page.get("Contents", [])}
    # a blank disk: none of its old objects (its StorageNodes may have begun refilling it already)
    assert all(written > off for written in held().values())
    out = subprocess.run([ffs, "repair", *overrides], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr  # team/one.bin's single copies on host 2 are gone
    health = repair_survey.survey(state, creds, cfg.placement.load_slack)
    assert "team/two.bin" not in health.degraded, health
    assert registry.fetch_manifest(state.name, "team/two.bin").chunks == two.chunks  # every piece back home
    assert {c.key for c in two.chunks if 2 in c.nodes} <= set(held())
    assert ray.get(read_file.options(**on0).remote("team/two.bin"))[0] == xxh3(blob)
