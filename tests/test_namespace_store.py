"""The namespace as the head keeps it (NamespaceStore over each engine), on a temporary
directory: no Ray, no MinIO. Pushes to the StorageNodes are recorded instead of sent."""
import dataclasses
import json
import os
import pickle
import time

import pytest

from fasterfs.core import process
from fasterfs.core.errors import FasterFSError
from fasterfs.core.manifest import ChunkInfo, Manifest, decode_many
from fasterfs.meta import ENGINES, NamespaceStore, open_engine
from fasterfs.meta.redis_server import RedisServer
from fasterfs.meta.store import whole

# SQLite's cases are unit tests; Redis's start a redis-server each: the cluster tier's
WITH_ENGINES = [pytest.param(e, marks=pytest.mark.unit) if e == "sqlite" else e for e in ENGINES]


def manifest(name: str, generation: str, nodes=((0, 1), (1, 2))) -> Manifest:
    chunks = [ChunkInfo(i, f"{name}/{generation}/{i}", list(n), 10, 0, 0, 0.0, 0.0, i) for i, n in enumerate(nodes)]
    return Manifest(name, "bytes", 0, 0, 0, 2, 3, "b", generation, chunks, kind="file")


_SERVERS: dict[str, int] = {}  # root -> the PID of the Redis server started for it


@pytest.fixture(params=WITH_ENGINES)
def engine(request):
    yield request.param
    process.terminate_all(list(_SERVERS.values()))
    _SERVERS.clear()


def reopen(engine, root, push=lambda m, a: []):
    """A store on `engine` under `root` (its Redis server started once per root)."""
    if engine == "redis" and str(root) not in _SERVERS:
        _SERVERS[str(root)] = RedisServer(root).start(timeout=20)
    return NamespaceStore(open_engine(engine, root), "c", push)


@pytest.fixture
def store(engine, tmp_path):
    pushed = []
    s = reopen(engine, tmp_path, lambda method, arg: pushed.append((method, arg)) or [0, 1])
    s.pushed = pushed
    return s


def test_a_published_generation_is_pushed_kept_and_known_after_a_restart(store, engine, tmp_path):
    v0 = store.version
    assert store.publish(manifest("a/x", "g1"), "a/x/g1/") == [0, 1]
    method, changes = store.pushed[-1]
    assert method == "apply_changes" and (changes.since, changes.version) == (v0, v0 + 1)
    assert changes.names["a/x"].generation == "g1"
    assert store.version == v0 + 1
    again = reopen(engine, tmp_path)
    assert again.manifest("a/x").generation == "g1" and again.manifest("a/x") == store.manifest("a/x")
    assert again.version == store.version  # the same namespace: readers need not reload
    assert reopen(engine, tmp_path / "other").version > store.version  # a new store: from the clock


def test_a_replaced_generation_expires_after_keep_old_s(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    store.publish(manifest("d", "g2"), "d/g2/")
    assert store.generations("d") == ["g1", "g2"] and store.manifest("d").generation == "g2"
    assert store.expired(keep_old_s=3600) == []
    time.sleep(0.01)
    gone = store.expired(keep_old_s=0)
    assert [(g["generation"], g["prefix"]) for g in gone] == [("g1", "d/g1/")]
    assert store.generations("d") == ["g2"]


def test_repair_moves_apply_only_to_the_generation_repaired(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    key = store.manifest("d").chunks[0].key
    assert store.update_chunks("d", "g0", {0: ([0, 1], [0, 2])}) == []          # another generation
    assert store.expired_pieces(keep_old_s=0) == []                               # its orphans go with it
    assert not store.manifest("d").moved
    assert store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])}) == [0]
    assert store.manifest("d").chunks[0].nodes == [0, 2]
    assert store.manifest("d").moved  # its surveys check where its pieces belong
    assert store.expired_pieces(keep_old_s=3600) == []
    assert store.expired_pieces(keep_old_s=0) == [(1, key)]                       # the copy moved away


