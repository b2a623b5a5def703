"""The namespace on the live cluster: many datasets, files stored with `put`, `ls`/`cat`/`rm`,
the `fasterfs://` filesystem (pandas, pyarrow, polars through the real fsspec registry),
the FUSE mount (real /dev/fuse, the kernel counting its reads) and Ray Data."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
import ray
from conftest import CLEAN_ENV, command_lines, dashboard_headers, minio_holdings, source_csv, source_rows, wait_until

import fasterfs
from fasterfs.control import credentials, s3
from fasterfs.core import config, lobster, namespace
from fasterfs.core.errors import FasterFSError
from fasterfs.ops import cluster
from fasterfs.read.reader import Namespace
from fasterfs.write.ingest import ingest, put, remove


@pytest.fixture
def cfg_of(overrides):
    def make(*extra):
        return config.load(overrides + list(extra))
    return make


@pytest.fixture
def fs(live_cluster, overrides):
    return fsspec.filesystem("fasterfs", overrides=overrides, skip_instance_cache=True)


def open_cache_entries() -> list[str]:
    """Files of a cache directory this process has open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "/cache/" in target:
            out.append(target)
    return out


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_names_are_checked():
    for bad in ("a/b", "..", ".hidden", "with space", "nul\0", "", "files"):
        with pytest.raises(FasterFSError, match="dataset name"):
            namespace.check_dataset_name(bad)
    for bad in ("../x", "a/../b", "a//b", "/", "a/./b", "x\0y", "tab\there"):
        with pytest.raises(FasterFSError, match="path"):
            namespace.check_path(bad)
    assert namespace.check_path("/team/x.parquet/") == "team/x.parquet"


def test_put_ls_cat_rm_and_two_datasets(ingest_as, cfg_of, overrides, tmp_path, client_for):
    first = ingest_as("csv")
    ingest(cfg_of("data=synthetic", "data.rows=3000", "data.name=SYNTH_SMALL", "data.rows_per_chunk=1000"))
    rng = np.random.default_rng(5)
    blobs = {"research/r.bin": rng.bytes(int(4.5 * 2**20)), "research/empty.bin": b"", "one": b"x"}
    for dest, data in blobs.items():
        put(cfg_of("files.chunk_mb=1"), write(tmp_path / "src", data), dest)
    ns = Namespace(cfg_of())
    top = {e.path for e in ns.listdir("")}
    assert {first.name, "SYNTH_SMALL", "research", "one"} <= top  # the second ingest added, replaced nothing
    assert ns.lookup("research/r.bin").size == len(blobs["research/r.bin"])
    assert len(ns.lookup("research/r.bin").chunk_ids) == 5  # 4.5 MiB in 1 MiB chunks
    for dest, data in blobs.items():
        assert ns.cat(dest) == data
        assert ns.cat(dest, 3, 2_000_000) == data[3:2_000_000]  # across chunk boundaries
    # reading ahead, from several threads at once as the mount's requests come: the same bytes,
    # and every cache entry opened on the way closed again
    ahead = Namespace(cfg_of("namespace.read_ahead_chunks=2"))
    data = blobs["research/r.bin"]
    for _ in range(2):  # the second time some chunks may be in the cache (hot after two reads)
        f = ahead.open("research/r.bin")
        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(lambda off, f=f: f.read(off, 300_000), range(0, len(data), 300_000)))
        assert b"".join(parts) == data
        f.close()
    ahead.close()
    assert open_cache_entries() == []
    assert ns.cat(f"{first.name}/{first.name}.csv") == source_csv()  # the source files as gzip reads them
    assert fasterfs.connect(overrides=overrides, dataset="SYNTH_SMALL").manifest.rows == 3000
    assert fasterfs.connect(overrides=overrides).manifest.name == "SYNTH_SMALL"  # the default: ingested last
    # the CLI, as a user runs it
    cli = [str(Path(os.sys.executable).parent / "fasterfs")]
    out = subprocess.run(cli + ["ls", "research"] + overrides, capture_output=True, text=True, timeout=120)
    assert "research/r.bin" in out.stdout and "research/empty.bin" in out.stdout, out.stderr
    out = subprocess.run(cli + ["cat", "research/r.bin"] + overrides, capture_output=True, timeout=120)
    assert out.stdout == blobs["research/r.bin"]
    # bad input: named, nothing stored
    with pytest.raises(FasterFSError, match="already exists.*--force"):
        put(cfg_of(), tmp_path / "src", "one")
    with pytest.raises(FasterFSError, match="cannot read .*missing"):
        put(cfg_of(), tmp_path / "missing", "two")
    with pytest.raises(FasterFSError, match="is a dataset"):
        put(cfg_of(), tmp_path / "src", f"{first.name}/extra.bin")
    with pytest.raises(FasterFSError, match="is a file"):
        put(cfg_of(), tmp_path / "src", "one/below")
    with pytest.raises(FasterFSError, match="path"):
        put(cfg_of(), tmp_path / "src", "../escape")
    with pytest.raises(FasterFSError, match=r"ec.data=2 \+ ec.parity=1: .* the data goes on 2"):
        put(cfg_of("layout=ec", "ec.data=2", "ec.parity=1"), tmp_path / "src", "two")
    with pytest.raises(FasterFSError, match="no such dataset or file"):
        fasterfs.connect(overrides=overrides, dataset="two")
    out = subprocess.run(cli + ["put", "--force", str(write(tmp_path / "src", b"replaced")), "one"] + overrides,
                         capture_output=True, text=True, timeout=120)  # the CLI's put, replacing
    assert out.returncode == 0 and Namespace(cfg_of()).cat("one") == b"replaced", out.stdout + out.stderr
    # rm: a reader holding it keeps reading (keep_old_s); a new one is told it is gone
    holder = fasterfs.connect(overrides=overrides, dataset="research/r.bin")
    remove(cfg_of(), "research/r.bin")
    assert holder.read_chunk(4) == blobs["research/r.bin"][4 * 2**20:]
    with pytest.raises(FasterFSError, match="no such dataset or file"):
        fasterfs.connect(overrides=overrides, dataset="research/r.bin")
    with pytest.raises(FasterFSError, match="no such dataset or file"):
        remove(cfg_of(), "research/r.bin")
    out = subprocess.run(cli + ["rm", "SYNTH_SMALL", "research/empty.bin", "one"] + overrides,
                         capture_output=True, text=True, timeout=120)  # the CLI's rm, of several
    assert out.returncode == 0, out.stdout + out.stderr
    assert not {"SYNTH_SMALL", "one"} & {e.path for e in Namespace(cfg_of()).listdir("")}
    with pytest.raises(FasterFSError, match="no such dataset or file"):
        fasterfs.connect(overrides=overrides, dataset="research/empty.bin")


