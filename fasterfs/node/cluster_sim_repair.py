"""Repair after a node's loss (`measure_repair`): manifests of many chunks placed by the real
placement, the lost node's listing failed; the real planner (`repair_survey.plan_repairs`, what a
survey computes) and the real assignment of targets (`repair_rebuild.assign`) run, timed. What
stands in is the moving of bytes: each node's reads and writes are counted and divided by the
configured per-node rate (`repair.mb_per_s`, which a node's Rebuilder enforces), both for the
leader rebuilding everything (the design before) and for each target rebuilding what it takes.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from types import SimpleNamespace
from typing import cast

from ..control.state import ClusterState
from ..core.manifest import ChunkInfo, Manifest
from ..core.placement import chunk_homes
from .repair_listing import TRUSTED
from .repair_rebuild import assign
from .repair_survey import plan_repairs


def measure_repair(nodes: int, chunks: int, chunks_per_file: int = 16, chunk_mb: float = 4.0, replicas: int = 2,
                   mb_per_s: float = 200.0, load_slack: float = 0.1, every_home: bool = True) -> dict:
    """Node 0 lost from `nodes` holding `chunks` chunks (files of `chunks_per_file`, `replicas`
    copies): the planner's CPU seconds (every node listed; and the others believed, as the
    leader's look after a change of the nodes plans, which must plan the same), the
    assignment's, and the seconds to move the bytes at `mb_per_s` per node (reads and writes)
    with one leader against every target rebuilding. `every_home`: also the planner's CPU placing
    every chunk again (as before manifests said which a repair had moved)."""
    ids = list(range(nodes))
    members = [SimpleNamespace(index=i, draining=False) for i in ids]
    state = cast(ClusterState, SimpleNamespace(nodes=members, placing=lambda: members))
    size = int(chunk_mb * 2**20)
    manifests: list[Manifest] = []
    listing: dict[int, set[str] | None] = {n: set() for n in ids}
    for f in range(chunks // chunks_per_file):
        name = f"d{f // 1000:04d}/f{f % 1000:04d}.bin"
        placed = chunk_homes(name, chunks_per_file, ids, replicas, load_slack)
        cs = [ChunkInfo(i, f"files/{f:016x}/g/part-{i:05d}", where, size, 0, 0, 0.0, 0.0, i)
              for i, where in enumerate(placed)]
        manifests.append(Manifest(name, "bytes", 0, 0, 0, replicas, nodes, "b", "g", cs, kind="file"))
        for c in cs:
            for n in c.nodes:
                cast(set, listing[n]).add(c.key)
    listing[0] = None  # its MinIO does not answer: gone
    t = time.process_time()
    health, plans = plan_repairs(manifests, state, listing, load_slack)
    plan_cpu = time.process_time() - t
    t = time.process_time()  # the leader's look after a loss: the nodes listed before believed
    believed_health, believed_plans = plan_repairs(
        manifests, state, {n: TRUSTED if keys is not None else None for n, keys in listing.items()}, load_slack)
    believed_cpu = time.process_time() - t
    same = (believed_health.degraded == health.degraded and believed_health.chunks == health.chunks
            and [(p.manifest.name, p.chunk.id, p.missing) for p in believed_plans]
            == [(p.manifest.name, p.chunk.id, p.missing) for p in plans])
    every_cpu = None
    if every_home:
        t = time.process_time()
        plan_repairs([dataclasses.replace(m, moved=True) for m in manifests], state, listing, load_slack)
        every_cpu = time.process_time() - t
    alive = set(ids[1:])
    t = time.process_time()
    jobs, failed = assign(plans, alive)
    assign_cpu = time.process_time() - t
    work: Counter[int] = Counter()  # bytes each writer reads and writes
    served: Counter[int] = Counter()  # bytes each survivor is read for
    for job in jobs:
        work[job.writer] += job.plan.chunk.bytes * (1 + len(job.slots))
        served[next(n for n in job.plan.chunk.nodes if n in alive)] += job.plan.chunk.bytes
    rate = mb_per_s * 1e6
    moved = sum(work.values())
    return {"nodes": nodes, "chunks": chunks, "chunk_mb": chunk_mb, "replicas": replicas, "mb_per_s": mb_per_s,
            "degraded": health.degraded_count, "lost": health.lost_count, "failed": len(failed),
            "bytes_rebuilt": sum(j.plan.chunk.bytes for j in jobs),
            "plan_cpu_s": plan_cpu, "plan_every_home_cpu_s": every_cpu, "assign_cpu_s": assign_cpu,
            "plan_believed_cpu_s": believed_cpu, "believed_same_plan": same,
            "writers": len(work), "max_writer_bytes": max(work.values(), default=0),
            "max_served_bytes": max(served.values(), default=0),
            "leader_move_s": moved / rate, "spread_move_s": max(work.values(), default=0) / rate,
            "leader_total_s": plan_cpu + assign_cpu + moved / rate,
            "spread_total_s": plan_cpu + assign_cpu + max(work.values(), default=0) / rate,
            "believed_total_s": believed_cpu + assign_cpu + max(work.values(), default=0) / rate}
