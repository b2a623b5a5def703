"""The native mount on the live cluster (native/ffs-mount answering the kernel, its agent
fasterfs.read.mount holding the namespace): a hot file is opened by FUSE passthrough, so its reads
reach no daemon (the daemon's own counters say so) and its bytes are the source's; a write the
kernel sees is never served old to a new open; evicting an entry under an open passthrough file
leaves its bytes; fio verifies every block it reads through the mount by its own CRC32C.
Expected bytes come from the local files and from MinIO read with boto3, never from FasterFS."""
from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from conftest import mounts_under, source_csv, wait_until

from fasterfs.control import credentials, registry, s3
from fasterfs.core import config
from fasterfs.core.config import Paths
from fasterfs.core.errors import FasterFSError
from fasterfs.core.process import running
from fasterfs.node.mount_supervisor import Mounts, agent_env
from fasterfs.ops import cluster
from fasterfs.read import fuse_uring
from fasterfs.write import bulk_load
from fasterfs.write.ingest import put, remove


def daemon_counts(actor, point, after: float) -> dict:
    """The daemon's counters as its agent last wrote them, once written after `after`."""
    def fresh():
        rows = [m for m in ray.get(actor.status.remote())["mounts"] if m["path"] == str(point)]
        stats = rows[0]["daemon"] if rows else None
        return stats if stats and stats["time"] > after else None
    wait_until(lambda: fresh() is not None, timeout=15, what="the mount's counters")
    return fresh()


def daemon_read_bytes(actor, point) -> int:
    """Bytes the mount's native daemon has read by system calls (`rchar` in /proc/<pid>/io, the
    kernel's count, not the daemon's): a READ it answers reads its file; passthrough does not."""
    agent = next(m["pid"] for m in ray.get(actor.status.remote())["mounts"] if m["path"] == str(point))
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    daemon = next(int(c) for c in children if Path(f"/proc/{c}/exe").resolve().name == "ffs-mount")
    return int(next(line.split()[1] for line in Path(f"/proc/{daemon}/io").read_text().splitlines()
                    if line.startswith("rchar:")))


def daemon_reads(stats: dict) -> int:
    """READs the daemon answered other than from a cache entry: fetched from MinIO itself, or
    forwarded to the agent."""
    return stats["reads_forwarded"] + stats["fetch"]["reads"]


@contextlib.contextmanager
def random_reads(f: Path):
    """`f` once the mount shows it, opened for random reads: the kernel sends one request per read."""
    wait_until(f.exists, timeout=10, what="the file in the mount")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        yield fd
    finally:
        os.close(fd)


def read_by_the_daemon(actor, point, f: Path, data: bytes, chunks: int) -> tuple[dict, dict]:
    """`f` read whole through the mount once it shows it: the source's bytes, at least `chunks`
    GETs by the daemon and no READ reaching the agent. The counters before and after."""
    wait_until(f.exists, timeout=10, what="the file in the mount")
    before = daemon_counts(actor, point, time.time())
    assert f.read_bytes() == data
    after = daemon_counts(actor, point, time.time())
    assert after["reads_forwarded"] == before["reads_forwarded"], (before, after)
    assert after["fetch"]["gets"] - before["fetch"]["gets"] >= chunks, (before, after)
    return before, after


def put_hot(point, actor, overrides, local, name: str):
    """`local` stored at `name`, seen through the mount, made hot and cached: its path there
    and its manifest."""
    m = put(config.load(overrides), local, name)
    f = point / name
    wait_until(f.exists, timeout=10, what="the file in the mount")
    make_hot(f, actor, m.chunk(0).key)
    return f, m


def make_hot(path, actor, key: str) -> None:
    """Read through the mount until the kernel has made the chunk hot and the cache holds it
    (bounded: at most 20 s)."""
    def filled():
        path.read_bytes()
        return ray.get(actor.cache_contains.remote(key))
    wait_until(filled, timeout=20, what="the kernel to make the chunk hot and the cache to fill")


def test_hot_file_is_read_by_passthrough_never_by_a_daemon(mounted, live_cluster, overrides, tmp_path):
    point, actor = mounted
    data = os.urandom(3_000_000)  # one chunk (files.chunk_mb=4): its cache entry is the whole file
    (tmp_path / "book.bin").write_bytes(data)
    try:
        f, _ = put_hot(point, actor, overrides, tmp_path / "book.bin", "native/book.bin")
        assert f.read_bytes() == data  # the open that finds it hot
        before, read_before = daemon_counts(actor, point, time.time()), daemon_read_bytes(actor, point)
        for _ in range(20):
            with open(f, "rb") as fh:
                assert fh.read() == data
                fh.seek(1_234_567)
                assert fh.read(4096) == data[1_234_567:1_234_567 + 4096]
        assert daemon_read_bytes(actor, point) - read_before < len(data)  # 20 reads of it: not through the daemon
        after = daemon_counts(actor, point, time.time())
        assert after["passthrough_enabled"], after
        assert after["passthrough_opens"] - before["passthrough_opens"] >= 20, (before, after)
        assert after["reads_forwarded"] == before["reads_forwarded"], (before, after)  # zero READs reached the agent
        assert after["agent_opens"] - before["agent_opens"] == 0, (before, after)
    finally:
        remove(config.load(overrides), "native/book.bin")


