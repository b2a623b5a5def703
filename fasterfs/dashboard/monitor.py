"""What the web dashboard shows, gathered: live snapshots of every StorageNode, per-second
timelines and the job runs on disk.

The dashboard actor takes a snapshot every second while anyone watches, every few seconds
otherwise (`Cadence`), reuses it for anyone who asks meanwhile and keeps the last 900, so a page
opened mid-run shows what happened before; rates and latency quantiles are differences between
consecutive snapshots, per second. The same figures as Prometheus and Ray metrics are
fasterfs.dashboard.metrics; the kernel heatmap's frames, sampled only while a /kernel page is
open, fasterfs.dashboard.heat (`Heat`).
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from pathlib import Path
from typing import Any

from ..bpf.events import hist_quantile
from ..control.node_directory import NodeDirectory
from ..control.registry import REPORT_SUFFIXES
from ..control.state import ClusterState
from ..core.config import Paths
from ..core.fsutil import read_json
from ..read.reader_stats import LATENCY_SLOTS
from .metrics import prometheus_text

# Counters whose per-second rates the dashboard shows (and charts).
RATES = {"minio_gets": "GETs to MinIO the kernel counted", "cache_hits": "reads served from the cache",
         "hot_events": "chunks the kernel made hot"}
# The timelines' series: per-second rates of these totals, and latency quantiles of these histograms.
TIMELINE_RATES = {"minio_reads": "reads from MinIO", "cache_reads": "reads from the cache",
                  "minio_gets": "GETs the kernel counted", "hot_events": "HOT events", "fills": "cache fills",
                  "evictions": "evictions"}
# The objects and bytes per node shown are what the namespace places there (current, nothing
# listed); what a MinIO holds is listed when `fasterfs status` asks, and the page shows that count
# with its age: asking for it every 15 s kept a million-object bucket listed 2 % of the time.
COUNT_MAX_AGE_S = float("inf")
TIMELINE_HISTS = {"read": "readers' read latency", "kernel": "kernel: request to first byte"}


class Cadence:
    """When the timelines take a sample: at every tick (a second) while anyone watches (a /kernel
    page's stream, or a page or API request within `watched_s`), else every `idle_s`, so a
    cluster nobody looks at is asked a fifth as often (3 calls per StorageNode a sample)."""

    def __init__(self, idle_s: float = 5.0, watched_s: float = 30.0):
        self.idle_s, self.watched_s = idle_s, watched_s
        self.watched_at = self.taken = float("-inf")

    def seen(self, now: float | None = None) -> None:
        self.watched_at = time.monotonic() if now is None else now

    def due(self, viewers: int, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if viewers > 0 or now - self.watched_at < self.watched_s or now - self.taken >= self.idle_s:
            self.taken = now
            return True
        return False


class Monitor:
    def __init__(self, root: str | Path, top_keys: int = 10, min_interval: float = 1.0, history: int = 900,
                 answer_timeout: float = 5.0):
        self.root = Path(root)
        self.state = ClusterState.load(self.root)
        self.paths = Paths(self.root)
        self.top_keys, self.min_interval, self.answer_timeout = top_keys, min_interval, answer_timeout
        self.nodes = NodeDirectory(self.state.ray_namespace)
        self.history: collections.deque = collections.deque(maxlen=history)  # (time, {node: totals})
        self._last: dict | None = None
        self._taken = float("-inf")  # monotonic: a wall-clock step back must not freeze the live view
        self._lock = threading.Lock()

    # -- live ------------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self._lock:
            if self._last is None or time.monotonic() - self._taken >= self.min_interval:
                self._last, self._taken = self._collect(), time.monotonic()
            return self._last

    def _collect(self) -> dict:
        """Ask every StorageNode at once; a node that does not answer in time is shown as such."""
        import ray

        calls: dict[int, dict[str, Any]] = {}  # node -> {part: the ObjectRef of its answer}
        missing: dict[int, str] = {}
        for node in self.state.nodes:
            actor = self.nodes.get(node.index)
            if actor is None:
                missing[node.index] = f"no StorageNode actor in Ray namespace {self.state.ray_namespace}"
                continue
            calls[node.index] = {"status": actor.status.remote(COUNT_MAX_AGE_S),
                                 "kernel": actor.kernel_status.remote(self.top_keys),
                                 "cache": actor.cache_status.remote()}
        pending = [ref for parts in calls.values() for ref in parts.values()]
        ready = set(ray.wait(pending, num_returns=len(pending), timeout=self.answer_timeout)[0] if pending else ())
        now = time.time()
        nodes = []
        for node in self.state.nodes:
            row: dict[str, Any] = {"index": node.index, "address": node.address, "endpoint": node.endpoint,
                                   "netns": node.netns}
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
                    self.nodes.forget(node.index)  # it may come back as a new actor
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
                "lab": self.state.lab, "nodes": nodes, "redundancy": redundancy, "notebook": self.notebook_url()}

    def notebook_url(self) -> str | None:
        """JupyterLab's address, if `fasterfs notebook` started it (after the dashboard)."""
        try:
            return (ClusterState.load(self.root).notebook or {}).get("url")
        except Exception:  # the state file mid-rewrite or gone with the cluster
            return None

    def timeline(self, since: float = 0.0) -> dict:
        """Per node, per second after `since`: the TIMELINE_RATES and the p50/p99 (ms) of the
        TIMELINE_HISTS over that second. A gap (no answer, a restarted counter) is null."""
        points = list(self.history)
        out: dict[str, Any] = {"time": [], "nodes": {}}
        for (t0, a), (t1, b) in itertools.pairwise(points):
            if t1 <= since:
                continue
            out["time"].append(round(t1, 3))
            for node in sorted(set(a) | set(b)):
                series = out["nodes"].setdefault(str(node), {k: [] for k in [*TIMELINE_RATES, *(
                    f"{h}_{q}" for h in TIMELINE_HISTS for q in ("p50_ms", "p99_ms"))]})
                fill = len(out["time"]) - 1 - len(series["minio_reads"])
                for values in series.values():  # a node that appeared later: nulls before it
                    values.extend([None] * fill)
                before, after = a.get(node, {}), b.get(node, {})
                rates = _rates(t0, before, t1, after)
                for k in TIMELINE_RATES:
                    series[k].append(None if k not in rates else round(rates[k], 3))
                for h in TIMELINE_HISTS:
                    delta = _hist_delta(before.get(f"{h}_hist"), after.get(f"{h}_hist"))
                    series[f"{h}_p50_ms"].append(_quantile_ms(delta, 0.5))
                    series[f"{h}_p99_ms"].append(_quantile_ms(delta, 0.99))
        return out

    def series(self, name: str) -> dict[int, list[tuple[float, float]]]:
        """Per node, (time, per-second rate of `name`) between consecutive snapshots."""
        out: dict[int, list] = collections.defaultdict(list)
        points = list(self.history)
        for (t0, a), (t1, b) in itertools.pairwise(points):
            for node, totals in b.items():
                rate = _rates(t0, a.get(node, {}), t1, totals).get(name)
                if rate is not None:
                    out[node].append((t1, rate))
        return dict(out)

    # -- job runs ----------------------------------------------------------------------

    def output_dir(self) -> Path:
        return Path(self.state.settings.output_dir or self.root / "outputs")

    def runs(self, limit: int = 30) -> list[dict]:
        """Job runs (newest first): their files and the headline figures their report gives."""
        out = []
        base = self.output_dir()
        dirs = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime,
                      reverse=True) if base.is_dir() else []
        for d in dirs[:limit]:
            files = sorted(f.name for f in d.iterdir() if f.suffix in REPORT_SUFFIXES and not f.name.startswith("."))
            headline: dict[str, Any] = {}
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
        return prometheus_text(self.snapshot())