def test_spreading_places_the_narrower_names_over_every_node_and_moves_nothing_itself(store):
    """Nodes joined: each name placed on fewer nodes is placed on them all (its node count
    raised, marked for repair to move its pieces home), its chunks where they were; a wider one
    and a second spread change nothing. One push per batch, naming what it changed."""
    store.publish(manifest("a", "g1"), "a/g1/")                                  # on 3 nodes
    store.publish(dataclasses.replace(manifest("b", "g1"), node_count=5), "b/g1/")
    store.publish(manifest("c", "g1"), "c/g1/")
    v, pushes = store.version, len(store.pushed)
    assert store.spread(4, batch=1) == ["a", "c"]
    for name in ("a", "c"):
        now = store.manifest(name)
        assert (now.node_count, now.moved, now.chunks) == (4, True, manifest(name, "g1").chunks)
    assert (store.manifest("b").node_count, store.manifest("b").moved) == (5, False)
    assert store.version == v + 2 and [set(c.names) for _, c in store.pushed[pushes:]] == [{"a"}, {"c"}]
    assert store.spread(4) == [] and store.version == v + 2


def test_a_move_another_repair_made_counts_and_a_lost_ones_pieces_go(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    key = store.manifest("d").chunks[0].key
    assert store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])}) == [0]
    version = store.version
    assert store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])}) == [0]          # the same move, again
    assert store.version == version                                               # nothing changed
    assert store.update_chunks("d", "g1", {0: ([0, 1], [3, 1])}) == []           # not as it saw it: lost
    assert store.update_chunks("d", "g1", {0: ([0, 2], [4, 2])}, refused=True) == []  # fenced off
    assert store.manifest("d").chunks[0].nodes == [0, 2]
    assert sorted(store.expired_pieces(keep_old_s=0)) == [(1, key), (3, key), (4, key)]


def test_a_lost_nodes_files_are_repaired_in_one_change(store):
    """Moves of many names in one call: one version, one push naming each changed name; a name
    of another generation and one already moved there take their own outcomes."""
    for name in ("a", "b", "c"):
        store.publish(manifest(name, "g1"), f"{name}/g1/")
    version, pushes = store.version, len(store.pushed)
    got = store.update_chunks_many([("a", "g1", {0: ([0, 1], [0, 2])}), ("b", "g0", {0: ([0, 1], [0, 2])}),
                                    ("c", "g1", {0: ([0, 1], [2, 1])})])
    assert got == {"a": [0], "b": [], "c": [0]}
    assert store.version == version + 1 and len(store.pushed) == pushes + 1
    method, changes = store.pushed[-1]
    assert method == "apply_changes" and set(changes.names) == {"a", "c"}
    assert [store.manifest(n).chunks[0].nodes for n in "abc"] == [[0, 2], [0, 1], [2, 1]]


def test_a_retired_piece_named_again_is_not_deleted(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    key = store.manifest("d").chunks[0].key
    store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])})
    store.update_chunks("d", "g1", {0: ([0, 2], [0, 1])})                         # moved back
    assert store.expired_pieces(keep_old_s=0) == [(2, key)]


