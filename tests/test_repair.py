"""Repair and the MinIO scrub (fasterfs.node.repair) on the real 2-node cluster: missing pieces
are put back and the chunks read right; chunks with too few pieces are named and left as they
are; a bad object is found by its node's scrub and rewritten from the others. Repair onto
other hosts, moving pieces home, hosts that come back empty and the peer cache tier are tested
on the share-nothing lab (test_lab.py)."""
import os
import time

import pytest
import ray
from conftest import minio_keys, minio_requests, task_ids, tasks_ray_recorded, wait_until

import fasterfs
from fasterfs.control import registry, s3
from fasterfs.control.node_directory import LONG, actor_name
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.node import repair_listing, repair_survey
from fasterfs.ops import cluster
from fasterfs.ui import cli
from fasterfs.write.ingest import put


def _read_all(root, name) -> bytes:
    client = fasterfs.connect(root, dataset=name, use_cache=False)
    return b"".join(client.read_chunk(i) for i in range(len(client)))


def leaders_look(state, node: int, version: int, since: float) -> int | None:
    """How many chunks node `node`'s repair leader covered when it looked at the namespace at
    `version` or later (a check of the changes, or a survey begun after `since`, wall clock);
    None: it has not looked."""
    r = ray.get(cluster.storage_nodes(state)[node].status.remote(max_age_s=60))["redundancy"] or {}
    checked = r.get("changes_checked") or {}
    if checked.get("version", 0) >= version:
        return checked["chunks"]
    return r["chunks"] if r.get("time", 0) > since else None


def put_then_leader_looked(state, cfg, src, name: str):
    """`put`, then wait for the leader's look at it: a piece deleted behind FasterFS's back after
    that is not repaired before the test's own survey (the leader looks again only at the next
    change, or after repair.survey_s)."""
    since = time.time()
    m = put(cfg, src, name)
    version = registry.namespace_version(state.name)
    wait_until(lambda: leaders_look(state, 0, version, since) is not None,
               timeout=3 * state.config["repair"]["check_s"] + 10, what="node 0's look at the change")
    return m


