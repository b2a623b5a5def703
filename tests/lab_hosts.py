"""What the lab tests do on share-nothing hosts: run a command on a host as on that machine,
store a small file, and read on a given host (Ray tasks placed there), returning checksums
the tests hold against the bytes they stored themselves."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ray
from conftest import assert_nothing_left, cluster_overrides
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.core import config
from fasterfs.ops import cluster, lab
from fasterfs.write.ingest import put

SUBNET = "198.18.7"
PROJECT = config.PROJECT_DIR


def lab_overrides(root: Path, nodes: int = 3) -> list[str]:
    # a host powered on beside the suite's other clusters (and make run's) has taken over 90 s to rejoin
    return cluster_overrides(root, "127.0.4.2", 3, nodes=nodes) + [f"lab.subnet={SUBNET}", "lab.link_mbit=200",
                                                                   "lab.disk_mbit=null", "cluster.start_timeout_s=240"]


def shared_lab(tmp_path_factory, name: str, *options: str, after=lambda state: None):
    """A 3-host lab for the tests that share it (a fixture's body), made and removed as a user
    does (`fasterfs lab up`, `fasterfs lab down`): yields (state, overrides); afterwards, checks
    it left nothing (and `after(state)`)."""
    root = Path(str(tmp_path_factory.mktemp(name))[:60])  # under /tmp: the hosts' own /tmp hides it from them
    overrides = lab_overrides(root) + list(options)
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    out = subprocess.run([ffs, "lab", "up", *overrides], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "FasterFS lab up: 3 hosts" in " ".join(out.stdout.split()), out.stdout + out.stderr
    state = cluster.ClusterState.load(root)
    cluster.connect_ray(state)
    yield state, overrides
    ray.shutdown()
    state = cluster.ClusterState.load(root)  # as the tests left it: a host may have joined
    out = subprocess.run([ffs, "lab", "down", *overrides], capture_output=True, text=True, timeout=600)
    said = " ".join(out.stdout.split())
    ray_nodes = len(state.nodes) + bool(state.head_pid)  # and the head's, a Ray node without storage
    assert out.returncode == 0 and f"{len(state.nodes)} StorageNodes and {ray_nodes} Ray nodes stopped" in said, \
        out.stdout + out.stderr
    assert_nothing_left(state)
    assert lab.leftovers(state.name) == []
    after(state)


def in_ns(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, check=True).stdout


def on_host(state, index: int, *cmd: str) -> subprocess.CompletedProcess:
    """A command run on a lab host as on that machine (`fasterfs lab exec`)."""
    return subprocess.run(lab.exec_args(state, index, list(cmd)), capture_output=True, text=True, timeout=180,
                          cwd=PROJECT)


def put_blob(state, overrides: list[str], name: str, mb: int, *options: str) -> tuple[bytes, object]:
    """A file of about `mb` random MB stored in 1 MB chunks (a dataset that costs no parsing)."""
    blob = os.urandom(mb * 2**20 - 7)
    src = Path(state.root) / f"{name.replace('/', '_')}.src"
    src.write_bytes(blob)
    return blob, put(config.load(overrides + ["files.chunk_mb=1", *options]), src, name)


def chunk_xxh3(blob: bytes, i: int) -> int:
    """xxh3 of chunk i of a file put_blob stored: its own bytes, as the test made them."""
    return xxh3(blob[i * 2**20:(i + 1) * 2**20])


@ray.remote(num_cpus=0)
def read_ids(root, ids, dataset=None):
    """(this host's Ray node id, [(xxh3, the node it was read from)] of chunks `ids`)."""
    client = fasterfs.connect(root, ["cache.prefetch.enabled=false"], dataset=dataset)
    return ray.get_runtime_context().get_node_id(), [(xxh3(client.read_chunk(i)), client.sources(i)[0]) for i in ids]


@ray.remote(num_cpus=0)
def read_file(name):
    """xxh3 of a whole file read on this host, how many of its chunks needed parity, and why. Not
    hedged: a busy host's late shard would need parity too, and the count is what is under test."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false", "client.hedge.enabled=false"], dataset=name,
                              use_cache=False)
    data = b"".join(client.read_chunk(i) for i in range(len(client)))
    return xxh3(data), client.degraded_reads, list(client.degraded_why)


def check_file(where, name, checksum, degraded):
    """The whole file read on host `where` has `checksum`, `degraded` of its chunks needing parity."""
    got, count, why = ray.get(read_file.options(**where).remote(name))
    assert (got, count) == (checksum, degraded), f"{name}: {count} chunks needed parity, {degraded} expected: {why}"


@ray.remote(num_cpus=0)
def read_twice(name, i):
    """Chunk i of `name` read twice on this host: the kernel makes it hot here."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=False)
    return [xxh3(client.read_chunk(i)) for _ in range(2)][-1]


@ray.remote(num_cpus=0)
def read_once(name, i):
    """xxh3 of chunk i read on this host, and how many chunks came from another host's cache."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name)
    return xxh3(client.read_chunk(i)), client.peer_reads


@ray.remote(num_cpus=0)
def read_slow(name, i):
    """Chunk i read twice on this host, every MinIO counted as slow: the first read measures its
    holder, the second asks the caches of other hosts first. (xxh3, peer reads, MinIO reads)."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false", "cache.peer_slower_ms=0.001"], dataset=name)
    client.read_chunk(i)
    return xxh3(client.read_chunk(i)), client.peer_reads, sum(client.served_by.values())
