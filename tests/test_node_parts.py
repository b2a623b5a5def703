"""The StorageNode's components on their own: no root, no Ray, no MinIO. Each is built as the
actor builds it, with the simulated kernel and a real cache directory; what would be a Ray call to
a peer or a request to MinIO is a plain function that records what it was asked."""
import os
import threading
import time
from types import SimpleNamespace

import pytest
import xxhash

from fasterfs.bpf.events import key_hash
from fasterfs.bpf.simulated import SimulatedPrograms
from fasterfs.control.node_directory import NodeDirectory
from fasterfs.core.errors import FasterFSError
from fasterfs.core.lease import Lease
from fasterfs.core.manifest import ChunkInfo, Manifest
from fasterfs.node import heatmap
from fasterfs.node.cache import ChunkCache, keep_capacity, kept_capacity
from fasterfs.node.cache_filler import CacheFiller
from fasterfs.node.fill_router import FillRouter
from fasterfs.node.invalidation import UNNAMED, Invalidations, WriteRouter
from fasterfs.node.minio_scrub import MinioScrub
from fasterfs.node.node_index import NodeIndex, Piece, Shard
from fasterfs.node.peer_tier import CacheNews, PeerTier
from fasterfs.node.repair import Outcome
from fasterfs.node.repair_health import Health
from fasterfs.node.repair_leader import DEFER_MAX, SURVEY_SHARE, RepairLeader, Timing
from fasterfs.read import cache_entry
from fasterfs.read.cache_entry import entry_name

pytestmark = pytest.mark.unit
BUCKET = "b"


def chunk(i: int, key: str, nodes: list[int], shards: int = 0) -> ChunkInfo:
    return ChunkInfo(i, key, nodes, 100, 0, 0, 0.0, 0.0, 1000 + i, [2000 + i * 10 + s for s in range(shards)])


def manifest(name: str, chunks: list[ChunkInfo], layout: str = "replicas", kind: str = "dataset") -> Manifest:
    ec = (2, 1) if layout == "ec" else (0, 0)
    return Manifest(name, "bytes", 0, 0, 0, 2, 3, BUCKET, "g1", chunks, kind=kind, layout=layout,
                    ec_data=ec[0], ec_parity=ec[1])


@pytest.fixture
def namespace():
    return {"rep": manifest("rep", [chunk(0, "rep/0", [0, 1]), chunk(1, "rep/1", [1, 2])]),
            "ec": manifest("ec", [chunk(0, "ec/0", [2, 0, 1], shards=3)], layout="ec"),
            "file": manifest("file", [chunk(0, "f/0", [1, 0]), chunk(1, "f/1", [2, 1])], kind="file")}


# -- NodeIndex ------------------------------------------------------------------------------

def test_node_index_names_every_object_of_every_chunk(namespace):
    index = NodeIndex.build(namespace, node=0)
    # the shard keys as MinIO holds them (fasterfs.core.erasure's naming, written out here)
    shard_keys = [f"ec/0.s{s}" for s in range(3)]
    assert index.object_keys("ec/0") == shard_keys
    assert index.object_keys("rep/0") == ["rep/0"]
    for k in shard_keys + ["ec/0"]:  # a shard's request names its chunk
        assert index.by_hash[key_hash(f"/{BUCKET}/{k}")].key == "ec/0"
    assert index.shards[shard_keys[1]] == Shard("ec/0", 1)
    assert "rep/0" not in index.shards
    assert index.by_entry[entry_name("rep/1")] == "rep/1"
    assert index.holders["rep/1"] == [1, 2]
    assert index.coded["ec/0"].data == 2 and index.coded["ec/0"].parity == 1
    # node 0's own objects: replica rep/0 (checked against its metadata), shard 1 of ec/0 (against
    # the manifest's checksum of that shard), and the file's second copy of f/0
    assert dict(index.pieces) == {"rep/0": Piece("rep", 0, None), "ec/0.s1": Piece("ec", 0, 2001),
                                  "f/0": Piece("file", 0, None)}
    assert index.resolve(key_hash(f"/{BUCKET}/rep/1")) == "chunk 1 (rep/1)"
    assert index.resolve(12345) is None


def test_node_index_places_a_files_chunks_at_its_home(namespace):
    index = NodeIndex.build(namespace, node=0)
    assert index.home_of("f/1", default=0) == 1  # the file's first chunk's first holder
    assert index.home_of("rep/1", default=0) == 0
    assert index.places["f/1"].offset == 100


def test_node_index_updated_by_changes_equals_one_built_anew(namespace):
    """Changes applied one after another (replaced, removed, added) leave the index a build from
    the final manifests makes, and the index before each change as it was."""
    def maps(index):
        return [dict(m) for m in (index.by_hash, index.by_entry, index.holders, index.shards, index.coded,
                                  index.pieces, index.places, index.names)]
    index = NodeIndex.build(namespace, node=0)
    kept = maps(index)
    rep2 = manifest("rep", [chunk(0, "rep2/0", [0, 2])])
    file2 = manifest("file2", [chunk(0, "g/0", [0, 1]), chunk(1, "g/1", [0, 2])], kind="file")
    now = index.updated([("rep", namespace["rep"], rep2), ("ec", namespace["ec"], None), ("file2", None, file2)])
    assert maps(index) == kept
    final = {"rep": rep2, "file": namespace["file"], "file2": file2}
    assert maps(now) == maps(NodeIndex.build(final, node=0))
    # the bytes node 0's objects hold, summed here from the final manifests' chunks on node 0
    assert now.placed_bytes == sum(c.bytes for m in final.values() for c in m.chunks if 0 in c.nodes) > 0


