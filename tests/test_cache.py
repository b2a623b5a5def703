"""The kernel-triggered node cache, against the live cluster: fills after exactly the
threshold, exact bytes, capacity, concurrent readers, damage, overwrites, restarts, prefetch."""
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import pytest
import ray
from conftest import NO_PREFETCH, cached_entry, emptied, source_lines, source_rows, source_xxh3, wait_until
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.control import credentials, registry, s3
from fasterfs.core import config, erasure
from fasterfs.core.config import Paths
from fasterfs.ops import cluster
from fasterfs.read import cache_entry
from fasterfs.write.ingest import put


@pytest.fixture
def cold(ingest_as, live_cluster):
    """The CSV dataset the tests that only read share, empty caches, a new kernel epoch."""
    return emptied(ingest_as("csv", reuse=True), live_cluster)


def no_fills_pending(actors) -> bool:
    return not any(r["fills_pending"] for r in ray.get([a.cache_status.remote() for a in actors]))


def counter(actors, *path: str) -> int:
    """A cache_status counter summed over nodes; counters only grow while the actors live, so
    tests take differences (other tests ran before on the same cluster)."""
    total = 0
    for row in ray.get([a.cache_status.remote() for a in actors]):
        for name in path[:-1]:
            row = row[name]
        total += row.get(path[-1], 0)
    return total


def minio_gets(actors, port: int) -> int:
    """GETs the nodes' MinIO servers answered, as their kernel programs counted them (readers'
    only: the fillers' are not counted)."""
    return sum(ray.get(a.kernel_status.remote())["ports"].get(port, {"gets": 0})["gets"] for a in actors)


def key_count(actor, manifest, i):
    return ray.get(actor.kernel_key_count.remote(f"/{manifest.bucket}/{manifest.chunk(i).key}"))


def test_cached_after_exactly_threshold_reads(cold, cluster_root, live_cluster):
    manifest, actors = cold
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 3
    node = client.sources(i)[0]
    threshold = live_cluster.config["kernel"]["hot_threshold"]
    entry = Path(client.cache_path(node, i))
    fills, hits = counter([actors[node]], "filler", "hot_fills"), counter([actors[node]], "readers", "hits")
    first = client.read_chunk(i)
    for _ in range(threshold - 2):
        client.read_chunk(i)
    # below the threshold, as the kernel counted (HOT is sent only when a count reaches it): nothing cached
    assert key_count(actors[node], manifest, i) == threshold - 1 and not entry.exists()
    client.read_chunk(i)  # the threshold-th read: the kernel emits HOT, the node fills
    wait_until(entry.exists, what="the kernel-triggered fill")
    assert key_count(actors[node], manifest, i) == threshold
    hit = client.read_chunk(i)
    assert key_count(actors[node], manifest, i) == threshold  # the hit never reached MinIO
    assert hit == first
    message, orderbook = source_lines([])  # gzip's read of the source files
    c = manifest.chunk(i)
    rows = slice(c.first_row, c.first_row + c.rows)
    assert hit.split(b"\n")[:-1] == [m + b"," + o for m, o in zip(message[rows], orderbook[rows])]
    assert counter([actors[node]], "filler", "hot_fills") - fills == 1
    assert counter([actors[node]], "readers", "hits") - hits >= 1