def _totals(row: dict) -> dict:
    """The counters rates are computed from (missing parts give no rate)."""
    kernel, cache = row.get("kernel") or {}, row.get("cache") or {}
    totals = {}
    if kernel:
        totals["minio_gets"] = sum(p.get("gets", 0) for p in kernel.get("ports", {}).values())
        totals["hot_events"] = kernel.get("counters", {}).get("hot_events", 0)
        hist: dict[int, int] = collections.Counter()
        for p in kernel.get("ports", {}).values():
            hist.update({int(s): c for s, c in p.get("latency_hist_log2_us", {}).items()})
        totals["kernel_hist"] = dict(hist)
    if cache:
        readers = cache.get("readers", {})
        totals["cache_hits"] = totals["cache_reads"] = readers.get("hits", 0)
        totals["minio_reads"] = readers.get("misses", 0)
        totals["fills"] = cache.get("fills", 0)
        totals["evictions"] = cache.get("evictions", 0)
        totals["read_hist"] = {s: readers.get(f"latency_us_log2_{s}", 0) for s in range(LATENCY_SLOTS)}
    return totals


def _hist_delta(before: dict | None, after: dict | None) -> dict[int, int] | None:
    if before is None or after is None:
        return None
    delta = {s: c - before.get(s, 0) for s, c in after.items()}
    return None if any(v < 0 for v in delta.values()) else delta  # a counter reset: no figure


def _quantile_ms(hist: dict[int, int] | None, q: float) -> float | None:
    """Upper edge of the log2 bucket holding quantile q, in ms; None with no reads."""
    us = hist_quantile(hist, q) if hist else None
    return None if us is None else (us + 1) / 1000


def _rates(t0: float, before: dict, t1: float, after: dict) -> dict:
    """Per-second rates between two totals (none across a counter reset, e.g. a restarted node)."""
    dt = t1 - t0
    return {k: (v - before[k]) / dt for k, v in after.items()
            if isinstance(v, int) and k in before and dt > 0 and v >= before[k]}
