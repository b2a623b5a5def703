"""ChunkCache on its own: no root, no Ray, no kernel. LRU order, capacity under concurrent
fills, damaged and foreign files, crash consistency, reservations of fills in flight."""
import os
import random
import threading
import time

import pytest

from fasterfs.node import cache, cache_files, cache_scrub
from fasterfs.node.cache import ChunkCache
from fasterfs.read import cache_entry
from fasterfs.read.cache_entry import XATTR, Header

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


def _touch_later(c: ChunkCache, key: str, seconds: float) -> None:
    t = time.time() + seconds
    os.utime(c.path(key), (t, t))


def test_lru_evicts_the_least_recently_read(tmp_path):
    c = ChunkCache(tmp_path, capacity=3 * 100)
    for k in ("a", "b", "c"):
        assert c.put(k, k.encode() * 100)
    _touch_later(c, "a", 10)  # a was read last (readers touch on a hit)
    assert cache_entry.read_entry(c.path("b"), stale_mark=0) == b"b" * 100
    _touch_later(c, "b", 20)
    assert c.put("d", b"d" * 100)
    assert [c.contains(k) for k in "abcd"] == [True, True, False, True]  # c was the oldest


def test_scrub_keeps_the_lru_order(tmp_path):
    c = ChunkCache(tmp_path, capacity=10_000)
    c.put("a", b"x" * 100)
    before = os.stat(c.path("a")).st_mtime_ns
    time.sleep(0.02)
    assert c.scrub() == 0
    assert os.stat(c.path("a")).st_mtime_ns == before  # verifying is not reading


def test_capacity_holds_under_concurrent_fills(tmp_path):
    cap = 10 * 1000
    c = ChunkCache(tmp_path, capacity=cap)
    peak, errors, stored = [0], [], []

    def on_disk() -> int:
        total = 0
        for f in tmp_path.iterdir():
            try:
                total += f.stat().st_size
            except FileNotFoundError:  # renamed or evicted while we looked
                pass
        return total

    def fill(t):
        try:
            for i in range(50):
                stored.append(c.put(f"{t}-{i}", bytes([i % 256]) * 1000))
                peak[0] = max(peak[0], on_disk())
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(stored) >= cap // 1000 and peak[0] >= cap // 2  # fills went in (a cache refusing all would pass)...
    assert c.used <= cap and peak[0] <= cap  # ...and never past the capacity
    assert c.used == sum(f.stat().st_size for f in tmp_path.glob("*" + cache_entry.SUFFIX))


def test_contains_keeps_a_fill_in_flights_reservation(tmp_path):
    """Asking about a key being filled (the dashboard does) must not uncount the fill."""
    c = ChunkCache(tmp_path, capacity=100_000)
    name = cache_entry.entry_name("k")
    with c._lock:  # a fill that has reserved its space and is writing
        c._sizes[name] = 10
        c.used += 10
        c._writing.add(name)
    assert not c.contains("k")
    assert c.used == 10 and name in c._sizes


@pytest.mark.parametrize("damage", ["no header", "truncated header", "size of 1 TB", "short body", "foreign magic"])
def test_damaged_entries_are_named_and_dropped(tmp_path, damage):
    c = ChunkCache(tmp_path, capacity=100_000)
    c.put("k", b"y" * 500)
    path = c.path("k")
    raw, header = path.read_bytes(), bytearray(os.getxattr(path, XATTR))
    if damage == "truncated header":
        header = header[:30]
    elif damage == "size of 1 TB":
        header[8:16] = (10**12).to_bytes(8, "little")
    elif damage == "short body":
        raw = raw[:-7]
    elif damage == "foreign magic":
        header[:8] = b"NOTMINE!"

    def damaged():  # the entry's bytes, and its header unless it has none
        path.unlink(missing_ok=True)
        path.write_bytes(raw)
        if damage != "no header":
            os.setxattr(path, XATTR, bytes(header))
    damaged()
    assert cache_entry.read_entry(path, verify=False) is cache_entry.DAMAGED  # never a crash, never a wrong byte
    assert not path.exists()
    damaged()
    c.rebuild()  # a node starting on such a directory drops it too
    assert not path.exists() and c.counters["invalid_removed"] >= 1


