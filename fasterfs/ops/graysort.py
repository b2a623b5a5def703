"""GraySort on Ray's object store with no single coordinator (the shape of Exoshuffle).

  generate  every node makes its own input partitions (records depend only on seed and
            index) and stores them in its own MinIO; each returns a small key sample
  map       tasks pinned to the node holding their input read it, sort it, and cut it at
            the sampled key boundaries into one block per output partition, returned as
            separate Ray objects (num_returns)
  reduce    tasks pinned to each output partition's node merge its blocks and store the
            sorted partition in that node's MinIO
  validate  tasks on the nodes holding the output check, like valsort, that each partition
            is sorted, that partitions are ordered, and that record count and checksum (sum
            of per-record CRC32) equal the input's

The driver holds object references and small summaries only, never records, and bounds
the map tasks in flight. The baseline is the original FasterFS design: one coordinator
task downloads everything, sorts and partitions it, and uploads the result.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import ray

from ..control import registry, s3
from ..core import records
from ..core.errors import FasterFSError
from . import cluster

SAMPLE_PER_PARTITION = 1000


class SortValidationError(FasterFSError):
    """The output is not a sorted permutation of the input; the message says where."""


def parse_size(text) -> int:
    """'100MB', '4GB' (decimal), '64MiB' (binary) or a byte count -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", str(text), re.IGNORECASE)
    if not m:
        raise FasterFSError(f"option graysort.size={text!r}: use a byte count or e.g. 100MB, 4GB, 64MiB")
    unit = m.group(2).upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    return int(float(m.group(1)) * scale)


