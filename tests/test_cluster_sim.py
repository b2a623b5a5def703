"""The simulated cluster (fasterfs.node.cluster_sim) at a size that fits the suite: real PeerTiers
gossiping deltas over a counted network. Expected figures come from the workload (names changed,
their length), not from the PeerTier; each view is checked against the caches' own name sets."""
from __future__ import annotations

import pickle

import pytest

from fasterfs.node.cluster_sim import SimulatedCluster, measure
from fasterfs.node.cluster_sim_invalidation import measure_invalidation
from fasterfs.node.cluster_sim_pushes import batch_of, measure_pushes
from fasterfs.node.cluster_sim_repair import measure_repair
from fasterfs.node.counting_bloom import FALSE_POSITIVE

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO

NODES, ENTRIES = 16, 500


def test_no_change_sends_nothing_and_changes_cost_what_changed():
    idle = measure(NODES, ENTRIES, 0, 3)
    assert idle["messages_per_node_s"] == 0 and idle["bytes_per_node_s"] == 0 and idle["consistent"]
    churn = 5  # fills a second per node, each evicting one entry: 10 names change
    busy = measure(NODES, ENTRIES, churn, 3)
    whole = measure(NODES, ENTRIES, churn, 3, deltas=False)
    assert busy["consistent"] and whole["consistent"]
    name = len(pickle.dumps("0" * 32 + ".chunk"))  # one entry name, pickled alone
    peers = NODES - 1
    # a delta carries the changed names and a fixed envelope; the whole set carries every name
    assert busy["bytes_per_node_s"] <= peers * (2 * churn * name + 1_000)
    assert whole["bytes_per_node_s"] >= peers * ENTRIES * (len("0" * 32 + ".chunk"))
    assert busy["messages_per_node_s"] == peers  # one message per peer per second that changed


def test_a_node_that_missed_changes_catches_up():
    sim = SimulatedCluster(NODES, 500)
    sim.second(0.0)
    assert sim.consistent()
    sim.net.cut = {3}  # node 3 hears nothing for three seconds of changes
    for s in (1.0, 2.0, 3.0):
        sim.second(s, churn_per_node=4)
    behind = sim.tiers[3].peers[0][2]
    assert behind.found(sim.caches[0].names) < len(sim.caches[0].names)  # 12 fills unheard
    sim.net.cut = set()
    sim.second(4.0, churn_per_node=1)  # the next delta does not follow what it has: it asks
    sim.net.drain()
    assert sim.consistent()


def test_writes_reach_every_node_caching_their_keys_and_few_others():
    """Broadcast (before): each node's writes go to every peer in one batch a second, so each node
    applies every other node's writes. Targeted (WriteRouter): each write of a key another node
    caches reaches that node, every one of them (the workload says which), and besides it only
    the nodes a filter errs on; writes of new keys reach nobody."""
    nodes, writes, share = 16, 50, 0.2
    before = measure_invalidation(nodes, writes, 2, targeted=False, cached_share=share)
    assert before["messages_per_node_s"] == nodes - 1
    assert before["applied_per_node_s"] == (nodes - 1) * writes
    key = len("files/" + "0" * 16 + "/g/000000")  # each write's key travels whole, its hash beside it
    assert (nodes - 1) * writes * (key + 8) <= before["bytes_per_node_s"] <= (nodes - 1) * writes * (key + 8) * 2
    now = measure_invalidation(nodes, writes, 2, targeted=True, cached_share=share)
    cached = round(writes * share)  # writes a second per node of a key one other node caches
    assert now["applied_per_node_s"] - now["needless_per_node_s"] == cached
    assert now["needless_per_node_s"] <= 3 * FALSE_POSITIVE * (nodes - 1) * writes
    assert now["bytes_per_node_s"] * 10 < before["bytes_per_node_s"]


def test_each_batch_is_pushed_to_every_node_and_applied_whole(tmp_path):
    """The store's pushes of `put -r` batches: every node gets each batch's manifests (at least
    their own pickled size), the head sends that to every node, and the observers' copies hold
    every name published."""
    nodes, files, batches = 8, 100, 2
    r = measure_pushes(nodes, files, batches, 2, tmp_path)
    m = batch_of(1, 0, nodes)[0][0]
    assert r["consistent"]  # each name and key travels whole
    assert r["bytes_per_node_per_batch"] >= files * (len(m.name) + len(m.chunks[0].key))
    assert r["head_bytes_per_batch"] == nodes * r["bytes_per_node_per_batch"]


def test_a_lost_nodes_chunks_are_rebuilt_by_every_other_node_in_equal_shares():
    """Node 0 lost: every chunk it held a copy of is degraded, none lost; the real assignment
    gives each of the other nodes a share of the rebuild within one chunk of equal, so moving
    the bytes takes about 1/(nodes-1) of what one leader moving everything takes."""
    nodes, chunk_mb = 16, 4.0
    r = measure_repair(nodes, 4_800, chunk_mb=chunk_mb, every_home=False)
    assert r["degraded"] > 0 and r["lost"] == 0 and r["failed"] == 0
    assert r["believed_same_plan"]  # the leader's look after a loss, the others believed: the same plan
    assert r["bytes_rebuilt"] == r["degraded"] * chunk_mb * 2**20
    assert r["writers"] == nodes - 1
    share = -(-r["degraded"] // (nodes - 1))  # chunks, rounded up
    assert r["max_writer_bytes"] <= (share + 1) * 2 * chunk_mb * 2**20  # each read once and written once
    assert r["spread_move_s"] <= r["leader_move_s"] / (nodes - 1) * 1.2
