"""The namespace's tree of paths (fasterfs.core.namespace.Tree) kept by changes: after any sequence of
changes it equals a tree built from scratch of the same manifests. No Ray, no MinIO."""
import random

import pytest

from fasterfs.core.manifest import ChunkInfo, Manifest
from fasterfs.core.namespace import Tree

pytestmark = pytest.mark.unit


def manifest(name: str, generation: str, kind: str = "file", created: float = 1.0) -> Manifest:
    chunks = [ChunkInfo(i, f"{name}/{generation}/chunk-{i:05d}.csv", [0], 10 + i, 0, 0, 0.0, 0.0, i)
              for i in range(2)]
    return Manifest(name, "csv", 1, 0, 0, 1, 1, "b", generation, chunks, created=created, kind=kind)


def shape(tree: Tree) -> dict:
    return {e.path: (e.is_dir, e.size, e.file_manifest.generation if not e.is_dir else "")
            for e in tree.all_entries()}


def listing(tree: Tree) -> dict:
    return {e.path: [c.path for c in tree.listdir(e.path)] for e in tree.all_entries() if e.is_dir}


def test_random_changes_leave_the_tree_a_fresh_build_would_make():
    rng = random.Random(7)
    names = [f"{a}/{b}/f{c}" for a in "xy" for b in "pq" for c in range(4)] + ["ds1", "ds2", "top"]
    now: dict[str, Manifest] = {}
    tree = Tree({}, 0)
    for version in range(1, 300):
        batch = {}
        for name in rng.sample(names, 3):
            batch[name] = None if name in now and rng.random() < 0.4 else manifest(
                name, f"g{version}", "dataset" if name.startswith("ds") else "file", created=version)
        entries, gone = tree.apply(batch, version)
        for name, m in batch.items():
            now.pop(name, None) if m is None else now.__setitem__(name, m)
        fresh = Tree(dict(now), version)
        assert shape(tree) == shape(fresh) and listing(tree) == listing(fresh)
        assert set(gone).isdisjoint(e.path for e in tree.all_entries())
        assert all(tree.lookup(e.path) is e for e in entries)


def test_a_change_reports_only_its_own_paths():
    tree = Tree({f"d/{i}": manifest(f"d/{i}", "g1") for i in range(1000)}, 1)
    entries, gone = tree.apply({"d/5": manifest("d/5", "g2", created=2.0), "e/1": manifest("e/1", "g1")}, 2)
    assert sorted(e.path for e in entries) == ["", "d", "d/5", "e", "e/1"] and gone == []
    entries, gone = tree.apply({"e/1": None}, 3)
    assert entries == [] and gone == ["e", "e/1"]


def test_a_readers_path_cache_forgets_every_path_of_a_changed_name():
    """What a reader cached of a dataset (its directories too) goes when the dataset changes; a
    sibling name's paths stay; every "no such path" goes with any change."""
    from fasterfs.read.path_cache import MISSING, PathCache

    ds, other = manifest("ds", "g1", "dataset"), manifest("x/f", "g1")
    cache = PathCache(max_entries=100)
    cache.changed(None, 5)
    first, second = Tree({"ds": ds}, 5), Tree({"x/f": other}, 5)
    for path in ("ds", "ds/chunks", "ds/chunks/chunk-00001.csv"):
        cache.put(path, first.lookup(path), 5, "ds")
    cache.put("x/f", second.lookup("x/f"), 5, "x/f")
    cache.put("x/g", None, 5)
    cache.put("late", None, 4)  # found at an older version: not kept
    assert cache.get("x/g") is None and cache.get("late") is MISSING
    cache.changed(["ds"], 6)
    assert [cache.get(p) for p in ("ds", "ds/chunks", "ds/chunks/chunk-00001.csv", "x/g")] == [MISSING] * 4
    assert cache.get("x/f") is second.lookup("x/f")
    # a dataset's tree, kept with its paths: its other paths found without the store, until it changes
    cache.put("ds", first.lookup("ds"), 6, "ds", first)
    found = cache.within("ds/chunks/chunk-00000.csv")
    assert found == first.lookup("ds/chunks/chunk-00000.csv") and found.size == ds.chunks[0].bytes
    assert cache.get("ds/chunks/chunk-00000.csv") is found  # kept as a put would keep it
    assert cache.within("ds/chunks/chunk-09999.csv") is None  # the dataset has no such chunk
    assert cache.within("x/f/deeper") is MISSING  # no dataset's tree above it: ask the store
    cache.changed(["ds"], 7)
    assert cache.within("ds/chunks/chunk-00001.csv") is MISSING
    small = PathCache(max_entries=2)
    small.changed(None, 1)
    for i in range(5):
        small.put(f"n{i}", second.lookup("x/f"), 1, f"n{i}")
    assert [small.get(f"n{i}") is MISSING for i in range(5)] == [True, True, True, False, False]