def _bytes_read() -> int:
    """What this process has read through read(2)-like calls, sockets included (the kernel's
    count, /proc/self/io rchar)."""
    return int(next(line.split()[1] for line in open("/proc/self/io") if line.startswith("rchar:")))


def test_small_random_reads_of_a_cold_chunk_fetch_ranges_the_kernel_counts(cfg_of, live_cluster, tmp_path):
    """A random 4 KiB read of a chunk cached nowhere costs a ranged GET, not the 4 MiB chunk (the
    kernel's count of this process' bytes read says so), and the kernel counts it as an access
    of the chunk: the second makes it hot, and later reads come from the cache."""
    data = os.urandom(8 * 2**20)
    cfg = cfg_of("files.chunk_mb=4")
    m = put(cfg, write(tmp_path / "src", data), "random/r.bin")
    try:
        actors = cluster.storage_nodes(live_cluster)
        counts = [lambda i=i: ray.get(actors[m.chunk(i).nodes[0]].kernel_key_count.remote(
            f"/{m.bucket}/{m.chunk(i).key}")) for i in range(2)]
        assert [c() for c in counts] == [0, 0]
        f = Namespace(cfg).open("random/r.bin")
        before = _bytes_read()
        for at in (1_000_001, 6_000_003):  # one per chunk, neither where the last read ended
            assert f.read(at, 4096) == data[at:at + 4096]
        assert _bytes_read() - before < 256 * 1024, "a 4 KiB random read fetched far more than its range"
        assert [c() for c in counts] == [1, 1]  # each range GET counted as an access of its chunk
        assert f.read(2_000_007, 4096) == data[2_000_007:2_000_007 + 4096]  # the second access: hot
        home = actors[m.chunk(0).nodes[0]]
        wait_until(lambda: ray.get(home.cache_contains.remote(m.chunk(0).key)), what="the hot chunk's fill")
        assert f.read(3_000_009, 4096) == data[3_000_009:3_000_009 + 4096]
        assert counts[0]() == 2  # served by the cache: no GET
        f.close()
    finally:
        remove(cfg, "random/r.bin")