def test_erasure_coded_chunk_cached_whole(live_cluster, overrides, cluster_root, tmp_path):
    """The kernel counts a chunk's shards; at the threshold the chunk's first holder fetches its
    data shards (over marked sockets: uncounted), caches the whole chunk, and the next read is
    a hit no MinIO sees. A shard rewritten by another tool drops the entry."""
    blob = os.urandom(2 * 2**20 + 77)
    (tmp_path / "b").write_bytes(blob)
    m = put(config.load(overrides + ["layout=ec", "ec.data=1", "ec.parity=1", "files.chunk_mb=1"]),
            tmp_path / "b", "cache/ec.bin")
    try:
        actors = cluster.storage_nodes(live_cluster)
        # no hedging: a shard GET slower than its hedge budget (a busy machine) would also be read from parity
        client = fasterfs.connect(cluster_root, NO_PREFETCH + ["client.hedge.enabled=false"], dataset="cache/ec.bin")
        c = m.chunks[1]
        owner = actors[c.nodes[0]]
        shard = f"/{m.bucket}/{erasure.shard_key(c.key, 0)}"
        entry = Path(client.cache_path(c.nodes[0], 1))
        threshold = live_cluster.config["kernel"]["hot_threshold"]
        fills, hits = counter([owner], "filler", "hot_fills"), counter(actors, "readers", "hits")
        for _ in range(threshold):
            assert client.read_chunk(1) == blob[2**20:2 * 2**20]
        # the entry's file appears just before the filler counts its fill
        wait_until(lambda: entry.exists() and counter([owner], "filler", "hot_fills") > fills,
                   what="the fill of an erasure-coded chunk")
        assert ray.get(owner.kernel_key_count.remote(shard)) == threshold
        assert counter([owner], "filler", "hot_fills") - fills == 1
        assert client.read_chunk(1) == blob[2**20:2 * 2**20]
        assert ray.get(owner.kernel_key_count.remote(shard)) == threshold  # the fill and the hit: uncounted
        assert counter(actors, "readers", "hits") - hits == 1
        creds = registry.fetch_credentials(live_cluster.name, "admin")
        s3.client(live_cluster.node(c.nodes[0]).endpoint, creds).put_object(
            Bucket=m.bucket, Key=erasure.shard_key(c.key, 0), Body=b"garbage")
        wait_until(lambda: not entry.exists(), what="the shard's STALE event to drop the chunk")
        assert client.read_chunk(1) == blob[2**20:2 * 2**20] and client.degraded_reads == 1  # from parity
    finally:
        registry.remove(live_cluster.name, "cache/ec.bin")


def test_capacity_never_exceeded(cold, cluster_root):
    manifest, actors = cold
    cap = 4 * max(c.bytes for c in manifest.chunks)
    sizes, evictions = [], [counter([a], "evictions") for a in actors]
    try:
        ray.get([a.cache_resize.remote(cap) for a in actors])
        client = fasterfs.connect(cluster_root, NO_PREFETCH)
        for _ in range(2):  # every chunk becomes hot: far more than the cache holds
            for i in range(len(manifest)):
                client.read_chunk(i)
                if i % 5 == 0:
                    sizes.append(max(_disk_bytes(Paths(cluster_root).cache_dir(n)) for n in range(len(actors))))
        wait_until(lambda: no_fills_pending(actors), what="the fills to finish")
        rows = ray.get([a.cache_status.remote() for a in actors])
        for r, before in zip(rows, evictions):
            assert r["bytes"] <= cap and _disk_bytes(Path(r["directory"])) <= cap
            assert r["evictions"] > before
        assert max(sizes) <= cap
        assert max(sizes) >= min(c.bytes for c in manifest.chunks)  # the count saw entries: it can fail
    finally:
        ray.get([a.cache_resize.remote(1024 * 1_000_000) for a in actors])


def _disk_bytes(directory: Path) -> int:
    """Bytes of the entries on disk right now (an entry may be evicted while we count)."""
    total = 0
    for f in directory.iterdir() if directory.exists() else []:
        if f.name.endswith(cache_entry.SUFFIX):
            try:
                total += f.stat().st_size
            except FileNotFoundError:
                pass
    return total


def _reader(root, ids, expected, rounds, go, out):
    client = fasterfs.connect(root, ["cache.prefetch.enabled=false", "cache.verify_reads=false"])
    go.wait(120)  # every reader connected: they read at once, while the caches are cleared
    bad = 0
    for _ in range(rounds):
        for i in ids:
            if xxh3(client.read_chunk(i)) != expected[i]:
                bad += 1
    out.put(bad)


