"""A storage host's copy of the namespace (fasterfs.meta.replica) and the head's recovery plan
(fasterfs.control.head_recovery.plan): what is read back is read with the standard library's sqlite3,
and a copy that is torn, behind or disagrees is never taken. No Ray, no MinIO."""
import random
import sqlite3
import time

import pytest

from fasterfs.control import credentials, head_recovery
from fasterfs.core.errors import FasterFSError
from fasterfs.core.manifest import ChunkInfo, Manifest
from fasterfs.meta.follower import Follower
from fasterfs.meta.replica import Replica
from fasterfs.meta.store import Changes

pytestmark = pytest.mark.unit


def manifest(name: str, generation: str = "g1") -> Manifest:
    chunks = [ChunkInfo(0, f"files/x/{generation}/part-00000", [0], 10, 0, 0, 0.0, 0.0, 1)]
    return Manifest(name, "bytes", 1, 0, 0, 1, 1, "b", generation, chunks, kind="file")


def rows(path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT name, manifest FROM names"))
    finally:
        db.close()


def test_a_followers_changes_are_on_disk_before_it_returns_and_equal_the_names_held(tmp_path):
    path = tmp_path / "r.sqlite"
    replica = Replica(path, "c")
    held: dict[str, Manifest] = {}
    follower = Follower(lambda since: None, lambda texts: (0, {}), replica=replica)
    rng = random.Random(3)
    version = -1  # a new follower's
    for _ in range(200):
        name = f"d{rng.randrange(5)}/f{rng.randrange(30)}"
        m = None if rng.random() < 0.3 else manifest(name, f"g{rng.randrange(1000)}")
        if m is None:
            held.pop(name, None)
        else:
            held[name] = m
        follower.apply(Changes(version, version + 1, {name: m}))
        version += 1
        assert rows(path) == {n: m.to_json() for n, m in held.items()}  # read by another connection, at once
    s, texts = Replica.verified(path)
    assert (s.version, s.names, len(texts)) == (version, len(held), len(held))
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_whole_reload_gives_the_digest_the_changes_gave(tmp_path):
    a, b = Replica(tmp_path / "a", "c"), Replica(tmp_path / "b", "c")
    names = {f"f{i}": manifest(f"f{i}") for i in range(20)}
    for n, m in names.items():
        a.keep({n: m}, 1)
    a.keep({"f3": None}, 2)
    b.keep({n: m for n, m in names.items() if n != "f3"} | {"gone": None}, 2, whole=True)
    assert Replica.summary(a.path).digest == Replica.summary(b.path).digest


def test_a_replica_whose_rows_were_altered_is_not_taken(tmp_path):
    r = Replica(tmp_path / "r", "c")
    r.keep({"a": manifest("a"), "b": manifest("b")}, 5)
    r.close()
    db = sqlite3.connect(tmp_path / "r")
    db.execute("DELETE FROM names WHERE name = 'b'")  # a copy that lost a row behind its digest's back
    db.commit()
    db.close()
    with pytest.raises(FasterFSError, match=r"1 names do not give the digest .* version 5 \(torn or altered\)"):
        Replica.verified(tmp_path / "r")


def test_another_clusters_replica_is_refused(tmp_path):
    Replica(tmp_path / "r", "one").close()
    with pytest.raises(FasterFSError, match="belongs to cluster 'one', not 'two'"):
        Replica(tmp_path / "r", "two")


def host(address: str, node: int, version: int | None = None, digest: str = "ab", names: int = 3,
         keys: str | None = "k1", objects: bool = True) -> dict:
    replica = None if version is None else {"path": f"/r/node-{node}/ns", "cluster": "c", "version": version,
                                            "names": names, "digest": digest, "updated": 0.0, "error": None}
    return {"address": address, "held": [{"node": node, "dir": f"/r/node-{node}", "replica": replica,
                                          "keys": keys, "objects": objects}]}


def test_the_newest_replica_is_taken_for_an_empty_head_and_the_keys_with_it():
    p = head_recovery.plan([host("10.0.0.1", 0, 7), host("10.0.0.2", 1, 9, "cd"), host("10.0.0.3", 2, 9, "cd")],
                           head_names=0, head_version=10**18, head_has_keys=False)
    assert p.replica is not None and p.replica[0] == "10.0.0.2" and p.replica[1].version == 9
    assert p.keys_from == ("10.0.0.1", f"/r/node-0/{credentials.NODE_COPY}")


def test_replicas_that_disagree_at_the_newest_version_are_refused_naming_both():
    with pytest.raises(FasterFSError, match=r"at version 9 disagree: 10\.0\.0\.1:/r/node-0/ns digest ab .*"
                                            r"10\.0\.0\.2:/r/node-1/ns digest cd"):
        head_recovery.plan([host("10.0.0.1", 0, 9, "ab"), host("10.0.0.2", 1, 9, "cd")], 0, 0, True)


def test_a_head_store_behind_a_replica_is_refused():
    with pytest.raises(FasterFSError, match=r"reaches version 5, but 10\.0\.0\.2:/r/node-1/ns holds version 9"):
        head_recovery.plan([host("10.0.0.1", 0, 5), host("10.0.0.2", 1, 9)], head_names=3, head_version=5,
                           head_has_keys=True)


def test_no_empty_namespace_over_stored_objects():
    with pytest.raises(FasterFSError, match=r"no host holds a replica of it, yet \['10\.0\.0\.1:/r/node-0'\] hold"):
        head_recovery.plan([host("10.0.0.1", 0, None)], head_names=0, head_version=0, head_has_keys=True)
    with pytest.raises(FasterFSError, match="copies differ"):
        head_recovery.plan([host("10.0.0.1", 0, 1, keys="k1"), host("10.0.0.2", 1, 1, keys="k2")], 0, 0, False)
    fresh = head_recovery.plan([host("10.0.0.1", 0, None, keys=None, objects=False)], 0, 0, False)
    assert fresh.replica is None and fresh.keys_from is None  # a new cluster: nothing to recover, nothing refused


def test_a_current_head_takes_nothing():
    p = head_recovery.plan([host("10.0.0.1", 0, 9), host("10.0.0.2", 1, 8)], head_names=3, head_version=9,
                           head_has_keys=True)
    assert p.replica is None and p.keys_from is None


def test_a_replica_answers_lookups_and_listings_as_the_store_does(tmp_path):
    from fasterfs.meta import NamespaceStore
    from fasterfs.meta.replica import ReplicaView
    from fasterfs.meta.sqlite import SQLiteEngine

    store = NamespaceStore(SQLiteEngine(tmp_path / "head.sqlite"), "c", lambda method, arg: [])
    replica = Replica(tmp_path / "r", "c")
    rng = random.Random(5)
    for i in range(60):
        name = f"a{rng.randrange(3)}/b{rng.randrange(3)}/f{i}" if i % 7 else f"top{i}"
        store.publish(manifest(name, f"g{i}"), "p/")
    version, names = store.manifests()
    replica.keep(dict(names), version, whole=True)
    view = ReplicaView(tmp_path / "r")
    paths = ["", "a0", "a1/b2", "nothing", "a0/b1/f5", "top0", "a2/b0/nope"] + sorted(names)[:5]
    for path in paths:
        want, got = store.resolve(path), view.resolve(path)
        assert (got.version, got.manifest, got.dir_mtime is None) == (want.version, want.manifest,
                                                                      want.dir_mtime is None), path
        want_l, got_l = store.attrs(path), view.attrs(path)
        assert (got_l is None) == (want_l is None), path
        if want_l is not None:
            assert [d for d, _ in got_l.dirs] == [d for d, _ in want_l.dirs] and got_l.names == want_l.names, path


def test_a_reader_asks_the_head_once_per_absence_then_this_hosts_copy(tmp_path):
    from fasterfs.control import identity
    from fasterfs.core.config import Paths
    from fasterfs.meta.replica import FILE
    from fasterfs.read.head_link import HeadAway, HeadLink

    identity.record(Paths(tmp_path), 0, "c", "10.0.0.1")
    x = manifest("x")
    Replica(Paths(tmp_path).node_dir(0) / FILE, "c").keep({"x": x}, 4)
    asked = []
    up = {"head": False}

    def ask(what, *args):
        asked.append(what)
        if not up["head"]:
            raise FasterFSError("no registry")
        return 4

    link = HeadLink("c", tmp_path, timeout_s=1, retry_s=0.05, ask=ask)
    for _ in range(3):
        with pytest.raises(HeadAway):
            link.ask("resolve", "x")
        assert link.local().resolve("x").manifest == x
    assert asked.count("resolve") == 1  # once; then only the probe, off the readers' path
    assert link.status()["head"] == "away" and link.status()["copy"]["version"] == 4
    up["head"] = True
    deadline = time.monotonic() + 5
    while link.away_since is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert link.ask("namespace_version") == 4 and link.status()["head"] == "answering"


def test_a_reader_started_without_the_head_never_asks_it(tmp_path):
    from fasterfs.control import identity
    from fasterfs.core.config import Paths
    from fasterfs.meta.replica import FILE
    from fasterfs.read.head_link import HeadAway, HeadLink

    identity.record(Paths(tmp_path), 1, "c", "10.0.0.2")
    Replica(Paths(tmp_path).node_dir(1) / FILE, "c").keep({"x": manifest("x")}, 7)

    def ask(what, *args):  # joining Ray here would start one of this process's own
        raise AssertionError(f"asked the head {what}")

    link = HeadLink("c", tmp_path, timeout_s=1, retry_s=0.01, ask=ask, headless=True)
    with pytest.raises(HeadAway):
        link.ask("changes", 0, False)
    assert link.read("resolve", "x").manifest.name == "x"
    time.sleep(0.05)  # no probe either
    assert link.status()["head"] == "away when this process started"
    Replica(Paths(tmp_path).node_dir(1) / FILE, "c").keep({"y": manifest("y")}, 8)  # the host's node moves on
    assert link.read("resolve", "y").manifest.name == "y" and link.local().summary().version == 8


def test_a_node_starts_from_its_own_copy_and_asks_only_for_what_changed_since(tmp_path):
    replica = Replica(tmp_path / "r", "c")
    replica.keep({f"f{i}": manifest(f"f{i}") for i in range(50)}, 7, whole=True)
    asked, changed = [], []
    later = manifest("f1", "g2")
    follower = Follower(lambda since: asked.append(since) or Changes(since, 9, {"f1": later, "f2": None}),
                        lambda texts: pytest.fail("the whole namespace was fetched"),
                        lambda c, whole: changed.append((len(c), whole)), replica=replica)
    follower.seed(*replica.load())
    follower.catch_up()
    assert asked == [7] and changed == [(50, True), (2, False)]
    assert follower.version == 9 and follower.manifests["f1"] == later and "f2" not in follower.manifests
    s, texts = Replica.verified(tmp_path / "r")  # the copy followed, its digest true to its rows
    assert (s.version, s.names, len(texts)) == (9, 49, 49)
