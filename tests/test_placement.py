"""Rendezvous placement: balanced, stable when nodes are added, replicas on distinct nodes."""
from collections import Counter

import pytest

from fasterfs.core.placement import place

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO

KEYS = [f"AAPL_2012-06-21_L30/chunk-{i:05d}" for i in range(87)]  # the real sample's 87 chunks


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_balanced(nodes):
    load = Counter(owners[0] for owners in place(KEYS, nodes))
    assert len(load) == nodes
    assert max(load.values()) / min(load.values()) <= 1.5, load


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 7])
def test_adding_a_node_moves_about_one_nth(nodes):
    before, after = place(KEYS, nodes), place(KEYS, nodes + 1)
    moved = sum(b[0] != a[0] for b, a in zip(before, after)) / len(KEYS)
    assert moved <= 1 / (nodes + 1) + 0.10, moved
    # what moved went to the new node, apart from the few the load cap shifts
    to_new = sum(b[0] != a[0] and a[0] == nodes for b, a in zip(before, after)) / len(KEYS)
    assert to_new >= moved - 0.10


def test_replicas_distinct_and_full_copy():
    for owners in place(KEYS, 4, replicas=2):
        assert len(set(owners)) == 2
    assert all(sorted(o) == [0, 1, 2] for o in place(KEYS, 3, replicas=3))  # read-mostly: every node


def test_same_placement_in_every_process():
    """Every host computes placement itself: it must not depend on the process (hash seeds)."""
    import json
    import subprocess
    import sys

    code = f"import json; from fasterfs.core.placement import place; print(json.dumps(place({KEYS!r}, 3)))"
    got = [json.loads(subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": seed},
                                     capture_output=True, text=True, check=True).stdout) for seed in ("1", "2")]
    assert got[0] == got[1] == place(KEYS, 3)


def test_owners_are_the_highest_blake2b_scores():
    """Where data already lies is fixed by the hash: with no load cap binding, each key's
    owners are the nodes of highest blake2b-64("node-i\\0key"), as hashlib computes them."""
    import hashlib

    for nodes, replicas in ((3, 1), (16, 2), (130, 3)):
        for key, owners in zip(KEYS, place(KEYS, nodes, replicas, load_slack=1e9)):
            scores = {i: int.from_bytes(hashlib.blake2b(f"node-{i}\0{key}".encode(), digest_size=8).digest(), "big")
                      for i in range(nodes)}
            assert owners == sorted(scores, key=scores.__getitem__, reverse=True)[:replicas]


def test_bad_arguments():
    with pytest.raises(ValueError):
        place(KEYS, 2, replicas=3)
    with pytest.raises(ValueError):
        place(KEYS, 0)