def test_read_ahead_loads_the_next_chunks_the_kernel_counts(cfg_of, live_cluster, tmp_path):
    """A sequential read of a file's first chunk loads the next namespace.read_ahead_chunks
    chunks too, one GET each as the kernel counts them, and none further."""
    data = os.urandom(5 * 2**20)
    cfg = cfg_of("files.chunk_mb=1", "namespace.read_ahead_chunks=2", "namespace.shed_read_ahead_above=100")
    m = put(cfg, write(tmp_path / "src", data), "ahead/r.bin")
    ns = Namespace(cfg)
    try:
        actors = cluster.storage_nodes(live_cluster)

        def gets() -> list[int]:  # each chunk's GETs, as its holder's kernel counted them
            return [ray.get(actors[c.nodes[0]].kernel_key_count.remote(f"/{m.bucket}/{c.key}")) for c in m.chunks]
        assert gets() == [0] * 5
        f = ns.open("ahead/r.bin")
        assert f.read(0, 65536) == data[:65536]
        wait_until(lambda: gets() == [1, 1, 1, 0, 0], what="chunks 1 and 2 loaded ahead, and only they")
        f.close()
    finally:
        ns.close()
        remove(cfg, "ahead/r.bin")


def test_removed_generations_are_deleted_after_the_grace(ingest_as, cfg_of, tmp_path, live_cluster):
    ingest_as("csv", reuse=True)
    m = put(cfg_of(), write(tmp_path / "f", b"abc" * 1000), "gc/f.bin")
    remove(cfg_of("ingest.keep_old_s=0"), "gc/f.bin")  # no grace: the next write collects it
    from fasterfs.control import registry, s3
    creds = registry.fetch_credentials(live_cluster.name, "admin")
    for node in m.chunks[0].nodes:
        c = s3.client(live_cluster.node(node).endpoint, creds)
        with pytest.raises(c.exceptions.ClientError):
            c.head_object(Bucket=m.bucket, Key=m.chunks[0].key)


def test_fsspec_pandas_pyarrow_polars(ingest_as, fs, cfg_of, tmp_path):
    m = ingest_as("csv", reuse=True)
    assert fsspec.get_filesystem_class("fasterfs").__module__ == "fasterfs.read.fsspec_fs"  # through the entry point
    chunk = pd.read_csv(fs.open(f"{m.name}/chunks/chunk-00003.csv"), header=None)
    assert chunk.shape[0] == m.chunk(3).rows
    c3 = m.chunk(3)
    assert chunk.iloc[:, 0].tolist() == [r[0] for r in source_rows([])[c3.first_row:c3.first_row + c3.rows]]
    whole = pd.read_csv(fs.open(f"{m.name}/{m.name}.csv"), header=None)
    assert whole.shape[0] == m.rows
    assert fs.cat_file(f"{m.name}/{m.name}.csv", 10, 20) == source_csv()[10:20]
    assert fs.info(f"{m.name}/chunks")["type"] == "directory"
    assert len(fs.ls(f"{m.name}/chunks")) == len(m)
    # a Parquet dataset of the team's own, read by pyarrow.dataset and polars through the filesystem
    table = pa.table({"sym": ["AAPL"] * 5000, "px": np.arange(5000, dtype=np.float64)})
    for k in range(2):
        pq.write_table(table.slice(k * 2500, 2500), tmp_path / f"part-{k}.parquet")
        put(cfg_of(), tmp_path / f"part-{k}.parquet", f"team/book/part-{k}.parquet")
    ds = pds.dataset("team/book", filesystem=fs, format="parquet")
    assert ds.to_table().num_rows == 5000 and ds.to_table()["px"].to_pylist() == list(range(5000))
    with fs.open("team/book/part-1.parquet") as f:
        assert pl.read_parquet(f)["px"][0] == 2500
    with pytest.raises(OSError) as e:
        fs.open("team/new.bin", "wb")
    assert e.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        fs.info("team/nothing")
    remove(cfg_of(), "team/book/part-0.parquet")
    remove(cfg_of(), "team/book/part-1.parquet")


