"""The share-nothing lab: hosts in network and mount namespaces of their own, sharing only
the network and the installed software. Every multi-host behaviour is tested here: no host
sees another's files; the cluster's facts reach every host through Ray; data read across
hosts is right and cached on the reader's host; a write from anywhere invalidates every
host's cache; node ids follow the disks; any host can drive; up/down leave nothing."""
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import ray
from conftest import (
    assert_nothing_left,
    cluster_overrides,
    data_overrides,
    load_job,
    mounts_under,
    source_pnls,
    submit_job,
    wait_until,
)
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs import auth, cluster, config, erasure, identity, lab, registry, repair, s3
from fasterfs.cgroup import cgroup2_mount
from fasterfs.errors import FasterFSError
from fasterfs.ingest import ingest, put

pytestmark = pytest.mark.lab  # share-nothing hosts: the last tier

SUBNET = "198.18.7"
PROJECT = config.PROJECT_DIR
SMALL_BACKTEST = ["backtest.windows=2", "backtest.window_min=5", "backtest.params=[[2,5],[3,8]]"]


@pytest.fixture
def lab_overrides(tmp_path_factory):
    root = Path(str(tmp_path_factory.mktemp("lab"))[:60])  # under /tmp: the hosts' own /tmp hides it from them
    return cluster_overrides(root, "127.0.4.2", 3, nodes=3) + [f"lab.subnet={SUBNET}", "lab.link_mbit=200",
                                                               "lab.disk_mbit=null"]


def _in_ns(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, check=True).stdout


def _on_host(state, index: int, *cmd: str) -> subprocess.CompletedProcess:
    """A command run on a lab host as on that machine (`fasterfs lab exec`)."""
    return subprocess.run(lab.exec_args(state, index, list(cmd)), capture_output=True, text=True, timeout=180,
                          cwd=PROJECT)


@ray.remote(num_cpus=0)
def _look_around(root: str) -> dict:
    """What a process on a host sees of the cluster's files, and which mount namespace it is in."""
    import os

    return {"node_id": ray.get_runtime_context().get_node_id(), "mnt": os.readlink("/proc/self/ns/mnt"),
            "root": sorted(os.listdir(root)), "tmp_ray": os.path.isdir("/tmp/ray")}


@ray.remote(num_cpus=0)
def _read(root, ids, dataset=None):
    client = fasterfs.connect(root, ["cache.prefetch.enabled=false"], dataset=dataset)
    return ray.get_runtime_context().get_node_id(), [(xxh3(client.read_chunk(i)), client.sources(i)[0]) for i in ids]


def _put_blob(state, overrides: list[str], name: str, mb: int) -> tuple[bytes, object]:
    """A file of `mb` random MB stored in 1 MB chunks (a dataset that costs no parsing)."""
    blob = os.urandom(mb * 2**20 - 7)
    src = Path(state.root) / f"{name.replace('/', '_')}.src"
    src.write_bytes(blob)
    return blob, put(config.load(overrides + ["files.chunk_mb=1"]), src, name)