def test_removing_a_name_pushes_the_drop_and_names_a_missing_one(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    assert store.remove("d").generation == "g1"
    method, changes = store.pushed[-1]
    assert method == "apply_changes" and changes.names == {"d": None} and store.manifest("d") is None
    with pytest.raises(FasterFSError, match="'d': no such dataset or file in cluster 'c'"):
        store.remove("d")


def test_the_last_dataset_ingested_is_the_default(store):
    store.publish(manifest("f", "g1"), "f/g1/")  # a file: never the default
    assert store.manifest() is None
    first = manifest("d1", "g1")
    first.kind = "dataset"
    store.publish(first, "d1/g1/")
    second = manifest("d2", "g1")
    second.kind, second.created = "dataset", first.created + 1
    store.publish(second, "d2/g1/")
    assert store.manifest().name == "d2"


def test_a_wall_clock_step_neither_expires_nor_keeps_a_generation(store, monkeypatch):
    """The head's wall clock a day ahead (or behind): a generation replaced just now is kept; once
    keep_old_s has passed on the monotonic clock it goes. A stamp from before a reboot (another
    boot id), or a bare wall-clock time as older files kept, ages by the wall clock."""
    from fasterfs.core import stamp

    store.publish(manifest("d", "g1"), "d/g1/")
    store.publish(manifest("d", "g2"), "d/g2/")
    wall, mono = time.time, time.monotonic
    monkeypatch.setattr(time, "time", lambda: wall() + 86400)
    assert store.expired(keep_old_s=3600) == []
    monkeypatch.setattr(time, "time", lambda: wall() - 86400)
    monkeypatch.setattr(time, "monotonic", lambda: mono() + 3601)
    assert [g["generation"] for g in store.expired(keep_old_s=3600)] == ["g1"]
    monkeypatch.setattr(time, "time", wall)
    monkeypatch.setattr(time, "monotonic", mono)
    before_reboot = {"wall": wall() - 7200, "mono": mono(), "boot": stamp.BOOT + 1}
    assert 7199 < stamp.age(before_reboot) < 7300 and 7199 < stamp.age(wall() - 7200) < 7300


def fill(store, engine):
    """The store made full: SQLite's file capped at its size (a full disk), Redis's memory capped
    below what it uses (maxmemory, no eviction: what a full Redis refuses writes with). Returns
    the undoing and what the refusal says."""
    if engine == "sqlite":
        db = store.engine.db
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
        return lambda: db.execute("PRAGMA max_page_count = 1073741823"), r"\S+namespace.sqlite: .*full"
    r = store.engine.r
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    return lambda: r.config_set("maxmemory", 0), r"\(Redis at \S+\): .*used memory > .maxmemory."


def test_the_heads_store_full_names_the_store_and_changes_nothing(store, engine, tmp_path):
    """The head's store full while the Registry writes the namespace: the error names the store,
    and nothing of the change is kept, in this store or one opened anew (a history naming the
    current generation replaced would have its objects deleted once keep_old_s passed)."""
    store.publish(manifest("d", "g1"), "d/g1/")
    version = store.version
    undo, says = fill(store, engine)
    big = manifest("d", "g2", nodes=[(0, 1)] * 5000)  # more pages than are left
    with pytest.raises(FasterFSError, match=r"the head cannot write the namespace store " + says +
                       r".*; the namespace is unchanged"):
        store.publish(big, "d/g2/")
    undo()
    for seen in (store, reopen(engine, tmp_path)):
        assert seen.manifest("d").generation == "g1" and seen.generations("d") == ["g1"]
        assert seen.expired(keep_old_s=0) == [] and seen.version == version


def test_directories_list_by_parent_and_go_when_emptied(store):
    for name in ("t/2024/a.csv", "t/2024/b.csv", "t/2025/c.csv", "top.bin"):
        store.publish(manifest(name, "g1"), "x/")
    root = store.listdir("")
    assert [d for d, _ in root.dirs] == ["t"] and [m.name for m in root.names] == ["top.bin"]
    assert [d for d, _ in store.listdir("t").dirs] == ["t/2024", "t/2025"]
    assert [m.name for m in store.listdir("t/2024").names] == ["t/2024/a.csv", "t/2024/b.csv"]
    assert store.listdir("t/2026") is None and store.listdir("top.bin") is None
    store.remove("t/2025/c.csv")
    assert [d for d, _ in store.listdir("t").dirs] == ["t/2024"] and store.listdir("t/2025") is None
    store.remove("t/2024/a.csv")
    store.remove("t/2024/b.csv")
    assert store.listdir("t") is None and [d for d, _ in store.listdir("").dirs] == []


def test_a_listing_with_attributes_says_what_the_manifests_say(store):
    """What the mount lists (each name's size, time and generation, read out of the store
    without its manifest) against the manifests themselves."""
    for name in ("t/a.csv", "t/b.csv", "t/sub/c.csv"):
        store.publish(manifest(name, "g-" + name[-5]), "x/")
    listed, whole = store.attrs("t"), store.listdir("t")
    assert listed.dirs == whole.dirs and listed.version == whole.version
    assert [(a.name, a.kind, a.size, a.created, a.generation) for a in listed.names] == \
        [(m.name, m.kind, sum(c.bytes for c in m.chunks), m.created, m.generation) for m in whole.names]
    assert store.attrs("t/none") is None and store.attrs("t/a.csv") is None


def test_conflicts_are_named_and_fail_the_whole_batch(store):
    store.publish(manifest("a/b", "g1"), "x/")
    dataset = manifest("ds", "g1")
    dataset.kind = "dataset"
    store.publish(dataset, "ds/")
    assert store.conflict("a/b/c", "file") == "'a/b' is a file"
    assert store.conflict("a", "file") == "'a' is a directory"
    assert store.conflict("ds/x", "file") == "'ds' is a dataset"
    assert store.conflict("a", "dataset") == "'a' is already a directory of files"
    assert store.conflict("a/b", "dataset") == "'a/b' is already a file"
    assert store.conflict("a/c", "file") is None and store.conflict("a/b", "file") is None
    version = store.version
    with pytest.raises(FasterFSError, match="cannot store file 'a/b/c' in the namespace: 'a/b' is a file"):
        store.publish_batch([(manifest("n/1", "g1"), "x/"), (manifest("a/b/c", "g1"), "x/")])
    assert store.manifest("n/1") is None and store.version == version and store.listdir("n") is None


def test_changes_since_a_version_name_only_what_changed_and_a_log_past_its_reach_says_so(store, monkeypatch):
    from fasterfs.meta import engine as engines

    v0 = store.version
    version, _ = store.publish_batch([(manifest(f"d/{i}", "g1"), "x/") for i in range(3)])
    assert version == v0 + 1  # one batch, one version
    store.publish(manifest("d/1", "g2"), "x/")
    store.remove("d/2")
    changes = store.changes(v0 + 1)
    assert changes.version == v0 + 3 and set(changes.names) == {"d/1", "d/2"}
    assert changes.names["d/1"].generation == "g2" and changes.names["d/2"] is None
    assert store.changes(store.version).names == {}
    monkeypatch.setattr(store, "CHANGES_MOST", 1)  # too many for one answer: reload, by pages
    assert store.changes(v0 + 1) is None and set(store.changes(v0 + 2).names) == {"d/2"}
    monkeypatch.undo()
    monkeypatch.setattr(engines, "LOG_KEEP", 1)
    store.publish(manifest("d/3", "g1"), "x/")
    assert store.changes(v0 + 1) is None          # the log no longer reaches back: reload
    assert set(store.changes(store.version - 1).names) == {"d/3"}


def test_the_whole_namespace_is_read_in_pages_at_one_version_while_changes_go_on(store, monkeypatch):
    """Pages of 3 names; between two pages a name is replaced, one removed and one added: the
    result is each name as published last, at the version after those changes."""
    from fasterfs.meta import engine as engines

    monkeypatch.setattr(engines, "PAGE", 3)
    store.publish_batch([(manifest(f"d/{i:02d}", "g1"), "x/") for i in range(10)])
    pages = []

    def page(cursor):
        pages.append(cursor)
        if len(pages) == 2:  # mid-read: a change to a name already read, one not yet, a new one
            store.publish(manifest("d/00", "g2"), "x/")
            store.remove("d/09")
            store.publish(manifest("d/10", "g1"), "x/")
        return store.page(cursor)

    texts = {"stale": "{}"}
    version, manifests = whole(lambda: store.version, page, store.changes, texts)
    assert len(pages) >= 2 and version == store.version  # Redis pages as HSCAN will: COUNT is a hint
    expected = {f"d/{i:02d}": "g1" for i in range(11) if i != 9} | {"d/00": "g2"}
    assert {n: m.generation for n, m in manifests.items()} == expected
    assert all(m == store.manifest(n) for n, m in manifests.items())
    # the texts as the pages gave them: none for a name changed after its page (the log's is newer)
    assert set(texts) == set(expected) - {"d/00", "d/10"}
    assert all(text == manifests[n].to_json() for n, text in texts.items())


def test_a_replica_written_from_the_pages_is_the_one_kept_from_manifests_and_a_cut_read_keeps_the_old(
        store, tmp_path, monkeypatch):
    """The store's texts written into a replica page by page, a name changed and one removed
    mid-read, a name given twice: the same rows and digest as a replica kept from the manifests; a
    read cut short leaves the replica as it was."""
    from fasterfs.meta import engine as engines
    from fasterfs.meta.replica import Replica

    monkeypatch.setattr(engines, "PAGE", 4)
    store.publish_batch([(manifest(f"d/{i:02d}", "g1"), "x/") for i in range(20)])
    pages = []

    def page(cursor):
        pages.append(cursor)
        if len(pages) == 2:
            store.publish(manifest("d/00", "g2"), "x/")
            store.remove("d/19")
        texts, more = store.page(cursor)
        return texts + texts[:1], more  # a name given twice, as Redis's HSCAN may

    streamed, encoded = Replica(tmp_path / "a", "c"), Replica(tmp_path / "b", "c")
    with streamed.whole() as texts:
        version, manifests = whole(lambda: store.version, page, store.changes, texts)
        streamed.keep(dict(manifests), version, whole=True, texts=texts)
    encoded.keep(dict(manifests), version, whole=True)
    (a, rows_a), (b, rows_b) = Replica.verified(tmp_path / "a"), Replica.verified(tmp_path / "b")
    assert len(pages) >= 2 and (a.version, a.names, a.digest) == (b.version, 19, b.digest)
    assert sorted(rows_a) == sorted(rows_b) == sorted(store.manifest(n).to_json() for n in manifests)

    def cut(cursor):
        raise ConnectionError("the head went away")
    with pytest.raises(ConnectionError), streamed.whole() as texts:
        whole(lambda: store.version, cut, store.changes, texts)
    assert Replica.verified(tmp_path / "a")[0] == a


@pytest.mark.unit
def test_manifests_survive_pickling_and_a_text_that_is_not_json_is_named():
    m = manifest("d/x", "g1")
    assert pickle.loads(pickle.dumps(m)) == m and pickle.loads(pickle.dumps(m.chunks[0])) == m.chunks[0]
    assert decode_many([m.to_json(), m.to_json()], "here") == [m, m]
    with pytest.raises(FasterFSError, match=r"a manifest in the test store is not JSON .*'\{broken'"):
        decode_many([m.to_json(), "{broken"], "the test store")


def test_a_write_never_published_is_collected_and_one_collected_cannot_publish(store):
    pending = manifest("p", "g1")
    store.pending_write([(n, key, "p") for c in pending.chunks for n, key in pending.pieces(c)])
    store.publish_batch([(pending, "x/")], pending=True)
    assert store.expired_pieces(keep_old_s=0) == []  # published: its pieces are the file's
    lost = manifest("q", "g1")
    store.pending_write([(n, key, "q") for c in lost.chunks for n, key in lost.pieces(c)])
    assert sorted(store.expired_pieces(keep_old_s=0)) == sorted((n, key) for c in lost.chunks
                                                                for n, key in lost.pieces(c))
    with pytest.raises(FasterFSError, match="write of 'q' took longer than ingest.keep_old_s"):
        store.publish_batch([(lost, "x/")], pending=True)
    assert store.manifest("q") is None


def test_a_follower_takes_pushes_in_order_and_fetches_what_it_missed(store):
    from fasterfs.meta.follower import Follower

    heard = []
    follower = Follower(store.changes, store.manifests, lambda changed, whole: heard.append(changed))
    store.publish(manifest("a", "g1"), "x/")
    follower.catch_up()
    assert follower.reloads == 1 and set(follower.manifests) == {"a"}
    store.publish(manifest("b", "g1"), "x/")
    missed = store.pushed[-1][1]
    store.publish(manifest("a", "g2"), "x/")
    follower.apply(store.pushed[-1][1])  # out of order: the gap is fetched
    assert follower.version == store.version and follower.manifests["a"].generation == "g2"
    assert set(follower.manifests) == {"a", "b"} and follower.reloads == 1
    follower.apply(missed)               # late: already seen
    assert follower.manifests["a"].generation == "g2"
    assert [(n, before.generation if before else None) for n, before, _ in heard[-1]] in (
        [("a", "g1"), ("b", None)], [("b", None), ("a", "g1")])


def test_a_redis_directory_another_user_made_is_refused(tmp_path):  # chown: root, the cluster tier
    """A local user who made the server's directory first (to plant its password) is named, and
    no server starts."""
    planted = tmp_path / "redis"
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(FasterFSError, match=rf"{planted} belongs to uid 65534, not to this user"):
        RedisServer(tmp_path).start(timeout=5)
    assert not (planted / "redis.conf").exists()


# -- a root an earlier FasterFS kept its names in, as files ----------------------------------

def _files_before_the_store(root, manifests, generations, retired):
    """What FasterFS wrote before the store, with the standard library: a manifest per name in
    namespace/ (its quoted name), generations.json and retired-pieces.json."""
    from urllib.parse import quote

    (root / "namespace").mkdir()
    for m in manifests:
        (root / "namespace" / (quote(m.name, safe="") + ".json")).write_text(json.dumps(dataclasses.asdict(m)))
    (root / "generations.json").write_text(json.dumps(generations))
    (root / "retired-pieces.json").write_text(json.dumps(retired))


def test_a_namespace_kept_as_files_is_adopted_once_whole(engine, tmp_path):
    from fasterfs.meta import legacy

    old, new, other = manifest("team/d", "g1"), manifest("team/d", "g2"), manifest("a b/ü.bin", "g7")
    replaced = {"wall": time.time() - 10, "mono": time.monotonic() - 10, "boot": 0}
    _files_before_the_store(tmp_path, [new, other], [
        {"dataset": "team/d", "generation": "g1", "prefix": "team/d/g1/", "replaced": time.time() - 10},
        {"dataset": "team/d", "generation": "g2", "prefix": "team/d/g2/", "replaced": None},
        {"dataset": "a b/ü.bin", "generation": "g7", "prefix": "x/g7/", "replaced": None}],
        [{"node": 1, "key": old.chunks[0].key, "retired": replaced}])
    store = reopen(engine, tmp_path)
    v0 = store.version
    assert legacy.adopt(store, tmp_path) == 2
    assert store.manifest("team/d") == new and store.manifest("a b/ü.bin") == other
    assert store.version > v0 and set(store.changes(v0).names) == {"team/d", "a b/ü.bin"}
    assert store.generations("team/d") == ["g1", "g2"]
    assert [(g["generation"], g["prefix"]) for g in store.expired(keep_old_s=5)] == [("g1", "team/d/g1/")]
    assert store.expired_pieces(keep_old_s=0) == [(1, old.chunks[0].key)]
    assert sorted(p.name for p in tmp_path.iterdir() if "adopted" in p.name) == [
        "generations.json.adopted", "namespace.adopted", "retired-pieces.json.adopted"]
    assert legacy.adopt(reopen(engine, tmp_path), tmp_path) == 0  # once


def test_a_copy_adopted_at_its_version_goes_on_from_it(store, engine, tmp_path):
    """A head rebuilt from a storage host's replica at version v (fasterfs.control.head_recovery): its
    holders at v are told nothing changed, one behind v reloads, the next change is v + 1."""
    names = [manifest(f"r/{i}", "g1") for i in range(5)]
    store.adopt(names, [], [], version=1234)
    assert store.version == 1234 and store.count() == 5
    assert store.changes(1234).names == {} and store.changes(1233) is None
    store.publish(manifest("r/new", "g1"), "r/new/g1/")
    assert store.version == 1235 and list(store.changes(1234).names) == ["r/new"]
    assert reopen(engine, tmp_path).version == 1235


def test_an_unreadable_file_of_an_earlier_namespace_is_named_and_nothing_adopted(engine, tmp_path):
    from fasterfs.meta import legacy

    _files_before_the_store(tmp_path, [manifest("d", "g1")], [], [])
    bad = tmp_path / "namespace" / "e.json"
    bad.write_text('{"dataset": "e", "chunks": [')
    store = reopen(engine, tmp_path)
    with pytest.raises(FasterFSError, match=f"manifest {bad} .*cannot be read"):
        legacy.adopt(store, tmp_path)
    assert store.count() == 0 and (tmp_path / "namespace" / "d.json").exists()


@pytest.mark.unit
def test_a_pause_of_the_collector_nests_and_a_freezing_one_keeps_what_it_built():
    import gc

    from fasterfs.core import gc_pause

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with gc_pause.paused():
            with gc_pause.paused(freeze=True):
                built = [[i] for i in range(1000)]
            assert not gc.isenabled()  # the outer pause still holds
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(built)
        with gc_pause.paused():
            pass
        assert gc.isenabled()
    finally:
        gc.unfreeze()