def test_rebuild_after_an_unclean_stop_verifies_every_entry(tmp_path):
    c = ChunkCache(tmp_path, capacity=100_000)
    c.put("k", b"z" * 500)
    c.put("j", b"w" * 500)
    path = c.path("k")
    path.write_bytes(bytes(500))  # a crash left zeros where the bytes should be; header and size fine
    ChunkCache(tmp_path, capacity=100_000)  # no clean-shutdown marker: verified
    assert not path.exists() and c.path("j").exists()
    # after a clean stop, sizes are trusted (fast start) and the scrub catches the rest
    c2 = ChunkCache(tmp_path, capacity=100_000)
    c2.close()
    assert (tmp_path / cache.CLEAN).exists()
    ChunkCache(tmp_path, capacity=100_000)
    assert not (tmp_path / cache.CLEAN).exists()  # consumed: a crash from now on verifies again


def test_entries_of_another_boot_are_stale(tmp_path):
    c = ChunkCache(tmp_path, capacity=100_000)
    c.put("k", b"v" * 100)
    path = c.path("k")
    h = Header.parse(os.getxattr(path, XATTR), path.stat().st_size)
    os.setxattr(path, XATTR, Header(h.size, h.checksum, h.etag, h.fetched_ns, h.boot ^ 1).pack())
    assert cache_entry.read_entry(path) is cache_entry.STALE  # its fill time cannot be compared with this boot's marks


def test_a_keys_mark_drops_the_entry_and_a_suspect_mark_keeps_it_unserved(tmp_path):
    """The readers' rule: fetched before its key's last write: dropped; fetched before the
    bucket's suspect mark (a write nobody could name): not served, but kept for the owner's
    check. The marks are times on the clock the fill was stamped with (CLOCK_MONOTONIC)."""
    c = ChunkCache(tmp_path, capacity=100_000)
    c.put("k", b"v" * 100)
    later = time.monotonic_ns()
    assert cache_entry.read_entry(c.path("k"), stale_mark=(0, later)) is cache_entry.SUSPECT
    assert cache_entry.open_entry(c.path("k"), stale_mark=(0, later)) is None
    assert c.path("k").exists()
    assert cache_entry.read_entry(c.path("k"), stale_mark=(0, 1)) == b"v" * 100  # a mark older than the fill
    assert cache_entry.read_entry(c.path("k"), stale_mark=(later, 0)) is cache_entry.STALE
    assert not c.path("k").exists()


def test_foreign_files_are_named_and_left_alone(tmp_path, caplog):
    (tmp_path / "notes.txt").write_text("mine")
    c = ChunkCache(tmp_path, capacity=100_000)
    assert (tmp_path / "notes.txt").exists() and c.counters["foreign_files"] == 1
    assert "notes.txt" in caplog.text


def test_retain_drops_other_generations(tmp_path):
    c = ChunkCache(tmp_path, capacity=100_000)
    for k in ("d/g1/a", "d/g1/b", "d/g2/a"):
        c.put(k, b"q" * 10)
    assert c.retain(["d/g2/a"]) == 2
    assert [c.contains(k) for k in ("d/g1/a", "d/g1/b", "d/g2/a")] == [False, False, True]
    assert c.used == 10


def test_a_killed_fill_leaves_no_entry(tmp_path):
    """SIGKILL during a fill: the temp file is all that can be left, and the next start removes it."""
    c = ChunkCache(tmp_path, capacity=100_000)
    (tmp_path / f"{cache_entry.TMP_PREFIX}{cache_entry.entry_name('k')}.123.456").write_bytes(b"partial")
    c = ChunkCache(tmp_path, capacity=100_000)
    assert list(tmp_path.iterdir()) == [] and not c.contains("k")


