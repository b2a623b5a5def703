"""Attacks and floods on the live cluster: what a local user who is not root, a stray packet, an
unnamed delete or a flood of writes can do to the caches. The hostile requests run as `nobody`;
what is asserted comes from the cache directories on disk, MinIO's own answers and the bytes
MinIO holds (boto3), never from FasterFS's word about itself."""
import ctypes as ct
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import ray
from conftest import NO_PREFETCH, cached_entry, dashboard_headers, source_csv, source_xxh3, wait_until
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.bpf.events import key_hash
from fasterfs.bpf.libbpf import lib as libbpf
from fasterfs.control import auth, credentials, s3, tls
from fasterfs.control.state import ClusterState
from fasterfs.core import config
from fasterfs.core.config import Paths
from fasterfs.core.errors import FasterFSError
from fasterfs.ops import cluster

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


def kernel_counts(actors, name: str) -> list[int]:
    """Each node's kernel counter `name` (fasterfs.h's FFS_C_*): what its TC program recorded."""
    return [ray.get(a.kernel_status.remote())["counters"].get(name, 0) for a in actors]


def refused_seen(actors, before: list[int], n: int = 1) -> None:
    """Until every node's kernel has seen `n` more answers MinIO refused: the moment a stale mark
    or HOT event would have been made, so what is absent afterwards was never caused."""
    wait_until(lambda: all(now >= b + n for now, b in zip(kernel_counts(actors, "refused"), before)), 15,
               f"every node's kernel to see {n} refused answer(s)")


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
    refused, marks = kernel_counts(actors, "refused"), kernel_counts(actors, "stale_marks")
    for n in live_cluster.nodes:
        host, port = n.endpoint.split("//")[1].split(":")
        status = raw_request_as_nobody(host, int(port), f"POST /{manifest.bucket} HTTP/1.1\r\nHost: x\r\n"
                                                        "Content-Length: 0\r\n\r\n".encode())
        assert status.split()[1] in ("400", "403"), status  # MinIO refused it
    refused_seen(actors, refused)
    assert kernel_counts(actors, "stale_marks") == marks  # the kernel marked nothing written ...
    assert entries(cluster_root, live_cluster) == before  # ... and no cache lost an entry