def make_file_hot(path, live_cluster, m) -> None:
    """Read a stored file of several chunks through the mount until every chunk is cached at
    its file's home (kernel.watch=own: the first chunk's first holder), bounded: 30 s."""
    home = cluster.storage_nodes(live_cluster)[m.chunk(0).nodes[0]]

    def filled():
        path.read_bytes()
        return all(ray.get([home.cache_contains.remote(c.key) for c in m.chunks]))
    wait_until(filled, timeout=30, what="every chunk of the file to be cached")


def test_a_file_of_several_chunks_is_one_passthrough_file(mounted, live_cluster, overrides, tmp_path):
    """Chunks on both nodes, filled one by one into one file entry at the file's home: once all
    are there, opens are passthrough (zero READs reach the agent) and the bytes are the source's."""
    point, actor = mounted
    data = os.urandom(3 * 1024 * 1024 + 12_345)
    (tmp_path / "multi.bin").write_bytes(data)
    cfg = config.load(overrides + ["files.chunk_mb=1"])
    m = put(cfg, tmp_path / "multi.bin", "native/multi.bin")
    try:
        assert len(m.chunks) == 4 and len({c.nodes[0] for c in m.chunks}) == 2, m.chunks
        f = point / "native" / "multi.bin"
        wait_until(f.exists, timeout=10, what="the file in the mount")
        make_file_hot(f, live_cluster, m)
        assert f.read_bytes() == data  # the open that finds it hot
        before, read_before = daemon_counts(actor, point, time.time()), daemon_read_bytes(actor, point)
        for k in range(10):
            with open(f, "rb") as fh:
                at = 1_000_000 * (k % 4)
                fh.seek(at)
                assert fh.read(70_000) == data[at:at + 70_000]  # across a chunk's end
                fh.seek(0)
                assert fh.read() == data
        assert daemon_read_bytes(actor, point) - read_before < len(data)  # 10 reads of it: not through the daemon
        after = daemon_counts(actor, point, time.time())
        assert after["passthrough_opens"] - before["passthrough_opens"] >= 10, (before, after)
        assert after["reads_forwarded"] == before["reads_forwarded"], (before, after)
    finally:
        remove(cfg, "native/multi.bin")


def test_the_cached_parts_of_a_file_are_read_by_the_daemon(mounted, live_cluster, overrides, tmp_path):
    """Chunks 0 and 2 of a 4-chunk file cached, 1 and 3 not: the daemon reads the cached ones
    from the file's entry itself, the others from MinIO itself (no READ reaches the agent)."""
    point, actor = mounted
    data = os.urandom(4 * 2**20)
    (tmp_path / "part.bin").write_bytes(data)
    cfg = config.load(overrides + ["files.chunk_mb=1"])
    m = put(cfg, tmp_path / "part.bin", "native/part.bin")
    try:
        home = cluster.storage_nodes(live_cluster)[m.chunk(0).nodes[0]]
        assert ray.get(home.cache_warm.remote([m.chunk(0).key, m.chunk(2).key])) == 2
        with random_reads(point / "native" / "part.bin") as fd:
            before = daemon_counts(actor, point, time.time())
            for at in (5_000, 2 * 2**20 + 77_777, 900_000):  # in chunks 0, 2, 0
                assert os.pread(fd, 4096, at) == data[at:at + 4096]
            mid = daemon_counts(actor, point, time.time())
            assert mid["reads_forwarded"] == before["reads_forwarded"], (before, mid)
            assert mid["reads_cached"] - before["reads_cached"] >= 3, (before, mid)
            at = 2**20 + 5_555  # chunk 1: not cached
            assert os.pread(fd, 4096, at) == data[at:at + 4096]
            after = daemon_counts(actor, point, time.time())
            assert after["fetch"]["reads"] > mid["fetch"]["reads"], (mid, after)
            assert after["reads_forwarded"] == mid["reads_forwarded"], (mid, after)
    finally:
        remove(cfg, "native/part.bin")