def test_a_cancelled_fill_keeps_its_room_until_its_write_ends(tmp_path, monkeypatch):
    """clear() during a fill: the fill's bytes are on disk until its write ends, so its
    reservation must stand until then, or another fill could take the room twice."""
    c = ChunkCache(tmp_path, capacity=100_000)
    writing, release = threading.Event(), threading.Event()
    real_replace = os.replace

    def slow_replace(src, dst):
        writing.set()
        release.wait(10)
        return real_replace(src, dst)

    monkeypatch.setattr(cache_files.os, "replace", slow_replace)
    t = threading.Thread(target=c.put, args=("k", b"p" * 1000))
    t.start()
    assert writing.wait(10)
    assert c.clear() == 1
    assert c.used == 1000  # still reserved: the temp file is on disk
    release.set()
    t.join(10)
    assert c.used == 0 and not c.path("k").exists() and not list(tmp_path.iterdir())


def test_cancel_all_drops_queued_and_running_fills(tmp_path):
    """Emptying the cache cancels the fills the old epoch's heat queued: none lands afterwards."""
    from fasterfs.node.cache_filler import CacheFiller

    started, release = threading.Event(), threading.Event()

    class Getter:  # MinIO's answer, held back so fills are running or queued when cancelled
        def get(self, bucket, key):
            started.set()
            release.wait(10)
            return key.encode() * 10, f"etag-{key}"

    c = ChunkCache(tmp_path, capacity=1 << 20)
    filler = CacheFiller(c, lambda key: Getter(), "b", threads=1)
    futures = [filler.request(k, "hot") for k in ("a", "b", "c")]
    assert started.wait(10)
    assert filler.cancel_all() == 1  # "a" runs; "b" and "c" were only queued
    release.set()
    assert futures[0].result(10) is False and futures[1].cancelled() and futures[2].cancelled()
    assert not any(c.contains(k) for k in ("a", "b", "c")) and filler.pending() == 0
    filler.close()


# -- file entries: a stored file of several chunks is one local file --------------------------

def _file_manifest(sizes, key="c/f/g1/chunk-"):
    from fasterfs.core.manifest import ChunkInfo, Manifest

    chunks = [ChunkInfo(i, f"{key}{i:05d}", [0], n, 0, 0, 0.0, 0.0, 0) for i, n in enumerate(sizes)]
    return Manifest("f", "bytes", 0, 0, 0, 1, 1, "b", "g1", chunks, kind="file")


def _file_cache(tmp_path, sizes, capacity=1 << 20, **kw):
    m = _file_manifest(sizes)
    c = ChunkCache(tmp_path, capacity, **kw)
    places = cache_entry.places(m)
    c.set_places({ch.key: p for ch, p in zip(m.chunks, places)})
    blobs = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    return c, m, places, blobs


def test_a_files_chunks_fill_one_local_file_of_exactly_its_bytes(tmp_path):
    c, m, places, blobs = _file_cache(tmp_path, [4096, 4096, 1000])
    path = places[0].paths(tmp_path)[0]
    for i in (2, 0):  # out of order; chunk 1 not yet
        assert c.put(m.chunks[i].key, blobs[i])
    assert cache_entry.open_entry(path, place=places[1]) is None  # the hole is no chunk
    assert cache_entry.read_entry(path, place=places[2]) == blobs[2]
    assert c.used == 4096 + 1000 and os.stat(path).st_blocks * 512 < 9192  # sparse: unfilled takes no room
    assert c.put(m.chunks[1].key, blobs[1])
    with open(path, "rb") as f:  # the file entry is the file: what the mount hands to the kernel
        assert f.read() == b"".join(blobs)
    assert c.names() == {cache_entry.entry_name(ch.key) for ch in m.chunks}