def test_repair_puts_missing_pieces_back_and_names_lost_chunks(live_cluster, overrides, cluster_root, tmp_path,
                                                              capsys):
    blob = os.urandom(3 * 2**20 + 5)
    (tmp_path / "b").write_bytes(blob)
    ec = config.load(overrides + ["layout=ec", "ec.data=1", "ec.parity=1", "files.chunk_mb=1"])
    m = put_then_leader_looked(live_cluster, ec, tmp_path / "b", "repair/ec.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    p0, p1 = m.pieces(m.chunks[0]), m.pieces(m.chunks[1])
    clients = {n.index: s3.client(n.endpoint, creds) for n in state.nodes}
    clients[p0[1][0]].delete_object(Bucket=m.bucket, Key=p0[1][1])  # chunk 0: one of 2 shards gone
    for node, key in p1:  # chunk 1: both gone, more than parity: lost
        clients[node].delete_object(Bucket=m.bucket, Key=key)
    health = repair_survey.survey(state, creds, 0.1)
    assert health.degraded.get("repair/ec.bin") == [0, 1] and health.lost.get("repair/ec.bin") == [1]

    survivor = ray.get_actor(actor_name(p0[0][0]), namespace=state.ray_namespace)
    counted = ray.get(survivor.kernel_key_count.remote(f"/{m.bucket}/{p0[0][1]}"))
    assert cli.main(["repair", *overrides, "repair.mb_per_s=50"]) == 1
    # repair read the surviving shard over marked sockets: no sign of heat to the kernel
    assert ray.get(survivor.kernel_key_count.remote(f"/{m.bucket}/{p0[0][1]}")) == counted
    shown = capsys.readouterr()  # the report on stdout, the error line on stderr
    said = " ".join((shown.out + shown.err).split())  # rich wraps long lines
    assert "lost" in said and "repair/ec.bin: chunks 1" in said, said
    after = minio_keys(state, m.chunks[0].key.rsplit("/", 1)[0])
    assert p0[1][1] in after[p0[1][0]]  # back on its own node (it answers)
    assert not any(key in after[node] for node, key in p1)  # the lost chunk: nothing made up, nothing removed
    assert repair_survey.survey(state, creds, 0.1).lost.get("repair/ec.bin") == [1]
    client = fasterfs.connect(cluster_root, dataset="repair/ec.bin", use_cache=False)
    assert client.read_chunk(0) == blob[:2**20] and client.read_chunk(2) == blob[2 * 2**20:3 * 2**20]
    with pytest.raises(FasterFSError, match="chunk 1 .* 0 of its 2 shards readable"):
        client.read_chunk(1)
    assert cli.main(["status", *overrides]) == 0
    assert "1 degraded; LOST 1 (repair/ec.bin: chunks 1)" in " ".join(capsys.readouterr().out.split())
    registry.remove(live_cluster.name, "repair/ec.bin")


def test_each_node_rebuilds_the_pieces_it_takes(live_cluster, overrides, tmp_path, capsys):
    """A repair's work is spread over the nodes that take the pieces, not read and written by
    one: with a replica gone from each node, node 1's StorageNode rebuilds its own (Ray records
    its `rebuild` call) whoever repairs — `fasterfs repair`, which then has both nodes rebuild, or
    node 0's automatic leader if it surveys first (its own share it rebuilds in its process) — and
    each piece is back on its node, byte for byte as put."""
    from ray.util.state import list_actors

    blob = os.urandom(2 * 2**20)
    (tmp_path / "b").write_bytes(blob)
    m = put(config.load(overrides + ["replicas=2", "files.chunk_mb=1"]), tmp_path / "b", "repair/spread.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    clients = {n.index: s3.client(n.endpoint, creds) for n in state.nodes}
    gone = [(0, m.chunks[0].key, blob[:2**20]), (1, m.chunks[1].key, blob[2**20:])]
    rebuilds = [("name", "=", "StorageNode.rebuild")]
    names = {a.actor_id: a.name for a in list_actors(address=live_cluster.dashboard_url,
                                                      filters=[("class_name", "=", "StorageNode")])}
    earlier = task_ids(live_cluster, rebuilds)
    try:
        for node, key, _ in gone:
            clients[node].delete_object(Bucket=m.bucket, Key=key)
        assert cli.main(["repair", *overrides]) == 0
        by_cli = "repaired 2 chunks" in " ".join(capsys.readouterr().out.split())
        tasks = tasks_ray_recorded(live_cluster, rebuilds, excluding=earlier, present=lambda ts: {
            names.get(t.actor_id) for t in ts} >= ({actor_name(0), actor_name(1)} if by_cli else {actor_name(1)}))
        rebuilt = {names.get(t.actor_id) for t in tasks}
        assert actor_name(1) in rebuilt
        if by_cli:
            assert rebuilt == {actor_name(0), actor_name(1)}
        for node, key, body in gone:
            assert clients[node].get_object(Bucket=m.bucket, Key=key)["Body"].read() == body
    finally:
        registry.remove(live_cluster.name, "repair/spread.bin")


def test_scrub_finds_a_bad_object_and_rewrites_it(live_cluster, overrides, cluster_root, tmp_path):
    """A node's scrub finds the garbage written over two of its objects and the replica deleted
    behind MinIO's back: the replica and the garbage over a copy with a good twin are put back
    (boto3 then reads the bytes put), the single copy has nothing to rebuild from."""
    blob = os.urandom(2 * 2**20)
    (tmp_path / "b").write_bytes(blob)
    # each put waited for the repair leader's look at it: it would otherwise put the deleted
    # replica back before the scrub reaches it (the leader checks what changed every check_s)
    two = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=2", "files.chunk_mb=1"]),
                                 tmp_path / "b", "repair/two.bin")
    one = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=1", "files.chunk_mb=1"]),
                                 tmp_path / "b", "repair/one.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    one_bad = one.chunks[0]
    node = one_bad.nodes[0]  # replicas=2 on 2 nodes: every chunk has a copy there too
    garbage = {"Body": os.urandom(1000), "Metadata": {"xxh3": "1"}}
    s3.client(state.node(node).endpoint, creds).put_object(Bucket=two.bucket, Key=two.chunks[1].key, **garbage)
    s3.client(state.node(node).endpoint, creds).put_object(Bucket=one.bucket, Key=one_bad.key, **garbage)
    s3.client(state.node(node).endpoint, creds).delete_object(Bucket=two.bucket, Key=two.chunks[0].key)

    found = ray.get(ray.get_actor(actor_name(node), namespace=state.ray_namespace).scrub_minio.remote())
    assert sorted(found["bad"]) == sorted([two.chunks[1].key, one_bad.key])
    assert found["missing"] == [two.chunks[0].key]
    assert found["repaired"] == 2  # the copies with a good twin; the single copy has nothing to rebuild from
    for chunk, expected in ((two.chunks[0], blob[:2**20]), (two.chunks[1], blob[2**20:])):
        body = s3.client(state.node(node).endpoint, creds).get_object(Bucket=two.bucket, Key=chunk.key)
        assert body["Body"].read() == expected  # the bytes put, from the good twin
    assert _read_all(cluster_root, "repair/two.bin") == blob
    with pytest.raises(FasterFSError, match="does not match its stored checksum"):
        _read_all(cluster_root, "repair/one.bin")
    for name in ("repair/two.bin", "repair/one.bin"):
        registry.remove(live_cluster.name, name)


def test_a_long_call_on_a_node_holds_up_none_of_its_other_calls(live_cluster, overrides, tmp_path):
    """A scrub paced to take several seconds, called in the StorageNode's concurrency group for
    long calls (as a survey at a million objects, a rebuild): while it runs, the same actor's
    cache_status answers at once (on the actor's one thread it waited for the scrub's end), and
    the scrub then ends with the file's pieces on that node checked."""
    (tmp_path / "b").write_bytes(os.urandom(8 * 2**20))
    m = put(config.load(overrides + ["replicas=2", "files.chunk_mb=1"]), tmp_path / "b", "repair/long.bin")
    state = registry.find_in_ray(live_cluster.name)
    actor = ray.get_actor(actor_name(0), namespace=state.ray_namespace)
    try:
        held = sum(node == 0 for n in registry.fetch_manifests(state.name)[1].values() for c in n.chunks
                   for node, _ in n.pieces(c))  # what node 0's scrub GETs
        share = held * 0.0005 / 1.5  # at >= 0.5 ms a GET (loopback): >= 1.5 s (9 s in the whole suite)
        scrub = actor.scrub_minio.options(concurrency_group=LONG).remote(share)
        time.sleep(0.5)
        asked = time.monotonic()
        ray.get(actor.cache_status.remote(), timeout=30)
        answered = time.monotonic()
        assert not ray.wait([scrub], timeout=0)[0] and answered - asked < 2, (answered - asked, held)
        assert ray.get(scrub, timeout=120)["checked"] >= len(m)
    finally:
        registry.remove(live_cluster.name, "repair/long.bin")


def test_a_node_whose_listing_failed_is_waited_for(live_cluster, overrides, tmp_path):
    """The auto repair's plan: a piece absent from a node that listed counts as missing even
    while the node is waited for; pieces on a waited-for node whose listing failed (just back,
    busy) are left alone, not rebuilt elsewhere to move back later; once the node is gone
    (not waited for) they are rebuilt."""
    (tmp_path / "b").write_bytes(os.urandom(2 * 2**20))
    m = put(config.load(overrides + ["replicas=2", "files.chunk_mb=1"]), tmp_path / "b", "repair/wait.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    listed = repair_listing.listings(state, creds)
    assert all(c.key in listed[n] for c in m.chunks for n in c.nodes)

    def missing(listing, waiting):
        _, plans = repair_survey.plan_repairs([m], state, listing, 0.1, waiting=waiting)
        return sorted((p.chunk.id, p.chunk.nodes[s]) for p in plans for s in p.missing)
    lost_on_0 = {0: listed[0] - {m.chunks[0].key}, 1: listed[1]}  # lost behind MinIO's back; node 0 answers
    assert missing(lost_on_0, {0, 1}) == [(0, 0)]
    failed_1 = {0: listed[0], 1: None}  # node 1's listing failed
    assert missing(failed_1, {0, 1}) == []
    assert missing(failed_1, {0}) == [(c.id, 1) for c in m.chunks]
    registry.remove(live_cluster.name, "repair/wait.bin")


def test_a_believed_node_is_asked_whether_it_answers_not_listed(live_cluster, overrides, tmp_path):
    """What the leader does after a change of the nodes: node 0 believed (it answered every probe
    since it was last listed) is not listed, as MinIO counts its own ListObjectsV2 requests, while
    node 1 is, its keys as boto3 lists them; so a replica deleted behind MinIO's back is seen on a
    node listed, and not on a node believed (the periodic survey's, which lists every node)."""
    (tmp_path / "b").write_bytes(os.urandom(2 * 2**20))
    m = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=2", "files.chunk_mb=1"]),
                               tmp_path / "b", "repair/believed.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")

    def lists() -> dict[int, int]:
        return {n.index: minio_requests(n.endpoint, creds, "ListObjectsV2") for n in state.nodes}

    def node0_at_rest() -> bool:  # a survey or a count of the cluster's own, paced, lists for seconds
        at = lists()[0]
        time.sleep(2)
        return lists()[0] == at
    try:
        tries = []
        for _ in range(3):  # and may begin at any moment: node 0's count must stay put once
            wait_until(node0_at_rest, timeout=120, what="node 0's MinIO serving no listing for 2 s")
            before = lists()
            listed = repair_listing.listings(state, creds, trusted={0})
            after = lists()
            assert listed[0] is repair_listing.TRUSTED and after[1] > before[1]
            tries.append(after[0] - before[0])
            if tries[-1] == 0:
                break
        assert 0 in tries, tries
        assert listed[1] == minio_keys(state, "")[1]
        node, key = m.pieces(m.chunks[0])[1]
        s3.client(state.node(node).endpoint, creds).delete_object(Bucket=m.bucket, Key=key)
        believed = repair_survey.survey(state, creds, 0.1, trusted={0, 1})
        seen = repair_survey.survey(state, creds, 0.1, trusted={1 - node})
        assert m.name not in believed.degraded and seen.degraded.get(m.name) == [0]
    finally:
        registry.remove(live_cluster.name, "repair/believed.bin")


def test_a_node_back_is_listed_and_the_others_believed(live_cluster, overrides, tmp_path):
    """The leader's look when node 1's MinIO comes back after a stop: node 1 is listed, so the
    replica deleted from it behind MinIO's back is put back on it by the leader's own repair;
    node 0, answering throughout, is believed (the look's health says so), so the replica deleted
    from it is not seen by that look: the next look that lists it (here the user's `fasterfs
    repair`) puts it back. Where each replica is: boto3's listings."""
    (tmp_path / "b").write_bytes(os.urandom(2 * 2**20))
    m = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=2", "files.chunk_mb=1"]),
                               tmp_path / "b", "repair/back.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    prefix = m.chunks[0].key.rsplit("/", 1)[0]
    leader, node1 = cluster.storage_nodes(live_cluster)

    def redundancy() -> dict:
        return ray.get(leader.status.remote(max_age_s=1e9))["redundancy"] or {}
    try:
        for node, c in ((0, m.chunks[0]), (1, m.chunks[1])):  # a replica on each node, behind MinIO's back
            s3.client(state.node(node).endpoint, creds).delete_object(Bucket=m.bucket, Key=c.key)
        ray.get(node1.hold_minio.remote())
        try:
            wait_until(lambda: redundancy().get("nodes_down") == [1], timeout=60, what="the leader seeing node 1 down")
        finally:
            ray.get(node1.release_minio.remote())
        wait_until(lambda: m.chunks[1].key in minio_keys(state, prefix)[1], timeout=60,
                   what="node 1's replica put back by the leader's repair")
        reports: list[dict] = []  # the leader reports its look once its repair returns, after the PUT
        wait_until(lambda: reports.append(redundancy()) or reports[-1].get("nodes_down") == [], timeout=30,
                   what="the leader's report of the look that listed node 1 again")
        assert reports[-1]["believed"] == [0], reports[-1]
        assert m.chunks[0].key not in minio_keys(state, prefix)[0]
        assert cli.main(["repair", *overrides]) in (0, 1)  # 1: chunks other tests lost on purpose
        assert m.chunks[0].key in minio_keys(state, prefix)[0]
    finally:
        registry.remove(live_cluster.name, "repair/back.bin")


def test_the_lowest_live_node_looks_at_a_change(live_cluster, overrides, tmp_path):
    """Auto repair's leader: node 0, the lowest whose MinIO answers its probe, looks at a change
    (a new file) up to the namespace's version after it: it checks the names changed, or (while
    the last survey found work, as another test's lost chunks) surveys again; node 1 does
    neither. (Which of the two, and resting while nothing changes, is RepairLeader's unit test.)"""
    since = time.time()
    (tmp_path / "b").write_bytes(os.urandom(2**20))
    m = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=2", "files.chunk_mb=1"]),
                               tmp_path / "b", "repair/lead.bin")
    version = registry.namespace_version(live_cluster.name)
    try:
        assert leaders_look(live_cluster, 0, version, since) >= len(m)
        assert leaders_look(live_cluster, 1, version, since) is None
    finally:
        registry.remove(live_cluster.name, "repair/lead.bin")