def test_concurrent_readers_see_only_whole_chunks(cold, cluster_root, live_cluster):
    manifest, actors = cold
    ids = list(range(min(24, len(manifest))))
    expected = {c.id: source_xxh3(c) for c in manifest.chunks}
    cap = 6 * max(c.bytes for c in manifest.chunks)  # small: fills and evictions all the time
    fills, hits = counter(actors, "fills"), counter(actors, "readers", "hits")
    port = live_cluster.config["minio"]["port"]
    gets = minio_gets(actors, port)
    ctx = mp.get_context("spawn")
    out, readers, rounds = ctx.Queue(), 4, 4
    go = ctx.Barrier(readers + 1)
    try:
        ray.get([a.cache_resize.remote(cap) for a in actors])
        procs = [ctx.Process(target=_reader, args=(str(cluster_root), random.Random(p).sample(ids, len(ids)),
                                                    expected, rounds, go, out)) for p in range(readers)]
        for p in procs:
            p.start()
        go.wait(120)
        for _ in range(6):  # and caches cleared under them
            time.sleep(0.2)
            ray.get([a.cache_clear.remote() for a in actors])
        bad = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs)
        assert bad == [0] * readers
        assert counter(actors, "fills") > fills and counter(actors, "readers", "hits") > hits
        # the kernel's count: fewer GETs reached MinIO than the readers made reads (some were hits)
        assert minio_gets(actors, port) - gets < readers * rounds * len(ids)
    finally:
        ray.get([a.cache_resize.remote(1024 * 1_000_000) for a in actors])


