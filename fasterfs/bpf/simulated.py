"""SIMULATED kernel programs, for machines where eBPF cannot run (not root, no BCC or
kernel headers, not Linux). Same interface as KernelPrograms; requests are counted in
user space from the client's read path instead of from packets, and there is no TCP
tuning. Every snapshot says `mode: simulated` and why."""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from . import events as ev
from .backend import KernelSnapshot
from .write_marks import NoWriteMarks

MAX_NAMES = 65536
METHOD_IDS = {v: k for k, v in ev.METHODS.items()}


class SimulatedPrograms:
    mode = "simulated"

    def __init__(self, hot_threshold: int = 2, fill_mark: int = 0, delack_max_us: int = 5000,
                 on_event: Callable[[dict], None] | None = None, reason: str = "", **maps):
        self.hot_threshold, self.on_event, self.reason = hot_threshold, on_event, reason
        self.suspect_key = ev.key_hash(f"/{maps.get('bucket', 'fasterfs')}")
        self.marks = NoWriteMarks()
        self.epoch = 0
        self.ports: set[int] = set()
        self.counts: collections.Counter = collections.Counter()
        self.names: dict[int, str] = {}
        self.counters: collections.Counter = collections.Counter()
        self.received: collections.Counter = collections.Counter()
        self.recent: collections.deque[dict] = collections.deque(maxlen=256)
        self._lock = threading.Lock()

    def watch(self, address: str | None, port: int) -> None:
        self.ports.add(port)

    def new_epoch(self) -> int:
        with self._lock:
            self.epoch += 1
            self.counts.clear()
        return self.epoch

    def reset_key(self, key: int) -> None:
        with self._lock:
            self.counts.pop(key, None)

    def key_count(self, key: int) -> int:
        return self.counts.get(key, 0)

    def all_counts(self) -> dict[int, int]:
        with self._lock:
            return dict(self.counts)

    def attach_tc(self, interface: str, name: str, direction: str = "egress", netns: str | None = None,
                  sole_owner: bool = False) -> None:
        pass  # nothing to attach: requests arrive through observe()

    def attach_sockops(self, cgroup_path: str) -> None:
        pass

    def start_events(self) -> None:
        pass

    def close(self) -> None:
        pass

    def count_reported(self, method: str, path: str, port: int) -> None:
        """A request seen by the client's read path, counted as the kernel would count it."""
        key = ev.key_hash(path)
        event = None
        with self._lock:
            self.counters["requests"] += 1
            self.names[key] = path
            if len(self.names) > MAX_NAMES:  # as many as the kernel tracks keys
                self.names.pop(next(iter(self.names)))
            if method == "GET":
                self.counters["gets"] += 1
                self.counts[key] += 1
                if ev.becomes_hot(self.counts[key], self.hot_threshold):
                    self.counters["hot_events"] += 1
                    event = "HOT"
            else:
                self.counters["stale_marks"] += 1
                event = "STALE"
            if event:
                record = {"type": event, "method": method, "key": key, "path": path, "count": self.counts[key],
                          "port": port, "ts_ns": time.monotonic_ns()}
                self.recent.append(record)
                self.received[event] += 1
        if event and self.on_event:
            self.on_event(record)

    def snapshot(self, top: int = 10, resolve: Callable[[int], str | None] | None = None) -> KernelSnapshot:
        with self._lock:
            keys = self.counts.most_common(top)
            return {
                "mode": self.mode, "simulated_because": self.reason, "hot_threshold": self.hot_threshold,
                "epoch": self.epoch, "tc": [], "sockops_cgroup": None,
                "counters": dict(self.counters), "keys_tracked": len(self.counts),
                "top_keys": [{"key": f"{k:016x}", "count": c, "name": (resolve(k) if resolve else None)
                              or self.names.get(k)} for k, c in keys],
                "stale_marks": None, "ring_pages": None, "key_counts": None,  # no kernel maps
                "ports": {}, "events_received": dict(self.received), "recent_events": list(self.recent)[-10:],
                "reported_by_readers": {"gets": self.counters["gets"], "hot_events": self.counters["hot_events"]},
                "sockops": {"note": "SIMULATED mode: no TCP tuning"},
                "stale_source": "none: SIMULATED mode counts the client's reads only and sees no PUT or DELETE, "
                                "so an overwritten object stays cached until evicted, cleared or scrubbed",
            }