def test_the_heatmap_past_its_cells_shows_what_is_read_then_what_is_cached(namespace):
    """Past its cells a host offers the names of the chunks its kernel counted, busiest first,
    then of its newest cache entries, each whole while it fits; the dashboard takes the hosts'
    offers in turn within the cells. Expected values worked out by hand from the namespace."""
    index = NodeIndex.build(namespace, node=0)
    sizes = {n: len(m.chunks) for n, m in namespace.items()}  # rep 2, ec 1, file 2

    def offer(total, cells, counts, cached):
        return heatmap.choose(total, cells, counts, cached,
                              lambda h: index.names.get(index.by_hash[h].key) if h in index.by_hash else None,
                              lambda e: index.names.get(index.by_entry.get(e, "")), sizes.__getitem__)

    h = {k: key_hash(f"/{BUCKET}/{k}") for k in ("rep/1", "ec/0.s2", "f/0")}
    assert offer(5, 5, {h["rep/1"]: 9}, []) is None  # every chunk fits: every name
    # counted: ec (busiest, by a shard's GETs) then rep; a hash of no chunk and a cached entry
    # of no name are passed over; then the cache: file
    counts = {h["rep/1"]: 3, h["ec/0.s2"]: 7, 12345: 99}
    assert offer(6, 4, counts, ["nothing", entry_name("f/0")]) == [("ec", 1), ("rep", 2)]
    assert offer(6, 5, counts, ["nothing", entry_name("f/0")]) == [("ec", 1), ("rep", 2), ("file", 2)]
    assert offer(6, 2, {h["f/0"]: 1, h["ec/0.s2"]: 1}, []) in ([("file", 2)], [("ec", 1)])  # fills the cells
    assert offer(6, 1, {h["rep/1"]: 5}, [entry_name("ec/0")]) == [("ec", 1)]  # rep does not fit whole
    # two hosts' offers in turn within 3 cells: a's busiest, b's busiest, then what still fits
    assert heatmap.merge([[("rep", 2), ("file", 2)], [("ec", 1), ("rep", 2)]], 3) == ["ec", "rep"]
    assert heatmap.merge([[("file", 2)], [("rep", 2)]], 3) == ["file"]