def test_dropping_one_chunk_unlinks_the_file_entry_under_an_open_reader(tmp_path):
    evicted = []
    c, m, places, blobs = _file_cache(tmp_path, [4096, 4096], on_evict=evicted.append)
    for ch, b in zip(m.chunks, blobs):
        c.put(ch.key, b)
    path = places[0].paths(tmp_path)[0]
    with open(path, "rb") as reader:
        assert c.remove(m.chunks[1].key)
        assert not path.exists() and not path.with_suffix(cache_entry.INDEX_SUFFIX).exists()
        assert not c.contains(m.chunks[0].key) and c.used == 0
        assert evicted == [cache_entry.entry_name(m.chunks[0].key)]  # went with it: its kernel count is reset
        c.put(m.chunks[0].key, b"Z" * 4096)  # a refill makes a new file: the open one is untouched
        assert reader.read() == b"".join(blobs)


def test_a_file_entry_is_evicted_whole_and_each_chunk_reported(tmp_path):
    evicted = []
    c, m, places, blobs = _file_cache(tmp_path, [4096, 4096], capacity=2 * 4096 + 100, on_evict=evicted.append)
    for ch, b in zip(m.chunks, blobs):
        c.put(ch.key, b)
    old = time.time() - 100
    os.utime(places[0].paths(tmp_path)[0], (old, old))
    assert c.put("other", b"o" * 4096)
    assert sorted(evicted) == sorted(cache_entry.entry_name(ch.key) for ch in m.chunks)
    assert c.used == 4096 and sorted(p.name for p in tmp_path.iterdir()) == [cache_entry.entry_name("other")]


def test_rebuild_keeps_whole_chunks_of_file_entries_and_drops_rotten_ones(tmp_path):
    c, m, places, blobs = _file_cache(tmp_path, [4096, 4096, 4096])
    for ch, b in zip(m.chunks, blobs):
        c.put(ch.key, b)
    path = places[0].paths(tmp_path)[0]
    with open(path, "r+b") as f:  # a flipped byte in chunk 1; no clean-shutdown marker
        f.seek(4096 + 7)
        f.write(b"!")
    c = ChunkCache(tmp_path, 1 << 20)  # verifies every chunk: its slot would vouch for the rotten bytes
    assert c.names() == frozenset() and c.used == 0 and list(tmp_path.iterdir()) == []


def test_a_clean_restart_finds_a_file_entrys_chunks_and_a_killed_fill_leaves_none(tmp_path):
    c, m, places, blobs = _file_cache(tmp_path, [4096, 4096, 4096])
    for ch, b in zip(m.chunks[:2], blobs):
        c.put(ch.key, b)
    path = places[0].paths(tmp_path)[0]
    with open(path, "r+b") as f:  # killed after chunk 2's bytes, before its slot
        f.seek(2 * 4096)
        f.write(blobs[2])
    c.close()
    c = ChunkCache(tmp_path, 1 << 20)
    assert c.names() == {cache_entry.entry_name(ch.key) for ch in m.chunks[:2]} and c.used == 2 * 4096
    assert cache_entry.read_entry(path, place=places[2]) is None
    assert [cache_entry.read_entry(path, place=p) for p in places[:2]] == blobs[:2]


class Reads:
    """A reader's hits as readers make them (cache_entry touches the entry's mtime to now, at most
    once a second), on a clock of its own that moves 2 s per read: every hit is a touch."""

    def __init__(self, c: ChunkCache):
        self.c, self.now = c, time.time_ns()

    def hit(self, key: str) -> bool:
        """Whether `key` is cached; if so, read as a reader reads it."""
        if not self.c.contains(key):
            return False
        self.now += 2_000_000_000
        os.utime(self.c.path(key), ns=(self.now, self.now))
        return True