def test_unauthenticated_gets_make_nothing_hot(fresh, cluster_root, live_cluster):
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 6
    node = client.sources(i)[0]
    host, port = live_cluster.nodes[node].endpoint.split("//")[1].split(":")
    path = f"/{manifest.bucket}/{manifest.chunk(i).key}"
    refused, hot = kernel_counts(actors, "refused"), kernel_counts(actors, "hot_events")
    for _ in range(5):
        status = raw_request_as_nobody(host, int(port), f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert status.split()[1] == "403", status
    wait_until(lambda: kernel_counts(actors, "refused")[node] >= refused[node] + 5, 15,
               "the node's kernel to see MinIO refuse the 5 GETs")
    assert kernel_counts(actors, "hot_events") == hot  # the kernel made nothing hot ...
    assert not Path(client.cache_path(node, i)).exists()  # ... and nothing was cached
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


def test_a_clean_up_deletes_exactly_its_keys_and_on_this_host_the_kernel_skips_it(live_cluster, cluster_root):
    """What every clean-up deletes with (replaced generations, retired pieces: objects no manifest
    names): to a MinIO of this host, a DeleteObjects on sockets with the filler's mark, which the
    kernel programs skip (their stale and suspect marks do not move: no node checks its whole
    cache for it); without the mark (another host's MinIO, where the mark does not travel), one
    DELETE a key, each of which the kernel marks stale. Either way exactly the keys named are gone
    by boto3's listing, names with &, <, quotes, spaces and UTF-8 among them; a key never there
    is no error."""
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    node = live_cluster.nodes[0]
    bucket, actors = live_cluster.settings.bucket, cluster.storage_nodes(live_cluster)
    boto = s3.client(node.endpoint, creds)
    prefix = f"cleanup-{uuid.uuid4().hex}/"
    keys = [f"{prefix}{i} a&b<c>\"d'e ü" for i in range(6)]
    for k in keys + [f"{prefix}kept"]:
        boto.put_object(Bucket=bucket, Key=k, Body=b"x")

    def marks() -> tuple[int, int]:
        return sum(kernel_counts(actors, "stale_marks")), sum(kernel_counts(actors, "suspect_marks"))
    before = marks()
    assert s3.MarkedGetter(node.endpoint, creds, live_cluster.settings.fill_mark).delete(
        bucket, keys[:3] + [f"{prefix}never"]) == []
    assert marks() == before
    assert s3.MarkedGetter(node.endpoint, creds, 0).delete(bucket, keys[3:]) == []
    assert marks() == (before[0] + 3, before[1])
    listed = boto.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    assert [o["Key"] for o in listed] == [f"{prefix}kept"]
    boto.delete_object(Bucket=bucket, Key=f"{prefix}kept")


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


# -- a machine shared with other users: what they plant is never used ---------------------------

NOBODY_UID = 65534


@pytest.fixture
def world_writable(tmp_path):
    """A directory like /var/tmp: anyone may create in it (sticky)."""
    os.chmod(tmp_path, 0o755)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    return shared


def planted(path: Path, data: str = "", directory: bool = False) -> Path:
    """`path` made by the unprivileged user, as if they had been first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        path.mkdir()
    else:
        path.write_text(data)
        os.chmod(path, 0o600)
    os.chown(path, NOBODY_UID, NOBODY_UID)
    return path


def test_a_root_another_user_made_first_is_refused_before_anything_starts(world_writable):
    root = planted(world_writable / "fasterfs", directory=True)
    planted(root / "ray_token", "planted-token")
    cfg = config.load([f"cluster.root={root}"])
    with pytest.raises(FasterFSError, match=f"the cluster root {root} belongs to uid {NOBODY_UID}"):
        cluster.up(cfg)
    assert sorted(p.name for p in root.iterdir()) == ["ray_token"]  # nothing written, nothing started


def test_a_new_root_is_only_its_owners(world_writable):
    root = world_writable / "mine"
    with pytest.raises(FasterFSError):  # no MinIO binary at this path: up stops after making the root
        cluster.up(config.load([f"cluster.root={root}", "minio.binary=/nonexistent/minio"]))
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.geteuid()


@pytest.mark.parametrize("name", ["ray_token", "credentials.json", "cluster.json", "tls-ca/ca.key"])
def test_a_secret_or_state_file_another_user_planted_is_refused(tmp_path, name):
    """In a root that is ours, a file that is not: never read, never overwritten, named."""
    paths = Paths(tmp_path)
    target = planted(tmp_path / name, '{"name": "x"}')
    use = {"ray_token": lambda: auth.read(auth.token_file(tmp_path)),
           "credentials.json": lambda: credentials.create(paths.credentials_file),
           "cluster.json": lambda: ClusterState.load(tmp_path),
           "tls-ca/ca.key": lambda: tls.create_ca(paths.tls_ca_dir, "x")}[name]
    with pytest.raises(FasterFSError, match=f"{target} belongs to uid {NOBODY_UID}"):
        use()
    assert target.read_text() == '{"name": "x"}' and target.stat().st_uid == NOBODY_UID


def test_a_ca_trust_file_another_user_planted_is_not_trusted(world_writable, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(world_writable))
    ca = tls.create_ca(world_writable.parent / "ca", "x")
    theirs = planted(tls._ca_path(ca), "-----BEGIN CERTIFICATE-----\nnot the cluster's\n")
    os.chmod(theirs, 0o644)
    used = Path(tls.trust(ca))  # root may replace theirs (the sticky bit does not bind it); others get a private file
    assert used.read_text() == ca and used.stat().st_uid == os.geteuid()
    tls.forget(ca)


# -- verified bytes -------------------------------------------------------------------------------

def test_a_rotten_cache_entry_is_never_served_to_readers_that_copy(fresh, cluster_root, overrides):
    """The mount's agent, fasterfs:// and `cat` all read through the namespace: a cache entry
    with a flipped byte is caught against the manifest's checksum and the read is right."""
    from fasterfs.read.reader import Namespace

    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    entry = cached_entry(client, actors, 3)
    raw = bytearray(entry.read_bytes())
    raw[100] ^= 0xFF
    entry.write_bytes(bytes(raw))
    got = Namespace(config.load(overrides)).cat(f"{manifest.name}/{manifest.name}.csv")
    assert xxh3(got) == xxh3(source_csv(0, manifest.rows))  # the source files as gzip reads them
    assert not entry.exists() or xxh3(entry.read_bytes()) == source_xxh3(manifest.chunk(3))


def test_a_rotten_replica_is_never_cached(fresh, cluster_root, live_cluster):
    """A holder whose copy is not the manifest's bytes (written behind FasterFS's back): the fill
    refuses it, and no entry of it appears on disk."""
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 4
    node = manifest.chunk(i).nodes[0]
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    s3.client(live_cluster.nodes[node].endpoint, creds).put_object(Bucket=manifest.bucket, Key=manifest.chunk(i).key,
                                                                 Body=b"rotten " * 1000)
    time.sleep(0.5)  # the write's own invalidation first
    ray.get(actors[node].cache_warm.remote([manifest.chunk(i).key]))
    assert not Path(client.cache_path(node, i)).exists()
    refused = ray.get(actors[node].cache_status.remote())["filler"]["rotten_copies_refused"]
    assert refused >= 1


# -- the dashboard: its own address only -----------------------------------------------------------

def test_the_dashboard_answers_only_to_its_own_address(live_cluster):
    """DNS rebinding: a page on another site whose name now resolves to this address sends its
    own name as Host; a cross-site WebSocket sends its site as Origin. Both are refused."""
    import urllib.error
    import urllib.request

    from websockets.sync.client import connect

    host, port = live_cluster.web_url.split("//")[1].split(":")

    def status(host_header: str, token: bool = True) -> int:
        request = urllib.request.Request(f"{live_cluster.web_url}/api/snapshot",
                                         headers={**(dashboard_headers(live_cluster) if token else {}),
                                                  "Host": host_header})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    assert status(f"{host}:{port}") == 200 and status(f"localhost:{port}") == 200  # its address; a tunnel
    assert status(f"rebound.attacker.example:{port}") == 403
    url = f"ws://{host}:{port}/ws/kernel"
    token = dashboard_headers(live_cluster)  # a page elsewhere may ride on the browser's login cookie
    with connect(url, max_size=None, origin=f"http://{host}:{port}", additional_headers=token) as ws:  # its own page
        assert ws.recv(timeout=30)
    with pytest.raises(Exception, match="403"):
        connect(url, origin="http://attacker.example", additional_headers=token).__enter__()
    assert status(f"{host}:{port}", token=False) == 401  # and nothing without the token, loopback or not


# -- another local user: the mount, the cache, the marks -------------------------------------------

def test_another_user_reads_neither_the_mount_nor_the_cache(live_cluster, cluster_root, fresh):
    """As `nobody`: a mount at a place anyone may enter is still root's alone (no allow_other by
    default: the kernel refuses other users), and the cluster root (0700: as `up` makes a new one,
    here mkdtemp's) keeps the cache entries and the pinned marks out of reach."""
    _, actors = fresh
    point = Path(tempfile.mkdtemp(prefix="ffs-open-mnt-"))
    os.chmod(point, 0o755)
    ray.get(actors[0].mount.remote(str(point)))
    try:
        assert os.listdir(point)  # root reads it
        code = textwrap.dedent(f"""
            import os, sys
            for what, go in (("mount", lambda: os.listdir({str(point)!r})),
                             ("cache", lambda: os.listdir({str(Paths(cluster_root).cache_dir(0))!r})),
                             ("marks", lambda: open({str(Paths(cluster_root).stale_pin(0))!r}, "rb"))):
                try:
                    go()
                    print(what, "READ")
                except PermissionError:
                    print(what, "refused")
        """)
        done = subprocess.run([*NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["mount", "refused", "cache", "refused", "marks", "refused"], done
    finally:
        ray.get(actors[0].umount.remote(str(point)))
        point.rmdir()
