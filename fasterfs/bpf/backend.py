"""What a StorageNode asks of its kernel side, whichever backend serves it: KernelPrograms (eBPF,
fasterfs.bpf.programs) or SimulatedPrograms (the labelled fallback, fasterfs.bpf.simulated).
Both report the same snapshot, so no reader of one has to guess at the other's keys."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

from .write_marks import NoWriteMarks, WriteMarks


class KernelSnapshot(TypedDict):
    mode: str                        # real | simulated
    simulated_because: str | None    # why eBPF is not used (None: it is)
    stale_source: str                # what marks a written key stale
    hot_threshold: int
    epoch: int
    tc: list[dict[str, Any]]         # attachments: interface, filter, netns, direction
    sockops_cgroup: str | None
    counters: dict[str, int]
    keys_tracked: int
    key_counts: dict[str, int] | None  # the counting map: capacity, held, evicted (None: no kernel maps)
    stale_marks: dict[str, Any] | None  # held, capacity, suspect_since_ns (None: no kernel maps)
    ring_pages: int | None
    top_keys: list[dict[str, Any]]   # key (hex), count, name
    ports: dict[int, dict[str, Any]]
    events_received: dict[str, int]
    recent_events: list[dict]
    reported_by_readers: dict[str, int]
    sockops: dict[str, Any]


class KernelBackend(Protocol):
    mode: str
    epoch: int
    hot_threshold: int
    suspect_key: int  # the bucket's key: its mark makes every entry fetched before it suspect

    @property
    def marks(self) -> WriteMarks | NoWriteMarks: ...  # the kernel's record of writes, pinned for readers
    def watch(self, address: str | None, port: int) -> None: ...
    def attach_tc(self, interface: str, name: str, direction: str = "egress", netns: str | None = None,
                  sole_owner: bool = False) -> None: ...
    def attach_sockops(self, cgroup_path: str) -> None: ...
    def start_events(self) -> None: ...
    def close(self) -> None: ...
    def new_epoch(self) -> int: ...
    def reset_key(self, key: int) -> None: ...
    def key_count(self, key: int) -> int: ...
    def all_counts(self) -> dict[int, int]: ...
    def count_reported(self, method: str, path: str, port: int) -> None: ...
    def snapshot(self, top: int = 10, resolve: Callable[[int], str | None] | None = None) -> KernelSnapshot: ...
