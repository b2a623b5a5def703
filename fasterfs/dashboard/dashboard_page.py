"""The dashboard's page, rendered on the server from a Monitor's snapshot: each node's MinIO, what
its kernel programs counted and made hot, its cache, the runs of jobs. Every figure shown comes
from the snapshot; a node that did not answer is shown as silent, never filled in.
"""
from __future__ import annotations

import time
from html import escape as e
from typing import Any

from ..control.report import fmt_bytes, fmt_writes_told
from ..node.mount_supervisor import mount_counts
from .monitor import RATES, Monitor

COLORS = ("#0b6bcb", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207", "#4d7c0f")


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#0d1b2a;color:#fff;padding:10px 20px}header a{color:#9cd}
main{padding:8px 20px}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;margin-bottom:6px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:right}th{background:#eef1f4}
td.l,th.l{text-align:left}.ok{color:#15803d}.bad{color:#b91c1c;font-weight:600}.warn{color:#b45309;font-weight:600}
.sim{background:#fff3c4;border:2px solid #d4a000;padding:8px;margin:8px 0;font-weight:600}
.err{background:#ffe4e4;border:2px solid #b91c1c;padding:8px;margin:8px 0}
.muted{color:#656d76}.charts{display:flex;gap:16px;flex-wrap:wrap}
.charts figure{margin:0;background:#fff;border:1px solid #d0d7de;padding:6px}
img.run{max-width:560px;border:1px solid #d0d7de;background:#fff}
"""


SCRIPT = """
const live = document.getElementById('live');
setInterval(async () => {
  try {
    const r = await fetch('fragment');
    if (!r.ok) return;
    live.innerHTML = await r.text();
    live.dataset.refreshes = (+live.dataset.refreshes || 0) + 1;
  } catch (err) {}  // the cluster is going down: keep the last figures on screen
}, REFRESH_MS);
"""


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Cells are HTML already (escaped by the caller); the first `left` columns align left."""
    cls = lambda i: ' class="l"' if i < left else ""  # noqa: E731
    out = ["<table><tr>", *(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(head)), "</tr>"]
    for row in rows:
        out += ["<tr>", *(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)), "</tr>"]
    return "".join(out + ["</table>"])


def _num(v, fmt: str = "{:,}") -> str:
    return "-" if v is None else e(fmt.format(v))


def _age(seconds: float | None) -> str:
    """How old a count is, when older than the dashboard's refresh: a big bucket is listed seldom."""
    return "" if seconds is None or seconds < 60 else f" ({seconds / 60:.0f} min ago)"


def _banners(snap: dict) -> str:
    out = []
    simulated = [n for n in snap["nodes"] if (n.get("kernel") or {}).get("mode") == "simulated"]
    if simulated:
        why = simulated[0]["kernel"]["simulated_because"]
        out.append(f'<div class="sim">SIMULATED kernel on node(s) {e(", ".join(str(n["index"]) for n in simulated))}: '
                   f'no eBPF programs run there ({e(why)}). Their request counts come from the readers, '
                   f'not from the kernel, and no socket is tuned.</div>')
    for n in snap["nodes"]:
        if n.get("error"):
            out.append(f'<div class="err">node {n["index"]} ({e(n["address"])}): {e(n["error"])}</div>')
    return "".join(out)


def _nodes(snap: dict) -> str:
    rows = []
    for n in snap["nodes"]:
        st, k = n.get("status") or {}, n.get("kernel") or {}
        if not st:
            health = '<span class="bad">no answer</span>'
        elif st.get("healthy"):
            health = '<span class="ok">healthy</span>'
        else:
            health = '<span class="bad">held</span>' if st.get("held") else '<span class="bad">down</span>'
        mode: dict[str | None, str] = {"real": '<span class="ok">real eBPF</span>',
                                       "simulated": '<span class="bad">SIMULATED</span>'}
        rows.append([str(n["index"]), e(n["address"] + (f" ({n['netns']})" if n.get("netns") else "")),
                     e(n["endpoint"]), health, _num(st.get("placed_objects")), e(fmt_bytes(st.get("placed_bytes"))),
                     _num(st.get("objects")) + _age(st.get("objects_age_s")),
                     _num(st.get("minio_restarts")), mode.get(k.get("mode"), "-"), _mounts(st.get("mounts"))])
    return _table(["node", "address", "MinIO", "health", "objects", "stored", "listed in MinIO", "MinIO restarts",
                   "kernel", "FUSE mounts"], rows, 4)


def _mounts(mounts: list[dict] | None) -> str:
    """A node's mounts: path, its daemon's PID, and whether both daemon and mount are there."""
    if not mounts:
        return '<span class="muted">none</span>' if mounts is not None else "-"
    state = lambda m: ('<span class="ok">healthy</span>' if m["healthy"] else  # noqa: E731
                       '<span class="bad">daemon dead</span>' if not m["alive"] else
                       '<span class="bad">not mounted</span>')
    return "<br>".join(f"{e(m['path'])} (daemon {m['pid']}) {state(m)}<br><small>{e(mount_counts(m.get('daemon')))}"
                       "</small>" for m in mounts)


def _redundancy(snap: dict) -> str:
    r = snap.get("redundancy")
    if not r:
        return ('<p class="muted">Redundancy: not surveyed yet (the lowest-numbered live node does when nodes or '
                'the namespace change, and every repair.survey_s)</p>')
    down = f'; nodes down: {e(", ".join(map(str, r["nodes_down"])))}' if r["nodes_down"] else ""
    lost = "".join(f"; <b>LOST</b> {e(name)}: chunks {e(', '.join(map(str, ids)))}"
                   for name, ids in r["lost_chunks"].items())
    more = r.get("lost_names", 0) - len(r["lost_chunks"])
    lost += f"; and {more:,} more names with lost chunks" if more > 0 else ""
    cls = "bad" if r["lost"] else "warn" if r["degraded"] else "ok"
    moving = f"; {e(r['moving'])}" if r.get("moving") else ""  # growth or a drain: pieces on their way home
    return (f'<p>Redundancy: <span class="{cls}">{r["chunks"] - r["degraded"]:,} of {r["chunks"]:,} chunks at full '
            f'redundancy, {r["degraded"]:,} degraded</span>{lost}{down}{moving} '
            f'<span class="muted">(surveyed {e(time.strftime("%H:%M:%S", time.localtime(r["time"])))})</span></p>')


def _kernel(snap: dict) -> str:
    rows, sock_rows, hot_rows = [], [], []
    for n in snap["nodes"]:
        k = n.get("kernel")
        if not k:
            continue
        c, rates = k["counters"], n.get("rates", {})
        lat = [p for p in k["ports"].values() if p.get("latency_count")]
        avg = lat[0]["latency_avg_us"] if lat else None
        rows.append([str(n["index"]), _num(c.get("requests", 0)), _num(n["totals"].get("minio_gets")),
                     _num(rates.get("minio_gets"), "{:.1f}"), _num(k["hot_threshold"]), _num(c.get("hot_events", 0)),
                     _num(c.get("stale_marks", 0)), _num(c.get("filler_skipped", 0)), _num(k["keys_tracked"]),
                     _num(avg, "{:.0f}"), _num(c.get("ringbuf_drops", 0)),
                     _num((k.get("key_counts") or {}).get("evicted")),
                     _num((k.get("key_counts") or {}).get("second_chances")), _num(k["epoch"])])
        sock = k.get("sockops", {})
        opts = sock.get("options", {})
        sock_rows.append([str(n["index"]), _num(sock.get("connections_matched", 0 if opts else None)),
                          " ".join(f"{e(name)} <span class=ok>{o['ok']} ok</span>"
                                   + (f" <span class=bad>{o['fail']} refused (errno {o['last_error']})</span>"
                                      if o["fail"] else "")
                                   for name, o in opts.items()) or e(sock.get("skipped") or "not attached")])
        for t in k["top_keys"]:
            hot_rows.append([str(n["index"]), e(t["name"] or t["key"]), _num(t["count"]),
                             "yes" if t["count"] >= k["hot_threshold"] else "no",
                             {True: '<span class="ok">cached</span>', False: "not cached"}.get(t.get("cached"), "-")])
    out = _table(["node", "requests", "MinIO GETs", "GETs/s", "hot at", "HOT events", "stale marks",
                  "filler GETs skipped", "keys tracked", "request → first byte µs (avg)", "ring-buffer drops",
                  "counts let go", "known again (second chance)", "epoch"], rows)
    out += "<h2>Connection tuning (SOCK_OPS)</h2>" + _table(["node", "MinIO connections", "options set"], sock_rows, 3)
    out += ("<h2>Hottest chunks (kernel counts this epoch)</h2>"
            + (_table(["node", "chunk", "GETs", "hot", "on this node's disk"], hot_rows, 2) if hot_rows
               else '<p class="muted">no GETs counted yet</p>'))
    return out


def _cache(snap: dict) -> str:
    rows = []
    for n in snap["nodes"]:
        c = n.get("cache")
        if not c:
            continue
        rd, f = c["readers"], c["filler"]
        reads = rd["hits"] + rd["misses"]
        rows.append([str(n["index"]), _num(c["entries"]), e(fmt_bytes(c["bytes"])), e(fmt_bytes(c["capacity"])),
                     _num(c["bytes"] / c["capacity"] if c["capacity"] else None, "{:.1%}"), _num(rd["hits"]),
                     _num(rd["misses"]), _num(rd["hits"] / reads if reads else None, "{:.1%}"),
                     _num(n.get("rates", {}).get("cache_hits"), "{:.1f}"), e(fmt_bytes(rd["bytes_from_cache"])),
                     _num(f.get("hot_fills", 0)), _num(f.get("prefetch_fills", 0)), _num(c["evictions"]),
                     _num(c["fills_pending"]), e(fmt_writes_told(c["writes_told"]))])
    return _table(["node", "entries", "size", "capacity", "used", "hits", "misses", "hit ratio", "hits/s",
                   "served from cache", "kernel-triggered fills", "prefetch fills", "evictions", "fills pending",
                   "writes seen / peers told (late)"], rows)


def _events(snap: dict, limit: int = 12) -> str:
    events = sorted(((ev, n["index"]) for n in snap["nodes"]
                     for ev in (n.get("kernel") or {}).get("recent_events", [])),
                    key=lambda x: x[0].get("ts_ns", 0), reverse=True)[:limit]
    if not events:
        return '<p class="muted">none yet</p>'
    return _table(["node", "event", "request", "count"],
                  [[str(i), e(ev["type"]), e(f"{ev['method']} {ev['path']}"), _num(ev.get("count"))]
                   for ev, i in events], 3)


def _spark(series: dict[int, list[tuple[float, float]]], now: float, span: float = 300, w: int = 420,
           h: int = 90) -> str:
    """An SVG line per node of a rate over the last `span` seconds (points are real snapshots)."""
    peak = max((v for pts in series.values() for _, v in pts), default=0) or 1
    lines = []
    for node, pts in sorted(series.items()):
        xy = " ".join(f"{w * (1 - (now - t) / span):.1f},{h - 4 - (h - 14) * v / peak:.1f}"
                      for t, v in pts if now - t <= span)
        if xy:
            lines.append(f'<polyline fill="none" stroke="{COLORS[node % len(COLORS)]}" stroke-width="1.6" '
                         f'points="{xy}"><title>node {node}</title></polyline>')
    legend = " ".join(f'<tspan fill="{COLORS[n % len(COLORS)]}">node {n}</tspan>' for n in sorted(series))
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}"><rect width="{w}" height="{h}" fill="#fff"/>'
            f'<text x="4" y="11" font-size="10" fill="#656d76">peak {peak:,.1f}/s · last {span / 60:.0f} min · '
            f'{legend}</text>{"".join(lines)}</svg>')


def _charts(monitor: Monitor, now: float) -> str:
    figs = [f"<figure>{_spark(monitor.series(name), now)}<figcaption>{e(label)} per second</figcaption></figure>"
            for name, label in RATES.items()]
    return ('<div class="charts">' + "".join(figs) + '</div><p class="muted">Rates are measured between the '
            'snapshots this dashboard took while someone was watching; gaps mean nobody was.</p>')


def _runs(monitor: Monitor) -> str:
    runs = monitor.runs()
    if not runs:
        return f'<p class="muted">no job runs yet under {e(str(monitor.output_dir()))}</p>'
    rows, latest = [], {}
    for r in runs:
        links = " ".join(f'<a href="runs/{e(r["run"])}/{e(f)}">{e(f)}</a>' for f in r["files"])
        figures = "<br>".join(f"{e(k)}: <b>{e(str(v))}</b>" for k, v in r["headline"].items())
        rows.append([e(r["job"]), e(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))), figures, links])
        png = next((f for f in r["files"] if f.endswith(".png")), None)
        if png and r["job"] not in latest:
            latest[r["job"]] = f'<figure><img class="run" src="runs/{e(r["run"])}/{e(png)}" alt="{e(r["run"])}">' \
                               f'<figcaption>{e(r["run"])}</figcaption></figure>'
    return _table(["job", "finished", "measured", "report"], rows, 4) + \
        '<div class="charts">' + "".join(latest.values()) + "</div>"


def _ray_jobs(monitor: Monitor) -> str:
    jobs = ray_jobs(monitor.state.dashboard_url)
    if jobs and "error" in jobs[0]:
        return f'<p class="muted">{e(jobs[0]["error"])}</p>'
    if not jobs:
        return '<p class="muted">none submitted (`ray job submit --address ... -- python jobs/demo_a.py`)</p>'
    cls = {"RUNNING": "warn", "SUCCEEDED": "ok", "FAILED": "bad", "STOPPED": "bad"}
    rows = [[e(j["id"]), f'<span class="{cls.get(j["status"], "")}">{e(j["status"])}</span>', e(j["entrypoint"]),
             e(time.strftime("%H:%M:%S", time.localtime(j["start"]))) if j["start"] else "-",
             f'{(j["end"] or time.time()) - j["start"]:.0f} s' if j["start"] else "-", e(j["message"] or "")]
            for j in jobs[:10]]
    return _table(["job", "status", "entrypoint", "started", "ran", "message"], rows, 3)


def render_live(monitor: Monitor) -> str:
    """The part of the page that refreshes."""
    snap = monitor.snapshot()
    now = snap["time"]
    return (f'<p class="muted">updated {e(time.strftime("%H:%M:%S", time.localtime(now)))}; cluster up '
            f'{(now - snap["started"]) / 60:.0f} min</p>' + _banners(snap)
            + "<h2>Nodes</h2>" + _nodes(snap) + _redundancy(snap) + "<h2>Kernel programs</h2>" + _kernel(snap)
            + "<h2>Caches</h2>" + _cache(snap) + "<h2>Live rates</h2>" + _charts(monitor, now)
            + "<h2>Recent kernel events</h2>" + _events(snap) + "<h2>Ray jobs</h2>" + _ray_jobs(monitor)
            + "<h2>Job runs</h2>" + _runs(monitor))


def insecure_banner(state) -> str:
    return ('<p style="color:#b91c1c"><b>Insecure:</b> Ray runs without token authentication '
            "(cluster.insecure=true): anyone who reaches it can run code on the cluster.</p>") if state.insecure else ""


def render_page(monitor: Monitor, refresh_s: float) -> str:
    st = monitor.state
    where = f"lab ({st.lab['profile']} profile)" if st.lab else "local"
    lab_url = monitor.notebook_url()
    jupyter = f' · <a href="{e(lab_url)}">JupyterLab</a>' if lab_url else ""
    insecure = insecure_banner(st)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>FasterFS — {e(st.name)}</title>'
            f"<style>{STYLE}</style></head><body><header><b>FasterFS</b> · cluster {e(st.name)} · {where} · "
            f"{len(st.nodes)} nodes · Ray {e(st.ray_address)} · "
            f"<a href=\"{e(st.dashboard_url)}\">Ray dashboard</a>{jupyter}"
            ' · <a href="kernel">kernel view</a> · <a href="runs">job runs, charted</a> · '
            '<a href="api/snapshot">JSON</a> · <a href="metrics">metrics</a></header>'
            f'{insecure}<main id="live">{render_live(monitor)}</main>'
            f"<script>{SCRIPT.replace('REFRESH_MS', str(int(refresh_s * 1000)))}</script></body></html>")


def ray_jobs(ray_dashboard: str) -> list[dict]:
    """Jobs submitted to Ray (`ray job submit`), newest first, from Ray's job API."""
    from ray.job_submission import JobSubmissionClient

    try:
        jobs = JobSubmissionClient(ray_dashboard).list_jobs()
    except Exception as err:
        return [{"error": f"Ray's job API at {ray_dashboard} did not answer: {type(err).__name__}"}]
    submitted: list[dict[str, Any]] = [
        {"id": j.submission_id or j.job_id, "status": str(j.status.value if hasattr(j.status, "value") else j.status),
         "entrypoint": j.entrypoint, "start": (j.start_time or 0) / 1000, "end": (j.end_time or 0) / 1000,
         "message": j.message, "metadata": j.metadata or {}} for j in jobs
        if j.submission_id]  # `ray job submit`, not every driver that connected
    return sorted(submitted, key=lambda j: j["start"], reverse=True)[:50]
