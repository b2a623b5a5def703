"""GraySort on the live 2-node cluster: small sorts validate (both record formats, skewed
keys); corrupted output fails validation at the right place; the driver's memory stays
flat as the size grows; bad input is refused before anything starts."""
import collections
from pathlib import Path

import numpy as np
import pytest
import ray
from conftest import load_job, minio_listing, tasks_ray_recorded

from fasterfs.control import credentials, s3
from fasterfs.core import config, records
from fasterfs.core.config import Paths
from fasterfs.core.errors import FasterFSError
from fasterfs.ops import graysort


def sort_cfg(overrides, *extra):
    return config.load(overrides + ["graysort.baseline=false", "graysort.reference_mb=0", *extra])


def objects(state, prefix="graysort/"):
    return sum(len(o) for o in minio_listing(state, prefix).values())


def stored_records(state, p, kind: str) -> list[bytes]:
    """The records of every partition of `kind` (input, output, baseline) as MinIO holds them
    (boto3), partitions in order."""
    creds = credentials.load(Paths(Path(state.root)).credentials_file).admin
    records: list[bytes] = []
    for part in range(p.parts):
        c = s3.client(state.nodes[p.node_of(part)].endpoint, creds)
        body = c.get_object(Bucket=p.bucket, Key=p.key(kind, part))["Body"].read()
        assert len(body) % p.fmt.record == 0
        records += [body[k:k + p.fmt.record] for k in range(0, len(body), p.fmt.record)]
    return records


def assert_sorted_of(output: list[bytes], inputs: list[bytes], key: int) -> None:
    """The standard library's oracle: `output` is `inputs` in key order (any order among equal
    keys), every record once, none changed."""
    assert [r[:key] for r in output] == sorted(r[:key] for r in inputs)
    assert collections.Counter(output) == collections.Counter(inputs)


@pytest.mark.parametrize("extra", [["graysort.format=gray"], ["graysort.format=fasterfs"],
                                   ["graysort.format=gray", "graysort.skew=3"]])
def test_small_sorts_validate(live_cluster, overrides, extra):
    p = graysort.plan(sort_cfg(overrides, "graysort.size=4MB", "graysort.partitions_per_node=3", *extra), 2)
    try:
        result = graysort.run(live_cluster, p, baseline=True, reference_mb=0)
        held = minio_listing(live_cluster, f"graysort/{p.run}/output/")
        inputs = stored_records(live_cluster, p, "input")
        for kind in ("output", "baseline"):  # both sorts, checked on what MinIO holds, not by graysort.check
            assert_sorted_of(stored_records(live_cluster, p, kind), inputs, p.fmt.key)
    finally:
        graysort.delete_run(live_cluster, p)
    # generate, map and reduce each ran where its data lives, as Ray's state API recorded it
    names = {f"graysort.{phase}[part {j} @ node {p.node_of(j)}]": live_cluster.node(p.node_of(j)).ray_node_id
             for phase in ("generate", "map", "reduce") for j in range(p.parts)}
    ran = [t for t in tasks_ray_recorded(live_cluster, [("job_id", "=", ray.get_runtime_context().get_job_id())],
                                         present=lambda ts: set(names) <= {t.name for t in ts if t.node_id})
           if t.name in names]
    assert {t.name for t in ran} == set(names) and all(t.node_id == names[t.name] for t in ran if t.node_id)
    steps = result["task_seconds"]  # every task reports the time of each of its steps
    assert set(steps["generate"]) == {"generate", "checksum", "put"} and set(steps["map"]) == {"get", "sort"}
    assert set(steps["reduce"]) == {"merge", "put"} and all(s > 0 for phase in steps.values() for s in phase.values())
    timeline = result["timeline"]  # one span per task, on the node that ran it, maps after their inputs exist
    assert sorted((t["phase"], t["part"]) for t in timeline) == sorted(
        (phase, j) for phase in ("generate", "map", "reduce") for j in range(p.parts))
    assert all(0 <= t["start_s"] <= t["end_s"] for t in timeline)
    last_generate = max(t["end_s"] for t in timeline if t["phase"] == "generate")
    assert min(t["start_s"] for t in timeline if t["phase"] == "map") >= last_generate
    counts = result["partition_records"]
    assert min(counts) > 0.5 * p.records / p.parts  # sampled boundaries balance even skewed keys
    assert sum(o["Size"] for objs in held.values() for o in objs) == p.records * p.fmt.record  # MinIO's sizes
    assert objects(live_cluster, f"graysort/{p.run}/") == 0  # cleaned up


