"""The namespace as the head keeps it (NamespaceStore), on a temporary directory: no Ray, no
MinIO. Pushes to the StorageNodes are recorded instead of sent."""
import time

import pytest

from fasterfs.errors import FasterFSError
from fasterfs.manifest import ChunkInfo, Manifest
from fasterfs.namespace_store import NamespaceStore

pytestmark = pytest.mark.unit


def manifest(name: str, generation: str, nodes=((0, 1), (1, 2))) -> Manifest:
    chunks = [ChunkInfo(i, f"{name}/{generation}/{i}", list(n), 10, 0, 0, 0.0, 0.0, i) for i, n in enumerate(nodes)]
    return Manifest(name, "bytes", 0, 0, 0, 2, 3, "b", generation, chunks, kind="file")


@pytest.fixture
def store(tmp_path):
    pushed = []
    s = NamespaceStore(tmp_path / "namespace", "c", lambda method, arg: pushed.append((method, arg)) or [0, 1])
    s.pushed = pushed
    return s


def test_a_published_generation_is_pushed_kept_and_known_after_a_restart(store, tmp_path):
    v0 = store.version
    assert store.publish(manifest("a/x", "g1"), "a/x/g1/") == [0, 1]
    assert store.pushed[-1][0] == "set_manifest" and store.pushed[-1][1].generation == "g1"
    assert store.version == v0 + 1
    again = NamespaceStore(tmp_path / "namespace", "c", lambda m, a: [])
    assert again.manifest("a/x").generation == "g1"
    assert again.version > store.version  # from the clock: never a number a reader saw before


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
    assert store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])}) == [0]
    assert store.manifest("d").chunks[0].nodes == [0, 2]
    assert store.expired_pieces(keep_old_s=3600) == []
    assert store.expired_pieces(keep_old_s=0) == [(1, key)]                       # the copy moved away


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


def test_a_retired_piece_named_again_is_not_deleted(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    key = store.manifest("d").chunks[0].key
    store.update_chunks("d", "g1", {0: ([0, 1], [0, 2])})
    store.update_chunks("d", "g1", {0: ([0, 2], [0, 1])})                         # moved back
    assert store.expired_pieces(keep_old_s=0) == [(2, key)]


def test_removing_a_name_pushes_the_drop_and_names_a_missing_one(store):
    store.publish(manifest("d", "g1"), "d/g1/")
    assert store.remove("d").generation == "g1"
    assert store.pushed[-1] == ("drop_manifest", "d") and store.manifest("d") is None
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
    from fasterfs import stamp

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


def test_the_heads_disk_full_names_the_file_and_changes_nothing(store, tmp_path, monkeypatch):
    """ENOSPC while the Registry writes the namespace: the error names the file, and neither
    memory nor disk has half of the change (a history naming the current generation replaced
    would have its objects deleted once keep_old_s passed)."""
    import errno

    from fasterfs import namespace_store

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")
    store.publish(manifest("d", "g1"), "d/g1/")
    monkeypatch.setattr(namespace_store, "atomic_write_json", full)  # the manifest fits, the history does not
    with pytest.raises(FasterFSError, match=r"the head cannot write \S+/generations.json: No space left on device; "
                                            "the namespace is unchanged"):
        store.publish(manifest("d", "g2"), "d/g2/")
    with pytest.raises(FasterFSError, match="generations.json: No space left"):
        store.remove("d")
    monkeypatch.setattr(Manifest, "save", full)  # nor the manifest
    with pytest.raises(FasterFSError, match=r"the head cannot write \S+/namespace/d.json"):
        store.publish(manifest("d", "g3"), "d/g3/")
    monkeypatch.undo()
    for seen in (store, NamespaceStore(tmp_path / "namespace", "c", lambda m, a: [])):  # in memory, on disk
        assert seen.manifest("d").generation == "g1" and seen.generations("d") == ["g1"]
        assert seen.expired(keep_old_s=0) == []