@pytest.mark.parametrize("policy", ["s3fifo", "lru"])
def test_a_scan_of_ten_caches_keeps_a_re_read_set_under_s3fifo(tmp_path, policy):
    """A cache of 100 entries; a hot set of 5 (5 %) read once per 150 entries of a scan that fills
    1,000 entries once each (10x the cache) and never reads them again. Under S3-FIFO the hot set
    is hit at >= 90 % of its reads; under the LRU policy (CLOCK) beside it, the scan pushes it out
    (each hit counted by looking, as a reader would, for the entry on disk)."""
    size = 256
    c = ChunkCache(tmp_path, capacity=100 * size, policy=policy)
    reads = Reads(c)
    hot = [f"hot-{i}" for i in range(5)]
    for k in hot:
        c.put(k, k.encode().ljust(size, b"."))
        reads.hit(k)
    hits = tries = 0
    for i in range(1000):
        c.put(f"scan-{i}", b"s" * size)
        if i % 150 == 149:
            for k in hot:
                tries += 1
                if reads.hit(k) and cache_entry.read_entry(c.path(k), stale_mark=0) == k.encode().ljust(size, b"."):
                    hits += 1
                else:
                    c.put(k, k.encode().ljust(size, b"."))  # a miss refills it, as the kernel's HOT would
        assert c.used <= c.capacity
    ratio = hits / tries
    if policy == "s3fifo":
        assert ratio >= 0.9, ratio
    else:
        assert ratio < 0.5, ratio  # what the small queue buys


def test_evicting_looks_at_a_few_entries_whatever_the_cache_holds(tmp_path, monkeypatch):
    """A full cache of 1,000 and of 4,000 entries (copies of one entry, found by a restart; half of
    them read since, in a random order), 200 fills each evicting one: the entries the cache stats
    per fill (counted by wrapping os.stat) stay a few at both sizes, and a removal of a key not
    cached stats nothing; capacity holds (the bytes on disk, summed with os.scandir)."""
    per_fill = {}
    stats, real_stat = [0], os.stat

    def counted(*a, **k):
        stats[0] += 1
        return real_stat(*a, **k)
    for n in (1000, 4000):
        d = tmp_path / str(n)
        one = ChunkCache(d, capacity=64)
        one.put("k0", b"x" * 64)
        header = os.getxattr(one.path("k0"), XATTR)
        for i in range(1, n):
            path = one.path(f"k{i}")
            path.write_bytes(b"x" * 64)
            os.setxattr(path, XATTR, header)
        one.close()
        c = ChunkCache(d, capacity=n * 64)
        assert c.stats()["entries"] == n
        reads = Reads(c)
        for i in random.Random(n).sample(range(n), n // 2):
            reads.hit(f"k{i}")
        stats[0] = 0
        monkeypatch.setattr(cache.os, "stat", counted)
        for i in range(200):
            c.put(f"new{i}", b"y" * 64)
        per_fill[n] = stats[0] / 200
        stats[0] = 0
        assert not c.remove("never-cached") and stats[0] == 0
        monkeypatch.setattr(cache.os, "stat", real_stat)
        assert sum(e.stat().st_size for e in os.scandir(d) if e.is_file()) <= c.capacity
    assert per_fill[4000] <= 4 and per_fill[1000] <= 4, per_fill


def test_a_budgeted_scrub_verifies_that_many_bytes_a_round_and_goes_on(tmp_path):
    """Ten entries of 1,000 bytes, one of them damaged on disk: a scrub of three small entries'
    worth a round (each counted as cache_scrub.SCRUB_ENTRY_MIN bytes: what verifying any entry costs)
    verifies three entries per round (the cache's own byte count against the entries' sizes),
    and within four rounds has found and dropped the damaged one; a whole scrub finds nothing more."""
    c = ChunkCache(tmp_path, capacity=100_000)
    for i in range(10):
        c.put(f"k{i}", bytes([i]) * 1000)
    with open(c.path("k7"), "r+b") as f:
        f.write(b"\xff")
    dropped = [c.scrub(3 * cache_scrub.SCRUB_ENTRY_MIN) for _ in range(4)]
    assert sum(dropped) == 1 and not c.contains("k7")
    assert c.stats()["scrub_bytes"] == 4 * 3000 - 2000  # the fourth round had one entry left
    assert c.scrub() == 0 and c.stats()["entries"] == 9