@pytest.mark.parametrize("fmt", ["gray", "fasterfs"])
def test_the_output_is_the_input_sorted_as_python_sorts_it(live_cluster, overrides, fmt):
    """The oracle is the standard library's, on the objects MinIO holds (boto3): the output
    partitions, in order, are exactly the input records sorted by key (any order among equal
    keys), whatever graysort's own validation says."""
    p = graysort.plan(sort_cfg(overrides, "graysort.size=1MB", "graysort.partitions_per_node=2",
                               f"graysort.format={fmt}", "graysort.skew=2"), 2)
    try:
        graysort.run(live_cluster, p, baseline=False, reference_mb=0)
        inputs, output = stored_records(live_cluster, p, "input"), stored_records(live_cluster, p, "output")
    finally:
        graysort.delete_run(live_cluster, p)
    assert len(inputs) == p.records and len(set(inputs)) == len(inputs)  # distinct records: a real test of order
    assert_sorted_of(output, inputs, p.fmt.key)


def test_job_reports_phases_baseline_and_reference(live_cluster, overrides):
    """The job's main in this process (its `ray job submit` from a new shell: test_command_line)."""
    result = load_job("graysort").main(overrides + ["graysort.size=3MB", "graysort.reference_mb=1"])
    out = sorted(Path(live_cluster.root, "outputs").glob("graysort-*"))[-1]
    assert (out / "graysort.png").stat().st_size > 0
    assert result["baseline"]["validation"]["records"] == result["records"] == 30_000
    assert result["speedup_vs_baseline"] > 0 and result["reference"]["single_process_mb_s"] > 0
    assert result["minio_md5_etags"] is True
    assert objects(live_cluster, f"graysort/{result['plan']['run']}/") == 0  # the job removes its objects


def test_maps_take_turns_across_nodes(overrides):
    p = graysort.plan(sort_cfg(overrides, "graysort.size=6MB", "graysort.partitions_per_node=3"), 2)
    order = p.map_order()
    assert sorted(order) == list(range(p.parts))
    assert [p.node_of(j) for j in order] == [0, 1] * 3  # both nodes busy from the first map


def _corrupt(live_cluster, p, how):
    creds = credentials.load(Paths(Path(live_cluster.root)).credentials_file).admin
    if how == "swap_parts":  # each partition sorted, but partition 0 now holds the higher keys
        a, b = (s3.client(live_cluster.nodes[p.node_of(j)].endpoint, creds) for j in (0, 1))
        first = a.get_object(Bucket=p.bucket, Key=p.key("output", 0))["Body"].read()
        second = b.get_object(Bucket=p.bucket, Key=p.key("output", 1))["Body"].read()
        a.put_object(Bucket=p.bucket, Key=p.key("output", 0), Body=second)
        b.put_object(Bucket=p.bucket, Key=p.key("output", 1), Body=first)
        return
    node = live_cluster.nodes[p.node_of(1)]
    client = s3.client(node.endpoint, creds)
    key = p.key("output", 1)
    body = client.get_object(Bucket=p.bucket, Key=key)["Body"].read()
    recs = np.frombuffer(body, np.uint8).reshape(-1, p.fmt.record).copy()
    if how == "swap":
        recs[[10, 11]] = recs[[11, 10]]
    elif how == "drop":
        recs = np.delete(recs, 5, axis=0)
    else:
        recs[7, p.fmt.key + 3] ^= 0x01  # payload byte: order intact, checksum not
    client.put_object(Bucket=p.bucket, Key=key, Body=recs.tobytes())


