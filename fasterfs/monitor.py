"""What the web dashboard shows, gathered: live snapshots of every StorageNode, rates
between snapshots, the job runs on disk, and the same figures as Prometheus metrics.

A snapshot is taken when someone asks for one (a page view, an API call, a scrape) and
reused for `min_interval` seconds: nothing is sampled while nobody looks, so benchmarks
run undisturbed. Rates are differences between consecutive snapshots.
"""
from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from .config import Paths
from .fsutil import read_json
from .state import ClusterState, actor_name

# Counters whose per-second rates the dashboard shows (and charts).
RATES = {"minio_gets": "GETs to MinIO the kernel counted", "cache_hits": "reads served from the cache",
         "hot_events": "chunks the kernel made hot"}
REPORT_SUFFIXES = (".json", ".png")


class Monitor:
    def __init__(self, root: str | Path, top_keys: int = 10, min_interval: float = 1.0, history: int = 150,
                 answer_timeout: float = 5.0):
        self.root = Path(root)
        self.state = ClusterState.load(self.root)
        self.paths = Paths(self.root)
        self.top_keys, self.min_interval, self.answer_timeout = top_keys, min_interval, answer_timeout
        self.history: collections.deque = collections.deque(maxlen=history)  # (time, {node: totals})
        self._last: dict | None = None
        self._lock = threading.Lock()

    # -- live ------------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self._lock:
            if self._last is None or time.time() - self._last["time"] >= self.min_interval:
                self._last = self._collect()
            return self._last

    def _collect(self) -> dict:
        """Ask every StorageNode at once; a node that does not answer in time is shown as such."""
        import ray

        calls, missing = {}, {}
        for node in self.state.nodes:
            try:
                actor = ray.get_actor(actor_name(node.index), namespace=self.state.namespace)
            except ValueError as e:
                missing[node.index] = f"no StorageNode actor: {e}"
                continue
            calls[node.index] = {"status": actor.status.remote(), "kernel": actor.kernel_status.remote(self.top_keys),
                                 "cache": actor.cache_status.remote()}
        pending = [ref for parts in calls.values() for ref in parts.values()]
        ready = set(ray.wait(pending, num_returns=len(pending), timeout=self.answer_timeout)[0] if pending else ())
        now = time.time()
        nodes = []
        for node in self.state.nodes:
            row = {"index": node.index, "address": node.address, "endpoint": node.endpoint, "netns": node.netns}
            if node.index in missing:
                row["error"] = missing[node.index]
            for part, ref in calls.get(node.index, {}).items():
                if ref not in ready:
                    row.setdefault("error", f"no answer to {part} within {self.answer_timeout:.0f} s")
                    continue
                try:
                    row[part] = ray.get(ref)
                except Exception as e:  # a dead actor: show it, keep the other nodes
                    row.setdefault("error", f"{part}: {type(e).__name__}: {e}"[:300])
            row["totals"] = _totals(row)
            nodes.append(row)
        previous = self.history[-1] if self.history else None
        self.history.append((now, {n["index"]: n["totals"] for n in nodes}))
        for n in nodes:
            n["rates"] = _rates(previous[0], previous[1].get(n["index"], {}), now, n["totals"]) if previous else {}
        # the node that leads repair (the lowest-numbered live one) surveyed the namespace last
        redundancy = next((n["status"]["redundancy"] for n in nodes if (n.get("status") or {}).get("redundancy")), None)
        return {"time": now, "cluster": self.state.name, "root": str(self.root), "started": self.state.started,
                "ray_address": self.state.ray_address, "ray_dashboard": self.state.dashboard_url,
                "lab": self.state.lab, "nodes": nodes, "redundancy": redundancy}

    def series(self, name: str) -> dict[int, list[tuple[float, float]]]:
        """Per node, (time, per-second rate of `name`) between consecutive snapshots."""
        out: dict[int, list] = collections.defaultdict(list)
        points = list(self.history)
        for (t0, a), (t1, b) in zip(points, points[1:]):
            for node, totals in b.items():
                rate = _rates(t0, a.get(node, {}), t1, totals).get(name)
                if rate is not None:
                    out[node].append((t1, rate))
        return dict(out)

    # -- job runs ----------------------------------------------------------------------

    def output_dir(self) -> Path:
        return Path(self.state.config.get("output_dir") or self.root / "outputs")

    def runs(self, limit: int = 30) -> list[dict]:
        """Job runs (newest first): their files and the headline figures their report gives."""
        out = []
        base = self.output_dir()
        dirs = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime,
                      reverse=True) if base.is_dir() else []
        for d in dirs[:limit]:
            files = sorted(f.name for f in d.iterdir() if f.suffix in REPORT_SUFFIXES and not f.name.startswith("."))
            headline = {}
            for name in (f for f in files if f.endswith(".json")):
                try:
                    headline.update(read_json(d / name, "job report").get("headline") or {})
                except Exception as e:  # a damaged report is listed, not fatal
                    headline["report"] = f"unreadable: {e}"[:200]
            out.append({"run": d.name, "job": d.name.rsplit("-", 2)[0], "time": d.stat().st_mtime,
                        "files": files, "headline": headline})
        return out

    def run_file(self, run: str, name: str) -> Path | None:
        """A report file of a listed run, or None: names come from the listing, never from a path."""
        base = self.output_dir()
        if not base.is_dir():
            return None
        for d in base.iterdir():
            if d.name == run and d.is_dir():
                for f in d.iterdir():
                    if f.name == name and f.suffix in REPORT_SUFFIXES and f.is_file():
                        return f
        return None

    # -- Prometheus --------------------------------------------------------------------

    def metrics(self) -> bytes:
        """The snapshot in Prometheus' text format."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self.snapshot()))
        return generate_latest(registry)


def _totals(row: dict) -> dict:
    """The counters rates are computed from (missing parts give no rate)."""
    kernel, cache = row.get("kernel") or {}, row.get("cache") or {}
    totals = {}
    if kernel:
        totals["minio_gets"] = sum(p.get("gets", 0) for p in kernel.get("ports", {}).values())
        totals["hot_events"] = kernel.get("counters", {}).get("hot_events", 0)
    if cache:
        totals["cache_hits"] = cache.get("readers", {}).get("hits", 0)
    return totals


def _rates(t0: float, before: dict, t1: float, after: dict) -> dict:
    """Per-second rates between two totals (none across a counter reset, e.g. a restarted node)."""
    dt = t1 - t0
    return {k: (v - before[k]) / dt for k, v in after.items() if k in before and dt > 0 and v >= before[k]}


class _Collector:
    """One scrape's metrics, built from one snapshot."""

    def __init__(self, snap: dict):
        self.snap = snap

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def family(kind, name, doc, labels=("node", "address")):
            return kind(f"fasterfs_{name}", doc, labels=list(labels))

        up = family(GaugeMetricFamily, "minio_up", "1 if the node's MinIO answers its health check")
        objects = family(GaugeMetricFamily, "minio_objects", "objects in the node's bucket")
        stored = family(GaugeMetricFamily, "minio_bytes", "bytes in the node's bucket")
        restarts = family(CounterMetricFamily, "minio_restarts", "times the StorageNode restarted MinIO")
        real = family(GaugeMetricFamily, "kernel_real",
                      "1: real eBPF programs in the kernel; 0: SIMULATED user-space counting")
        kernel = {k: family(CounterMetricFamily, f"kernel_{k}", f"kernel counter {k}")
                  for k in ("requests", "hot_events", "stale_marks", "filler_skipped", "ringbuf_drops", "truncated")}
        gets = family(CounterMetricFamily, "kernel_minio_gets", "GETs to MinIO the kernel counted")
        sockopt = family(CounterMetricFamily, "sockops_options", "socket options the SOCK_OPS program set",
                         ("node", "address", "option", "result"))
        cache = {k: family(GaugeMetricFamily, f"cache_{name}", doc) for k, name, doc in (
            ("entries", "entries", "chunks in the node's cache"), ("bytes", "used_bytes", "bytes the cache holds"),
            ("capacity", "capacity_bytes", "the cache's bound; LRU eviction keeps it under"))}
        cache_counters = {k: family(CounterMetricFamily, f"cache_{k}", f"cache {k}")
                          for k in ("fills", "evictions", "hits", "misses", "bytes_from_cache", "bytes_from_minio")}
        redundancy = family(GaugeMetricFamily, "chunks", "chunks of the namespace by redundancy, as last surveyed",
                            ("state",))
        r = self.snap.get("redundancy")
        if r:
            for state, count in (("full", r["chunks"] - r["degraded"]), ("degraded", r["degraded"]),
                                 ("lost", r["lost"])):
                redundancy.add_metric([state], count)
        for n in self.snap["nodes"]:
            labels = [str(n["index"]), n["address"]]
            st, k, c = n.get("status"), n.get("kernel"), n.get("cache")
            up.add_metric(labels, 1.0 if st and st.get("healthy") else 0.0)
            if st:
                if st.get("objects") is not None:
                    objects.add_metric(labels, st["objects"])
                    stored.add_metric(labels, st["bytes"])
                restarts.add_metric(labels, st.get("minio_restarts", 0))
            if k:
                real.add_metric(labels, 1.0 if k["mode"] == "real" else 0.0)
                for name, fam in kernel.items():
                    fam.add_metric(labels, k["counters"].get(name, 0))
                gets.add_metric(labels, n["totals"].get("minio_gets", 0))
                for option, o in k.get("sockops", {}).get("options", {}).items():
                    sockopt.add_metric(labels + [option, "ok"], o["ok"])
                    sockopt.add_metric(labels + [option, "fail"], o["fail"])
            if c:
                for name, fam in cache.items():
                    fam.add_metric(labels, c[name])
                for name, fam in cache_counters.items():
                    fam.add_metric(labels, c.get(name, c["readers"].get(name, 0)))
        yield from [redundancy, up, objects, stored, restarts, real, *kernel.values(), gets, sockopt, *cache.values(),
                    *cache_counters.values()]
