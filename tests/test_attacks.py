"""Attacks and floods on the live cluster: what a local user who is not root, a stray packet, an
unnamed delete or a flood of writes can do to the caches. The hostile requests run as `nobody`;
what is asserted comes from the cache directories on disk, MinIO's own answers and the bytes
MinIO holds (boto3), never from FasterFS's word about itself."""
import ctypes as ct
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import ray
from conftest import NO_PREFETCH, cached_entry, wait_until

import fasterfs
from fasterfs import cluster, credentials, s3
from fasterfs.bpf.events import key_hash
from fasterfs.bpf.libbpf import lib as libbpf
from fasterfs.config import Paths

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def entries(cluster_root, state) -> dict[int, set[str]]:
    """Each node's cache entries as its directory lists them."""
    return {n.index: {p.name for p in Paths(cluster_root).cache_dir(n.index).iterdir() if not p.name.startswith(".")}
            for n in state.nodes}


def raw_request_as_nobody(address: str, port: int, request: bytes) -> str:
    """Send `request` on a fresh TCP connection as the unprivileged user; MinIO's status line."""
    code = textwrap.dedent(f"""
        import socket
        s = socket.create_connection(({address!r}, {port}), timeout=5)
        s.sendall({request!r})
        print(s.recv(4096).split(b"\\r\\n")[0].decode())
    """)
    done = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def warmed(client, actors, chunks) -> None:
    for i in chunks:
        assert cached_entry(client, actors, i).exists()


def checks_done(actors) -> int:
    return sum(r["suspect_checks"]["checks"] for r in ray.get([a.cache_status.remote() for a in actors]))


def test_an_unauthenticated_post_empties_no_cache(fresh, cluster_root, live_cluster):
    """The 58-byte packet that emptied every cache: MinIO answers 400, and the kernel waits for
    that answer now."""
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    warmed(client, actors, range(4))
    before = entries(cluster_root, live_cluster)
    assert sum(map(len, before.values())) >= 4
    for n in live_cluster.nodes:
        host, port = n.endpoint.split("//")[1].split(":")
        status = raw_request_as_nobody(host, int(port), f"POST /{manifest.bucket} HTTP/1.1\r\nHost: x\r\n"
                                                        "Content-Length: 0\r\n\r\n".encode())
        assert status.split()[1] in ("400", "403"), status  # MinIO refused it
    time.sleep(3)  # as long as the caches took to empty before
    assert entries(cluster_root, live_cluster) == before


def test_unauthenticated_gets_make_nothing_hot(fresh, cluster_root, live_cluster):
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 6
    node = client.sources(i)[0]
    host, port = live_cluster.nodes[node].endpoint.split("//")[1].split(":")
    path = f"/{manifest.bucket}/{manifest.chunk(i).key}"
    for _ in range(5):
        status = raw_request_as_nobody(host, int(port), f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status.split()[1] == "403", status
    time.sleep(2)
    assert not Path(client.cache_path(node, i)).exists()
    assert ray.get(actors[node].kernel_key_count.remote(path)) == 0


def test_a_multi_object_delete_drops_what_it_deleted_and_keeps_the_rest(fresh, cluster_root, live_cluster):
    """GraySort's clean-up is a DeleteObjects: the kernel sees only the bucket. The node checks its
    entries against MinIO: the deleted chunk's entry goes, the others stay."""
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    warmed(client, actors, range(5))
    before = entries(cluster_root, live_cluster)
    gone = 2
    gone_node, gone_entry = client.sources(gone)[0], Path(client.cache_path(client.sources(gone)[0], gone)).name
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    checks = checks_done(actors)
    for n in manifest.chunk(gone).nodes:  # every copy, as a clean-up would
        s3.client(live_cluster.nodes[n].endpoint, creds).delete_objects(
            Bucket=manifest.bucket, Delete={"Objects": [{"Key": manifest.chunk(gone).key}]})
    scratch = [f"scratch/{uuid.uuid4().hex}" for _ in range(3)]
    other = s3.client(live_cluster.nodes[0].endpoint, creds)
    for k in scratch:
        other.put_object(Bucket=manifest.bucket, Key=k, Body=b"x")
    other.delete_objects(Bucket=manifest.bucket, Delete={"Objects": [{"Key": k} for k in scratch]})
    assert wait_until(lambda: checks_done(actors) > checks
                      and gone_entry not in entries(cluster_root, live_cluster)[gone_node],
                      what="the node to check its entries and drop the deleted chunk's")
    after = entries(cluster_root, live_cluster)
    before[gone_node].discard(gone_entry)
    assert after == before


def _pinned_map(path: Path) -> int:
    lib = libbpf()
    lib.bpf_obj_get.argtypes = [ct.c_char_p]
    fd = lib.bpf_obj_get(str(path).encode())
    assert fd >= 0, f"opening {path}"
    return fd


def test_an_overwrite_in_a_full_mark_map_is_never_served_old(fresh, cluster_root, live_cluster):
    """Fill a node's pinned mark map to its size (as a flood of writes would), then overwrite a
    cached chunk: its key finds no room, the kernel marks the bucket suspect, and the check drops
    exactly the overwritten entry. Read back: MinIO's new bytes, never the cached old ones."""
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    warmed(client, actors, range(4))
    i = 1
    node = client.sources(i)[0]
    lib = libbpf()
    lib.bpf_map_update_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_uint64]
    lib.bpf_map_delete_elem.argtypes = [ct.c_int, ct.c_void_p]
    fd = _pinned_map(Paths(cluster_root).stale_pin(node))
    planted = []
    try:
        key = ct.c_uint64(key_hash(f"/{manifest.bucket}/{manifest.chunk(i).key}"))
        value = ct.c_uint64(time.monotonic_ns())
        lib.bpf_map_delete_elem(fd, ct.byref(key))  # the ingest's own mark, swept as it would be after a while
        for k in range(1, 1 << 20):  # bogus keys until the map refuses
            key.value = k
            if lib.bpf_map_update_elem(fd, ct.byref(key), ct.byref(value), 1) != 0:  # BPF_NOEXIST
                break
            planted.append(k)
        assert 1000 < len(planted) < 1 << 20
        before = entries(cluster_root, live_cluster)
        entry = Path(client.cache_path(node, i)).name
        creds = credentials.load(Paths(cluster_root).credentials_file).admin
        new = b"overwritten during a flood\n"
        for n in manifest.chunk(i).nodes:
            s3.client(live_cluster.nodes[n].endpoint, creds).put_object(Bucket=manifest.bucket,
                                                                       Key=manifest.chunk(i).key, Body=new)
        assert client.read_chunk(i) == new  # not the cached old bytes, even before the check
        assert wait_until(lambda: entry not in entries(cluster_root, live_cluster)[node],
                          what="the suspect check to drop the overwritten entry")
        after = entries(cluster_root, live_cluster)
        before[node].discard(entry)
        assert after == before
        status = ray.get(cluster.storage_nodes(live_cluster)[node].kernel_status.remote())
        assert status["counters"]["marks_full"] >= 1
    finally:
        for k in planted:
            key.value = k
            lib.bpf_map_delete_elem(fd, ct.byref(key))
        os.close(fd)