def test_a_check_of_changed_names_asks_minio_for_just_their_pieces(live_cluster, overrides, tmp_path):
    """repair_survey.check against the real MinIOs: a file's chunks all at full redundancy, then one
    replica deleted behind FasterFS's back (boto3) is that chunk degraded, and only it."""
    (tmp_path / "b").write_bytes(os.urandom(3 * 2**20))
    m = put_then_leader_looked(live_cluster, config.load(overrides + ["replicas=2", "files.chunk_mb=1"]),
                               tmp_path / "b", "repair/check.bin")
    state, creds = registry.find_in_ray(live_cluster.name), registry.fetch_credentials(live_cluster.name, "admin")
    try:
        whole = repair_survey.check(state, creds, [m], 0.1)
        assert (whole.chunks, whole.degraded, whole.lost, whole.nodes_down) == (len(m), {}, {}, [])
        node, key = m.pieces(m.chunks[1])[1]
        s3.client(state.node(node).endpoint, creds).delete_object(Bucket=m.bucket, Key=key)
        found = repair_survey.check(state, creds, [m], 0.1)
        assert (found.degraded, found.lost) == ({"repair/check.bin": [1]}, {})
    finally:
        registry.remove(live_cluster.name, "repair/check.bin")


def test_a_nodes_survey_fetches_not_the_whole_namespace(live_cluster, overrides, tmp_path):
    """A StorageNode's survey plans against its own copy of the namespace, caught up from the
    store's log: Ray records a call of the Registry's `changes` (what changed since that copy)
    while node 0 surveys, and none of its `manifest_page` (the whole namespace: a million names, at a
    team's size)."""
    # by name: a filter the GCS applies itself (the session's cluster records tens of thousands of tasks)
    whole, delta = ([("name", "=", f"Registry.{m}")] for m in ("manifest_page", "changes"))
    (tmp_path / "b").write_bytes(os.urandom(2**20))
    m = put(config.load(overrides + ["files.chunk_mb=1"]), tmp_path / "b", "repair/survey.bin")
    survey = [("name", "=", "StorageNode.survey")]
    earlier = {f[0][2]: task_ids(live_cluster, f) for f in (whole, delta, survey)}
    try:
        assert ray.get(cluster.storage_nodes(live_cluster)[0].survey.remote())["chunks"] >= len(m)
    finally:
        registry.remove(live_cluster.name, "repair/survey.bin")
    # the survey's end, as node 0's worker reported it: after the calls that worker made in it,
    # whose events it reported before (in the order made): any manifest_page is recorded by then
    tasks_ray_recorded(live_cluster, survey, present=lambda ts: any(t.state == "FINISHED" for t in ts),
                       excluding=earlier["StorageNode.survey"])
    assert tasks_ray_recorded(live_cluster, delta, present=lambda ts: len(ts) > 0,
                              excluding=earlier["Registry.changes"])
    assert not task_ids(live_cluster, whole) - earlier["Registry.manifest_page"]


def test_repair_options_checked():
    for option, why in (("repair.threads=0", "repair.threads"), ("repair.mb_per_s=-1", "repair.mb_per_s"),
                        ("scrub.interval_s=x", "scrub.interval_s"), ("repair.check_s=0", "repair.check_s"),
                        ("repair.survey_s=-1", "repair.survey_s"), ("repair.quiet_s=-1", "repair.quiet_s"),
                        ("minio.list_share=0", "minio.list_share"), ("minio.list_share=1.5", "minio.list_share"),
                        ("scrub.share=0", "scrub.share")):
        with pytest.raises(FasterFSError, match=why):
            config.load([option])
