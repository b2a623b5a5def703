"""What a StorageNode reports about itself, as the CLI, the monitor and the dashboard (JSON, then
its page's scripts) read it: one declared shape per report, so a reader finds every key it uses
here and the type checker holds producer and readers to it. The kernel's report is
fasterfs.bpf.backend.KernelSnapshot."""
from __future__ import annotations

from typing import Any, TypedDict


class NodeStatus(TypedDict):
    index: int
    address: str
    node_id: str
    actor_pid: int
    endpoint: str            # the node's MinIO
    healthy: bool            # its MinIO answers its liveness probe now
    held: bool               # stopped for maintenance (`hold_minio`), not restarted
    minio_pid: int | None
    minio_restarts: int
    objects: int | None      # None: not counted (MinIO down): unknown, never 0
    bytes: int | None
    objects_age_s: float | None  # how old that count is (a listing of many objects is made seldom)
    namespace_version: int   # the namespace's version this node's index is of (the Registry's, once caught up)
    placed_objects: int      # the objects the namespace places on this node (its index: current, nothing listed)
    placed_bytes: int
    kernel_mode: str
    redundancy: dict | None  # repair_health.Health.to_dict() of this node's latest survey (the leader's), or None
    repairs: list[dict]      # this node's latest repairs
    scrub: dict[str, Any]    # the MinIO scrub's totals
    started: dict[str, float]  # seconds per phase of this StorageNode's start
    mounts: list[dict]       # fasterfs.node.mount_supervisor.Mounts.status()
    namespace_replica: dict  # this host's copy of the namespace: {version, names, updated} (meta.replica.Summary)


class CacheStatus(TypedDict):
    index: int
    address: str
    kernel_mode: str
    directory: str
    entries: int
    bytes: int
    capacity: int
    # ChunkCache's counters, since its start
    fills: int
    fill_bytes: int
    evictions: int
    evicted_bytes: int
    removed: int
    too_large: int
    rebuilt_entries: int
    stray_temp_removed: int
    invalid_removed: int
    scrubs: int
    scrub_bytes: int
    scrub_dropped: int
    no_room: int
    promoted: int    # entries read while on probation, kept (cache.policy=s3fifo)
    ghost_hits: int  # entries filled again soon after going unread: kept at once
    foreign_files: int
    changed_at_source: int
    readers: dict[str, Any]    # what the node's readers counted (fasterfs.read.reader_stats.collect)
    filler: dict[str, int]
    fills_pending: int
    last_invalidation: float | None  # when this host last learnt of a write (its kernel or a peer's)
    suspect_checks: dict  # MarkKeeper: checks of every entry after writes nobody could name, entries dropped
    writes_told: dict[str, int]  # WriteRouter: writes this node's kernel saw, peers told of them (late: after a fill)
