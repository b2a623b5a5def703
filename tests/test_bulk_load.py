"""A team's data brought in bulk on the live cluster: `put -r` of a tree and `import` from a
second MinIO, each file checked against its source read with the standard library (or the
source store's own listing and bytes); a load killed mid-way; names refused; readers and
StorageNodes that learn changes, not the whole namespace."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from conftest import minio_keys, wait_until

from fasterfs.control import credentials, registry, s3
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.core.manifest import object_prefix
from fasterfs.meta import Changes
from fasterfs.node.minio_server import MinioServer
from fasterfs.ops import cluster
from fasterfs.read.reader import Namespace
from fasterfs.write import bulk_load

CLI = str(Path(sys.executable).parent / "fasterfs")


def tree(root: Path, files: int, dirs: int, seed: int = 1) -> dict[str, bytes]:
    """`files` small files (sizes 0 to 3 KiB) in `dirs` directories two levels deep, written; rel -> bytes."""
    rng = __import__("random").Random(seed)
    out = {}
    for i in range(files):
        rel = f"y{i % dirs // 10}/d{i % dirs}/f{i:05d}.bin"
        out[rel] = rng.randbytes(rng.randrange(0, 3072))
    for rel, data in out.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return out


def stored_keys(state, names: list[str]) -> set[str]:
    """Every object key MinIO holds under the files' prefixes (what the files' manifests may name)."""
    prefixes = {object_prefix(n, "file") for n in names}
    return {k for keys in minio_keys(state, "files/").values() for k in keys
            if any(k.startswith(p) for p in prefixes)}


def test_put_r_stores_every_file_as_its_source_in_batches(live_cluster, overrides, tmp_path):
    src = tmp_path / "src"
    files = tree(src, 600, 30)  # 20 a directory
    big = os.urandom(3 * 1024 * 1024 + 5)  # several chunks at files.chunk_mb=1
    (src / "big.bin").write_bytes(big)
    files["big.bin"] = big
    out = subprocess.run([CLI, "put", "-r", str(src), "bulk/a/", "files.batch_files=100", "files.chunk_mb=1"]
                         + overrides, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"stored {len(files)} files" in out.stdout and "7 batches" in out.stdout
    ns = Namespace(config.load(overrides))
    for rel, data in files.items():
        assert ns.cat(f"bulk/a/{rel}") == data, rel
    assert [e.path for e in ns.listdir("bulk/a/y0")] == [f"bulk/a/y0/d{i}" for i in range(10)]
    assert len(ns.listdir("bulk/a/y2/d25")) == 20
    listed = subprocess.run([CLI, "ls", "bulk/a/y1/d12"] + overrides, capture_output=True, text=True, timeout=120)
    assert listed.stdout.count("bulk/a/y1/d12/f") == 20, listed.stderr
    # MinIO holds one object per file (big.bin: one per chunk, four), nothing else
    assert len(stored_keys(live_cluster, [f"bulk/a/{rel}" for rel in files])) == len(files) - 1 + 4
    # a rerun stores nothing again
    again = subprocess.run([CLI, "put", "-r", str(src), "bulk/a/"] + overrides, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "stored 0 files" in again.stdout and f"{len(files)} already there" in \
        again.stdout, again.stdout + again.stderr


def test_a_load_killed_mid_way_shows_whole_batches_only_and_a_rerun_completes_it(live_cluster, overrides, tmp_path):
    src = tmp_path / "src"
    files = tree(src, 600, 4, seed=2)
    cfg = config.load(overrides)
    load = subprocess.Popen([CLI, "put", "-r", str(src), "bulk/k/", "files.batch_files=50", "files.threads=2"]
                            + overrides,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: registry.listdir(live_cluster.name, "bulk/k") is not None, timeout=120,
                   what="the first batch published")
    finally:
        load.send_signal(signal.SIGKILL)
        load.wait(timeout=30)
    ns = Namespace(cfg)
    listings = [registry.listdir(live_cluster.name, f"bulk/k/y0/d{i}") for i in range(4)]
    visible = [m.name for listing in listings if listing is not None for m in listing.names]
    assert 0 < len(visible) < len(files) and len(visible) % 50 == 0  # whole batches, never a part of one
    for name in visible:
        assert ns.cat(name) == files[name[len("bulk/k/"):]]
    # the rerun skips what is stored; objects the killed batch left are collected (keep_old_s passed)
    out = subprocess.run([CLI, "put", "-r", str(src), "bulk/k/", "ingest.keep_old_s=0"] + overrides,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(visible)} already there" in out.stdout
    ns = Namespace(cfg)
    for rel, data in files.items():
        assert ns.cat(f"bulk/k/{rel}") == data
    names = [f"bulk/k/{rel}" for rel in files]
    live = {c.key for m in registry.fetch_manifests_of(live_cluster.name, names).values() for c in m.chunks}
    assert stored_keys(live_cluster, names) == live  # no orphan of the killed batch left


def test_import_copies_a_prefix_of_another_store_byte_for_byte(live_cluster, overrides, tmp_path, monkeypatch):
    cfg = config.load(overrides)
    team_creds = credentials.create(tmp_path / "team.json").admin
    team = MinioServer(config.minio_binary(cfg), "127.0.4.9", 9480, 9481, tmp_path / "team", tmp_path / "team.log",
                       team_creds)
    team.start(30)
    try:
        store = s3.client(team.endpoint, team_creds)
        store.create_bucket(Bucket="team")
        sent = {f"taq/2024/d{i % 3}/s{i}.csv": os.urandom(1000 + i) for i in range(60)}
        sent["other/x"] = b"not under the prefix"
        for key, data in sent.items():
            store.put_object(Bucket="team", Key=key, Body=data)
        keys = tmp_path / "keys.json"
        keys.write_text(json.dumps({"access_key": team_creds.access_key, "secret_key": team_creds.secret_key}))
        keys.chmod(0o644)
        out = subprocess.run([CLI, "import", "s3://team/taq/", "imported/", "--endpoint", team.endpoint, "--keys",
                              str(keys)] + overrides, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1 and f"{keys}: keys readable by others" in out.stderr  # refused, nothing read
        keys.chmod(0o600)
        out = subprocess.run([CLI, "import", "s3://team/taq/", "imported/", "--endpoint", team.endpoint, "--keys",
                              str(keys), "files.batch_files=20"] + overrides, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0 and "stored 60 files" in out.stdout, out.stdout + out.stderr
        ns = Namespace(cfg)
        for page in store.get_paginator("list_objects_v2").paginate(Bucket="team", Prefix="taq/"):
            for o in page["Contents"]:  # the source store's own listing and bytes
                assert ns.cat(f"imported/{o['Key'][4:]}") == store.get_object(Bucket="team", Key=o["Key"])[
                    "Body"].read()
        with pytest.raises(FileNotFoundError):
            ns.lookup("imported/other/x")
        monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
        with pytest.raises(FasterFSError, match="no keys for the source store"):
            bulk_load.source_credentials(None)
    finally:
        team.stop()


def test_bad_names_are_refused_naming_them_and_nothing_is_stored(live_cluster, overrides, tmp_path):
    src = tmp_path / "src"
    (src / "ok").mkdir(parents=True)
    (src / "ok" / "fine.bin").write_bytes(b"1")
    with open(os.path.join(os.fsencode(src), b"caf\xe9.csv"), "wb") as f:  # Latin-1, as an old tool wrote it
        f.write(b"2")
    out = subprocess.run([CLI, "put", "-r", str(src), "bad/"] + overrides, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "bad/caf\\udce9.csv" in out.stderr and "not valid UTF-8" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert registry.listdir(live_cluster.name, "bad") is None  # not even the good file
    long = "x" * 256  # no local file system makes one; an S3 key or a DEST may name it
    out = subprocess.run([CLI, "put", str(src / "ok" / "fine.bin"), f"bad/{long}/f"] + overrides, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "is 256 bytes, over the 255 a file name may have" in out.stderr, out.stderr
    deep = "/".join(["d" * 200] * 19)  # 3,818 bytes: far past what one file per name could store
    src = tmp_path / "deep"
    src.mkdir()
    (src / "f").write_bytes(b"deep")
    from fasterfs.write.ingest import put

    put(config.load(overrides), src / "f", deep)
    assert Namespace(config.load(overrides)).cat(deep) == b"deep"


def test_readers_and_nodes_learn_changes_not_the_whole_namespace(live_cluster, overrides, tmp_path):
    cfg = config.load(overrides)
    src = tmp_path / "src"
    tree(src, 200, 2, seed=3)
    bulk_load.load(cfg, bulk_load.LocalTree(src), "learn/")
    ns = Namespace(cfg, refresh_s=0.0)
    watched = Namespace(cfg, refresh_s=0.0)  # as the mount's agent: told each change, with its manifest
    heard: list = []
    watched.watch(lambda version, names: heard.append(names))
    assert heard == [None]
    (tmp_path / "new.bin").write_bytes(b"new")
    from fasterfs.write.ingest import put

    with pytest.raises(FileNotFoundError):
        ns.lookup("learn/new.bin")
    put(cfg, tmp_path / "new.bin", "learn/new.bin")
    assert ns.cat("learn/new.bin") == b"new"  # seen at once: the change forgot the cached "no such path"
    watched.refresh()
    assert list(heard[-1]) == ["learn/new.bin"] and heard[-1]["learn/new.bin"].total_bytes == 3
    assert watched.fetched["names"] == 1  # the change alone crossed the wire
    # a node given a push that does not follow its version (one between was missed) fetches what
    # it missed from the store's log, and is then at the store's version, not the push's
    node = cluster.storage_nodes(live_cluster)[1]
    version = registry.namespace_version(live_cluster.name)
    assert ray.get(node.apply_changes.remote(Changes(version + 50, version + 51, {}))) == version


def test_a_reader_behind_the_store_catches_up_before_it_answers(live_cluster, overrides, tmp_path):
    """A watched reader that has not looked at the store for a while (refresh_s of an hour), asked
    for a listing and a lookup that the store answers at a newer version: its watcher hears each
    change before the answer comes back (the mount's agent sends that delta ahead of the listing,
    so its daemon never holds a name newer than its deltas)."""
    cfg = config.load(overrides)
    from fasterfs.write.ingest import put

    (tmp_path / "a.bin").write_bytes(b"a")
    put(cfg, tmp_path / "a.bin", "behind/a.bin")
    slow = Namespace(cfg, refresh_s=3600.0)
    told: list = []
    slow.watch(lambda version, names: told.append((version, names)))
    put(cfg, tmp_path / "a.bin", "behind/b.bin")
    listing = slow.listed("behind")
    assert {a.name for a in listing.names} == {"behind/a.bin", "behind/b.bin"}
    assert told[-1][0] >= listing.version and "behind/b.bin" in told[-1][1], told
    put(cfg, tmp_path / "a.bin", "behind/c.bin")
    assert slow.lookup("behind/c.bin").size == 1
    assert "behind/c.bin" in told[-1][1], told