def test_mount_reads_counts_caches_and_refuses_writes(ingest_as, mounted, live_cluster, cfg_of, tmp_path, client_for):
    point, _ = mounted
    m = ingest_as("csv", reuse=True)
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])
    client = client_for()
    d = point / m.name
    assert sorted(os.listdir(d)) == sorted(["chunks", f"{m.name}.csv"])
    dev = os.stat(point).st_dev  # the kernel's read-ahead window on the mount, as its sysfs knob says
    bdi = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    assert int(bdi.read_text()) == cfg_of().mount.read_ahead_kb
    assert os.stat(d / f"{m.name}.csv").st_size == m.total_bytes
    i = 7
    path = d / "chunks" / f"chunk-{i:05d}.csv"
    holder = actors[client.sources(i)[0]]
    expected = source_csv(m.chunk(i).first_row, m.chunk(i).rows)  # gzip's read of the source files
    assert path.read_bytes() == expected == client.read_chunk(i)  # the client's read counts once too

    def filled():  # read through the mount until hot and filled (a fill right after an ingest may be
        path.read_bytes()  # dropped again by the ingest's late invalidations: the key then starts cold)
        return ray.get(holder.cache_contains.remote(m.chunk(i).key))
    wait_until(filled, timeout=20, what="the kernel to make the chunk hot from reads through the mount and the "
               "cache to fill")
    hits = ray.get(holder.cache_status.remote())["readers"]["hits"]
    assert path.read_bytes() == expected == client.read_chunk(i)
    assert ray.get(holder.cache_status.remote())["readers"]["hits"] >= hits + 1  # served from the cache
    assert open(path, "rb").read()[100:200] == expected[100:200]
    for attempt in (lambda: open(d / "new.csv", "wb"), lambda: open(path, "r+b"), lambda: os.mkdir(d / "x"),
                    lambda: os.unlink(path)):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        (point / "no-such-dataset").stat()
    # a file replaced in the namespace: a new open sees the new bytes, never old pages
    put(cfg_of(), write(tmp_path / "v", b"one" * 5000), "mnt-test/v.bin")
    f = point / "mnt-test" / "v.bin"
    wait_until(lambda: f.exists(), timeout=10, what="the new file to appear in the mount")
    for _ in range(3):
        assert f.read_bytes() == b"one" * 5000
    put(cfg_of(), write(tmp_path / "v", b"two" * 7000), "mnt-test/v.bin", force=True)
    wait_until(lambda: f.read_bytes() == b"two" * 7000, timeout=10, what="the replaced file through the mount")
    remove(cfg_of(), "mnt-test/v.bin")


def test_mount_daemon_killed_is_replaced(ingest_as, mounted, live_cluster):
    point, actor = mounted
    m = ingest_as("csv", reuse=True)
    pid = ray.get(actor.status.remote())["mounts"][0]["pid"]
    os.kill(pid, signal.SIGKILL)

    def back():
        rows = ray.get(actor.status.remote())["mounts"]
        return rows and rows[0]["pid"] != pid and rows[0]["alive"]
    wait_until(back, timeout=60, what="the FUSE daemon to be replaced")
    # reads work again (no ENOTCONN), and give the bytes MinIO holds for the chunk (boto3's read)
    creds = credentials.load(config.Paths(Path(live_cluster.root)).credentials_file).admin
    stored = s3.client(live_cluster.node(m.chunk(0).nodes[0]).endpoint, creds).get_object(
        Bucket=m.bucket, Key=m.chunk(0).key)["Body"].read()
    assert (point / m.name / "chunks" / "chunk-00000.csv").read_bytes() == stored


