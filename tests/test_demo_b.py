"""Demo B and the cross-host job on the live 2-node cluster (small volume), each
submitted with `ray job submit` from a shell without the virtualenv, as a user would."""
from conftest import data_overrides, source_xxh3, submit_job, tasks_ray_recorded


def test_demo_b_reads_locally_the_planned_volume(ingest_as, overrides, live_cluster):
    ingest_as("csv", reuse=True)
    result = submit_job(live_cluster, "demo_b", overrides + data_overrides() +
                        ["demo_b.total_mb=24", "demo_b.sweep=[1,2]", "demo_b.replicated=true"])
    runs = result["runs"]
    assert [(r["nodes"], r["layout"]) for r in runs] == [(1, "partitioned"), (2, "partitioned"), (2, "replicated")]
    for r in runs:
        for p, node in zip(r["per_node"], live_cluster.nodes):
            assert p["ran_on"] == node.ray_node_id  # every task ran on the node holding its chunks
            assert p["remote_reads"] == 0           # answered by its own node's MinIO (replicated: its own copy)
            assert p["minio_requests"] == p["chunks"]  # its MinIO's kernel program saw exactly its reader's GETs
            assert p["bytes"] == p["planned_bytes"]  # every planned chunk read in full, checksums verified
        assert sum(p["bytes"] for p in r["per_node"]) >= 24e6
        assert r["wall_s"] > 0 and r["bound_by"]
    # where each read task ran, as Ray recorded it (its state API), not as the job reports it
    for n in {r["nodes"] for r in runs}:
        for k in range(n):  # each read task is named "demo_b.read[N nodes @ node K]" by fasterfs.control.state.on_node
            name = f"demo_b.read[{n} nodes @ node {k}]"
            ran = tasks_ray_recorded(live_cluster, [("name", "=", name), ("job_id", "=", result["ray_job_id"])])
            assert ran and {t.node_id for t in ran} == {live_cluster.node(k).ray_node_id}, (name, ran)


def test_cross_host_job_on_one_machine(ingest_as, overrides, live_cluster):
    manifest = ingest_as("csv", reuse=True)
    result = submit_job(live_cluster, "cross_host", overrides + ["cross_host.chunks=4"])
    # what every pass read, against the source rows of each chunk (gzip's read of LOBSTER's files)
    source = [source_xxh3(manifest.chunk(i)) for i in result["ids"]]
    assert len(source) == 4 and result["xxh3"] == {"cold": source, "warm": source, "hot": source}
    assert sum(result["filled_on"].values()) == 4  # the kernel made every one hot and a node cached it
    assert result["p50_ms"]["hot"] < result["p50_ms"]["cold"]