def write_entry(path: Path, header: bytes, data: bytes) -> None:
    """A cache entry as a fill leaves it: the bytes, and the header in the file's attribute."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    os.setxattr(path, cache_entry.XATTR, header)


def test_flipped_byte_caught_and_healed(cold, cluster_root):
    manifest, actors = cold
    client = fasterfs.connect(cluster_root, NO_PREFETCH + ["cache.verify_reads=true"])
    entry = cached_entry(client, actors, 5)
    raw = bytearray(entry.read_bytes())
    raw[1000] ^= 0xFF  # the entry file is the chunk's bytes; its header stays
    entry.write_bytes(bytes(raw))
    assert xxh3(client.read_chunk(5)) == source_xxh3(manifest.chunk(5))  # served right, from MinIO
    wait_until(lambda: entry.exists() and cache_entry.read_entry(entry, verify=True) not in (None, cache_entry.DAMAGED),
               what="the node to refetch the dropped entry")
    assert xxh3(client.read_chunk(5)) == source_xxh3(manifest.chunk(5))


def test_truncated_entry_caught_even_without_verification(cold, cluster_root):
    manifest, actors = cold
    client = fasterfs.connect(cluster_root, NO_PREFETCH + ["cache.verify_reads=false"])
    entry = cached_entry(client, actors, 6)
    with open(entry, "r+b") as f:
        f.truncate(entry.stat().st_size // 2)
    assert xxh3(client.read_chunk(6)) == source_xxh3(manifest.chunk(6))
    wait_until(lambda: entry.exists() and entry.stat().st_size == manifest.chunk(6).bytes,
               what="the heal")


def test_scrub_catches_damage_readers_do_not_verify(cold, cluster_root):
    _manifest, actors = cold
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    entry = cached_entry(client, actors, 7)
    raw = bytearray(entry.read_bytes())
    raw[-1] ^= 0x01
    entry.write_bytes(bytes(raw))
    assert ray.get(actors[client.sources(7)[0]].cache_scrub.remote()) == 1
    assert not entry.exists()


def test_overwritten_object_never_served_stale(fresh, cluster_root, live_cluster):
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 8
    node = client.sources(i)[0]
    entry = cached_entry(client, actors, i)
    old = client.read_chunk(i)
    assert entry.exists()
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    new = b"rewritten by another tool\n" + old[:1000]
    s3.client(live_cluster.nodes[node].endpoint, creds).put_object(Bucket=manifest.bucket,
                                                                   Key=manifest.chunk(i).key, Body=new)
    assert client.read_chunk(i) == new  # the kernel saw the PUT: the entry is gone before we read
    assert not entry.exists()


def test_entry_fetched_before_a_write_is_never_served(fresh, cluster_root, live_cluster):
    """The kernel's pinned stale marks, checked on every hit, catch what events may be too late
    for: here an old entry put back after the write (a fill that raced with it)."""
    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 9
    node = client.sources(i)[0]
    entry = cached_entry(client, actors, i)
    old_entry, old_header = entry.read_bytes(), os.getxattr(entry, cache_entry.XATTR)
    ingested = client._stale_mark(node, i)  # the ingest's own PUT
    assert client.read_chunk(i) == old_entry  # fetched after that: served
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    new = b"written after the fill\n"
    s3.client(live_cluster.nodes[node].endpoint, creds).put_object(Bucket=manifest.bucket,
                                                                   Key=manifest.chunk(i).key, Body=new)
    assert client._stale_mark(node, i) > ingested  # the kernel marked the key when the PUT went by
    wait_until(lambda: not entry.exists(), what="the STALE event to drop the entry")
    write_entry(entry, old_header, old_entry)  # the race: a fill of the old bytes lands after the write
    assert client.read_chunk(i) == new
    assert not entry.exists()


def test_a_write_is_told_only_to_the_nodes_caching_its_key(fresh, cluster_root, live_cluster):
    """Chunk i cached on the node that is not its home, chunk j on its home only; both overwritten
    at the home's MinIO behind FasterFS's back, j first: the home's kernel sees both, and Ray's
    records of StorageNode.invalidate show one call, to the node caching i (before, every write
    went to every node: the ingest's too). The other node's copy, filled after the ingest's write
    of i, was kept until then; afterwards i's new bytes are read."""
    from conftest import task_ids, tasks_ray_recorded

    manifest, actors = fresh
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    home = client.sources(0)[0]
    i, j = [c.id for c in manifest.chunks if client.sources(c.id)[0] == home][1:3]
    other = next(n.index for n in live_cluster.nodes if n.index != home)
    ray.get(actors[other].cache_warm.remote([manifest.chunk(i).key]))
    ray.get(actors[home].cache_warm.remote([manifest.chunk(j).key]))
    wait_until(lambda: ray.get(actors[home].cached_on.remote(manifest.chunk(i).key)) == [other], 10,
               "the home's view of the other node's cache")
    filters = [("func_or_class_name", "=", "StorageNode.invalidate")]
    time.sleep(3)  # the ingest's writes, told to the other node as it gained i: recorded by now
    before = task_ids(live_cluster, filters)
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    at_home = s3.client(live_cluster.nodes[home].endpoint, creds)
    routed = ray.get(actors[home].cache_status.remote())["writes_told"]["writes"]
    at_home.put_object(Bucket=manifest.bucket, Key=manifest.chunk(j).key, Body=b"new j\n")
    wait_until(lambda: ray.get(actors[home].cache_status.remote())["writes_told"]["writes"] > routed, 10,
               "the home to route j's write")
    new = b"new i\n" * 100
    at_home.put_object(Bucket=manifest.bucket, Key=manifest.chunk(i).key, Body=new)
    try:
        tasks_ray_recorded(live_cluster, filters, excluding=before)  # i's, once recorded ...
    except AssertionError as e:  # what the nodes say they told and heard, to tell a lost record from no call
        rows = ray.get([a.cache_status.remote() for a in actors])
        raise AssertionError(f"{e}; {[(r['writes_told'], r['last_invalidation']) for r in rows]}") from None
    # a call for j would have been made before i's by the same caller (the home's StorageNode),
    # whose task events reach Ray in the order it made them: recorded by now if it was made
    told = tasks_ray_recorded(live_cluster, filters, excluding=before)
    nodes = {n.ray_node_id: n.index for n in live_cluster.nodes}
    assert [nodes.get(t.node_id, t.node_id) for t in told] == [other]
    wait_until(lambda: not ray.get(actors[other].cache_contains.remote(manifest.chunk(i).key)), 10,
               "the other node to drop i")
    assert client.read_chunk(i) == new


def test_restarted_node_rebuilds_index_and_drops_temp_files(cold, cluster_root, live_cluster):
    manifest, actors = cold
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    ids = [i for i in range(len(manifest)) if client.sources(i)[0] == 0][:5]
    ray.get(actors[0].cache_warm.remote([manifest.chunk(i).key for i in ids]))
    stray = Paths(cluster_root).cache_dir(0) / f"{cache_entry.TMP_PREFIX}leftover.123"
    stray.write_bytes(b"half a fill")
    # the object of ids[1] changes while the node is down (forged here as an entry of other bytes
    # under the old ETag); an entry of another cluster's dataset sits beside them
    changed = Path(client.cache_path(0, ids[1]))
    other = b"not these bytes" * 100
    forged = cache_entry.Header(len(other), xxh3(other), "0" * 32, time.monotonic_ns(), cache_entry.BOOT).pack()
    write_entry(changed, forged, other)
    foreign = Paths(cluster_root).cache_dir(0) / cache_entry.entry_name("another-cluster/AAPL/g1/chunk-00001.csv")
    write_entry(foreign, forged, other)
    at_ingest = client._stale_mark(0, ids[0])[0]  # the client has this incarnation's pinned marks open
    assert at_ingest > 0  # the ingest's PUT
    configured = ray.get(actors[0].cache_status.remote())["capacity"]
    ray.get(actors[0].cache_resize.remote(configured - 1_000_000))  # set at run time: kept across the crash
    before = ray.get(actors[0].status.remote())
    os.kill(before["actor_pid"], signal.SIGKILL)

    def back():
        try:
            return ray.get(actors[0].status.remote(), timeout=5)["actor_pid"] != before["actor_pid"]
        except Exception:
            return False
    wait_until(back, timeout=60, what="StorageNode restart")
    st = ray.get(actors[0].cache_status.remote())
    assert st["rebuilt_entries"] == len(ids) + 1  # the foreign entry is well formed...
    # ...but only this cluster's, as MinIO has them
    assert st["entries"] == len(ids) - 1 and st["changed_at_source"] == 1
    assert not changed.exists() and not foreign.exists()
    assert xxh3(client.read_chunk(ids[1])) == source_xxh3(manifest.chunk(ids[1]))
    assert st["stray_temp_removed"] >= 1 and not stray.exists()
    assert st["capacity"] == configured - 1_000_000
    ray.get(actors[0].cache_resize.remote(configured))
    for i in ids[:1] + ids[2:]:
        assert cache_entry.read_entry(Path(client.cache_path(0, i)), verify=True) not in (None, cache_entry.DAMAGED)
    # a write marked in the new incarnation's map reaches the same client (it follows the re-pin)
    ray.get(actors[0].invalidate.remote([(client._key_hashes[ids[0]], manifest.chunk(ids[0]).key)]))
    followed = client.session.marks(0)
    try:
        # the client looks at the pin once a second (FollowedMarks.RECHECK_S); the rest is a loaded machine's
        wait_until(lambda: client._stale_mark(0, ids[0])[0] > at_ingest, 15, "the client to follow the new pin")
    except AssertionError as e:  # what it saw, for a failure that has been seen once
        pin, st = Paths(cluster_root).stale_pin(0), ray.get(actors[0].status.remote())
        inode = os.stat(pin).st_ino if os.path.exists(pin) else "none: no pin"  # an absent pin is a finding too
        raise AssertionError(f"{e}: its mark {client._stale_mark(0, ids[0])}, at ingest {at_ingest}; pin inode "
                             f"{inode} (the client's {followed._ino}); the node's kernel "
                             f"{st['kernel_mode']}, pid {st['actor_pid']} (killed: {before['actor_pid']})") from None


def test_prefetch_during_sequential_scan_not_random(cold, cluster_root):
    manifest, actors = cold
    window = 4
    client = fasterfs.connect(cluster_root, [f"cache.prefetch.window={window}", "cache.prefetch.trigger=2"])
    n = min(30, len(manifest) - window - 2)
    order = list(range(n))
    random.Random(1).shuffle(order)
    order = [i for k, i in enumerate(order) if k == 0 or abs(i - order[k - 1]) != 1]  # no in-order pairs
    requested = counter(actors, "filler", "prefetch_requested")
    for i in order:
        client.read_chunk(i)
    # a fence: one sequential pair, never read before, asks for the `window` chunks after it; its
    # hint travels behind any the random reads made, so the count stops at exactly `window`
    client.read_chunk(n)
    client.read_chunk(n + 1)
    wait_until(lambda: counter(actors, "filler", "prefetch_requested") - requested >= window, what="the fence")
    assert counter(actors, "filler", "prefetch_requested") - requested == window
    ray.get([a.cache_clear.remote() for a in actors])
    fills, hits = counter(actors, "filler", "prefetch_fills"), counter(actors, "readers", "hits")

    def filled_ahead(i: int) -> bool:  # chunks 2 .. i + window asked for, and none still filling
        asked = counter(actors, "filler", "prefetch_requested") - requested - window
        return asked >= min(i + window, len(manifest) - 1) - 1 and no_fills_pending(actors)
    for i in range(n):  # a backtest that works a while on each chunk: the next ones are filled meanwhile
        client.read_chunk(i)
        if i >= 1:
            wait_until(lambda i=i: filled_ahead(i), what=f"prefetch ahead of chunk {i}")
    assert counter(actors, "filler", "prefetch_fills") - fills >= n - 2
    assert counter(actors, "readers", "hits") - hits == n - 2  # all but the two that began the run


def test_cache_cli(cold, overrides, capsys, cluster_root, live_cluster):
    from fasterfs.ui.cli import main

    manifest, _ = cold

    def on_disk() -> set[str]:  # the entries in the nodes' cache directories, as the file system lists them
        return {f.name for n in range(len(live_cluster.nodes)) for f in Paths(cluster_root).cache_dir(n).iterdir()
                if f.name.endswith(cache_entry.SUFFIX)}
    assert main(["cache", "warm", "0-3"] + overrides) == 0
    assert "4 of 4 chunks cached" in capsys.readouterr().out
    assert {cache_entry.entry_name(manifest.chunk(i).key) for i in range(4)} <= on_disk()
    assert main(["cache", "status"] + overrides) == 0
    assert "node caches" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # as argparse: a usage error naming the argument, exit 2
        main(["cache", "warm", "999"] + overrides)
    assert e.value.code == 2 and "argument CHUNKS: chunk 999 does not exist" in capsys.readouterr().err
    assert main(["cache", "clear"] + overrides) == 0
    assert on_disk() == set()


def test_cached_arrow_chunk_mapped_into_polars(ingest_as, live_cluster, cluster_root, overrides):
    manifest = ingest_as("arrow", reuse=True)
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])
    client = fasterfs.connect(cluster_root, NO_PREFETCH)
    i = 2
    node = client.sources(i)[0]
    ray.get(actors[node].cache_warm.remote([manifest.chunk(i).key]))
    before = key_count(actors[node], manifest, i)
    table = client.read_table(i)
    assert key_count(actors[node], manifest, i) == before  # a hit: MinIO never asked
    c = manifest.chunk(i)
    assert table.rows() == source_rows([])[c.first_row:c.first_row + c.rows]  # the csv module's parse
    buf = cache_entry.map_entry(Path(client.cache_path(node, i)))
    import pyarrow as pa
    col = pa.ipc.open_file(buf).read_all().column("AskPrice1").chunk(0)
    start = buf.address
    assert start <= col.buffers()[1].address < start + buf.size  # the column lives in the mapped file: no copy