def test_storage_node_killed_takes_its_mount_over_again(ingest_as, mounted, live_cluster):
    """A StorageNode SIGKILLed while it serves a mount: its next incarnation takes the mount
    over (the record it keeps beside its data) and reads through it give the source's bytes."""
    point, actor = mounted
    m = ingest_as("csv", reuse=True)
    before = ray.get(actor.status.remote())
    assert before["mounts"] and before["mounts"][0]["alive"]
    os.kill(before["actor_pid"], signal.SIGKILL)

    def back():
        try:
            now = ray.get(actor.status.remote(), timeout=5)
        except Exception:
            return False  # still restarting
        return now["actor_pid"] != before["actor_pid"] and bool(now["mounts"]) and now["mounts"][0]["alive"]
    wait_until(back, timeout=90, what="the StorageNode back, serving its mount")
    c = m.chunk(1)
    assert (point / m.name / "chunks" / "chunk-00001.csv").read_bytes() == source_csv(c.first_row, c.rows)


def test_mounts_beside_another_clusters_token_listed_by_status_and_dashboard(
        mounted, live_cluster, overrides, cfg_of, tmp_path, another_clusters_token_at_the_default_root):
    """The default root holds another cluster's token (as after `make run`): this cluster's FUSE
    daemon, started by its StorageNode, still joins this cluster and reads; `fasterfs status` and
    the dashboard list the mount with the daemon /proc shows."""
    from fasterfs.control import auth

    point, _ = mounted
    assert another_clusters_token_at_the_default_root != auth.read(auth.token_file(live_cluster.root))
    data = os.urandom(300_000)
    put(cfg_of(), write(tmp_path / "r.bin", data), "beside/r.bin")
    try:
        wait_until(lambda: (point / "beside" / "r.bin").exists(), timeout=10, what="the file in the mount")
        assert (point / "beside" / "r.bin").read_bytes() == data
    finally:
        remove(cfg_of(), "beside/r.bin")
    daemons = [pid for pid, cmd in command_lines() if b"fasterfs.read.mount" in cmd and str(point).encode() in cmd]
    assert len(daemons) == 1, daemons
    # nor joins another cluster's Ray by Ray's auto-connect: off in its environment, as /proc has it
    assert b"RAY_ENABLE_AUTO_CONNECT=0" in Path(f"/proc/{daemons[0]}/environ").read_bytes().split(b"\0")
    out = subprocess.run([str(config.PROJECT_DIR / ".venv/bin/fasterfs"), "status", *overrides], env=CLEAN_ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    listed = [line for line in out.stdout.splitlines() if str(point) in line]
    assert len(listed) == 1 and f"pid {daemons[0]}" in listed[0] and "healthy" in listed[0], out.stdout
    fragment = urllib.request.Request(f"{live_cluster.web_url}/fragment", headers=dashboard_headers(live_cluster))
    page = lambda: urllib.request.urlopen(fragment, timeout=30).read().decode()  # noqa: E731
    wait_until(lambda: f"{point} (daemon {daemons[0]}) <span class=\"ok\">healthy</span>" in page(), timeout=15,
               what="the dashboard to list the mount")


def test_bad_mount_points_named(live_cluster, cluster_root, mounted):
    point, actor = mounted
    full = cluster_root / "full"
    full.mkdir(exist_ok=True)
    (full / "keep.txt").write_text("mine")
    for path, message in ((cluster_root / "absent", "does not exist"), (full, "not empty"),
                          (point, "already mounted"), (Path("relative"), "absolute")):
        with pytest.raises(ray.exceptions.RayTaskError, match=message):
            ray.get(actor.mount.remote(str(path)))
    assert (full / "keep.txt").read_text() == "mine"


def test_ray_data_reads_on_the_holders(ingest_as, live_cluster, overrides):
    m = ingest_as("csv", reuse=True)
    ds = fasterfs.data.read(m.name, overrides=overrides, with_node=True)
    df = ds.to_pandas()
    rows = source_rows([])  # the csv module's parse of the source files
    size = lobster.columns(m.level).index("Size")
    assert len(df) == len(rows) and int(df["Size"].sum()) == sum(r[size] for r in rows)
    # rows read on each node (Ray's node id in the task, as its runtime context says) against the
    # rows of the chunks that node's MinIO lists
    by_key = {c.key: c.rows for c in m.chunks}
    for node, held in minio_holdings(live_cluster, m).items():
        assert int((df["_read_on"] == node).sum()) == sum(by_key[o["Key"]] for o in held), node
    with pytest.raises(FasterFSError, match="no such dataset"):
        fasterfs.data.read("NOPE", overrides=overrides)