def test_a_random_readers_file_is_swept_whole_by_the_daemon(mounted, live_cluster, overrides, tmp_path):
    """Small reads at random in a file of 8 chunks cached nowhere: the first ones, in chunks 5, 2
    and 7, are a ranged GET each; the fourth chunk touched (3) makes the daemon sweep the whole
    file into its memory, so MinIO is asked for each chunk whole once — as its kernel counted:
    2 GETs of chunks 5, 2 and 7, 1 of every other — and the reads after ask MinIO nothing (the
    counts stay) and the agent nothing. Bytes are the source's, read with the standard library."""
    point, actor = mounted
    data = os.urandom(8 * 2**20 - 4321)
    (tmp_path / "random.bin").write_bytes(data)
    cfg = config.load(overrides + ["files.chunk_mb=1", "replicas=1"])
    m = put(cfg, tmp_path / "random.bin", "native/random.bin")
    actors = cluster.storage_nodes(live_cluster)

    def counts() -> list[int]:
        return [ray.get(actors[c.nodes[0]].kernel_key_count.remote(f"/{m.bucket}/{c.key}")) for c in m.chunks]

    try:
        assert len(m.chunks) == 8 and counts() == [0] * 8
        with random_reads(point / "native" / "random.bin") as fd:
            before = daemon_counts(actor, point, time.time())
            for i in (5, 2, 7, 3):
                at = i * 2**20 + 12_345
                assert os.pread(fd, 4096, at) == data[at:at + 4096]
            expected = [2 if i in (5, 2, 7) else 1 for i in range(8)]
            wait_until(lambda: counts() == expected, 15, f"the kernel to count {expected} GETs")
            rng = random.Random(7)
            for _ in range(200):
                at = rng.randrange(len(data))
                assert os.pread(fd, 4096, at) == data[at:at + 4096]
            assert counts() == expected
            after = daemon_counts(actor, point, time.time())
            assert after["fetch"]["sweeps"] - before["fetch"]["sweeps"] == 1, (before, after)
            assert after["reads_forwarded"] == before["reads_forwarded"], (before, after)
    finally:
        remove(cfg, "native/random.bin")


def test_an_erasure_coded_file_is_fetched_by_the_daemon_from_its_data_shards(mounted, live_cluster, overrides,
                                                                             tmp_path):
    """A file of 3 chunks stored as 1 data + 1 parity shard each, nothing cached: read cold
    through the mount, its bytes are the source's and come from the daemon's own GETs of the
    data shards (no READ reaches the agent, which would read parity)."""
    point, actor = mounted
    data = os.urandom(3 * 2**20 - 12_345)
    (tmp_path / "ec.bin").write_bytes(data)
    cfg = config.load(overrides + ["files.chunk_mb=1", "layout=ec", "ec.data=1", "ec.parity=1"])
    m = put(cfg, tmp_path / "ec.bin", "native/ec.bin")
    try:
        assert m.layout == "ec" and len(m.chunks) == 3
        before, after = read_by_the_daemon(actor, point, point / "native" / "ec.bin", data, len(m.chunks))
        assert after["fetch"]["bad_checksum"] == before["fetch"]["bad_checksum"], (before, after)
    finally:
        remove(cfg, "native/ec.bin")


def test_a_cold_file_is_fetched_by_the_daemon_itself_and_checked(mounted, live_cluster, overrides, tmp_path):
    """A file of 3 chunks, 2 copies each, nothing cached: the daemon GETs its chunks from MinIO
    itself (no READ reaches the agent) and serves the source's bytes. Copies overwritten behind
    FasterFS's back with other bytes of the same size (chunk 1's on one node, chunk 2's on the
    other, so that the copy the daemon tries first is rotten for one of them, whichever node it
    prefers) are refused by the manifest's checksum and the other copy served. The kernel counted
    the daemon's GETs (the agent made none): reading on makes the chunks hot, the cache fills
    them, and the next open is passthrough."""
    point, actor = mounted
    data = os.urandom(3 * 2**20 - 999)
    (tmp_path / "cold.bin").write_bytes(data)
    cfg = config.load(overrides + ["files.chunk_mb=1", "replicas=2"])
    m = put(cfg, tmp_path / "cold.bin", "native/cold.bin")
    state = registry.find_in_ray(live_cluster.name)
    admin = registry.fetch_credentials(live_cluster.name, "admin")
    holders = sorted(m.chunk(1).nodes)
    assert len(holders) == 2 and sorted(m.chunk(2).nodes) == holders
    rotten = []
    try:
        for i, node in ((1, holders[0]), (2, holders[1])):
            c = m.chunk(i)
            minio = s3.client(state.node(node).endpoint, admin)
            kept = minio.head_object(Bucket=m.bucket, Key=c.key)  # a GET here would count toward hot
            good = data[m.offsets()[i]:m.offsets()[i + 1]]
            minio.put_object(Bucket=m.bucket, Key=c.key, Body=bytes(b ^ 0xFF for b in good),
                             Metadata=kept["Metadata"])
            rotten.append((minio, c.key, good, kept["Metadata"]))
        f = point / "native" / "cold.bin"
        before, after = read_by_the_daemon(actor, point, f, data, len(m.chunks))
        assert after["fetch"]["bad_checksum"] > before["fetch"]["bad_checksum"], (before, after)
        for minio, key, good, meta in rotten:
            minio.put_object(Bucket=m.bucket, Key=key, Body=good, Metadata=meta)
        rotten.clear()

        make_file_hot(f, live_cluster, m)
        hot = daemon_counts(actor, point, time.time())
        assert hot["reads_forwarded"] == before["reads_forwarded"], (before, hot)  # every GET the daemon's
        assert f.read_bytes() == data
        last = daemon_counts(actor, point, time.time())
        assert last["passthrough_opens"] > hot["passthrough_opens"], (hot, last)
    finally:
        for minio, key, good, meta in rotten:
            minio.put_object(Bucket=m.bucket, Key=key, Body=good, Metadata=meta)
        remove(cfg, "native/cold.bin")


