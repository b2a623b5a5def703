"""The real 2-node cluster: nodes, actors and MinIO servers where they belong; data read
back exactly; failures healed (MinIO, actor) or routed around (replicas)."""
import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from botocore.exceptions import ClientError
from conftest import (
    CLEAN_ENV,
    assert_nothing_left,
    cluster_overrides,
    data_overrides,
    load_job,
    minio_holdings,
    minio_keys,
    minio_listing,
    mounts_under,
    run_job,
    source_lines,
    source_rows,
    source_xxh3,
    task_ids,
    tasks_ray_recorded,
    wait_until,
)
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.control import auth, credentials, registry, s3
from fasterfs.core import config, lobster
from fasterfs.core.cgroup import cgroup2_mount
from fasterfs.core.errors import FasterFSError
from fasterfs.node.minio_server import MinioServer, _cmdline
from fasterfs.node.storage_node import NAMESPACE_POLL_S
from fasterfs.ops import cluster
from fasterfs.write.ingest import ingest, put


def statuses(state):
    return ray.get([a.status.remote() for a in cluster.storage_nodes(state)], timeout=60)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@ray.remote(num_cpus=0)
def _pid_together(meeting: str, tag: str, count: int) -> int:
    """This worker's pid, once `count` tasks of `tag` run side by side (each leaves a file in
    `meeting`, a directory every node of this host sees): one burst, on as many workers."""
    import time
    import uuid

    Path(meeting, f"{tag}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + 60
    while sum(p.name.startswith(f"{tag}-") for p in Path(meeting).iterdir()) < count:
        assert time.monotonic() < deadline, f"{count} tasks of {tag} never ran side by side"
        time.sleep(0.05)
    return os.getpid()


def test_workers_past_the_cpu_count_are_kept_for_the_next_burst(live_cluster, cfg, tmp_path):
    """cluster.idle_worker_s: a burst of tasks that take no CPU, all running at once, runs on more
    workers than the node has CPUs; 3 s later (Ray's own 1 s would have ended those past the CPU
    count) the next such burst runs on them again, as the workers' own process ids say."""
    import time

    on0 = cluster.on_node(live_cluster.node(0))
    burst = cfg.cluster.cpus_per_node + 2
    first = set(ray.get([_pid_together.options(**on0).remote(str(tmp_path), "a", burst) for _ in range(burst)]))
    assert len(first) == burst  # side by side: a worker each, past the CPU count
    time.sleep(3)
    again = set(ray.get([_pid_together.options(**on0).remote(str(tmp_path), "b", burst) for _ in range(burst)]))
    assert len(first & again) > cfg.cluster.cpus_per_node, (first, again)


def test_nodes_on_their_own_loopback_addresses(live_cluster):
    cluster.connect_ray(live_cluster)
    alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert alive == {n.address: n.ray_node_id for n in live_cluster.nodes}
    assert all(a.startswith("127.") and a != "127.0.0.1" for a in alive)


def test_storage_nodes_pinned_with_minio_bound_to_node_address(live_cluster):
    rows = statuses(live_cluster)
    for node, row in zip(live_cluster.nodes, rows):
        assert row["node_id"] == node.ray_node_id
        assert row["healthy"] and row["endpoint"] == f"http://{node.address}:{live_cluster.config['minio']['port']}"
        cmd = open(f"/proc/{row['minio_pid']}/cmdline", "rb").read().split(b"\0")
        assert f"{node.address}:{live_cluster.config['minio']['port']}".encode() in cmd


def test_node_reports_have_their_declared_shapes(live_cluster):
    """What the CLI, the monitor and the dashboard read of a node has the keys fasterfs.node.node_status
    declares, no more and no fewer."""
    from fasterfs.node.node_status import CacheStatus, NodeStatus

    for actor in cluster.storage_nodes(live_cluster):
        assert set(ray.get(actor.status.remote())) == set(NodeStatus.__annotations__)
        assert set(ray.get(actor.cache_status.remote())) == set(CacheStatus.__annotations__)


def test_csv_chunks_equal_source_rows_byte_for_byte(ingest_as, client_for, overrides):
    manifest = ingest_as("csv", reuse=True)
    message, orderbook = source_lines(overrides)  # gzip's read of the source files
    client = client_for()
    assert len(client) == -(-len(message) // manifest.rows_per_chunk)
    for c in manifest.chunks:
        body = client.read_chunk(c.id)
        expected = [m + b"," + o for m, o in zip(message[c.first_row:c.first_row + c.rows],
                                                  orderbook[c.first_row:c.first_row + c.rows])]
        assert body.split(b"\n")[:-1] == expected, f"chunk {c.id}"
        assert xxh3(body) == c.xxh3
    assert sum(c.rows for c in manifest.chunks) == len(message)


def test_arrow_chunks_equal_source_values(ingest_as, client_for, overrides):
    manifest = ingest_as("arrow", reuse=True)
    rows = source_rows(overrides)  # the csv module's parse of the source files
    client = client_for()
    for c in manifest.chunks:
        table = client.read_table(c.id)
        assert table.columns == lobster.columns(manifest.level)
        assert table.rows() == rows[c.first_row:c.first_row + c.rows], f"chunk {c.id}"


@pytest.mark.parametrize("fmt", ["csv", "arrow"])
def test_time_window_equals_source_rows(ingest_as, client_for, overrides, fmt):
    manifest = ingest_as(fmt, reuse=True)
    rows = source_rows(overrides)  # the csv module's parse of the source files
    client = client_for()
    t0, t1 = rows[0][0], rows[-1][0]
    start, end = t0 + (t1 - t0) * 0.4, t0 + (t1 - t0) * 0.45
    ids = client.chunks_between(start, end)
    assert 0 < len(ids) < len(manifest) and ids == list(range(ids[0], ids[-1] + 1))
    window = client.read_between(start, end)
    expected = [r for r in rows if start <= r[0] < end]
    assert window.height > 0 and window.rows() == expected
    assert client.read_between(t1 + 1, t1 + 2).is_empty()
    assert client.read_between(t0, t1 + 1).height == len(rows)
    with pytest.raises(FasterFSError, match=r"time range \[5, 5\) of dataset .*start < end"):
        client.read_between(5, 5)
    with pytest.raises(FasterFSError, match="time range"):
        client.chunks_between("09:30", 36000)


def test_chunks_stored_only_on_their_nodes(ingest_as, live_cluster):
    manifest = ingest_as("csv", reuse=True)
    held = {n: sorted(o["Key"] for o in objects) for n, objects in minio_holdings(live_cluster, manifest).items()}
    for node, keys in held.items():
        assert keys == sorted(c.key for c in manifest.on_node(node))
    assert 1 <= min(len(k) for k in held.values())


def _generations(state, dataset: str) -> dict[str, int]:
    """Objects per generation of `dataset`, over every node's MinIO."""
    out: dict[str, int] = {}
    for objects in minio_listing(state, f"{dataset}/").values():
        for o in objects:
            g = o["Key"].split("/")[1]
            out[g] = out.get(g, 0) + 1
    return out


def test_reingest_keeps_the_replaced_generation_for_its_grace(ingest_as, live_cluster, client_for, overrides):
    first = ingest_as("csv", reuse=True)
    creds = registry.fetch_credentials(live_cluster.name, "admin")
    orphan = f"{first.dataset}/g-crashed-ingest/chunk-00000.csv"  # written by an ingest that never published
    s3.client(live_cluster.nodes[0].endpoint, creds).put_object(Bucket=first.bucket, Key=orphan, Body=b"x")
    second = ingest_as("csv")
    held = _generations(live_cluster, first.dataset)
    assert held[first.generation] == held[second.generation] == len(second)  # readers of the first still read
    assert "g-crashed-ingest" not in held  # no manifest ever named it: gone at once
    third = ingest(config.load(overrides + data_overrides() + ["ingest.keep_old_s=0"]))
    assert _generations(live_cluster, first.dataset) == {third.generation: len(third)}  # grace over: replaced ones go
    client_for().read_chunk(0)


def test_unknown_chunk_names_valid_range(ingest_as, client_for):
    manifest = ingest_as("csv", reuse=True)
    with pytest.raises(FasterFSError, match=rf"valid ids are 0..{len(manifest) - 1}"):
        client_for().read_chunk(len(manifest))


def test_killed_minio_is_restarted_and_reads_resume(ingest_as, live_cluster, client_for):
    manifest = ingest_as("csv", reuse=True)
    before = statuses(live_cluster)[1]
    os.kill(before["minio_pid"], signal.SIGKILL)
    wait_until(lambda: (statuses(live_cluster)[1]["healthy"]
                        and statuses(live_cluster)[1]["minio_pid"] != before["minio_pid"]),
               timeout=30, what="MinIO restart")
    after = statuses(live_cluster)[1]
    assert after["minio_restarts"] == before["minio_restarts"] + 1
    client = client_for()
    for c in manifest.on_node(1):
        assert xxh3(client.read_chunk(c.id)) == source_xxh3(c)


def test_killed_storage_node_actor_is_restarted(ingest_as, live_cluster, client_for):
    manifest = ingest_as("csv", reuse=True)
    before = statuses(live_cluster)[0]
    os.kill(before["actor_pid"], signal.SIGKILL)

    def back():
        try:
            row = statuses(live_cluster)[0]
        except Exception:
            return False
        return row["actor_pid"] != before["actor_pid"] and row["healthy"]
    wait_until(back, timeout=60, what="StorageNode restart")
    row = statuses(live_cluster)[0]
    assert row["node_id"] == live_cluster.nodes[0].ray_node_id  # restarted on the same node
    # the old incarnation's MinIO served on through the crash (no child of the worker Ray killed):
    # the new one took it over, the same process, still running as the kernel shows
    assert row["minio_pid"] == before["minio_pid"] and running(before["minio_pid"])
    assert Path(f"/proc/{row['minio_pid']}/cmdline").read_bytes().split(b"\0")[1] == b"server"
    client = client_for()
    for c in manifest.on_node(0):
        assert xxh3(client.read_chunk(c.id)) == source_xxh3(c)
    # the new incarnation replaced its predecessor's kernel attachments instead of adding to them
    import subprocess

    from fasterfs.bpf import tc
    assert sorted(n for n in tc.list_filters("lo") if n.startswith(f"ffs:{live_cluster.name}:")) == \
        [f"ffs:{live_cluster.name}:{n.index}:lo:egress" for n in live_cluster.nodes]
    tree = subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout.split("\n")
    at = tree.index(next(line for line in tree if line.endswith(f"fasterfs-{live_cluster.name}/node-0")))
    assert sum(1 for line in tree[at + 1:at + 3] if "sock_ops" in line) == 1


def test_replicas_survive_one_minio_down(ingest_as, live_cluster, client_for):
    manifest = ingest_as("csv", replicas=2)
    assert all(sorted(c.nodes) == [0, 1] for c in manifest.chunks)
    actors = cluster.storage_nodes(live_cluster)
    ray.get(actors[0].hold_minio.remote())
    try:
        assert not statuses(live_cluster)[0]["healthy"]
        client = client_for()
        owned_by_0 = [c for c in manifest.chunks if c.nodes[0] == 0]
        assert owned_by_0
        for c in owned_by_0:
            assert xxh3(client.read_chunk(c.id)) == source_xxh3(c)
    finally:
        ray.get(actors[0].release_minio.remote())
    assert statuses(live_cluster)[0]["healthy"]


def test_all_replicas_down_is_a_clear_error(ingest_as, live_cluster, client_for):
    manifest = ingest_as("csv", reuse=True)
    chunk = manifest.on_node(1)[0]
    actor = cluster.storage_nodes(live_cluster)[1]
    ray.get(actor.hold_minio.remote())
    try:
        with pytest.raises(FasterFSError, match=rf"chunk {chunk.id} .* could not be read from any holder: node 1"):
            client_for().read_chunk(chunk.id)
    finally:
        ray.get(actor.release_minio.remote())


def test_a_failed_ingest_leaves_nothing_and_the_old_generation_current(ingest_as, live_cluster, overrides):
    """A node's MinIO down during an ingest: the ingest fails naming the node, none of the new
    generation's objects is left on any node (as MinIO lists them), and the previous generation
    stays current and readable."""
    old = ingest_as("csv", reuse=True)
    actor = cluster.storage_nodes(live_cluster)[1]
    creds = credentials.load(config.Paths(Path(live_cluster.root)).credentials_file).admin
    prefix = old.chunks[0].key.rsplit("/", 2)[0] + "/"  # <dataset>/ : every generation's objects
    before = minio_keys(live_cluster, prefix)
    ray.get(actor.hold_minio.remote())
    try:
        with pytest.raises(FasterFSError, match=r"on node 1 \(http://"):
            ingest(config.load(overrides + data_overrides()))
    finally:
        ray.get(actor.release_minio.remote())
    assert minio_keys(live_cluster, prefix) == before  # nothing of the failed generation, nothing lost
    current = registry.fetch_manifest(live_cluster.name, old.name)
    assert current.generation == old.generation
    body = s3.client(live_cluster.node(old.chunks[0].nodes[0]).endpoint, creds).get_object(
        Bucket=old.bucket, Key=old.chunks[0].key)["Body"].read()
    assert xxh3(body) == source_xxh3(old.chunks[0])


def test_replicas_beyond_cluster_size_refused(live_cluster, overrides):
    from fasterfs.write.ingest import ingest
    with pytest.raises(FasterFSError, match="replicas=3"):
        ingest(config.load(overrides + ["nodes=3", "replicas=3"]))


def test_cluster_already_running_refused(live_cluster, cfg):
    with pytest.raises(FasterFSError, match="already running"):
        cluster.up(cfg)


def test_readback_job_runs_tasks_on_their_nodes(ingest_as, live_cluster, overrides):
    """Where each read task ran, as Ray recorded it, and what it read, against what each node's
    MinIO holds of the dataset by its own listing (not the job's verdicts)."""
    manifest = ingest_as("csv", reuse=True)
    names = {n.index: [("name", "=", f"readback.read[node {n.index}]")] for n in live_cluster.nodes}
    earlier = {i: task_ids(live_cluster, f) for i, f in names.items()}  # an earlier run's tasks are not this one's
    result = load_job("readback").main(overrides)  # in this process: `ray job submit` is the other jobs' tests'
    holdings = minio_holdings(live_cluster, manifest)
    for n in live_cluster.nodes:
        held = holdings[n.index]
        read = next(r for r in result["nodes"] if r["node"] == n.index)
        assert (read["chunks"], read["bytes"]) == (len(held), sum(o["Size"] for o in held)), (n.index, read)
        ran = tasks_ray_recorded(live_cluster, names[n.index], excluding=earlier[n.index])
        assert ran and {t.node_id for t in ran} == {n.ray_node_id}, ran


@pytest.mark.parametrize("md5_etags", [True, False])
def test_minio_etag_modes(tmp_path, md5_etags):
    """md5_etags=false (--no-compat) skips MinIO's MD5 of every PUT: ETags are then random
    per write yet still change on every overwrite, and a client's Content-MD5 is still
    checked, so a damaged upload is refused either way."""
    cfg = config.load([])
    creds = credentials.create(tmp_path / "credentials.json").admin
    server = MinioServer(config.minio_binary(cfg), "127.0.4.2", 9400, 9401, tmp_path / "minio",
                         tmp_path / "minio.log", creds, md5_etags=md5_etags)
    server.start(30)
    try:
        assert ("--no-compat" in _cmdline(server.pid)) is not md5_etags
        c = s3.client(server.endpoint, creds)
        c.create_bucket(Bucket="etags")
        body = b"0123456789" * 1000
        etags = [c.put_object(Bucket="etags", Key="k", Body=body)["ETag"].strip('"') for _ in range(2)]
        if md5_etags:
            assert etags == [hashlib.md5(body).hexdigest()] * 2
        else:
            assert etags[0] != etags[1] and hashlib.md5(body).hexdigest() not in etags
        wrong = base64.b64encode(hashlib.md5(b"other bytes").digest()).decode()
        with pytest.raises(ClientError, match="BadDigest"):
            c.put_object(Bucket="etags", Key="k", Body=b"damaged", ContentMD5=wrong)
        assert c.get_object(Bucket="etags", Key="k")["Body"].read() == body  # the refused write lost nothing
    finally:
        server.stop()
    assert not server.alive()


def test_registry_restarts_knowing_the_cluster(ingest_as, live_cluster, client_for):
    """The Registry keeps its facts on the head's disk: killed, it comes back with them."""
    manifest = ingest_as("csv", reuse=True)
    cluster.connect_ray(live_cluster)
    ray.kill(registry.handle(live_cluster.name), no_restart=False)
    client = client_for()  # state, keys and manifest from the restarted Registry
    assert client.manifest.generation == manifest.generation
    assert xxh3(client.read_chunk(0)) == source_xxh3(manifest.chunk(0))


def test_a_cluster_without_registry_is_a_clear_error(live_cluster):
    cluster.connect_ray(live_cluster)
    with pytest.raises(FasterFSError, match="no FasterFS registry for cluster 'nosuch'"):
        registry.find_in_ray("nosuch")


def test_status_counts_what_the_namespace_places_on_each_node(live_cluster, overrides, tmp_path):
    """`status`'s objects and bytes per node are what the namespace places there, kept by each
    change (nothing listed): a file put with 2 replicas and one erasure-coded (1+1) add to each
    node exactly the objects and bytes its MinIO then lists under their generations (boto3),
    and removing them takes as much away again."""
    def placed() -> dict[int, tuple[int, int]]:
        return {r["index"]: (r["placed_objects"], r["placed_bytes"]) for r in statuses(live_cluster)}

    def caught_up() -> bool:  # a node behind (an earlier test restarted the Registry) catches up by polling
        current = registry.namespace_version(live_cluster.name)
        return all(r["namespace_version"] == current for r in statuses(live_cluster))
    wait_until(caught_up, timeout=3 * NAMESPACE_POLL_S + 30, what="every node's namespace at the Registry's version")
    before = placed()
    (tmp_path / "f").write_bytes(os.urandom(3 * 2**20 + 5))
    added = [put(config.load(overrides + ["replicas=2", "files.chunk_mb=1"]), tmp_path / "f", "status/placed.bin"),
             put(config.load(overrides + ["layout=ec", "ec.data=1", "ec.parity=1", "files.chunk_mb=1"]),
                 tmp_path / "f", "status/placed-ec.bin")]
    try:
        stored = [minio_holdings(live_cluster, m) for m in added]  # pushed to every node before put returns
        now = placed()
        for node, (objects, size) in before.items():
            held = [o for listing in stored for o in listing[node]]
            assert now[node] == (objects + len(held), size + sum(o["Size"] for o in held)), node
    finally:
        for m in added:
            registry.remove(live_cluster.name, m.name)
    wait_until(lambda: placed() == before, 30, what="the removal's push to every node")


def test_new_manifest_reaches_every_storage_node(ingest_as, live_cluster):
    old = ingest_as("csv", reuse=True)
    manifest = ingest_as("csv")  # a new generation, pushed by the Registry before ingest returns
    assert manifest.generation != old.generation
    # every node holds the new generation: it resolves the new keys to chunk names
    from fasterfs.bpf.events import key_hash
    key = key_hash(f"/{manifest.bucket}/{manifest.chunk(0).key}")
    names = ray.get([a.resolve.remote(key) for a in cluster.storage_nodes(live_cluster)])
    assert names == [f"chunk 0 ({manifest.chunk(0).key})"] * len(live_cluster.nodes)


@ray.remote(num_cpus=0)
def _loop_reads(root: str, rounds: int, expected: list[int]) -> tuple[str, list[int], int]:
    """A reader that holds its manifest: reads the whole dataset `rounds` times, each chunk
    checked against `expected` (the xxh3 of its source rows)."""
    import fasterfs

    client = fasterfs.connect(root)
    seen, failures = [], 0
    for _ in range(rounds):
        for i in range(len(client)):
            try:
                seen.append(xxh3(client.read_chunk(i)) == expected[i])
            except Exception:
                failures += 1
    return client.manifest.generation, [sum(seen), len(seen)], failures


def test_readers_keep_their_generation_through_reingest(ingest_as, live_cluster, cluster_root, overrides):
    """Readers looping over the dataset while it is ingested again: every read right, none
    failed, each reader on the generation it connected to; a new connect() sees the new one."""
    import fasterfs

    first = ingest_as("csv", reuse=True)
    expected = [source_xxh3(c) for c in first.chunks]  # every generation holds the same source rows
    readers = [_loop_reads.options(**cluster.on_node(n)).remote(str(cluster_root), 3, expected)
               for n in live_cluster.nodes]
    second = ingest_as("csv")
    for generation, (right, reads), failures in ray.get(readers):
        assert failures == 0 and right == reads and reads == 3 * len(first)
        assert generation in (first.generation, second.generation)
    assert fasterfs.connect(cluster_root).manifest.generation == second.generation
    # an old reader still reads its generation, whole and unmixed
    old = fasterfs.connect(cluster_root)
    third = ingest_as("csv")
    assert [xxh3(old.read_chunk(i)) for i in range(len(old))] == expected
    # once a replaced generation's grace is over, the next ingest deletes it: a clear error, not a mix
    ingest(config.load(overrides + data_overrides() + ["ingest.keep_old_s=0"]))
    with pytest.raises(FasterFSError, match=f"generation {second.generation} is gone .* connect\\(\\) again"):
        old.read_chunk(0)
    assert third.generation != second.generation


def test_a_new_generation_drops_the_old_ones_cache_entries(ingest_as, live_cluster, client_for):
    first = ingest_as("csv", reuse=True)
    client = client_for()
    for _ in range(2):
        for i in range(4):
            client.read_chunk(i)
    actors = cluster.storage_nodes(live_cluster)
    wait_until(lambda: sum(r["entries"] for r in ray.get([a.cache_status.remote() for a in actors])) >= 4, 30,
               "fills of the first generation")
    second = ingest_as("csv")
    entries = sum(r["entries"] for r in ray.get([a.cache_status.remote() for a in actors]))
    assert entries == 0  # none of the first generation's chunks is in the second
    assert not any(ray.get([a.cache_contains.remote(first.chunk(i).key) for a in actors for i in range(4)]))
    assert second.generation != first.generation


def test_hints_never_join_ray(ingest_as, client_for):
    """The client's hint thread must not ray.init (or shutdown) behind the application's back."""
    ingest_as("csv", reuse=True)
    client = client_for()
    ray.shutdown()
    for i in range(6):  # in order: the prefetcher hints
        client.read_chunk(i)
    wait_until(lambda: client.hints_dropped > 0, 10, "a dropped hint")
    assert not ray.is_initialized()


def test_a_second_cluster_with_a_smaller_cache_and_no_dashboard_then_down(tmp_path_factory, capsys, live_cluster):
    """The cache is rebuilt (and evicts) at start: a smaller capacity must not stop the node. With
    dashboard.enabled=false no dashboard is started and `status` says only what runs. Its kernel
    programs are the SIMULATED ones (kernel.mode=simulated), labelled so by `kernel status`, and
    they still make a chunk read twice hot: the node caches it and the third read is served from
    that file with the bytes written. A job
    submitted to either this cluster or the session's (started before it) is given its own
    cluster's address by Ray, not the last one started on the machine. Its namespace is in Redis
    (cluster.namespace_store=redis): `up` starts Redis on a unix socket only root may reach, with
    a password of its own and no TCP port; a tree stored with put -r reads back byte for byte,
    also after the Registry restarts (from Redis, not its memory). Down stops all of it, Redis
    (by its PID) and the FUSE mount included: no process, filter, cgroup or mount left, and this
    process no longer Ray's driver. Ray Client is on here (cluster.client_port given): a driver
    elsewhere connects with `ray://` and the cluster's token, and sees this cluster's one node
    (the lab's listing of what listens shows it off by default)."""
    from fasterfs.node.cache import ChunkCache
    from fasterfs.ui.cli import main

    own = cluster_overrides(Path(str(tmp_path_factory.mktemp("beside"))[:60]), "127.0.5.2", 4, nodes=1)
    own = [o for o in own if not o.startswith("kernel.mode=")] + ["kernel.mode=simulated"]
    own += ["cluster.client_port=7104"]
    cfg = config.load(own + ["cache.capacity_mb=1", "dashboard.enabled=false", "cluster.namespace_store=redis"])
    cache_dir = config.Layout.of(cfg).paths.cache_dir(0)
    before = ChunkCache(cache_dir, capacity=10_000_000)  # a previous run's entries: 4 MB
    for i in range(4):
        before.put(f"ds/g/chunk-{i}", bytes([i]) * 1_000_000)
    before.close()
    state = cluster.up(cfg)
    try:
        cg = Path(state.cgroup["path"])
        assert cg.parent == cgroup2_mount() and len((cg / "node-0" / "cgroup.procs").read_text().split()) > 3
        row = ray.get(cluster.storage_nodes(state)[0].cache_status.remote())
        assert row["bytes"] <= 1_000_000 and row["evictions"] >= 3
        assert state.web_url is None and not _listening(cfg.dashboard.port)
        assert main(["status", *own]) == 0
        assert "FasterFS dashboard" not in capsys.readouterr().out
        assert main(["kernel", "status", *own]) == 0
        said = capsys.readouterr().out
        assert "SIMULATED" in said and "real eBPF" not in said, said
        blob = os.urandom(300_000)
        (src := Path(state.root) / "blob.bin").write_bytes(blob)
        put(config.load(own), src, "sim/blob.bin")
        client = fasterfs.connect(state.root, own, dataset="sim/blob.bin")
        assert [client.read_chunk(0) for _ in range(2)] == [blob] * 2
        wait_until(lambda: any(f.stat().st_size >= len(blob) for f in cache_dir.glob("**/*") if f.is_file()),
                   timeout=30, what="the simulated kernel's HOT to fill the cache")
        node = cluster.storage_nodes(state)[0]
        hits = ray.get(node.cache_status.remote())["readers"]["hits"]  # the readers' counter files, summed
        assert client.read_chunk(0) == blob and ray.get(node.cache_status.remote())["readers"]["hits"] == hits + 1
        for where in (live_cluster, state):  # what Ray hands a job's driver (its RAY_ADDRESS)
            said, _ = run_job(where, ["python", "-c", "import os; print('address:', os.environ['RAY_ADDRESS'])"])
            assert re.findall(r"^address: (\S+)$", said, re.M) == [where.ray_address], said
        far = subprocess.run(  # a clean shell with the token's path alone: Ray Client's own check of it
            [sys.executable, "-c", "import ray; ray.init('ray://127.0.5.2:7104', log_to_driver=False); "
             "print('nodes:', len([n for n in ray.nodes() if n['Alive']]))"],
            env=dict(CLEAN_ENV, **auth.ray_env(auth.token_file(state.root))), capture_output=True, text=True,
            timeout=120)
        assert far.returncode == 0 and "nodes: 1" in far.stdout, far.stdout[-2000:] + far.stderr[-2000:]
        point = Path(state.root) / "mnt"
        point.mkdir()
        ray.get(cluster.storage_nodes(state)[0].mount.remote(str(point)))  # down unmounts it
        assert str(point) in mounts_under(state.root)
        redis = _namespace_in_redis(cfg, state)
    finally:
        report = cluster.down(cfg)
        disconnected = not ray.is_initialized()
        cluster.connect_ray(live_cluster)  # this process's driver back on the session's cluster
    assert report["actors_stopped"] == 1 and report["ray_nodes_stopped"] == 1 and not report["actor_errors"]
    assert disconnected and not redis.is_ours(state.namespace_pid)
    assert_nothing_left(state)


def _namespace_in_redis(cfg, state):
    """Redis as `up` started it: the socket and password root's alone, no TCP port; 60 files put
    with put -r read back, also after Ray restarts the Registry (which then reads Redis anew)."""
    import stat

    from fasterfs.meta.redis_server import RedisServer
    from fasterfs.read.reader import Namespace
    from fasterfs.write import bulk_load

    server = RedisServer(Path(state.root))
    assert server.is_ours(state.namespace_pid)
    assert stat.S_IMODE(os.stat(server.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.password_file).st_mode) == 0o600
    listening = subprocess.run(["ss", "-Hlxp"], capture_output=True, text=True).stdout
    assert str(server.socket) in listening
    tcp = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    assert f"pid={state.namespace_pid}," not in tcp
    src = Path(state.root) / "tree"
    files = {f"d{i % 3}/f{i}.bin": os.urandom(100 + i) for i in range(60)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    assert bulk_load.load(cfg, bulk_load.LocalTree(src), "team/").stored == 60
    ray.kill(registry.handle(state.name), no_restart=False)
    ns = Namespace(cfg)
    for rel, data in files.items():
        assert ns.cat(f"team/{rel}") == data
    assert [e.path for e in ns.listdir("team")] == ["team/d0", "team/d1", "team/d2"]
    return server


def _listening(port: int) -> bool:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    return bool(out.strip())

