"""The dashboard's figures as metrics: Prometheus' text format for /metrics, and the same
families as Ray metrics, both built from one Monitor snapshot (fasterfs.dashboard.monitor)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.util.metrics import Gauge


def prometheus_text(snap: dict) -> bytes:
    """The snapshot in Prometheus' text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snap))
    return generate_latest(registry)


class RayMetrics:
    """The /metrics families also as Ray metrics (ray.util.metrics): each Ray node's metrics
    agent exports them with Ray's own (as ray_fasterfs_*), so a Ray user's Prometheus and
    Grafana see FasterFS beside Ray. Gauges throughout: they carry the totals as sampled."""

    def __init__(self) -> None:
        self._gauges: dict[str, Gauge] = {}

    def export(self, snap: dict) -> None:
        from ray.util.metrics import Gauge

        for family in _Collector(snap).collect():
            for sample in family.samples:
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    gauge = self._gauges[sample.name] = Gauge(sample.name, description=family.documentation,
                                                              tag_keys=tuple(sorted(sample.labels)))
                gauge.set(sample.value, tags=dict(sample.labels))


class _Collector:
    """One scrape's metrics, built from one snapshot."""

    def __init__(self, snap: dict):
        self.snap = snap

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def family(kind, name, doc, labels=("node", "address")):
            return kind(f"fasterfs_{name}", doc, labels=list(labels))

        up = family(GaugeMetricFamily, "minio_up", "1 if the node's MinIO answers its health check")
        objects = family(GaugeMetricFamily, "minio_objects", "objects the namespace places in the node's bucket")
        stored = family(GaugeMetricFamily, "minio_bytes", "bytes the namespace places in the node's bucket")
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
                objects.add_metric(labels, st["placed_objects"])
                stored.add_metric(labels, st["placed_bytes"])
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