def stored_tree(cfg, src: Path, files: int, dirs: int, dest: str) -> Path:
    """`files` small files of random bytes in `dirs` directories under `src`, stored with `put -r` at `dest`."""
    for i in range(files):
        f = src / f"d{i % dirs:02d}" / f"f{i:04d}.bin"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(os.urandom(i % 97))
    bulk_load.load(cfg, bulk_load.LocalTree(src), dest)
    return src


@pytest.fixture(scope="module")
def tree(live_cluster, overrides, tmp_path_factory) -> tuple[Path, str]:
    """600 small files in 12 directories, stored once with `put -r` under tree/ for the tests of
    a mount's tree (each leaves it as it found it): (the source, the name it is stored at)."""
    return stored_tree(config.load(overrides), tmp_path_factory.mktemp("tree"), 600, 12, "tree/"), "tree"


def sizes(top: Path) -> dict[str, int]:
    """Every file under `top` (os.walk), by its path there, with its size (os.stat)."""
    return {str(Path(d, f).relative_to(top)): os.stat(Path(d, f)).st_size
            for d, _, files in os.walk(top) for f in files}


def test_a_namespace_is_mounted_lazily_and_learns_each_change_alone(mounted, tree, overrides, tmp_path):
    """600 files stored with `put -r` in 12 directories, then the mount started: the daemon is
    sent none of them at the start; a `stat` brings the names on its path alone, a listing its
    directory's; walking the mount gives exactly the source tree (os.walk of it, sizes from
    os.stat). A file put later is seen at once, and removed is gone, its emptied directory with
    it, with only those names crossing to the daemon (its own count of entries received)."""
    point, actor = mounted
    cfg = config.load(overrides)
    src, stored = tree
    ray.get(actor.umount.remote(str(point)))
    since = time.time()
    ray.get(actor.mount.remote(str(point)))
    lazy = point / stored
    try:
        start = daemon_counts(actor, point, since)["entries_received"]
        assert start == 0, start  # the root alone
        assert os.stat(lazy / "d07" / "f0007.bin").st_size == 7
        one = daemon_counts(actor, point, time.time())["entries_received"]
        assert one - start <= 3, (start, one)  # lazy, lazy/d07, its file
        assert sorted(os.listdir(lazy / "d07")) == sorted(os.listdir(src / "d07"))
        listed = daemon_counts(actor, point, time.time())["entries_received"]
        assert listed - one <= 50, (one, listed)
        assert sizes(lazy) == sizes(src)

        walked = daemon_counts(actor, point, time.time())["entries_received"]
        (tmp_path / "new.bin").write_bytes(b"new")
        put(cfg, tmp_path / "new.bin", f"{stored}/d07/new.bin")
        put(cfg, tmp_path / "new.bin", f"{stored}/solo/new.bin")
        assert (lazy / "d07" / "new.bin").read_bytes() == b"new"
        assert (lazy / "solo" / "new.bin").read_bytes() == b"new"
        # the kernel keeps the listings it read (FOPEN_CACHE_DIR): a change drops d07's
        wait_until(lambda: sorted(os.listdir(lazy / "d07")) == sorted(os.listdir(src / "d07") + ["new.bin"]),
                   timeout=5, what="d07 listed with its new file")
        remove(cfg, f"{stored}/solo/new.bin")
        wait_until(lambda: not (lazy / "solo").exists(), timeout=10, what="the emptied directory gone")
        changed = daemon_counts(actor, point, time.time())["entries_received"]
        assert changed - walked <= 12, (walked, changed)  # each change's names (and their directories)
        remove(cfg, f"{stored}/d07/new.bin")
        wait_until(lambda: sorted(os.listdir(lazy / "d07")) == sorted(os.listdir(src / "d07")), timeout=5,
                   what="d07 listed without it")
    finally:
        for name in (f"{stored}/d07/new.bin", f"{stored}/solo/new.bin"):  # the tree as the next test expects it
            with contextlib.suppress(FasterFSError):
                remove(cfg, name)