@ray.remote(num_cpus=0)
def _read_file(name):
    """xxh3 of a whole file read on this host, how many of its chunks needed parity, and why."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=False)
    data = b"".join(client.read_chunk(i) for i in range(len(client)))
    return xxh3(data), client.degraded_reads, list(client.degraded_why)


def _check_file(where, name, checksum, degraded):
    """The whole file read on host `where` has `checksum`, `degraded` of its chunks needing parity."""
    got, count, why = ray.get(_read_file.options(**where).remote(name))
    assert (got, count) == (checksum, degraded), f"{name}: {count} chunks needed parity, {degraded} expected: {why}"


def test_share_nothing_lab(lab_overrides):
    cfg = config.load(lab_overrides)
    state = lab.up(cfg)
    try:
        assert [n.address for n in state.nodes] == [f"{SUBNET}.{10 + i}" for i in range(3)]
        assert state.head_address == f"{SUBNET}.1"
        for n in state.nodes:
            assert n.netns and n.kernel_mode == "real" and n.disk
            qdiscs = _in_ns(n.netns, "tc", "qdisc", "show")
            assert "tbf" in qdiscs and "dev lab0" in qdiscs
            assert f"{n.address}:{cfg.minio.port}" in _in_ns(n.netns, "ss", "-ltn")  # MinIO on the host's address
            filters = _in_ns(n.netns, "tc", "filter", "show", "dev", "lab0", "ingress") + \
                _in_ns(n.netns, "tc", "filter", "show", "dev", "lab0", "egress") + \
                _in_ns(n.netns, "tc", "filter", "show", "dev", "lo", "egress")
            for name in ("lo:egress", "lab0:egress", "lab0:ingress"):  # its own kernel state, on its own host
                assert f"ffs:{state.name}:{n.index}:{name}" in filters
        assert len({n.host_id for n in state.nodes}) == 3

        # -- no host process can see another host's cluster root (nor the head's)
        seen = ray.get([_look_around.options(**cluster.on_node(n)).remote(state.root) for n in state.nodes])
        head_mnt = os.readlink("/proc/self/ns/mnt")
        assert len({s["mnt"] for s in seen} | {head_mnt}) == 4, "every host has a mount namespace of its own"
        for n, s in zip(state.nodes, seen):
            assert s["node_id"] == n.ray_node_id
            nodes_seen = [d for d in s["root"] if d.startswith("node-")]
            assert nodes_seen == [f"node-{n.index}"], f"host {n.address} sees {s['root']}"
            assert not {"cluster.json", "credentials.json", "manifest.json", "lab-disks"} & set(s["root"])
            assert s["tmp_ray"]  # its own Ray session directory, on its own /tmp
        for n in state.nodes:  # and from a shell on the host, as a user would look
            listing = _on_host(state, n.index, "ls", "-a", state.root).stdout.split()
            assert f"node-{n.index}" in listing and "credentials.json" not in listing
            assert not [d for d in listing if d.startswith("node-") and d != f"node-{n.index}"]

        # -- ingest from the head; reads across hosts right; the reader's host caches what it made hot
        manifest = ingest(config.load(lab_overrides + data_overrides()))
        remote = [c.id for c in manifest.chunks if c.nodes == [1]][:3]
        node_id, got = ray.get(_read.options(**cluster.on_node(state.node(0))).remote(state.root, remote + remote))
        assert node_id == state.node(0).ray_node_id
        assert [h for h, _ in got] == [manifest.chunk(i).xxh3 for i in remote + remote]
        assert all(src == 1 for _, src in got)
        actors = cluster.storage_nodes(state)
        kernel = ray.get([a.kernel_status.remote() for a in actors])
        assert kernel[0]["counters"]["hot_events"] == len(remote)  # seen leaving host 0 on lab0
        assert kernel[1]["counters"].get("hot_events", 0) == 0  # host 1 served them: its ingress counts no GETs
        wait_until(lambda: ray.get(actors[0].cache_status.remote())["entries"] >= len(remote), 30, "host 0's fills")
        _, again = ray.get(_read.options(**cluster.on_node(state.node(0))).remote(state.root, remote))
        assert [h for h, _ in again] == [manifest.chunk(i).xxh3 for i in remote]
        # readers' statistics are summed by their own host's StorageNode: 6 misses, then 3 hits
        readers0 = ray.get(actors[0].cache_status.remote())["readers"]
        assert (readers0["misses"], readers0["hits"]) == (2 * len(remote), len(remote))
        assert ray.get(actors[1].cache_status.remote())["readers"]["misses"] == 0  # not host 1's readers

        # -- a write from anywhere invalidates every host: cache chunk X on all three hosts, overwrite it
        # from the head (a fourth machine with no StorageNode); no host serves the old bytes afterwards
        x = manifest.chunk(remote[0])
        for n in state.nodes:
            ray.get(_read.options(**cluster.on_node(n)).remote(state.root, [x.id, x.id]))
        wait_until(lambda: all(ray.get(a.cache_contains.remote(x.key)) for a in actors), 30, "X cached on 3 hosts")
        creds = registry.fetch_credentials(state.name, "admin")
        new = b"new bytes of chunk X\n" * 1000
        holder = s3.client(state.node(x.nodes[0]).endpoint, creds)
        t_put = time.time()
        holder.put_object(Bucket=manifest.bucket, Key=x.key, Body=new)
        t_done = time.time()
        got = ray.get([_read_raw.options(**cluster.on_node(n)).remote(x.id) for n in state.nodes])
        assert [h for h, _ in got] == [xxh3(new)] * 3, "a host served the old bytes after the overwrite"
        # when each host learnt of the write, measured against the PUT (same machine clock)
        heard = ray.get([a.cache_status.remote() for a in actors])
        for row in heard:
            assert row["last_invalidation"] is not None and row["last_invalidation"] >= t_put
        lag = [round((r["last_invalidation"] - t_done) * 1e3, 1) for r in heard]
        print(f"invalidation after the PUT returned (ms, per host): {lag}; PUT took {(t_done - t_put) * 1e3:.1f} ms")

        # -- any host can drive: the CLI and a job from a shell on host 2, given only the Ray address
        address = [f"cluster.ray_address={state.ray_address}"]
        out = _on_host(state, 2, str(PROJECT / ".venv/bin/fasterfs"), "status", *lab_overrides, *address)
        assert out.returncode == 0, out.stdout + out.stderr
        assert all(n.address in out.stdout for n in state.nodes)
        job = _on_host(state, 2, str(PROJECT / ".venv/bin/python"), "jobs/readback.py", *lab_overrides, *address)
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        # its report, written on host 2, is where the head's dashboard serves it
        outputs = Path(state.config["output_dir"])
        runs = [d for d in outputs.iterdir() if d.name.startswith("readback-")] if outputs.is_dir() else []
        assert runs and json.loads((runs[-1] / "readback.json").read_text())["chunks"] == len(manifest)
        def dashboard(path):  # on the bridge, not loopback: the dashboard wants the cluster's token
            token = auth.read(auth.token_file(state.root))
            request = urllib.request.Request(state.web_url + path, headers={"Authorization": f"Bearer {token}"})
            return json.loads(urllib.request.urlopen(request, timeout=30).read())
        snap = dashboard("/api/snapshot")
        assert [(n["index"], n["status"]["healthy"], n["kernel"]["mode"]) for n in snap["nodes"]] == \
            [(n.index, True, "real") for n in state.nodes]  # the dashboard on the head sees every host
        assert runs[-1].name in [r["run"] for r in dashboard("/api/runs")]

        # -- the mount on every host (each in its own mount namespace), from a shell on the head
        point = f"{state.root}/mnt"
        for n in state.nodes:
            assert _on_host(state, n.index, "mkdir", "-p", point).returncode == 0
        out = subprocess.run([str(PROJECT / ".venv/bin/fasterfs"), "mount", point, *lab_overrides],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "on 3 hosts" in out.stdout, out.stdout + out.stderr
        y = manifest.chunk(remote[1])
        for n in state.nodes:
            got = _on_host(state, n.index, "cat", f"{point}/{manifest.name}/chunks/{y.key.rsplit('/', 1)[-1]}")
            assert got.returncode == 0 and xxh3(got.stdout.encode()) == y.xxh3, got.stderr
        assert not [m for m in mounts_under(state.root) if m.endswith("/mnt")]  # the head has no StorageNode

        # -- erasure coding (2 data + 1 parity shards on the 3 hosts): read on host 0 while healthy,
        # with host 1's MinIO down, and with a shard turned to garbage on host 2
        blob = os.urandom(5 * 2**20 + 123)
        src = Path(state.root) / "blob.bin"
        src.write_bytes(blob)
        ec = put(config.load(lab_overrides + ["layout=ec", "ec.data=2", "ec.parity=1", "files.chunk_mb=1"]),
                 src, "team/blob.bin")
        assert (ec.layout, ec.ec_data, ec.ec_parity, len(ec)) == ("ec", 2, 1, 6)
        assert all(sorted(c.nodes) == [0, 1, 2] and len(c.shards) == 3 for c in ec.chunks)
        stored = sum(o["Size"] for n in state.nodes for o in s3.client(n.endpoint, creds).list_objects_v2(
            Bucket=ec.bucket, Prefix=ec.chunks[0].key.rsplit("/", 1)[0]).get("Contents", []))
        assert 1.5 <= stored / len(blob) < 1.6  # 3 shards of half a chunk each (+ 80-byte shard headers)
        on0 = cluster.on_node(state.node(0))
        _check_file(on0, "team/blob.bin", xxh3(blob), 0)
        ray.get(actors[1].hold_minio.remote())
        try:
            needs_parity = sum(1 in c.nodes[:2] for c in ec.chunks)  # host 1 held a data shard of these
            _check_file(on0, "team/blob.bin", xxh3(blob), needs_parity)
        finally:
            ray.get(actors[1].release_minio.remote())
        bad = ec.chunks[2]
        s3.client(state.node(bad.nodes[0]).endpoint, creds).put_object(
            Bucket=ec.bucket, Key=erasure.shard_key(bad.key, 0), Body=os.urandom(len(blob) // 10))
        _check_file(on0, "team/blob.bin", xxh3(blob), 1)
        found = ray.get(actors[bad.nodes[0]].scrub_minio.remote())  # that host's scrub finds it and rewrites it
        assert found["bad"] == [erasure.shard_key(bad.key, 0)] and found["repaired"] == 1
        _check_file(on0, "team/blob.bin", xxh3(blob), 0)
        # host 0's kernel counts the shards its readers fetch from every host: the chunk is cached
        # whole there, and stays readable with 2 of its 3 shards' hosts down (more than parity): on
        # host 0 from its own cache, on host 1 through the peer tier
        hot = ec.chunks[3]
        assert ray.get(_read_twice.options(**on0).remote("team/blob.bin", hot.id)) == hot.xxh3
        assert wait_until(lambda: ray.get(actors[0].cache_contains.remote(hot.key)), 15, "shards made a chunk hot")
        assert wait_until(lambda: ray.get(actors[1].cached_on.remote(hot.key)) == [0], 15, "cache index shared")
        ray.get([actors[i].hold_minio.remote() for i in (1, 2)])
        try:
            assert ray.get(_read_once.options(**on0).remote("team/blob.bin", hot.id)) == (hot.xxh3, 0)
            on1 = cluster.on_node(state.node(1))
            assert ray.get(_read_once.options(**on1).remote("team/blob.bin", hot.id)) == (hot.xxh3, 1)
        finally:
            ray.get([actors[i].release_minio.remote() for i in (1, 2)])

        # -- the jobs, small, on share-nothing hosts: Demo B, the backtest, GraySort
        demo_b = load_job("demo_b").main(lab_overrides + data_overrides() + ["demo_b.total_mb=12", "demo_b.sweep=[1,3]",
                                                          "demo_b.replicated=false"])
        assert demo_b["all_tasks_on_their_nodes"] and demo_b["remote_reads"] == 0
        assert all(0 <= p["cpu_busy"] <= 1 and p["host_cores"] >= 1 for r in demo_b["runs"] for p in r["per_node"])
        backtest = load_job("backtest").main(lab_overrides + SMALL_BACKTEST)
        # each window's P&L, both modes, against a plain loop over the source files' rows (csv module)
        runs = zip(*(backtest["modes"][m]["runs"] for m in ("MinIO direct", "FasterFS")))
        for (rows, expected), (a, b) in zip(source_pnls(backtest["windows"], backtest["params"]), runs):
            assert a["rows"] == b["rows"] == rows > 0 and a["pnl"] == b["pnl"]
            assert a["pnl"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert backtest["modes"]["FasterFS"]["on_home_nodes"]
        assert backtest["modes"]["FasterFS"]["cache_hits"] > 0  # replays served from the hosts' own caches
        # (GraySort as a user submits it: `ray job submit` to the lab head, from a shell without the venv)
        sort = submit_job(state, "graysort", lab_overrides + ["size=3MB", "graysort.reference_mb=1"])
        assert sort["records"] == 30_000 and sort["tasks_on_their_nodes"]
        assert sort["reference"]["cores"] >= 1  # counted on the hosts

        # -- a host dies: its chunks cached on another host stay readable (the peer tier), repair puts
        # its pieces on the other hosts, and when it comes back empty, it is refilled
        one = put(config.load(lab_overrides + ["files.chunk_mb=1"]), src, "team/one.bin")
        two = put(config.load(lab_overrides + ["replicas=2", "files.chunk_mb=1"]), src, "team/two.bin")
        only2 = next(c for c in one.chunks if c.nodes == [2])
        assert ray.get(_read_twice.options(**on0).remote("team/one.bin", only2.id)) == only2.xxh3
        assert wait_until(lambda: ray.get(actors[0].cache_contains.remote(only2.key)), 15, "hot chunk cached on host 0")
        assert wait_until(lambda: ray.get(actors[1].cached_on.remote(only2.key)) == [0], 15, "cache index shared")
        on1 = cluster.on_node(state.node(1))  # a holder slower than cache.peer_slower_ms: the peer first
        assert ray.get(_read_slow.options(**on1).remote("team/one.bin", only2.id)) == (only2.xxh3, 1, 1)
        ray.get(actors[2].hold_minio.remote())
        try:
            assert ray.get(_read_once.options(**on1).remote("team/one.bin", only2.id)) == (only2.xxh3, 1)
            out = subprocess.run([str(PROJECT / ".venv/bin/fasterfs"), "repair", *lab_overrides],
                                 capture_output=True, text=True, timeout=300)
            said = " ".join(out.stdout.split())
            assert out.returncode == 1 and "LOST" in said and "team/one.bin" in said, said + out.stderr
            moved = registry.fetch_manifest(state.name, "team/two.bin")
            assert all(sorted(c.nodes) == [0, 1] for c in moved.chunks)  # host 2's copies now on the others
            assert ray.get(_read_file.options(**on0).remote("team/two.bin"))[0] == xxh3(blob)
            # host 2 comes back with an empty disk
            minio_dir = config.Paths(Path(state.root)).node_dir(2) / "minio"
            assert _on_host(state, 2, "rm", "-rf", str(minio_dir)).returncode == 0
        finally:
            ray.get(actors[2].release_minio.remote())
        out = subprocess.run([str(PROJECT / ".venv/bin/fasterfs"), "repair", *lab_overrides],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 1, out.stdout + out.stderr  # team/one.bin's single copies on host 2 are gone
        health = repair.survey(state, creds, cfg.placement.load_slack)
        assert "team/two.bin" not in health.degraded and "team/blob.bin" not in health.degraded, health
        assert registry.fetch_manifest(state.name, "team/two.bin").chunks == two.chunks  # every piece back home
        held = {o["Key"] for o in s3.client(state.node(2).endpoint, creds).list_objects_v2(
            Bucket=two.bucket, Prefix="files/").get("Contents", [])}
        assert {c.key for c in two.chunks if 2 in c.nodes} <= held
        _check_file(on0, "team/blob.bin", xxh3(blob), 0)
    finally:
        cluster.down(cfg)
    assert_nothing_left(state)
    assert lab.leftovers(cfg.cluster.name) == []


WORKER_PORTS = range(10002, 20000)  # cluster.worker_ports, Ray's workers


def _listening(ns: str | None, pids: set[int] | None = None) -> set[tuple[str, int]]:
    """(address, port) of every TCP listener in namespace `ns` (None: this one, only `pids`')."""
    cmd = ["ss", "-Hltnp"] if ns is None else ["ip", "netns", "exec", ns, "ss", "-Hltn"]
    out = set()
    for line in subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if pids is not None and not any(f"pid={p}," in line for p in pids):
            continue
        address, port = fields[3].rsplit(":", 1)
        out.add((address.strip("[]"), int(port)))
    return out


def test_outsiders_are_kept_out(lab_overrides, tmp_path):
    """With MinIO over TLS (minio.tls=true), a machine on the lab's network that is not part
    of the cluster tries every way in: joining the GCS, submitting a Ray job, both dashboards,
    MinIO in plain HTTP, without the cluster's CA, with no keys, wrong keys, reader keys.
    Without the right secret each is refused; with it, it works. Nothing listens beyond the
    ports the README lists. And the cache still learns what is hot from the readers' reports,
    the kernel seeing only ciphertext."""
    from fasterfs import credentials
    from fasterfs.cgroup import ProjectCgroup
    from fasterfs.config import Paths

    overrides = lab_overrides + ["nodes=2", "lab.outsiders=1", "minio.tls=true"]
    cfg = config.load(overrides)
    state = lab.up(cfg)
    try:
        assert state.tls_ca and all(n.endpoint.startswith("https://") for n in state.nodes)
        for n in state.nodes:  # each host made its own key; the CA's key stays on the head
            key = Paths(Path(state.root)).minio_certs_dir(n.index) / "private.key"
            assert _on_host(state, n.index, "stat", "-c", "%a", str(key)).stdout.strip() == "600"
            assert "tls-ca" not in _on_host(state, n.index, "ls", state.root).stdout
        _, manifest = _put_blob(state, overrides, "team/tls.bin", 8)
        chunk = next(c for c in manifest.chunks if c.nodes[0] == 0)

        # hot chunks under TLS: the kernel sees no paths; host 0's readers report their GETs
        remote = [c.id for c in manifest.chunks if c.nodes == [1]][:3]
        assert len(remote) == 3
        on0 = cluster.on_node(state.node(0))
        _, got = ray.get(_read.options(**on0).remote(state.root, remote + remote, manifest.name))
        assert [h for h, _ in got] == [manifest.chunk(i).xxh3 for i in remote + remote]
        actors = cluster.storage_nodes(state)
        wait_until(lambda: ray.get(actors[0].cache_status.remote())["entries"] >= len(remote), 30, "host 0's fills")
        kernel = ray.get([a.kernel_status.remote() for a in actors])
        assert kernel[0]["reported_by_readers"] == {"gets": 2 * len(remote), "hot_events": len(remote)}
        assert kernel[0]["counters"].get("hot_events", 0) == 0  # no request line the kernel could read
        assert kernel[0]["counters"].get("packets", 0) > 0 and kernel[0]["counters"].get("requests", 0) == 0
        _, again = ray.get(_read.options(**on0).remote(state.root, remote, manifest.name))
        assert [h for h, _ in again] == [manifest.chunk(i).xxh3 for i in remote]
        readers0 = ray.get(actors[0].cache_status.remote())["readers"]
        assert (readers0["misses"], readers0["hits"]) == (2 * len(remote), len(remote))

        keys = credentials.load(Paths(Path(state.root)).credentials_file)
        outsider = state.lab["outsiders"][0]
        facts = tmp_path / "facts.json"
        facts.touch(mode=0o600)
        facts.write_text(json.dumps({
            "token": auth.read(auth.token_file(state.root)), "head": state.head_address,
            "ray_dashboard_port": cfg.cluster.dashboard_port, "dashboard_port": cfg.dashboard.port,
            "minio": state.node(0).endpoint, "bucket": manifest.bucket, "key": chunk.key,
            "reader": [keys.reader.access_key, keys.reader.secret_key],
            "admin": [keys.admin.access_key, keys.admin.secret_key],
            "ray": str(PROJECT / ".venv/bin/ray"), "ray_address": state.ray_address, "me": outsider["address"],
            "join_timeout": 120, "ca": state.tls_ca}))
        nodes_before = len([n for n in ray.nodes() if n["Alive"]])
        jail = ProjectCgroup.create(f"outsider-{cfg.cluster.name}", Path(state.root))  # whatever it starts, we stop
        try:
            proc = jail.spawn(["ip", "netns", "exec", outsider["netns"], str(PROJECT / ".venv/bin/python"),
                               str(PROJECT / "tests/outsider.py"), str(facts)], tmp_path / "outsider.log")
            assert proc.wait(timeout=600) == 0, (tmp_path / "outsider.log").read_text()[-3000:]
            nodes_after = len([n for n in ray.nodes() if n["Alive"]])
        finally:
            jail.remove()
        got = json.loads((tmp_path / "outsider.log").read_text().strip().splitlines()[-1])
        for door, wrong in (("ray_dashboard", 403), ("fasterfs_dashboard", 401), ("jobs", 403)):
            assert got[door] == {"none": 401, "wrong": wrong, "token": 200}, (door, got[door])
        assert got["tls"] == {"plain_http": 400, "system_cas": "SSLCertVerificationError",
                              "cluster_ca": 200}, got["tls"]
        from ray.job_submission import JobSubmissionClient

        submitted = {j.submission_id for j in JobSubmissionClient(state.dashboard_url).list_jobs()}
        assert "outsider-token" in submitted and not {"outsider-none", "outsider-wrong"} & submitted
        minio = got["minio"]
        assert minio["none"] == {"get": "AccessDenied", "put": "AccessDenied", "delete": "AccessDenied"}, minio
        assert set(minio["wrong"].values()) == {"InvalidAccessKeyId"}, minio
        assert minio["reader"] == {"get": "ok", "put": "AccessDenied", "delete": "AccessDenied"}, minio
        assert minio["admin"] == {"get": "ok", "put": "ok", "delete": "ok"}, minio
        # refused: `ray start` exits with an error; one that hangs (exit None) is not a refusal
        assert isinstance(got["join"]["exit"], int) and got["join"]["exit"] != 0, got["join"]
        assert nodes_after == nodes_before, got["join"]

        # what listens: on each host, only its node's documented ports; on the head, the head's
        c = cfg.cluster
        for i, node in enumerate(state.nodes):
            base = c.node_ports + 10 * i
            allowed = {cfg.minio.port, c.agent_port + i, *range(base, base + 5)}
            ports = _listening(node.netns)
            assert {p for _, p in ports if p not in WORKER_PORTS} <= allowed, (i, sorted(ports))
        head_cgroup = Path(state.cgroup["path"]) / "head"
        pids = {int(p) for p in (head_cgroup / "cgroup.procs").read_text().split()}
        base = c.node_ports + 990
        allowed = {c.ray_port, c.dashboard_port, c.client_port, c.agent_port + 99, cfg.dashboard.port,
                   *range(base, base + 7)}  # + the autoscaler's and Ray dashboard's metrics
        ports = _listening(None, pids)
        assert ports and {p for _, p in ports if p not in WORKER_PORTS} <= allowed, sorted(ports)
    finally:
        cluster.down(cfg)
    assert_nothing_left(state)
    assert lab.leftovers(cfg.cluster.name) == []


def test_hosts_losing_power(lab_overrides):
    """jobs/chaos.py, small: 4 hosts, ec=2+1, a host powered off (every process of it killed at
    once) while a backtest and a full read run: no read fails, the same P&L and chunks as without
    faults; repair then brings every chunk back to full redundancy on the 3 hosts left; the host
    comes back with a blank disk and is refilled."""
    overrides = lab_overrides + ["nodes=4"]
    cfg = config.load(overrides)
    state = lab.up(cfg)
    try:
        result = load_job("chaos").main(overrides + data_overrides() + SMALL_BACKTEST + [
            "chaos.ec_data=2", "chaos.ec_parity=1", "chaos.victims=[2]", "chaos.kill_at_s=[2]", "chaos.rounds_after=1"])
        assert result["killed"][0]["processes"] > 0 and result["layout"] == "ec=2+1"
        assert result["failed_reads"] == 0 and result["all_same"], result["rounds"]
        assert [r["hosts_down"] for r in result["rounds"]][-1] == 1
        assert sum(r["degraded_reads"] for r in result["rounds"]) > 0  # parity was needed, and it was there
        fixed = result["repair"]
        assert fixed["failed"] == 0 and fixed["repaired"] > 0, fixed
        assert f"{result['chunks']} at full redundancy, 0 degraded; nodes down: 2" in fixed["after"], fixed
        # host 2 back with a blank disk: refilled, every piece home again, the same results
        back = result["back"]
        assert back["full"] and back["misplaced"] == 0 and back["failed"] == 0, back
        assert back["pieces_on"][2] > 0 and back["moved"] > 0, back
        assert back["failed_reads"] == 0 and back["all_same"], back
        now = lab.cluster.ClusterState.load(cfg.cluster.root)
        assert now.node(2).ray_node_id != state.node(2).ray_node_id and cluster.is_ray_start(now.node(2).ray_pid)
    finally:
        cluster.down(cfg)
    assert_nothing_left(state)
    assert lab.leftovers(cfg.cluster.name) == []


@ray.remote(num_cpus=0)
def _read_twice(name, i):
    """Chunk i of `name` read twice on this host: the kernel makes it hot here."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=False)
    return [xxh3(client.read_chunk(i)) for _ in range(2)][-1]


@ray.remote(num_cpus=0)
def _read_once(name, i):
    """xxh3 of chunk i read on this host, and how many chunks came from another host's cache."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name)
    return xxh3(client.read_chunk(i)), client.peer_reads


@ray.remote(num_cpus=0)
def _read_slow(name, i):
    """Chunk i read twice on this host, every MinIO counted as slow: the first read measures its
    holder, the second asks the caches of other hosts first. (xxh3, peer reads, MinIO reads)."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false", "cache.peer_slower_ms=0.001"], dataset=name)
    client.read_chunk(i)
    return xxh3(client.read_chunk(i)), client.peer_reads, sum(client.served_by.values())


@ray.remote(num_cpus=0)
def _read_raw(i):
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"])
    return xxh3(client.read_chunk(i)), client.local_node


def test_node_ids_follow_the_disks(lab_overrides):
    """Stop the lab, start it with the disks on other hosts and one host more: every node keeps
    its id (its data), the new host gets a new one, and everything reads back."""
    cfg = config.load(lab_overrides + ["nodes=2"])
    state = lab.up(cfg)
    try:
        blob, manifest = _put_blob(state, lab_overrides + ["nodes=2"], "team/ids.bin", 6)
    finally:
        cluster.down(cfg)
    assert [(n.index, n.address) for n in state.nodes] == [(0, f"{SUBNET}.10"), (1, f"{SUBNET}.11")]
    cfg = config.load(lab_overrides + ["nodes=3", "lab.disks=[disk1,disk0,disk2]"])
    state = lab.up(cfg)
    try:
        assert [(n.index, n.address) for n in state.nodes] == [(0, f"{SUBNET}.11"), (1, f"{SUBNET}.10"),
                                                                 (2, f"{SUBNET}.12")]
        ids = list(range(len(manifest)))
        for n in state.nodes:  # every host reads everything back through the new addresses
            _, got = ray.get(_read.options(**cluster.on_node(n)).remote(state.root, ids, manifest.name))
            assert [h for h, _ in got] == [xxh3(blob[i * 2**20:(i + 1) * 2**20]) for i in ids]
            assert [src for _, src in got] == [c.nodes[0] for c in manifest.chunks]  # from the holder by id
    finally:
        cluster.down(cfg)
    assert_nothing_left(state)


def test_failed_lab_up_leaves_nothing(lab_overrides, tmp_path):
    fake = tmp_path / "minio"
    fake.write_text("#!/bin/sh\nexit 3\n")  # MinIO that dies: the network and Ray nodes are up by then
    fake.chmod(0o755)
    cfg = config.load(lab_overrides + [f"minio.binary={fake}", "cluster.start_timeout_s=60", "nodes=2"])
    with pytest.raises(FasterFSError, match=f"StorageNode failed to start on host {re.escape(SUBNET)}\\.1[01] "):
        lab.up(cfg)
    assert lab.leftovers(cfg.cluster.name) == []
    assert not config.Layout.of(cfg).paths.state_file.exists()
    assert not Path(cgroup2_mount(), f"fasterfs-{cfg.cluster.name}").exists()
    assert not mounts_under(cfg.cluster.root)  # its bpffs too
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd(p).find(str(cfg.cluster.root)) >= 0]
    assert not left


def _cmd(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# A receiver that counts the bytes of one connection and says how long they took (first to last
# byte), and a sender of N bytes: the standard library's sockets, run inside a lab host's namespace.
RECEIVE = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n, first = 0, None
while chunk := c.recv(1 << 16):
    first = first or time.monotonic(); n += len(chunk)
print(n, time.monotonic() - first, flush=True)
"""
SEND = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2]))).sendall(bytes(int(sys.argv[3])))"