def test_node_index_cannot_be_changed_in_place(namespace):
    index = NodeIndex.build(namespace, node=0)
    with pytest.raises(TypeError):
        index.holders["x"] = [0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        index.node = 3  # type: ignore[misc]


# -- Invalidations ----------------------------------------------------------------------------

class Node:
    """One node's cache, simulated kernel and filler, with what it asked its peers recorded."""

    def __init__(self, tmp_path, namespace, node: int = 0, watch_any: bool = False):
        self.kernel = SimulatedPrograms(hot_threshold=2)
        self.cache = ChunkCache(tmp_path / f"cache{node}", capacity=10_000)
        self.filler = CacheFiller(self.cache, lambda key: None, BUCKET, threads=1)
        self.fills: list[tuple[str, str]] = []
        self.told: list[list] = []
        self.seen: list[list[float]] = []  # when each told write was last seen (time.monotonic)
        self.suspected: list[bool] = []  # from_peer of each call for a check of every entry
        self.verified: list[list[str]] = []  # keys whose entries were to be checked against their holders
        self.index = NodeIndex.build(namespace, node)
        self.inv = Invalidations(node, BUCKET, self.kernel, self.cache, self.filler, watch_any,
                                 lambda key, why: self.fills.append((key, why)),
                                 lambda batch, seen: (self.told.append(batch), self.seen.append(seen)),
                                 self.suspected.append, self.verified.append)

    def event(self, type_: str, method: str, path: str) -> None:
        self.inv.on_kernel_event({"type": type_, "method": method, "path": path, "key": key_hash(path)}, self.index)


def test_hot_replica_becomes_a_fill(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    n.event("HOT", "GET", f"/{BUCKET}/rep/1")
    assert n.fills == [("rep/1", "hot")]


def test_hot_shard_is_filled_by_its_chunks_first_holder_only(tmp_path, namespace):
    first, other = Node(tmp_path, namespace, node=2), Node(tmp_path, namespace, node=0)
    for n in (first, other):
        n.event("HOT", "GET", f"/{BUCKET}/ec/0.s1")
    assert first.fills == [("ec/0", "hot")]  # node 2 holds shard 0
    assert other.fills == []
    everyone = Node(tmp_path, namespace, node=0, watch_any=True)  # readers' own GETs: their own fill
    everyone.event("HOT", "GET", f"/{BUCKET}/ec/0.s1")
    assert everyone.fills == [("ec/0", "hot")]


def test_a_write_drops_the_entry_resets_its_count_and_is_told_once(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    path = f"/{BUCKET}/rep/0"
    assert n.cache.put("rep/0", b"x" * 100)
    n.kernel.count_reported("GET", path, 9000)
    assert n.kernel.key_count(key_hash(path)) == 1
    n.event("STALE", "PUT", path)
    time.sleep(0.01)
    last = time.monotonic()
    n.event("STALE", "PUT", path)  # the commit, say, after the request line
    assert not n.cache.contains("rep/0")
    assert n.kernel.key_count(key_hash(path)) == 0
    assert n.inv.recent == {entry_name("rep/0"): heatmap.STALE}
    assert n.inv.send(wait_s=0) == 1  # two writes of one key: one entry in one batch
    assert n.told == [[(key_hash(path), "rep/0")]]
    assert last <= n.seen[0][0] <= time.monotonic()  # its last event's time: a late tell's age counts from it
    assert n.inv.send(wait_s=0) == 0 and len(n.told) == 1


def test_a_shard_write_drops_its_chunk(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    assert n.cache.put("ec/0", b"y" * 100)
    n.event("STALE", "PUT", f"/{BUCKET}/ec/0.s2")
    assert not n.cache.contains("ec/0")
    n.inv.send(wait_s=0)
    assert n.told == [[(key_hash(f"/{BUCKET}/ec/0"), "ec/0")]]  # told by the chunk's name


def test_a_multi_delete_keeps_the_cache_and_has_every_entry_checked(tmp_path, namespace):
    """DeleteObjects names its keys only in its body: nothing is dropped on its word; the entries
    are checked against MinIO (MarkKeeper), and the peers are told by the keeper, not here."""
    n = Node(tmp_path, namespace)
    n.cache.put("rep/0", b"x" * 100)
    epoch = n.kernel.epoch
    n.event("STALE", "POST", f"/{BUCKET}")
    assert n.cache.contains("rep/0") and n.kernel.epoch == epoch
    assert n.suspected == [False] and n.inv.send(wait_s=0) == 0


def test_a_peers_unnamed_write_has_entries_checked_here_and_is_not_told_back(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    n.cache.put("rep/0", b"x" * 100)
    n.inv.invalidate([(key_hash(f"/{BUCKET}"), None)])
    assert n.cache.contains("rep/0") and n.suspected == [True] and n.inv.last is not None
    assert n.inv.send(wait_s=0) == 0


def test_other_buckets_and_cut_paths_are_ignored(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    n.cache.put("rep/0", b"x" * 100)
    n.event("STALE", "PUT", "/other/rep/0")
    n.inv.on_kernel_event({"type": "STALE", "method": "PUT", "path": f"/{BUCKET}/rep/0", "key": 7}, n.index)
    assert n.cache.contains("rep/0") and n.fills == [] and n.inv.send(wait_s=0) == 0


def test_a_peers_write_is_dropped_here_and_not_told_back(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    n.cache.put("rep/1", b"z" * 100)
    n.inv.invalidate([(key_hash(f"/{BUCKET}/rep/1"), "rep/1")])
    assert not n.cache.contains("rep/1") and n.inv.last is not None
    assert n.inv.send(wait_s=0) == 0


def test_a_write_told_late_checks_a_copy_fetched_before_it_and_keeps_one_fetched_after(tmp_path, namespace):
    """Told of writes seen at most 5 s ago (a peer heard of this node's fills after it saw the
    writes): rep/0's copy, whose GET began 10 s ago, may be older than its write and is checked
    against its holders; rep/1's, begun 1 s ago, is newer and stays unchecked."""
    n = Node(tmp_path, namespace)
    now = time.monotonic_ns()
    n.cache.put("rep/0", b"y" * 100, fetched_ns=now - 10_000_000_000)
    n.cache.put("rep/1", b"z" * 100, fetched_ns=now - 1_000_000_000)
    n.inv.invalidate([(key_hash(f"/{BUCKET}/rep/0"), "rep/0"), (key_hash(f"/{BUCKET}/rep/1"), "rep/1")],
                     ages_s=[5.0, 5.0])
    assert n.verified == [["rep/0"]] and n.cache.read("rep/1") == b"z" * 100


def test_an_evicted_shard_chunk_can_become_hot_again(tmp_path, namespace):
    n = Node(tmp_path, namespace)
    for s in range(3):
        n.kernel.count_reported("GET", f"/{BUCKET}/ec/0.s{s}", 9000)
    n.inv.on_evict(entry_name("ec/0"), n.index)
    assert n.kernel.all_counts() == {}
    assert n.inv.recent[entry_name("ec/0")] == heatmap.EVICTED


def test_replacing_a_generation_marks_its_chunks(tmp_path, namespace):
    marked = []
    n = Node(tmp_path, namespace)
    n.kernel.marks.mark_stale = marked.append  # the simulated kernel keeps no marks: record them
    old = namespace["rep"]
    n.inv.mark_replaced(old, old)  # the same generation: nothing
    assert marked == []
    n.inv.mark_replaced(old, None)
    assert marked == [key_hash(f"/{BUCKET}/rep/0"), key_hash(f"/{BUCKET}/rep/1")]


# -- PeerTier -----------------------------------------------------------------------------

def test_peer_tier_tells_what_changed_and_nothing_while_nothing_does(tmp_path):
    """At the start a node asks the others for their caches and tells them all of its own; then
    each share tells what was filled and what went since the last (the set the caches hold, read
    with os.listdir, is what a peer ends up with), and nothing while nothing changes."""
    c = ChunkCache(tmp_path, capacity=10_000)
    told, asked, reconnects = [], [], []
    tier = PeerTier(0, c, lambda news, to: told.append((news, to)), asked.append,
                    lambda: reconnects.append(1), reconnect_s=30)
    assert tier.share(now=0.0) and asked == [None] and reconnects == [1]
    assert told[-1][0].since is None and told[-1][0].added == frozenset()
    assert not tier.share(now=1.0) and len(told) == 1
    for k in ("a", "b", "c"):
        c.put(k, b"1" * 10)
    assert tier.share(now=2.0)
    c.remove("b")
    assert tier.share(now=3.0) and not tier.share(now=4.0)
    peer = PeerTier(1, ChunkCache(tmp_path / "peer", capacity=10_000), lambda news, to: None)
    for news, _ in told:
        peer.heard(news)
    on_disk = {n for n in os.listdir(tmp_path) if n.endswith(cache_entry.SUFFIX)}
    view = peer.peers[0][2]
    assert view.count == len(on_disk) == 2 and view.found(on_disk) == 2 and entry_name("b") not in view
    assert [len(n.added) + len(n.removed) for n, _ in told[1:]] == [3, 1]  # the changes, not the cache
    assert tier.share(now=40.0) is False and reconnects == [1, 1]  # handles looked up again, nothing sent


def test_a_delta_names_only_what_changed_across_it(tmp_path):
    """An entry filled and dropped between two shares is in neither list (a peer's filter would
    otherwise take away a name it never had), nor is one dropped and filled again."""
    c = ChunkCache(tmp_path, capacity=10_000)
    c.put("kept", b"1" * 10)
    c.put("refilled", b"1" * 10)
    version = c.changes_since(0)[0]
    c.put("came-and-went", b"1" * 10)
    c.remove("came-and-went")
    c.remove("refilled")
    c.put("refilled", b"2" * 10)
    c.remove("kept")
    c.put("new", b"1" * 10)
    _, added, removed = c.changes_since(version)
    assert added == [entry_name("new")] and removed == [entry_name("kept")]


def test_a_peer_that_missed_news_or_restarted_asks_for_everything(tmp_path):
    c = ChunkCache(tmp_path, capacity=10_000)
    told = []
    tier = PeerTier(0, c, lambda news, to: told.append(news))
    tier.share(now=0.0)
    asked = []
    peer = PeerTier(1, ChunkCache(tmp_path / "peer", capacity=10_000), lambda news, to: None, asked.append)
    peer.heard(told[0])
    c.put("a", b"1" * 10)
    tier.share(now=1.0)  # lost on the way
    c.put("b", b"1" * 10)
    tier.share(now=2.0)
    peer.heard(told[-1])
    assert asked == [0] and peer.holders("a") == []  # a gap: it asks, and trusts nothing of the delta
    tier.tell_all(1)
    peer.heard(told[-1])
    assert peer.holders("a") == peer.holders("b") == [0]
    restarted = PeerTier(0, ChunkCache(tmp_path, capacity=10_000), lambda news, to: told.append(news))
    restarted.cache.put("c", b"1" * 10)
    restarted.share(now=0.0)  # a new incarnation's first news is everything
    peer.heard(told[-1])
    assert peer.holders("c") == [0] and asked == [0]


def test_a_peers_view_that_outgrows_its_filter_asks_for_everything(tmp_path):
    asked = []
    tier = PeerTier(1, ChunkCache(tmp_path, capacity=10_000), lambda news, to: None, asked.append)
    tier.heard(CacheNews(0, "e0", None, 1, frozenset()))
    small = tier.peers[0][2]
    names = frozenset(f"{i:032x}.chunk" for i in range(small.capacity + 1))
    tier.heard(CacheNews(0, "e0", 1, 2, names))
    assert asked == [0] and small.found(names) == len(names)  # still right meanwhile, just less sharp
    tier.heard(CacheNews(0, "e0", 2, 3, frozenset({"one-more.chunk"})))
    assert asked == [0]  # asked once
    tier.heard(CacheNews(0, "e0", None, 3, names | {"one-more.chunk"}))
    grown = tier.peers[0][2]
    assert grown.capacity > small.capacity and not grown.full() and grown.count == len(names) + 1


def _peers_of(tmp_path, holding: dict[int, list[str]]) -> tuple[dict, dict, list]:
    """Real caches at the given nodes holding the given keys; their PeerTiers; the news those told."""
    caches = {n: ChunkCache(tmp_path / f"n{n}", capacity=100_000) for n in holding}
    news = []
    tiers = {n: PeerTier(n, c, lambda m, to: news.append(m)) for n, c in caches.items()}
    for n, keys in holding.items():
        for k in keys:
            caches[n].put(k, b"1" * 10)
        tiers[n].share(now=0.0)
    return caches, tiers, news


def test_a_write_is_told_only_to_the_nodes_whose_caches_may_hold_its_key(tmp_path):
    """A write of a key cached at node 1 goes to node 1; of a key no cache holds, to nobody but a
    node whose cache this one was never told of (node 3); a write nobody could name, to every node.
    Who holds what is read from the caches' directories with os.listdir."""
    caches, _, news = _peers_of(tmp_path, {1: ["held"], 2: ["other"]})
    router = WriteRouter(PeerTier(0, ChunkCache(tmp_path / "n0", capacity=100), lambda m, to: None), window_s=60)
    for m in news:
        assert router.heard(m, now=0.0) == []
    held = {n: set(os.listdir(c.dir)) for n, c in caches.items()}
    assert [n for n in (1, 2) if entry_name("held") in held[n]] == [1]
    writes = [(key_hash("/b/held"), "held"), (key_hash("/b/new"), "new"), (7, None)]
    got = router.route(writes, [1, 2, 3], seen=[1.0] * 3)
    assert got == {1: [writes[0], writes[2]], 2: [writes[2]], 3: writes}
    assert router.counters == {"writes": 3, "told": 6, "told_late": 0, "to_every_node": 1}


def test_a_fill_heard_of_after_its_keys_write_is_told_of_it_once(tmp_path):
    """Node 1 fills "k" (its GET may have begun before the write) but tells its peers only at its
    next share, after node 0 routed the write: hearing it, node 0 tells node 1 of the write then,
    once, with how long ago it routed the write; a fill heard of after `window_s` is not told (its
    kernel has let the mark go as well)."""
    caches, tiers, news = _peers_of(tmp_path, {1: []})
    router = WriteRouter(PeerTier(0, ChunkCache(tmp_path / "n0", capacity=100), lambda m, to: None), window_s=60)
    router.heard(news.pop(), now=0.0)
    write, late_write = (key_hash("/b/k"), "k"), (key_hash("/b/late"), "late")
    assert router.route([write], [1], seen=[1.0]) == {}
    router.route([late_write], [1], seen=[2.0])
    caches[1].put("k", b"1" * 10)
    tiers[1].share(now=1.5)
    assert router.heard(news.pop(), now=1.5) == [(write, 0.5)]  # seen half a second before
    caches[1].remove("k")
    caches[1].put("k", b"2" * 10)  # filled again after being told: fresh
    tiers[1].tell_all(0)
    assert router.heard(news.pop(), now=1.7) == []
    caches[1].put("late", b"1" * 10)
    tiers[1].share(now=70.0)
    assert router.heard(news.pop(), now=70.0) == [] and router.counters["told_late"] == 1


def test_a_peer_whose_news_has_a_gap_hears_every_write_until_told_everything(tmp_path):
    caches, tiers, news = _peers_of(tmp_path, {1: []})
    asked = []
    router = WriteRouter(PeerTier(0, ChunkCache(tmp_path / "n0", capacity=100), lambda m, to: None, asked.append),
                         window_s=60)
    router.heard(news.pop(), now=0.0)
    write = (key_hash("/b/k"), "k")
    assert router.route([write], [1], seen=[0.5]) == {}
    caches[1].put("k", b"1" * 10)
    tiers[1].share(now=1.0)
    news.pop()  # lost
    caches[1].put("j", b"1" * 10)
    tiers[1].share(now=2.0)
    assert router.heard(news.pop(), now=2.0) == [] and asked == [1]  # a gap: nothing of it believed
    assert router.route([write], [1], seen=[2.5]) == {1: [write]}  # so node 1 may hold anything
    tiers[1].tell_all(0)
    assert router.heard(news.pop(), now=3.0) == []  # told already, in the route above
    assert router.route([(key_hash("/b/x"), "x")], [1], seen=[3.5]) == {}


def test_writes_past_what_the_router_keeps_have_gainers_check_everything(tmp_path):
    caches, tiers, news = _peers_of(tmp_path, {1: []})
    router = WriteRouter(PeerTier(0, ChunkCache(tmp_path / "n0", capacity=100), lambda m, to: None),
                         window_s=60, max_kept=2)
    router.heard(news.pop(), now=0.0)
    router.route([(key_hash(f"/b/{k}"), k) for k in "abc"], [1], seen=[1.0] * 3)  # "a" let go
    caches[1].put("z", b"1" * 10)
    tiers[1].share(now=2.0)
    assert router.heard(news.pop(), now=2.0) == [(UNNAMED, 0.0)]  # gained something: "a" cannot be ruled out
    caches[1].put("x", b"1" * 10)
    tiers[1].share(now=3.0)
    assert router.heard(news.pop(), now=3.0) == []  # told once: what it fetched before then is checked
    router.route([(key_hash("/b/d"), "d")], [1], seen=[4.0])  # "b" let go
    caches[1].put("w", b"1" * 10)
    tiers[1].share(now=5.0)
    assert router.heard(news.pop(), now=5.0) == [(UNNAMED, 0.0)]
    caches[1].put("y", b"1" * 10)
    tiers[1].share(now=65.0)
    assert router.heard(news.pop(), now=65.0) == []


def test_peer_tier_knows_where_a_key_is_cached(tmp_path):
    c = ChunkCache(tmp_path, capacity=10_000)
    tier = PeerTier(1, c, lambda news, to: None)
    c.put("k", b"1" * 10)
    tier.heard(CacheNews(3, "e3", None, 1, frozenset({entry_name("k")})))
    tier.heard(CacheNews(0, "e0", None, 2, frozenset({entry_name("k"), entry_name("j")})))
    assert tier.holders("k") == [1, 0, 3]
    assert tier.holders("j") == [0]
    assert tier.read("k") == b"1" * 10 and tier.read("j") is None


# -- RepairLeader -------------------------------------------------------------------------------

class Cluster:
    """Three nodes whose MinIOs answer as `alive` says; surveys and repairs recorded."""

    def __init__(self, degraded: bool = False):
        self.alive, self.version, self.repairs, self.surveys = {0, 1, 2}, 1, [], 0
        self.trusted: list[set[int]] = []  # the nodes each look believed, not listed
        self.degraded = degraded
        self.lost = False  # the degraded chunk has too few pieces left to rebuild it
        self.waits = False  # the degraded chunk misses only a piece of a node waited for
        self.left: list[int] = []  # nodes the data names that are not part of the cluster
        self.now = 0.0
        self.lease = Lease(lambda: self.now)  # the Registry's, on a clock of the test's
        self.sees: dict[int, set[int]] = {}  # what a node's probes see, when not `alive` (a partition)
        self.epochs: list[int] = []
        self.checks: list[int] = []  # the versions checks were asked since
        self.changed_degraded = False  # what a check of the changed names finds
        self.log_reaches = True        # the store's log still reaches back to the last look

    def health(self) -> Health:
        return Health(chunks=4, degraded={"d": [0]} if self.degraded else {}, lost={"d": [0]} if self.lost else {},
                      repairable=int(self.degraded and not self.lost and not self.waits),
                      nodes_down=sorted(set(self.left) | ({0, 1, 2} - self.alive)))

    def leader(self, node: int, auto: bool = True) -> RepairLeader:
        def survey(trusted: frozenset[int]) -> Health:
            self.surveys += 1
            self.trusted.append(set(trusted))
            return self.health()

        def repair(waiting: set[int], epoch: int, trusted: frozenset[int]) -> Outcome:
            self.repairs.append(set(waiting))
            self.trusted.append(set(trusted))
            self.epochs.append(epoch)
            return Outcome(self.health())
        def check(since: int) -> tuple[int, Health] | None:
            self.checks.append(since)
            if not self.log_reaches:
                return None
            return self.version, Health(chunks=1, degraded={"new": [0]} if self.changed_degraded else {})
        return RepairLeader(node, Timing(check_s=1, after_s=10, survey_s=100, auto=auto),
                            lambda: ([0, 1, 2], set(self.sees.get(node, self.alive))), lambda: self.version, survey,
                            check, repair, lambda ttl_s: self.lease.acquire(node, ttl_s))


def test_only_the_lowest_answering_node_leads():
    c = Cluster()
    assert c.leader(1).tick(0) == "follow"
    c.alive = {1, 2}
    assert c.leader(1).tick(0) == "repair"
    assert c.leader(2).tick(0) == "follow"


def test_a_node_down_for_less_than_after_s_keeps_its_pieces():
    c = Cluster()
    leader = c.leader(0)
    c.alive = {0, 1}
    assert leader.tick(0) == "repair" and c.repairs[-1] == {0, 1, 2}  # node 2 waited for
    assert leader.tick(5) == "wait"                                    # nothing changed
    assert leader.tick(11) == "repair" and c.repairs[-1] == {0, 1}     # gone: its pieces rebuilt
    c.alive = {0, 1, 2}
    assert leader.tick(12) == "repair" and c.repairs[-1] == {0, 1, 2}  # back


def test_a_node_no_longer_in_the_cluster_keeps_its_pieces_for_after_s_too():
    """A host left out at `up` is in no probe, only in the data: it waits like a down node."""
    c = Cluster()
    c.left = [3]
    leader = c.leader(0)
    assert leader.tick(0) == "repair" and c.repairs[-1] == {0, 1, 2, 3}
    assert leader.tick(11) == "repair" and c.repairs[-1] == {0, 1, 2}  # gone: its pieces rebuilt


def test_a_leader_surveys_again_on_nodes_changing_on_findings_and_when_due():
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair"
    assert leader.tick(1) == "wait"
    c.alive = {0, 1}  # a node stopped answering
    assert leader.tick(2) == "repair"
    c.alive = {0, 1, 2}
    assert leader.tick(3) == "repair"
    c.degraded = True  # found only by a survey, which is due after survey_s
    assert leader.tick(50) == "wait"
    assert leader.tick(150) == "repair"
    assert leader.tick(151) == "repair"  # not settled: it keeps going while there is work
    c.degraded = False
    assert leader.tick(152) == "repair" and leader.tick(153) == "wait"


def test_a_change_of_the_nodes_alone_believes_the_nodes_listed_before():
    """A node lost (then gone after after_s) is repaired by what the namespace places on it:
    the nodes listed by the first look and answering since are believed, not listed; a node
    back is listed (it may be empty), the others still believed; a look due, or a repair that
    failed, lists every node again; and names changed meanwhile are still checked."""
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair" and c.trusted == [set(), set()]      # the first looks list all
    c.alive = {0, 1}
    assert leader.tick(1) == "repair" and c.trusted[-1] == {0, 1}          # node 2 down: waited for
    assert leader.tick(12) == "repair" and c.repairs[-1] == {0, 1} and c.trusted[-1] == {0, 1}  # gone
    c.alive = {0, 1, 2}
    assert leader.tick(13) == "repair" and c.trusted[-1] == {0, 1}         # back: listed, 0 and 1 not
    c.alive = {0, 2}
    assert leader.tick(14) == "repair" and c.trusted[-1] == {0, 2}         # 2 was listed when it came back
    c.version = 2  # a name changed while node 1 was down: checked from the version seen before it
    c.alive = {0, 1, 2}
    assert leader.tick(15) == "repair" and c.trusted[-1] == {0, 2}
    assert leader.tick(16) == "check" and c.checks == [1]
    assert leader.tick(150) == "repair" and c.trusted[-1] == set()         # the periodic survey lists all


def test_a_repair_that_believed_nodes_and_failed_is_surveyed_whole():
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair"
    c.alive = {0, 1}
    outcomes = [Outcome(c.health(), failed=["d chunk 0: no replica readable"])]
    real = leader.repair
    leader.repair = lambda waiting, epoch, trusted: outcomes.pop() if outcomes else real(waiting, epoch, trusted)
    assert leader.tick(1) == "repair" and c.trusted[-1] == set() and c.surveys == 2  # the survey after: whole
    assert leader.repairs[-1]["failed"]


def test_a_node_waited_for_does_not_keep_the_leader_looking():
    """A node down for less than after_s leaves its chunks degraded, with nothing a repair may do
    until it is back or gone: the leader looks once, then waits for that change."""
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair"
    c.alive, c.degraded, c.waits = {0, 1}, True, True
    assert leader.tick(1) == "repair" and leader.tick(2) == "wait" and leader.tick(5) == "wait"
    assert len(c.repairs) == 2
    c.waits = False  # gone after after_s: its pieces are rebuilt elsewhere
    assert leader.tick(12) == "repair" and c.repairs[-1] == {0, 1}


def test_lost_chunks_alone_do_not_keep_the_leader_surveying():
    """A chunk with too few pieces to rebuild is left as it is: the leader looks again when the
    nodes change (one coming back may hold its pieces) or a survey is due, not every round."""
    c = Cluster(degraded=True)
    c.lost = True
    leader = c.leader(0)
    assert leader.tick(0) == "repair"
    assert leader.tick(1) == "wait" and leader.tick(50) == "wait" and len(c.repairs) == 1
    c.alive = {0, 1}
    assert leader.tick(51) == "repair"
    assert leader.tick(52) == "wait"


def test_a_change_of_the_namespace_alone_is_checked_not_surveyed():
    """The names changed since the last look are checked (the version it saw asked); a survey
    and a repair follow only when the check finds something, or cannot tell."""
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair" and len(c.repairs) == 1
    c.version = 2
    assert leader.tick(1) == "check" and c.checks == [1] and len(c.repairs) == 1
    assert leader.health is not None and leader.health["changes_checked"]["version"] == 2
    assert leader.tick(2) == "wait" and c.checks == [1]  # nothing new
    c.version, c.changed_degraded = 3, True  # a write published with a piece missing
    assert leader.tick(3) == "repair" and c.checks == [1, 2] and len(c.repairs) == 2
    c.version, c.changed_degraded, c.log_reaches = 4, False, False  # the log no longer reaches back
    assert leader.tick(4) == "repair" and len(c.repairs) == 3
    c.version, c.log_reaches = 5, True
    assert leader.tick(5) == "check"
    c.version = 6
    assert leader.tick(200) == "check"  # a survey due after survey_s waits while the namespace changes ...
    assert leader.tick(200 + leader.timing.quiet_s) == "repair"  # ... until it rests


def test_a_periodic_survey_waits_for_the_namespace_to_rest_but_not_for_ever():
    """A load changes the namespace every tick: each change is checked, the periodic survey
    (due after survey_s=100) waits, and comes at DEFER_MAX times its spacing regardless."""
    c = Cluster()
    leader = c.leader(0)
    assert leader.tick(0) == "repair"
    t = 0
    while t < 100 * DEFER_MAX - 10:
        t += 10
        c.version += 1
        assert leader.tick(t) == "check", t
    c.version += 1
    assert leader.tick(100 * DEFER_MAX) == "repair"


def test_a_survey_that_takes_long_comes_less_often():
    """Due every survey_s (100 here), or every 1/SURVEY_SHARE of its own duration when longer:
    a survey of 0.3 s (6 s at the share) waits past survey_s=0.1's due."""
    c = Cluster()

    def slow_repair(waiting: set[int], epoch: int, trusted: frozenset[int]) -> Outcome:
        time.sleep(0.3)  # on the real clock: what the leader measures
        return Outcome(c.health())
    leader = RepairLeader(0, Timing(check_s=1, after_s=10, survey_s=0.1, auto=True, quiet_s=0),
                          lambda: ([0, 1, 2], set(c.alive)), lambda: c.version, lambda trusted: c.health(),
                          lambda since: None,
                          slow_repair, lambda ttl_s: c.lease.acquire(0, ttl_s))
    assert leader.tick(0) == "repair"
    assert 0.3 / SURVEY_SHARE > 1.0  # the share's spacing, past survey_s and the next tick
    assert leader.tick(1.0) == "wait"
    assert leader.tick(0.3 / SURVEY_SHARE + 1) == "repair"


def test_surveys_asked_for_while_one_runs_share_the_next():
    """A survey under way when `status` asks again began before the ask: it is not the answer.
    Three callers waiting behind it get one new survey between them (not three), and a caller
    after that gets a new one again."""
    running, release, calls = threading.Event(), threading.Event(), []

    def survey() -> Health:
        calls.append(len(calls))
        if len(calls) == 1:
            running.set()
            release.wait(10)
        return Health(chunks=len(calls))
    leader = RepairLeader(0, Timing(check_s=1, after_s=10, survey_s=100, auto=True), lambda: ([0], {0}),
                          lambda: 0, lambda trusted: survey(), lambda since: None,
                          lambda waiting, epoch, trusted: Outcome(Health()),
                          lambda ttl_s: 1)
    got: list[dict] = []
    first = threading.Thread(target=lambda: got.append(leader.survey_now()))
    first.start()
    assert running.wait(10)
    waiting = [threading.Thread(target=lambda: got.append(leader.survey_now())) for _ in range(3)]
    for t in waiting:
        t.start()
    time.sleep(0.2)  # all three asked while the first ran
    release.set()
    for t in [first, *waiting]:
        t.join(10)
    assert len(calls) == 2 and sorted(g["chunks"] for g in got) == [1, 2, 2, 2]
    assert leader.survey_now()["chunks"] == 3 and leader.health["chunks"] == 3


def test_one_leader_across_a_partition_and_a_new_epoch_after_it():
    """Nodes 0 and 1 cut from each other: each sees itself as the lowest answering node, but only
    the lease's holder leads; when it stops renewing (cut off from the Registry), node 1 takes
    over after the lease's time, under a new epoch, and node 0's old epoch is no longer valid."""
    c = Cluster()
    c.sees = {0: {0, 2}, 1: {1, 2}}
    zero, one = c.leader(0), c.leader(1)
    assert zero.tick(0) == "repair" and one.tick(0) == "follow"
    c.now = 2.0
    assert zero.tick(2) == "wait" and one.tick(2) == "follow"  # renewed: still node 0's
    c.now = 2.0 + 3 * 1 + 0.1  # node 0 silent for longer than the lease (3 checks)
    assert one.tick(5.1) == "repair" and c.epochs == [1, 2]
    assert not c.lease.valid(0, 1) and c.lease.valid(1, 2)
    assert zero.tick(5.2) == "follow"  # node 0 is back in touch: the lease is node 1's now


def test_a_lease_is_one_holders_until_it_expires():
    now = [0.0]
    lease = Lease(lambda: now[0])
    assert lease.acquire(0, 10) == 1 and lease.acquire(1, 10) is None and lease.acquire(0, 10) == 1
    now[0] = 9.9
    assert lease.valid(0, 1) and lease.acquire(1, 10) is None
    now[0] = 20.0  # expired: node 0's epoch is not valid any more, node 1 gets a new one
    assert not lease.valid(0, 1) and lease.acquire(1, 10) == 2 and lease.acquire(0, 10) is None


def test_without_auto_repair_the_leader_only_surveys():
    c = Cluster()
    leader = c.leader(0, auto=False)
    assert leader.tick(0) == "survey" and c.surveys == 1 and c.repairs == []
    assert leader.health is not None and leader.health["chunks"] == 4


# -- MinioScrub ---------------------------------------------------------------------------------

class Store:
    """Objects as MinIO would return them: bytes and their headers."""

    def __init__(self, objects: dict[str, tuple[bytes, dict]]):
        self.objects, self.closed, self.asked = objects, False, []

    def get_object(self, bucket: str, key: str):
        self.asked.append(key)
        if key not in self.objects:
            raise KeyError(key)
        return self.objects[key]

    def close(self) -> None:
        self.closed = True


def test_minio_scrub_finds_rotten_bytes_and_missing_objects_and_asks_for_a_rebuild():
    good, shard = b"a" * 1000, b"b" * 500
    rotten = bytearray(shard)
    rotten[7] ^= 1
    objects = {"rep/0": (good, {"x-amz-meta-xxh3": str(xxhash.xxh3_64_intdigest(good))}),
               "ec/0.s1": (bytes(rotten), {})}
    store = Store(objects)
    asked = []

    def rebuild(pieces, chunks):
        asked.append((pieces, chunks))
        return len(chunks)
    scrub = MinioScrub(0, BUCKET, 0, lambda: store, rebuild)
    pieces = {"rep/0": Piece("rep", 0, None), "ec/0.s1": Piece("ec", 0, xxhash.xxh3_64_intdigest(shard)),
              "gone/0": Piece("gone", 0, None)}
    out = scrub.scrub(pieces)
    assert out == {"checked": 2, "bytes": 1500, "bad": ["ec/0.s1"], "missing": ["gone/0"], "repaired": 2}
    assert asked == [({(0, "ec/0.s1"), (0, "gone/0")}, {"ec": {0}, "gone": {0}})]
    assert store.closed and scrub.totals["passes"] == 1 and (scrub.totals["bad"], scrub.totals["missing"]) == (1, 1)
    assert sorted(store.asked) == sorted(pieces)  # every piece of this node asked for once, the missing one too
    # "gone/0" no longer the node's by the time it is found missing (its name removed meanwhile):
    # not taken for a loss, nothing rebuilt for it
    now = {k: p for k, p in pieces.items() if k != "gone/0"}
    out = scrub.scrub(pieces, current=lambda: now)
    assert out["missing"] == [] and asked[-1] == ({(0, "ec/0.s1")}, {"ec": {0}})


def test_minio_scrub_stops_when_asked():
    stopping = threading.Event()
    stopping.set()
    scrub = MinioScrub(0, BUCKET, 0, lambda: Store({"k": (b"x", {})}), lambda p, c: 0)
    assert scrub.scrub({"k": Piece("n", 0, None)}, stopping)["checked"] == 0


def test_minio_scrub_takes_at_most_its_share_of_the_time():
    """Each GET (here 20 ms, as a busy MinIO's) is followed by a rest: five at share 0.25 take
    at least 5 x 20 ms / 0.25 of wall-clock time, by the monotonic clock."""
    class Slow(Store):
        def get_object(self, bucket, key):
            time.sleep(0.02)
            return super().get_object(bucket, key)
    keys = [f"k{i}" for i in range(5)]
    scrub = MinioScrub(0, BUCKET, 0, lambda: Slow({k: (b"x", {}) for k in keys}), lambda p, c: 0)
    began = time.monotonic()
    assert scrub.scrub({k: Piece("n", 0, None) for k in keys}, share=0.25)["checked"] == 5
    assert time.monotonic() - began >= 5 * 0.02 / 0.25


def test_a_pacer_rests_in_proportion_to_each_step():
    from fasterfs.core.pace import Pacer

    rests: list[float] = []
    pacer = Pacer(0.25, rests.append)
    for _ in range(3):
        began = time.monotonic()
        with pacer.step():
            time.sleep(0.01)
        took = time.monotonic() - began
        assert took * 3 * 0.9 <= rests[-1] <= took * 3 * 1.1  # 1 / 0.25 - 1
    with Pacer(1.0, rests.append).step():
        pass
    assert len(rests) == 3  # share 1: never rests
    for share in (0, 1.5, -1):
        with pytest.raises(ValueError, match="share"):
            Pacer(share)


# -- NodeDirectory --------------------------------------------------------------------------

def test_node_directory_remembers_handles_until_told_to_forget():
    looked = []
    running = {"storage-node-0": "h0", "storage-node-2": "h2"}

    def lookup(name, namespace):
        looked.append((name, namespace))
        return running.get(name)
    d = NodeDirectory("ns", lookup)
    assert d.all([0, 1, 2]) == ["h0", "h2"]
    assert d.get(0) == "h0" and len(looked) == 3  # remembered
    d.forget(0)
    running["storage-node-0"] = "h0-new"
    assert d.get(0) == "h0-new"
    with pytest.raises(Exception, match="node 1"):
        d.require(1)


# -- FillRouter -------------------------------------------------------------------------------

class Peer:
    """What a StorageNode actor handle is to the router: methods with `.remote`, recorded."""

    def __init__(self):
        self.calls: list[tuple] = []
        for method in ("fill", "cache_warm", "prefetch"):
            setattr(self, method, self._method(method))

    def _method(self, name):
        class Remote:
            @staticmethod
            def remote(*args):
                self.calls.append((name, *args))
                return len(args[0]) if name == "cache_warm" else None
        return Remote


def test_a_files_chunks_are_filled_at_its_home_and_the_rest_here(tmp_path, namespace):
    c = ChunkCache(tmp_path, capacity=10_000)
    filled = []
    filler = CacheFiller(c, lambda key: None, BUCKET, threads=1)
    filler.request = lambda key, reason: filled.append((key, reason))  # what the filler was asked
    peers = {1: Peer()}
    index = NodeIndex.build(namespace, node=0)
    router = FillRouter(0, c, filler, lambda: index, True, peers.get, list)
    router.fill("f/1", "hot")        # the file's home is node 1
    router.fill("rep/1", "hot")      # not a file: here, whoever holds it
    assert peers[1].calls == [("fill", "f/1", "hot")] and filled == [("rep/1", "hot")]
    router.prefetch(["f/0", "rep/0"])
    assert peers[1].calls[-1] == ("prefetch", ["f/0"]) and filled[-1] == ("rep/0", "prefetch")
    everywhere = FillRouter(0, c, filler, lambda: index, False, peers.get, list)  # kernel.watch=any
    everywhere.fill("f/1", "hot")
    assert filled[-1] == ("f/1", "hot")


# -- the cache's capacity across a crash --------------------------------------------------------

def test_a_run_time_capacity_survives_a_crash_but_not_a_new_start(tmp_path):
    kept = tmp_path / "cache-capacity"
    assert kept_capacity(kept, restarted=False, configured=100) == 100
    keep_capacity(kept, 42)
    assert kept_capacity(kept, restarted=True, configured=100) == 42    # Ray restarted the crashed node
    assert kept_capacity(kept, restarted=False, configured=100) == 100  # a new `up`: its configuration
    assert not kept.exists()


# -- the kernel backend a node gets -------------------------------------------------------------

def test_kernel_mode_auto_falls_back_labelled_and_real_refuses(monkeypatch):
    from fasterfs import bpf

    monkeypatch.setattr(bpf, "unavailable_reason", lambda: "BCC's Python module is missing")
    got = bpf.load("auto")
    assert got.mode == "simulated" and got.snapshot()["simulated_because"] == "BCC's Python module is missing"
    with pytest.raises(FasterFSError, match="kernel.mode=real but eBPF cannot run here: BCC's Python module"):
        bpf.load("real")
    with pytest.raises(FasterFSError, match="option kernel.mode='kernel': must be auto, real or simulated"):
        bpf.load("kernel")
    assert bpf.load("simulated").snapshot()["simulated_because"] == "kernel.mode=simulated"


# -- no side effects of holding a cluster's state ------------------------------------------------

def test_a_cluster_state_is_trusted_only_when_asked(tmp_path, monkeypatch):
    import pickle

    from fasterfs.control import tls
    from fasterfs.control.state import ClusterState, NodeState

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tls, "_ca_file", None)
    state = ClusterState("c", str(tmp_path), "127.0.0.1:1", "http://127.0.0.1:2",
                         [NodeState(0, "127.0.0.2", "https://127.0.0.2:9000", None)], {}, {},
                         tls_ca="-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n")
    pickle.loads(pickle.dumps(state))  # as Ray sends it to a task
    assert tls._ca_file is None and list(tmp_path.iterdir()) == []  # made and unpickled: no effect
    state.trust()
    assert tls.ca_file("https://127.0.0.2:9000") == tls._ca_file and list(tmp_path.iterdir())


def test_a_rotten_copy_is_refused_and_the_next_one_filled():
    import xxhash

    from fasterfs.node.fill_sources import ReplicaGetter

    good = b"the manifest's bytes"
    chunk = ChunkInfo(0, "k", [1, 0], len(good), 0, 0, 0.0, 0.0, xxhash.xxh3_64_intdigest(good))
    copies = {1: b"the manifest's bytez", 0: good}
    marked = {n: SimpleNamespace(get=lambda bucket, key, n=n: (copies[n], f"etag{n}")) for n in copies}
    refused = []
    getter = ReplicaGetter(chunk, [1, 0], marked.__getitem__, lambda node, key: refused.append((node, key)))
    assert getter.get("b", "k") == (good, "etag0") and refused == [(1, "k")]
    copies[0] = b"short"
    with pytest.raises(FasterFSError, match="no copy of k"):
        getter.get("b", "k")


def test_a_health_with_many_lost_names_names_a_few_and_counts_the_rest():
    """A lost disk may hold a million names: what `status`, the dashboard and the logs carry
    names the first LOST_SHOWN and counts the others, not every name (7 MB a status at 131,000)."""
    from fasterfs.node.repair_health import LOST_SHOWN

    lost = {f"team/day-{i:05d}.parquet": [0] for i in range(5000)}
    h = Health(chunks=10_000, degraded=dict(lost), lost=lost)
    d = h.to_dict()
    assert (d["lost"], d["lost_names"], len(d["lost_chunks"])) == (5000, 5000, LOST_SHOWN)
    assert "team/day-00000.parquet: chunks 0" in d["summary"]
    assert f"and {5000 - LOST_SHOWN:,} more names" in d["summary"]
    assert len(d["summary"]) < 100 * LOST_SHOWN
    few = Health(chunks=3, degraded={"a": [1]}, lost={"a": [1]}).to_dict()
    assert few["lost_chunks"] == {"a": [1]} and "more names" not in few["summary"]


def test_pieces_on_their_way_home_say_their_bytes_and_at_the_leaders_rate_how_long(monkeypatch):
    """Two moves of 40 MB each, the first begun 20 s before the second ended: 80 MB over 20 s of
    wall time is 4 MB/s, and 120 MB left at that rate is 30 s; a survey with nothing to move says
    nothing of it, and moves older than the window give no rate."""
    from fasterfs.node import repair_leader

    leader = Cluster().leader(0)
    clock = [1000.0]
    monkeypatch.setattr(repair_leader.time, "time", lambda: clock[0])
    left = Health(chunks=10, misplaced=3, misplaced_bytes=120_000_000)
    assert left.moving() == "3 pieces (120.0 MB) to move to their homes"  # no move yet: no rate
    clock[0] = 990.0
    leader.record("moves", Outcome(left, moved=1, bytes_written=40_000_000, seconds=10.0))  # began at 980
    clock[0] = 1000.0
    leader.record("moves", Outcome(left, moved=1, bytes_written=40_000_000, seconds=5.0))
    assert leader.moving_mb_s() == pytest.approx(80 / 20)
    found = leader.repairs[-1]["found"]
    assert found["moving"] == "3 pieces (120.0 MB) to move to their homes, moving at 4.0 MB/s: about 30 s left"
    assert found["moving"] in found["summary"]
    assert Health(chunks=10).to_dict()["moving"] == "" and "to move" not in Health(chunks=10).summary()
    clock[0] = 1000.0 + repair_leader.MOVES_RECENT_S + 1
    assert leader.moving_mb_s() == 0.0


def test_a_call_of_moves_alone_copies_one_chunk_at_a_time(monkeypatch):
    """A Rebuilder copies repair.threads chunks at once where a piece is missing, but
    repair.move_threads where the chunks are only moved (a machine joined, a drain): counted by
    the copies running at the same moment."""
    from fasterfs.core import config
    from fasterfs.node.repair_rebuild import Rebuild, Rebuilder
    from fasterfs.node.repair_survey import ChunkPlan

    cfg = config.load(["repair.threads=4", "repair.move_threads=1"])
    rebuilder = Rebuilder.__new__(Rebuilder)  # its S3 clients and reads are not what is counted
    monkeypatch.setattr("fasterfs.read.client.Client", lambda session, manifest: None)
    rebuilder.session = None
    rebuilder.cfg, running, most, lock = cfg, [0], [0], threading.Lock()

    def one(job, reader) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return 1
    rebuilder.one = one
    m = manifest("d", [chunk(i, f"k{i}", [0]) for i in range(8)])

    def jobs(missing: bool) -> list:
        return [Rebuild(ChunkPlan(m, c, [0] if missing else [], [] if missing else [0], [1]), [1], [0])
                for c in m.chunks]
    for missing, threads in ((False, 1), (True, 4)):
        most[0] = 0
        assert rebuilder.many(jobs(missing)) == [1] * 8 and most[0] == threads