class AgentProcess:
    """A mount agent started as a StorageNode starts one (`python -m fasterfs.read.mount`), with these
    overrides, at `point`; its daemon's counters read from the file the agent writes them to."""

    def __init__(self, point: Path, overrides: list[str], work: Path):
        self.point, self.stats, self.log_path = point, work / "daemon.json", work / "mount.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "fasterfs.read.mount", str(point), *overrides],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=agent_env(self.stats))

    def counts(self, after: float) -> dict:
        wait_until(lambda: self.stats.exists() and json.loads(self.stats.read_text())["time"] > after,
                   timeout=15, what="the daemon's counters")
        return json.loads(self.stats.read_text())

    def said(self, what: str) -> bool:
        return what in self.log_path.read_text()

    def stop(self, cluster_root: Path) -> None:
        """By its PID; it leaves no mount."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        wait_until(lambda: str(self.point) not in mounts_under(cluster_root), timeout=15, what="the mount gone")


def test_a_mount_lists_its_tree_in_the_background_then_asks_nothing(tree, overrides, cluster_root, tmp_path):
    """A mount agent warming its daemon's tree (mount.warm_entries): it is up at once, then lists
    directories unasked, so that walking a tree of 600 files finds every name at hand (the daemon
    asks its agent for no name and no listing) and gives exactly the source tree."""
    src, stored = tree
    point = cluster_root / "mnt-warm"
    point.mkdir(exist_ok=True)
    agent = AgentProcess(point, [*overrides, "mount.warm_entries=1000000"], tmp_path)
    try:
        wait_until(lambda: str(point) in mounts_under(cluster_root), timeout=30, what="the mount")
        wait_until(lambda: agent.said("sent the daemon"), timeout=60, what="the agent to say it sent the tree")
        warmed = agent.counts(time.time())
        assert sizes(point / stored) == sizes(src)
        walked = agent.counts(time.time())
        assert (walked["name_lookups"], walked["listings"]) == (warmed["name_lookups"], warmed["listings"]), \
            (warmed, walked)  # every name at hand
    finally:
        agent.stop(cluster_root)


def test_a_mount_holds_at_most_its_bound_and_still_serves_every_name(tree, overrides, cluster_root, tmp_path):
    """A daemon bounded to 200 entries (mount.max_entries) over a tree of 600 files in 12
    directories: walked twice, the mount gives exactly the source tree each time (os.walk and
    os.stat of it); the second walk lists again directories the first one's eviction dropped; a
    file held open through it all still reads its bytes; once walked, the daemon holds at most its
    bound (the entries the kernel held meanwhile go once it lets go of them)."""
    src, stored = tree
    point = cluster_root / "mnt-bounded"
    point.mkdir(exist_ok=True)
    agent = AgentProcess(point, [*overrides, "mount.max_entries=200", "mount.warm_entries=1000000"], tmp_path)
    try:
        wait_until(lambda: str(point) in mounts_under(cluster_root), timeout=30, what="the mount")
        held_open = open(point / stored / "d03" / "f0003.bin", "rb")
        assert sizes(point / stored) == sizes(src)
        first = agent.counts(time.time())
        assert first["evicted"] > 0, first
        assert sizes(point / stored) == sizes(src)
        second = agent.counts(time.time())
        assert second["listings"] > first["listings"], (first, second)  # evicted directories listed again
        assert held_open.read() == (src / "d03" / "f0003.bin").read_bytes()
        held_open.close()

        wait_until(lambda: agent.counts(time.time())["entries_held"] <= 200, timeout=30,
                   what="the daemon back within its bound")
    finally:
        agent.stop(cluster_root)


def io_uring_completions(daemon: int) -> dict[int, int]:
    """Each io_uring the daemon holds, by fd: the completions the kernel has posted to it
    (`CqTail` in /proc/<pid>/fdinfo; a FUSE request served through a ring is one)."""
    out = {}
    for fd in Path(f"/proc/{daemon}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == "anon_inode:[io_uring]":
                info = Path(f"/proc/{daemon}/fdinfo/{fd.name}").read_text()
                out[int(fd.name)] = int(next(line.split()[1] for line in info.splitlines()
                                             if line.startswith("CqTail:")))
    return out


@pytest.mark.parametrize("uring", [True, False])
def test_requests_come_through_a_ring_per_cpu_or_dev_fuse(live_cluster, overrides, cluster_root, tmp_path, uring):
    """mount.uring=true: the daemon holds one io_uring per CPU the kernel keeps a queue for, its
    thread for queue q pinned to CPU q (the kernel's affinity list), and files opened and read
    through the mount are served through them: the kernel's completion counts grow by at least
    the opens, and every read gives the source's bytes. The kernel's switch is on while the
    mount's agent says it needs it, and its word is gone when it stops. mount.uring=false: no
    io_uring at all, the same bytes through /dev/fuse."""
    data = os.urandom(300_000)
    (tmp_path / "f.bin").write_bytes(data)
    put(config.load(overrides), tmp_path / "f.bin", f"uring-{uring}/f.bin")
    point = cluster_root / f"mnt-uring-{uring}"
    point.mkdir(exist_ok=True)
    agent = AgentProcess(point, [*overrides, f"mount.uring={str(uring).lower()}"], tmp_path)
    try:
        wait_until(lambda: str(point) in mounts_under(cluster_root), timeout=30, what="the mount")
        children = Path(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children").read_text().split()
        daemon = next(int(c) for c in children if Path(f"/proc/{c}/exe").resolve().name == "ffs-mount")
        f = point / f"uring-{uring}" / "f.bin"
        wait_until(f.exists, timeout=10, what="the file in the mount")
        before = io_uring_completions(daemon)
        for _ in range(20):
            assert f.read_bytes() == data
        after = io_uring_completions(daemon)
        marker = fuse_uring.USERS / str(agent.proc.pid)
        if not uring:
            assert before == after == {} and not marker.exists()
            return
        # the kernel keeps a queue per possible CPU (its list, e.g. "0-1")
        possible = Path("/sys/devices/system/cpu/possible").read_text().strip()
        last = max(int(n) for part in possible.split(",") for n in part.split("-"))
        assert len(after) == last + 1, (possible, after)
        assert sum(after.values()) - sum(before.values()) >= 20, (before, after)
        pinned = {}
        for task in Path(f"/proc/{daemon}/task").iterdir():
            try:  # the daemon's other threads come and go (a ring's thread lives as long as the mount)
                name = (task / "comm").read_text().strip()
            except FileNotFoundError:
                continue
            if name.startswith("fuser-uring-"):
                status = (task / "status").read_text()
                pinned[int(name.rsplit("-", 1)[1])] = next(line.split()[1] for line in status.splitlines()
                                                           if line.startswith("Cpus_allowed_list:"))
        assert pinned == {q: str(q) for q in range(len(after))}, pinned
        assert marker.exists() and fuse_uring.PARAM.read_text().strip() == "Y"
    finally:
        agent.stop(cluster_root)
    assert not marker.exists()


def test_a_hung_mount_is_replaced_and_reads_again(live_cluster, overrides, cluster_root, tmp_path):
    """A mount whose agent stops answering (SIGSTOP: alive to `poll()`, its daemon's requests
    unanswered) is found silent by its supervisor (`Mounts`, built here as a StorageNode builds
    it, mount.hung_s of 3 s) no sooner than 3 s, stopped with its daemon (by their PIDs) and
    mounted again; the file then reads its source's bytes."""
    data = os.urandom(5000)
    (tmp_path / "f.bin").write_bytes(data)
    put(config.load(overrides), tmp_path / "f.bin", "hung/f.bin")
    point = cluster_root / "mnt-hung"
    point.mkdir(exist_ok=True)
    mounts = Mounts(tmp_path / "mounts.json", tmp_path / "logs", overrides, hung_s=3)
    mounts.mount(str(point))
    agent = mounts.status()[0]["pid"]
    try:
        wait_until(lambda: mounts.silent_s(str(point)) < 1, timeout=15, what="the agent and its daemon speaking")
        daemon = int(Path(f"/proc/{agent}/task/{agent}/children").read_text().split()[0])
        os.kill(agent, signal.SIGSTOP)
        stopped = time.monotonic()

        def replaced() -> bool:
            mounts.supervise()
            now = mounts.status()
            return bool(now) and now[0]["pid"] != agent and now[0]["healthy"]
        wait_until(replaced, timeout=30, what="the hung mount replaced")
        assert time.monotonic() - stopped >= 3
        assert not running(agent) and not running(daemon)
        assert (point / "hung" / "f.bin").read_bytes() == data
    finally:
        if running(agent):
            os.kill(agent, signal.SIGKILL)
        mounts.unmount_all()
        remove(config.load(overrides), "hung/f.bin")
    assert str(point) not in mounts_under(cluster_root)


def test_a_frozen_minio_delays_only_the_reads_that_need_it(mounted, live_cluster, overrides, tmp_path):
    """The MinIO holding a cold file's only copy frozen (SIGSTOP: connections accepted, nothing
    answered) while 4 readers read that file through the mount: hot files read meanwhile take
    their usual time (the reads waiting on MinIO hold no FUSE thread); thawed, the cold reads
    complete with the source's bytes."""
    point, _ = mounted
    hot = os.urandom(500_000)
    (tmp_path / "hot.bin").write_bytes(hot)
    m_hot = put(config.load(overrides), tmp_path / "hot.bin", "native/frozen-hot.bin")
    f_hot = point / "native" / "frozen-hot.bin"
    wait_until(f_hot.exists, timeout=10, what="the file in the mount")
    make_file_hot(f_hot, live_cluster, m_hot)
    cold = os.urandom(3 * 2**20)
    (tmp_path / "cold.bin").write_bytes(cold)
    cfg = config.load(overrides + ["files.chunk_mb=4", "replicas=1"])
    m = put(cfg, tmp_path / "cold.bin", "native/frozen-cold.bin")
    holder = cluster.storage_nodes(live_cluster)[m.chunk(0).nodes[0]]
    minio = ray.get(holder.status.remote())["minio_pid"]
    f_cold = point / "native" / "frozen-cold.bin"
    wait_until(f_cold.exists, timeout=10, what="the file in the mount")

    def usual() -> float:
        t = time.perf_counter()
        for _ in range(20):
            assert f_hot.read_bytes() == hot
        return (time.perf_counter() - t) / 20
    before = usual()
    got: dict[int, bytes] = {}

    def read(k: int) -> None:
        with open(f_cold, "rb") as fh:
            fh.seek(k * 2**20)
            got[k] = fh.read(2**20)
    readers = [threading.Thread(target=read, args=(k,)) for k in range(3)] + \
        [threading.Thread(target=read, args=(0,))]
    os.kill(minio, signal.SIGSTOP)
    try:
        for r in readers:
            r.start()
        time.sleep(1.0)  # the readers are waiting on the frozen MinIO
        assert any(r.is_alive() for r in readers)
        meanwhile = usual()
    finally:
        os.kill(minio, signal.SIGCONT)
    for r in readers:
        r.join(timeout=60)
    try:
        assert meanwhile < max(10 * before, 0.05), (before, meanwhile)
        assert all(got[k] == cold[k * 2**20:(k + 1) * 2**20] for k in range(3)), sorted(got)
    finally:
        remove(config.load(overrides), "native/frozen-hot.bin")
        remove(cfg, "native/frozen-cold.bin")


def resident_pages(path) -> tuple[int, int]:
    """(pages of `path` in the kernel's page cache, pages it has), by mincore(2) on a mapping of
    it: the kernel's own answer, asked without reading the file."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                             ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size, page = os.stat(path).st_size, os.sysconf("SC_PAGE_SIZE")
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)  # an open: the kernel drops the file's pages unless told to keep them
    try:
        at = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert at not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(at, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(at, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw), pages


def test_a_file_cached_here_keeps_its_pages_across_opens_until_its_chunks_change(mounted, ingest_as, live_cluster):
    """A dataset's whole-file view, every chunk in a cache of this host but not one backing file
    (no passthrough): the first open after they were all cached does not keep the kernel's pages
    (the copies are new); the next open of the same copies does (keep_cache), so a whole read
    reaches the daemon only for pages the kernel has reclaimed since; once a chunk is gone from the
    cache an open drops the pages again and reads reach the daemon."""
    point, actor = mounted
    m = ingest_as("csv", reuse=True)
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])
    homes: dict[int, list[str]] = {}
    for c in m.chunks:
        homes.setdefault(c.nodes[0], []).append(c.key)
    assert ray.get([actors[n].cache_warm.remote(keys) for n, keys in homes.items()]) == [len(k) for k in homes.values()]
    f = point / m.name / f"{m.name}.csv"
    expected = source_csv()  # gzip's read of the source files
    assert f.read_bytes() == expected  # the first open of these copies: its pages are not kept
    before = daemon_counts(actor, point, time.time())
    resident, pages = resident_pages(f)  # an open of the same copies: the pages are kept (all but a few
    assert resident >= 0.9 * pages, (resident, pages)  # this VM's DAMON pageout scheme may take meanwhile)
    assert f.read_bytes() == expected
    after = daemon_counts(actor, point, time.time())
    # the kernel's pages served the read: only a page it no longer held reaches the daemon, one READ at most
    reached = daemon_reads(after) - daemon_reads(before) + after["reads_cached"] - before["reads_cached"]
    assert reached <= pages - resident, (reached, pages - resident)
    assert after["agent_opens"] > before["agent_opens"]  # opened by the agent each time, read from the kernel's pages
    ray.get(actors[m.chunks[0].nodes[0]].cache_clear.remote())  # a chunk is no longer cached here
    assert resident_pages(f)[0] == 0  # that open dropped the pages
    assert f.read_bytes() == expected
    assert daemon_reads(daemon_counts(actor, point, time.time())) > daemon_reads(after)


def test_a_replaced_file_is_never_served_old_to_a_new_open(mounted, live_cluster, overrides, tmp_path):
    """`put` over a hot file opened by passthrough and still held: the next open, right after
    `put` returns, reads the new bytes; the held handle keeps reading the old (a snapshot)."""
    point, _actor = mounted
    cfg = config.load(overrides + ["files.chunk_mb=1"])
    versions = [os.urandom(2 * 1024 * 1024 + 7) for _ in range(2)]
    for k, v in enumerate(versions):
        (tmp_path / f"v{k}").write_bytes(v)
    m = put(cfg, tmp_path / "v0", "native/replaced.bin")
    f = point / "native" / "replaced.bin"
    try:
        wait_until(f.exists, timeout=10, what="the file in the mount")
        for k in range(1, 4):
            old, new = versions[(k - 1) % 2], versions[k % 2]
            make_file_hot(f, live_cluster, m)
            assert f.read_bytes() == old
            with open(f, "rb") as held:
                m = put(cfg, tmp_path / f"v{k % 2}", "native/replaced.bin", force=True)
                assert f.read_bytes() == new, f"replacement {k}: a new open read old bytes"
                assert held.read() == old, f"replacement {k}: the held handle changed"
    finally:
        remove(cfg, "native/replaced.bin")


def test_a_write_the_kernel_sees_is_never_served_old(mounted, ingest_as, live_cluster, cluster_root):
    """A chunk object overwritten behind FasterFS's back (same key, same length): the next open
    through the mount has the new bytes, although its old entry had been opened by passthrough."""
    point, actor = mounted
    m = ingest_as("csv")
    i = next(c.id for c in m.chunks if c.nodes[0] == 0)
    f = point / m.name / "chunks" / m.chunk(i).key.rsplit("/", 1)[-1]
    make_hot(f, actor, m.chunk(i).key)
    creds = credentials.load(Paths(cluster_root).credentials_file).admin
    minio = s3.client(live_cluster.nodes[0].endpoint, creds)
    old = minio.get_object(Bucket=m.bucket, Key=m.chunk(i).key)["Body"].read()
    assert f.read_bytes() == old
    new = b"#" * 100 + old[100:]
    minio.put_object(Bucket=m.bucket, Key=m.chunk(i).key, Body=new)
    assert f.read_bytes() == new  # at once: the kernel's stale mark refuses the old entry


def test_eviction_under_an_open_passthrough_file_keeps_its_bytes(mounted, live_cluster, overrides, tmp_path):
    point, actor = mounted
    data = os.urandom(2_000_000)
    (tmp_path / "ev.bin").write_bytes(data)
    try:
        f, m = put_hot(point, actor, overrides, tmp_path / "ev.bin", "native/ev.bin")
        before = daemon_counts(actor, point, time.time())
        with open(f, "rb") as fh:
            head = fh.read(1_000_000)
            assert ray.get(actor.cache_clear.remote()) >= 1  # the entry file is unlinked under the reader
            assert not ray.get(actor.cache_contains.remote(m.chunk(0).key))
            assert head + fh.read() == data
        after = daemon_counts(actor, point, time.time())
        assert after["passthrough_opens"] > before["passthrough_opens"]
        assert f.read_bytes() == data  # a new open: through the agent, from MinIO
    finally:
        remove(config.load(overrides), "native/ev.bin")


def test_fio_verifies_every_block_read_through_the_mount(mounted, live_cluster, overrides, tmp_path):
    """fio writes a file whose every 64 KiB block carries its CRC32C; read back through the mount,
    sequentially and at random, cold and then hot (by passthrough), fio checks each block."""
    point, _actor = mounted
    local = tmp_path / "verify.fio"
    job = ["--bs=64k", "--size=24M", "--verify=crc32c", "--ioengine=psync", "--verify_state_save=0"]
    subprocess.run(["fio", "--name=write", f"--filename={local}", "--rw=write", "--do_verify=0", *job],
                   check=True, capture_output=True, timeout=120)
    cfg = config.load(overrides + ["files.chunk_mb=8"])  # several chunks: reads cross chunk ends
    put(cfg, local, "native/verify.fio")
    try:
        f = point / "native" / "verify.fio"
        wait_until(f.exists, timeout=10, what="the file in the mount")
        for rw in ("read", "randread", "read", "randread"):
            out = subprocess.run(["fio", f"--name={rw}", f"--filename={f}", f"--rw={rw}", "--readonly", *job],
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            assert "verify" not in out.stderr.lower(), out.stderr[-2000:]
    finally:
        remove(cfg, "native/verify.fio")


def test_the_daemon_alone_against_a_scripted_agent():
    """native/ffs-mount/selftest.py: the daemon's protocol, passthrough rules, stale marks on a real
    pinned BPF map, tree updates and every way it exits, with nothing of FasterFS around it."""
    out = subprocess.run(["/usr/bin/python3", str(config.PROJECT_DIR / "native/ffs-mount/selftest.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("PASS"), out.stdout[-3000:] + out.stderr[-2000:]