@dataclass(frozen=True)
class SortPlan:
    """Everything a run needs, with the derived fields computed in one place."""

    nodes: int
    size: int
    format: str
    skew: float
    parts_per_node: int
    seed: int
    max_inflight: int
    bucket: str
    run: str

    @property
    def fmt(self) -> records.Format:
        return records.record_format(self.format)

    @property
    def records(self) -> int:
        return self.size // self.fmt.record

    @property
    def parts(self) -> int:
        return self.nodes * self.parts_per_node

    def node_of(self, part: int) -> int:
        return part // self.parts_per_node  # contiguous key ranges per node: partitions ordered across nodes

    def map_order(self) -> list[int]:
        """Input partitions taking turns across nodes, so every node maps from the start."""
        ppn = self.parts_per_node
        return [n * ppn + k for k in range(ppn) for n in range(self.nodes)]

    def input_range(self, part: int) -> tuple[int, int]:
        per = -(-self.records // self.parts)
        start = part * per
        return start, max(0, min(per, self.records - start))

    def key(self, kind: str, part: int) -> str:
        return f"graysort/{self.run}/{kind}/part-{part:05d}"


def plan(cfg, cluster_nodes: int, nodes: int | None = None) -> SortPlan:
    """Check the job's options before anything starts. `nodes` defaults to the cluster's size."""
    g = cfg.graysort
    nodes = cluster_nodes if nodes is None else nodes
    if not isinstance(nodes, int) or nodes < 1:
        raise FasterFSError(f"option nodes={nodes!r}: GraySort needs at least one node")
    if nodes > cluster_nodes:
        raise FasterFSError(f"option nodes={nodes}: the running cluster has {cluster_nodes} nodes")
    fmt = records.record_format(g.format)
    size = parse_size(cfg.graysort.size)
    if size <= 0 or size % fmt.record:
        raise FasterFSError(f"option graysort.size={cfg.graysort.size!r} ({size} bytes) is not a positive "
                            f"multiple of the {fmt.record}-byte {fmt.name} record")
    if g.skew < 0:
        raise FasterFSError(f"option graysort.skew={g.skew}: must be >= 0")
    per_node = g.partitions_per_node
    if per_node in (None, "auto"):  # partitions of at most partition_mb each
        per_node = max(1, math.ceil(size / nodes / (g.partition_mb * 1e6)))
    if not isinstance(per_node, int) or per_node < 1:
        raise FasterFSError(f"option graysort.partitions_per_node={per_node!r}: a whole number >= 1, or auto")
    return SortPlan(nodes, size, fmt.name, float(g.skew), per_node, int(g.seed), int(g.max_inflight) or 2 * nodes,
                    cfg.minio.bucket,
                    time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(4))  # unique even within a second


# -- tasks (each pinned to the node whose data it touches) -----------------------------------


@functools.cache
def _s3(cluster_name: str, node: int):
    """One client per node (position in the cluster's nodes) per worker process: making one
    costs ~0.1 s, as much as a 64 MB GET. Endpoints and keys come from the Registry."""
    state = registry.find_in_ray(cluster_name)
    return s3.client(state.nodes[node].endpoint, registry.fetch_credentials(cluster_name, "admin"), read_timeout=300)


def _get(client, bucket: str, key: str, width: int) -> np.ndarray:
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return np.frombuffer(body, dtype=np.uint8).reshape(-1, width)


@ray.remote(num_cpus=1)
def warm_up(cluster_name: str, node: int) -> tuple[str, int]:
    """Start a worker with the libraries loaded, so the timed phases measure sorting, not
    interpreter start-up. Returns the host's machine and its cores, counted on that host."""
    _s3(cluster_name, node)
    return _machine_id(), os.cpu_count() or 1


def _machine_id() -> str:
    """The machine (not the network namespace): lab hosts on one machine share its cores."""
    try:
        return open("/etc/machine-id").read().strip() or os.uname().nodename
    except OSError:
        return os.uname().nodename


class Steps(dict):
    """Seconds a task spent in each of its steps (summed by the driver into the report), and
    the wall-clock span of those steps (the report's timeline)."""

    def __init__(self):
        super().__init__()
        self.span = [time.time(), time.time()]
        self.node = ray.get_runtime_context().get_node_id()  # where the task really ran

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self[name] = self.get(name, 0.0) + time.perf_counter() - t
        self.span[1] = time.time()


@ray.remote(num_cpus=1)
def generate_part(cluster_name: str, p: SortPlan, part: int) -> dict:
    start, count = p.input_range(part)
    step = Steps()
    with step("generate"):
        recs = records.generate(p.fmt, p.seed, start, count, p.skew)
    with step("checksum"):
        checksum = records.checksum(recs)
    with step("put"):
        _s3(cluster_name, p.node_of(part)).put_object(Bucket=p.bucket, Key=p.key("input", part), Body=recs.tobytes())
    rng = np.random.default_rng(part)
    sample: np.ndarray | list[int] = (records.key_prefix(recs)[rng.integers(0, count, min(count, SAMPLE_PER_PARTITION))]
                                      if count else [])
    return {"count": count, "checksum": checksum, "sample": np.asarray(sample, dtype=np.uint64), "steps": step}


@ray.remote(num_cpus=1)
def map_part(cluster_name: str, p: SortPlan, part: int, boundaries: np.ndarray):
    """(steps, block for partition 0, block for partition 1, ...): num_returns = parts + 1."""
    step = Steps()
    with step("get"):
        recs = _get(_s3(cluster_name, p.node_of(part)), p.bucket, p.key("input", part), p.fmt.record)
    with step("sort"):
        recs = records.sort(recs, p.fmt)
        cuts = np.searchsorted(records.key_prefix(recs), boundaries, side="right")
    return (step, *np.split(recs, cuts))  # one block per output partition, in key order


@ray.remote(num_cpus=1)
def reduce_part(cluster_name: str, p: SortPlan, part: int, *blocks: np.ndarray) -> dict:
    step = Steps()
    with step("merge"):
        recs = np.concatenate(blocks) if blocks else np.empty((0, p.fmt.record), np.uint8)
        recs = records.sort(recs, p.fmt)  # sorted runs: the stable sort merges them
    with step("put"):
        _s3(cluster_name, p.node_of(part)).put_object(Bucket=p.bucket, Key=p.key("output", part), Body=recs.tobytes())
    return {"part": part, "count": len(recs), "steps": step}


@ray.remote(num_cpus=1)
def validate_part(cluster_name: str, p: SortPlan, part: int, kind: str = "output") -> dict:
    recs = _get(_s3(cluster_name, p.node_of(part)), p.bucket, p.key(kind, part), p.fmt.record)
    bad = records.first_unsorted(recs, p.fmt)
    return {"part": part, "count": len(recs), "checksum": records.checksum(recs), "first_unsorted": bad,
            "first_key": bytes(recs[0, :p.fmt.key]) if len(recs) else None,
            "last_key": bytes(recs[-1, :p.fmt.key]) if len(recs) else None}


@ray.remote(num_cpus=1)
def coordinator_sort(cluster_name: str, p: SortPlan, boundaries: np.ndarray) -> dict:
    """The original design: one node downloads everything, sorts, partitions, uploads."""
    t0 = time.perf_counter()
    recs = np.concatenate([_get(_s3(cluster_name, p.node_of(j)), p.bucket, p.key("input", j), p.fmt.record)
                           for j in range(p.parts)])
    t1 = time.perf_counter()
    recs = records.sort(recs, p.fmt)
    cuts = np.searchsorted(records.key_prefix(recs), boundaries, side="right")
    t2 = time.perf_counter()
    for part, block in enumerate(np.split(recs, cuts)):
        _s3(cluster_name, p.node_of(part)).put_object(Bucket=p.bucket, Key=p.key("baseline", part),
                                                      Body=block.tobytes())
    t3 = time.perf_counter()
    return {"download_s": t1 - t0, "sort_partition_s": t2 - t1, "upload_s": t3 - t2}


@ray.remote(num_cpus=1)
def inmemory_sort_rate(p: SortPlan, nbytes: int) -> float:
    """MB/s of one process sorting the same records in memory (sort + gather), the yardstick."""
    recs = records.generate(p.fmt, p.seed, 0, nbytes // p.fmt.record, p.skew)
    t = time.perf_counter()
    records.sort(recs, p.fmt)
    return nbytes / 1e6 / (time.perf_counter() - t)


# -- the driver: references and summaries only -----------------------------------------------


def _sum_steps(steps) -> dict:
    total: dict = {}
    for st in steps:
        for name, secs in st.items():
            total[name] = total.get(name, 0.0) + secs
    return total


def _timeline(per_task: dict, nodes: list) -> list[dict]:
    """Every task's node (where it really ran) and span, in seconds since the first started."""
    origin = min(st.span[0] for tasks in per_task.values() for st in tasks.values())
    node_index = {n.ray_node_id: i for i, n in enumerate(nodes)}
    return [{"phase": phase, "part": part, "node": node_index.get(st.node),
             "start_s": st.span[0] - origin, "end_s": st.span[1] - origin}
            for phase, tasks in per_task.items() for part, st in tasks.items()]


def boundaries_from(samples: list[np.ndarray], parts: int) -> np.ndarray:
    """Cut points giving each output partition an equal share of the sampled keys."""
    allkeys = np.sort(np.concatenate([s for s in samples if len(s)]))
    if parts == 1 or not len(allkeys):
        return np.empty(0, dtype=np.uint64)
    return allkeys[(np.arange(1, parts) * len(allkeys)) // parts]


def check(p: SortPlan, parts: list[dict], expected_count: int, expected_checksum: int, what: str) -> dict:
    """valsort's verdict over all partitions; raises SortValidationError at the first fault."""
    for v in parts:
        if v["first_unsorted"] is not None:
            raise SortValidationError(f"{what}: partition {v['part']} (node {p.node_of(v['part'])}) is not sorted "
                                      f"at record {v['first_unsorted']}")
    nonempty = [v for v in parts if v["count"]]
    for a, b in itertools.pairwise(nonempty):
        if a["last_key"] > b["first_key"]:
            raise SortValidationError(f"{what}: partitions out of order: last key of partition {a['part']} > first "
                                      f"key of partition {b['part']} (record 0 of partition {b['part']})")
    count = sum(v["count"] for v in parts)
    if count != expected_count:
        raise SortValidationError(f"{what}: {count} records, the input had {expected_count}")
    total = sum(v["checksum"] for v in parts)
    if total != expected_checksum:
        raise SortValidationError(f"{what}: checksum {total:#x} differs from the input's {expected_checksum:#x} "
                                  "(records changed, lost or duplicated)")
    return {"records": count, "checksum": total, "partitions": len(parts)}


def validate(state: cluster.ClusterState, p: SortPlan, expected_count: int, expected_checksum: int,
             kind: str = "output") -> dict:
    """valsort over a run's partitions, each checked on the node that holds it."""
    nodes = state.nodes[:p.nodes]
    parts = ray.get([validate_part.options(**cluster.on_node(nodes[p.node_of(q)], f"graysort.validate[part {q}"))
                     .remote(state.name, p, q, kind) for q in range(p.parts)])
    return check(p, parts, expected_count, expected_checksum, kind)


def run(state: cluster.ClusterState, p: SortPlan, baseline: bool = True, reference_mb: int = 100,
        progress: Callable[[str, int, int], None] | None = None) -> dict:
    tick = progress or (lambda phase, done, total: None)
    nodes = state.nodes[:p.nodes]
    on = lambda part, task: cluster.on_node(nodes[p.node_of(part)], f"graysort.{task}[part {part}")  # noqa: E731
    root = state.name  # tasks find the cluster through its Registry
    times = {}

    def gather(phase: str, refs: list) -> list:
        out, pending = [None] * len(refs), {r: i for i, r in enumerate(refs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            out[pending.pop(done[0])] = ray.get(done[0])
            tick(phase, len(refs) - len(pending), len(refs))
        return out

    tw = time.perf_counter()
    machines = dict(ray.get([warm_up.options(**cluster.on_node(n, "graysort.warm_up")).remote(root, k)
                             for k, n in enumerate(nodes) for _ in range(2)]))
    times["warm_up_s"] = time.perf_counter() - tw
    t0 = time.perf_counter()
    gen = gather("generate", [generate_part.options(**on(j, "generate")).remote(root, p, j) for j in range(p.parts)])
    in_count, in_checksum = sum(g["count"] for g in gen), sum(g["checksum"] for g in gen)
    bounds = boundaries_from([g["sample"] for g in gen], p.parts)
    t1 = time.perf_counter()
    times["generate_s"] = t1 - t0

    maps: dict[int, tuple[ray.ObjectRef, list[ray.ObjectRef]]] = {}  # map -> (its steps, its blocks)
    inflight: list[ray.ObjectRef] = []
    for j in p.map_order():
        if len(inflight) >= p.max_inflight:  # bound the maps in flight
            _, inflight = ray.wait(inflight, num_returns=1)
            tick("map", len(maps) - len(inflight), p.parts)
        # num_returns > 1: a list of refs (Ray's typing has one)
        refs: list[ray.ObjectRef] = map_part.options(  # type: ignore[assignment]
            num_returns=p.parts + 1, **on(j, "map")).remote(root, p, j, bounds)
        steps, *blocks = refs
        maps[j] = (steps, blocks)
        inflight.append(steps)
    reduces = [reduce_part.options(**on(q, "reduce")).remote(root, p, q, *[maps[j][1][q] for j in range(p.parts)])
               for q in range(p.parts)]
    map_steps = [steps for steps, _ in maps.values()]
    del maps  # the reducers hold the blocks now; they are freed as each reducer finishes
    summaries = gather("map+reduce", reduces)
    t2 = time.perf_counter()
    times["map_reduce_s"] = t2 - t1
    times["sort_s"] = t2 - t0
    per_task = {"generate": {j: g["steps"] for j, g in enumerate(gen)},
                "map": dict(zip(p.map_order(), ray.get(map_steps))),
                "reduce": {s["part"]: s["steps"] for s in summaries}}
    task_seconds = {phase: _sum_steps(tasks.values()) for phase, tasks in per_task.items()}
    timeline = _timeline(per_task, nodes)

    checked = gather("validate", [validate_part.options(**on(q, "validate")).remote(root, p, q)
                                  for q in range(p.parts)])
    verdict = check(p, checked, in_count, in_checksum, "output")
    times["validate_s"] = time.perf_counter() - t2
    result = {"plan": asdict(p), "bytes": p.size, "records": in_count, "input_checksum": in_checksum,
              "times": times, "task_seconds": task_seconds, "timeline": timeline, "validation": verdict,
              "minio_md5_etags": state.settings.md5_etags,
              "tasks_on_their_nodes": all(t["node"] == p.node_of(t["part"]) for t in timeline),
              "sort_mb_s": p.size / 1e6 / times["sort_s"],
              "partition_records": [v["count"] for v in checked]}
    if baseline:
        tb = time.perf_counter()
        coord = ray.get(coordinator_sort.options(**on(0, "baseline.coordinator_sort")).remote(root, p, bounds))
        result["baseline"] = {"total_s": time.perf_counter() - tb, **coord}
        result["baseline"]["validation"] = validate(state, p, in_count, in_checksum, "baseline")
        result["speedup_vs_baseline"] = result["baseline"]["total_s"] / times["map_reduce_s"]
    if reference_mb:
        ref = min(p.size, int(reference_mb * 1e6)) // p.fmt.record * p.fmt.record
        rate = ray.get(inmemory_sort_rate.options(**on(0, "reference.numpy_sort")).remote(p, ref))
        cores = sum(machines.values())  # per machine, as its hosts counted them
        result["reference"] = {"single_process_mb_s": rate, "cores": cores,
                               "sort_phase_mb_s": p.size / 1e6 / times["map_reduce_s"],
                               "fraction_of_cores_x_single": (p.size / 1e6 / times["map_reduce_s"]) / (cores * rate)}
    return result


def delete_run(state: cluster.ClusterState, p: SortPlan) -> int:
    """Remove the run's objects from every node."""
    creds = registry.fetch_credentials(state.name, "admin")
    removed = 0
    for n in state.nodes[:p.nodes]:
        c = s3.client(n.endpoint, creds)
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=p.bucket, Prefix=f"graysort/{p.run}/"):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                c.delete_objects(Bucket=p.bucket, Delete={"Objects": keys, "Quiet": True})
                removed += len(keys)
    return removed