def _mbit_between(receiver_ns: str, sender_ns: str, address: str, size: int) -> float:
    """Mbit/s of `size` bytes sent from namespace `sender_ns` to a receiver at `address` in `receiver_ns`."""
    rx = subprocess.Popen(["ip", "netns", "exec", receiver_ns, "python3", "-c", RECEIVE, address, "47001"],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        subprocess.run(["ip", "netns", "exec", sender_ns, "python3", "-c", SEND, address, "47001", str(size)],
                       check=True, timeout=60)
        got, seconds = rx.stdout.readline().split()
        assert int(got) == size
        return size * 8 / float(seconds) / 1e6
    finally:
        rx.kill()
        rx.wait()


@pytest.mark.parametrize("profile", ["laptops", "unlimited"])
def test_bandwidth_profiles_limit_what_a_host_can_pull(lab_overrides, profile):
    """The lab's bandwidth profiles, measured with plain sockets: under `laptops` a host sends to
    another at most link_mbit (tbf on its link) and reads its own loopback (its "disk") at most
    disk_mbit; under `unlimited` there is no limit on either."""
    cfg = config.load([o for o in lab_overrides if not o.startswith(("lab.link_mbit", "lab.disk_mbit"))]
                      + [f"lab={profile}", f"lab.subnet={SUBNET}"])
    record, _, hosts = lab.create_network(cfg.cluster.name, 2, cfg.lab)
    try:
        a, b = hosts
        size = 8 * 2**20  # 32x the tbf burst: the rate, not the burst, decides
        link = _mbit_between(b.netns, a.netns, b.address, size)
        disk = _mbit_between(a.netns, a.netns, "127.0.0.1", size)
        print(f"{profile}: link {link:.0f} Mbit/s, loopback {disk:.0f} Mbit/s")
        laptops = config.load(["lab=laptops"]).lab
        for measured, limit in ((link, cfg.lab.link_mbit), (disk, cfg.lab.disk_mbit)):
            if limit:
                assert limit / 3 < measured <= limit * 1.15, (profile, measured, limit)  # + the burst
            else:  # well past what the laptops are allowed
                assert measured > 4 * max(laptops.link_mbit, laptops.disk_mbit), (profile, measured)
        assert ("tbf" in _in_ns(a.netns, "tc", "qdisc", "show")) == bool(cfg.lab.link_mbit)
    finally:
        lab.destroy_network(record)
    assert lab.leftovers(cfg.cluster.name) == []


def test_lab_down_without_lab_is_an_error(lab_overrides):
    with pytest.raises(FasterFSError, match="no FasterFS lab is running"):
        lab.down(config.load(lab_overrides))


def test_leftovers_of_a_crashed_lab_are_removed(lab_overrides):
    cfg = config.load(lab_overrides)
    lab.create_network(cfg.cluster.name, 2, cfg.lab)  # as if the process that made them died
    assert lab.leftovers(cfg.cluster.name)
    report = lab.down(cfg)  # no state file: `lab down` still removes what is left
    assert report["lab_removed"] >= 2 and lab.leftovers(cfg.cluster.name) == []


def test_bad_lab_disks_are_named(lab_overrides):
    with pytest.raises(FasterFSError, match="lab.disks"):
        lab.up(config.load(lab_overrides + ["lab.disks=[a,a,b]"]))
    assert lab.leftovers(config.load(lab_overrides).cluster.name) == []


# -- node identity, decided from what the disks record (no cluster needed) ---------------------


def _host(address, *ids_at):
    return {"address": address, "identities": [{"node": i, "address": a} for i, a in ids_at]}


def test_identity_keeps_ids_by_address_then_by_disk():
    shared = [(0, "a"), (1, "b")]  # a one-machine cluster: every node sees every identity
    assert identity.assign([_host("a", *shared), _host("b", *shared), _host("c", *shared)]) == {"a": 0, "b": 1, "c": 2}
    # disks moved to other addresses, one new empty host
    assert identity.assign([_host("x", (1, "b")), _host("y", (0, "a")), _host("z")]) == {"x": 1, "y": 0, "z": 2}
    # a host left: the others keep their ids
    assert identity.assign([_host("a", (0, "a")), _host("c", (2, "c"))]) == {"a": 0, "c": 2}


def test_identity_refuses_an_id_on_two_hosts():
    with pytest.raises(FasterFSError, match="node id 1 is recorded on two hosts"):
        identity.assign([_host("a", (1, "a")), _host("b", (1, "b"))])


def test_identity_refuses_another_version():
    with pytest.raises(FasterFSError, match="host h2 runs FasterFS 0.0.1"):
        identity.check_versions([{"address": "h2", "version": "0.0.1"}])