@pytest.mark.parametrize("how, message", [("swap", r"partition 1 .* not sorted at record 11"),
                                          ("swap_parts", r"partitions out of order: last key of partition 0 > "
                                                         r"first key of partition 1"),
                                          ("drop", r"records, the input had"),
                                          ("flip", r"checksum .* differs")])
def test_corrupted_output_fails_validation(live_cluster, overrides, how, message):
    p = graysort.plan(sort_cfg(overrides, "graysort.size=2MB", "graysort.partitions_per_node=1"), 2)
    try:
        result = graysort.run(live_cluster, p, baseline=False, reference_mb=0)
        graysort.validate(live_cluster, p, result["records"], result["input_checksum"])  # fine before
        _corrupt(live_cluster, p, how)
        with pytest.raises(graysort.SortValidationError, match=message):
            graysort.validate(live_cluster, p, result["records"], result["input_checksum"])
    finally:
        graysort.delete_run(live_cluster, p)


def _status_mb(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def _peak_growth(fn) -> float:
    """How far this process's resident memory rose above where it was while `fn` ran: the
    kernel's own high-water mark (VmHWM, reset through clear_refs), not a sampler's guess."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    base = _status_mb("VmRSS")
    fn()
    return _status_mb("VmHWM") - base


def test_driver_memory_flat_as_size_grows(live_cluster, overrides):
    growth = {}
    for size in ("4MB", "60MB"):
        p = graysort.plan(sort_cfg(overrides, f"graysort.size={size}", "graysort.partition_mb=8"), 2)
        try:
            growth[size] = _peak_growth(lambda p=p: graysort.run(live_cluster, p, baseline=False, reference_mb=0))
        finally:
            graysort.delete_run(live_cluster, p)
    print(f"driver's peak resident growth, MB: {growth}")
    # 15x the data; no record passes through the driver, so its peak memory hardly moves
    assert growth["60MB"] < growth["4MB"] + 25, growth


@pytest.mark.parametrize("extra, message", [
    (["graysort.size=1000001"], r"graysort.size=1000001 .* not a positive multiple of the 100-byte gray record"),
    (["graysort.size=10MiB"], r"not a positive multiple"),
    (["graysort.size=lots"], r"option graysort.size='lots'"),
    (["graysort.format=weird"], r"unknown record format 'weird'"),
])
def test_bad_input_refused_before_anything_starts(live_cluster, overrides, extra, message):
    before = objects(live_cluster)
    with pytest.raises(FasterFSError, match=message):
        graysort.plan(sort_cfg(overrides, *extra), 2)
    assert objects(live_cluster) == before


@pytest.mark.parametrize("rows,width", [(70_000, 100), (70_000, 64), (300, 7), (5, 3), (0, 100)])
def test_record_crc32s_equal_zlib(rows, width):
    import zlib
    recs = np.random.default_rng(width).integers(0, 256, (rows, width), dtype=np.uint8)
    assert records.crc32_each(recs).tolist() == [zlib.crc32(bytes(r)) for r in recs]  # across the 65,536-row passes


def test_zero_nodes_refused(overrides):
    with pytest.raises(FasterFSError, match="at least one node"):
        graysort.plan(sort_cfg(overrides), 2, nodes=0)
    with pytest.raises(FasterFSError, match="has 2 nodes"):
        graysort.plan(sort_cfg(overrides), 2, nodes=3)


def test_records_depend_only_on_seed_and_index():
    fmt = records.record_format("gray")
    whole = records.generate(fmt, 5, 0, 1000)
    assert (records.generate(fmt, 5, 400, 100) == whole[400:500]).all()
    assert not (records.generate(fmt, 6, 0, 1000) == whole).all()
    import zlib
    assert records.checksum(whole) == sum(zlib.crc32(bytes(r)) for r in whole)


def test_two_runs_in_one_second_get_their_own_objects(overrides):
    """delete_run removes graysort/<run>/: two runs must never share a run id."""
    plans = [graysort.plan(sort_cfg(overrides, "graysort.size=2MB"), 2) for _ in range(20)]  # within a second or two
    assert len({p.run for p in plans}) == 20
