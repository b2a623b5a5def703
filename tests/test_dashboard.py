"""FasterFS's web dashboard on the live 2-node cluster: it serves what the StorageNodes
report (the kernel's counts, a chunk the kernel made hot and the cache filled, job runs
and their charts), as HTML, JSON and Prometheus metrics; it refuses paths outside the
job reports; down removes it (conftest); a taken port is named (test_lifecycle)."""
import json
import os
import urllib.error
import urllib.request
from itertools import pairwise
from pathlib import Path

import pytest
import ray
from conftest import dashboard_headers, load_job, minio_holdings, wait_until
from prometheus_client.parser import text_string_to_metric_families

from fasterfs import bpf
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.dashboard.dashboard_page import _banners, _nodes
from fasterfs.dashboard.monitor import Cadence, Monitor
from fasterfs.ops import cluster


def get(state, path: str) -> tuple[int, bytes, str]:
    """GET `path` of the cluster's dashboard, with its token."""
    try:
        with urllib.request.urlopen(urllib.request.Request(state.web_url + path, headers=dashboard_headers(state)),
                                    timeout=30) as r:
            return r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def api(state, path: str):
    status, body, _ = get(state, path)
    assert status == 200, body[:300]
    return json.loads(body)


def test_dashboard_listens_on_the_head_address(live_cluster):
    assert live_cluster.web_url == f"http://{live_cluster.nodes[0].address}:{live_cluster.config['dashboard']['port']}"
    assert api(live_cluster, "/healthz") == {"ok": True, "cluster": live_cluster.name}
    snap = api(live_cluster, "/api/snapshot")
    assert [n["address"] for n in snap["nodes"]] == [n.address for n in live_cluster.nodes]
    for row, node in zip(snap["nodes"], live_cluster.nodes):
        assert "error" not in row, row.get("error")
        assert row["status"]["healthy"] and row["status"]["node_id"] == node.ray_node_id
        assert row["kernel"]["mode"] == "real" and row["kernel"]["tc"]


def test_hot_chunk_shows_counted_and_cached(ingest_as, client_for, live_cluster):
    manifest = ingest_as("csv", reuse=True)  # the caches are cleared below
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])  # a new epoch: every key cold
    chunk = manifest.chunk(3)
    owner = chunk.nodes[0]
    client = client_for()
    for _ in range(2):  # the kernel's threshold: the second GET makes it hot
        client.read_chunk(3)
    name = f"chunk 3 ({chunk.key})"

    def hot_row():
        rows = api(live_cluster, "/api/snapshot")["nodes"][owner]["kernel"]["top_keys"]
        return next((t for t in rows if t["name"] == name and t["cached"]), None)
    wait_until(lambda: hot_row() is not None, 20, "the dashboard to show chunk 3 hot and cached")
    assert hot_row()["count"] == 2
    status, page, ctype = get(live_cluster, "/")
    assert status == 200 and ctype.startswith("text/html")
    html = page.decode()
    assert name in html and "real eBPF" in html and "SIMULATED" not in html

    # /metrics says what the StorageNode says
    metrics = {(s.name, s.labels.get("node")): s.value
               for fam in text_string_to_metric_families(get(live_cluster, "/metrics")[1].decode())
               for s in fam.samples}
    kernel = ray.get(actors[owner].kernel_status.remote())
    cache = ray.get(actors[owner].cache_status.remote())
    assert metrics[("fasterfs_kernel_hot_events_total", str(owner))] == kernel["counters"]["hot_events"] >= 1
    assert metrics[("fasterfs_cache_entries", str(owner))] == cache["entries"] >= 1
    assert metrics[("fasterfs_cache_used_bytes", str(owner))] == cache["bytes"]
    assert metrics[("fasterfs_kernel_real", str(owner))] == 1
    assert all(metrics[("fasterfs_minio_up", str(n.index))] == 1 for n in live_cluster.nodes)


def test_heatmap_past_its_cells_shows_the_names_being_read(ingest_as, client_for, live_cluster, cfg, tmp_path):
    """A namespace of more chunks than the heatmap's cells: the layout holds the names the
    kernels count (the dataset read), says how many chunks the namespace holds (the store's
    manifests counted here), and a host's row over it shows the read chunk cached; with cells
    for every chunk, every name."""
    from fasterfs.control import registry
    from fasterfs.dashboard.heat import Heat
    from fasterfs.node import heatmap
    from fasterfs.write import ingest

    manifest = ingest_as("csv", reuse=True)
    (tmp_path / "other.bin").write_bytes(os.urandom(1000))
    ingest.put(cfg, tmp_path / "other.bin", "heat/other.bin")  # one chunk more than the dataset
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])  # a new epoch: no name counted
    chunk = manifest.chunk(3)
    owner = chunk.nodes[0]
    client = client_for()
    for _ in range(2):  # the kernel's threshold: hot, then filled
        client.read_chunk(3)
    wait_until(lambda: ray.get(actors[owner].cache_status.remote())["entries"] >= 1, 20, "chunk 3's fill")
    total = sum(len(m.chunks) for m in registry.fetch_manifests(live_cluster.name)[1].values())
    heat = Heat(live_cluster, interval=3600, cells=len(manifest))
    layout, names = heat.current()
    assert names == [manifest.name] and [d["name"] for d in layout["datasets"]] == names
    assert layout["total_chunks"] == total > len(manifest)
    layout_id, row = ray.get(actors[owner].heat.remote(names))
    assert layout_id == layout["id"] and len(row) == len(manifest)
    assert row[3] >> 5 == heatmap.CACHED
    heat.watch(+1)  # the sampler's frame over the same names: each host's row, present, the same
    wait_until(lambda: heat.frame[0] >= 1, 30, "a frame")
    body = heat.frame[1][heatmap.HEADER.size:]
    rows = [body[i * (1 + len(row)):(i + 1) * (1 + len(row))] for i in range(len(live_cluster.nodes))]
    assert rows[owner] == b"\x01" + row and all(r[0] == 1 for r in rows), heat.missing
    heat.watch(-1)
    everything, names = Heat(live_cluster, interval=3600, cells=total).current()
    assert names is None and sum(len(d["keys"]) for d in everything["datasets"]) == everything["total_chunks"] == total


def test_job_runs_listed_with_their_reports(live_cluster, overrides):
    result = load_job("graysort").main(overrides + ["graysort.size=2MB", "graysort.baseline=false",
                                                    "graysort.reference_mb=0"])
    runs = api(live_cluster, "/api/runs")
    run = next(r for r in runs if r["job"] == "graysort")
    assert run["headline"]["sorted"] == "2 MB on 2 nodes, valid"
    t = result["times"]["map_reduce_s"]
    assert run["headline"]["map+shuffle+reduce"] == f"{t:.2f} s ({result['bytes'] / 1e6 / t:.0f} MB/s)"
    out = Path(live_cluster.root, "outputs", run["run"])
    status, body, ctype = get(live_cluster, f"/runs/{run['run']}/graysort.png")
    assert status == 200 and ctype == "image/png" and body == (out / "graysort.png").read_bytes()
    page = get(live_cluster, "/")[1].decode()
    assert f"runs/{run['run']}/graysort.png" in page

    # only report files of listed runs: nothing else under the cluster root
    (out / "notes.txt").write_text("not a report")
    for path in (f"/runs/{run['run']}/notes.txt", f"/runs/{run['run']}/absent.png", "/runs/..%2F/credentials.json",
                 f"/runs/{run['run']}/..%2F..%2Fcredentials.json", "/runs/nosuchrun/graysort.json"):
        status, body, _ = get(live_cluster, f"{path}")
        assert status == 404, (path, status)
        assert b"access_key" not in body


def test_stopped_minio_shown_down_not_healthy(live_cluster):
    actor = cluster.storage_nodes(live_cluster)[1]
    ray.get(actor.hold_minio.remote())
    try:
        def node1():
            return api(live_cluster, "/api/snapshot")["nodes"][1]
        wait_until(lambda: node1()["status"]["healthy"] is False, 10, "node 1 shown not healthy")
        assert node1()["status"]["held"] and node1()["status"]["objects"] is None  # unknown, not zero
        assert '<span class="bad">held</span>' in get(live_cluster, "/")[1].decode()
        up = {s.labels["node"]: s.value for fam in text_string_to_metric_families(
            get(live_cluster, "/metrics")[1].decode()) for s in fam.samples if s.name == "fasterfs_minio_up"}
        assert up == {"0": 1.0, "1": 0.0}
    finally:
        ray.get(actor.release_minio.remote())
    wait_until(lambda: api(live_cluster, "/api/snapshot")["nodes"][1]["status"]["healthy"], 10, "node 1 healthy again")


def test_page_refreshes_itself_in_a_browser(live_cluster, tmp_path):
    """Headless Chromium, logged in, runs the page's script: it fetches the live part and puts it
    in place, refresh after refresh."""
    from browser import Browser

    b = Browser()
    try:
        b.log_in(live_cluster)
        b.open(f"{live_cluster.web_url}/")
        b.wait("Number(document.getElementById('live').dataset.refreshes) >= 2",
               5 * live_cluster.config["dashboard"]["refresh_s"] + 30, "two refreshes of the live part")
        dom = b.js("document.documentElement.outerHTML")
    finally:
        b.close()
    assert "real eBPF" in dom and "Hottest chunks" in dom


def test_simulated_nodes_labelled(live_cluster):
    """A node whose kernel programs are the user-space stand-in is labelled wherever it shows."""
    cluster.connect_ray(live_cluster)
    snap = Monitor(live_cluster.root).snapshot()
    stand_in = bpf.load("simulated")
    try:
        snap["nodes"][1]["kernel"] = stand_in.snapshot()
    finally:
        stand_in.close()
    banner, table = _banners(snap), _nodes(snap)
    assert "SIMULATED kernel on node(s) 1" in banner and "kernel.mode=simulated" in banner
    assert table.count("SIMULATED") == 1 and table.count("real eBPF") == 1


@pytest.mark.unit
def test_timelines_sample_every_tick_only_while_watched():
    """Ticks a second apart: nobody watching, a sample every idle_s; a request, then every tick
    until watched_s has passed; a /kernel viewer, every tick."""
    c = Cadence(idle_s=5, watched_s=30)
    assert [t for t in range(20) if c.due(0, t)] == [0, 5, 10, 15]
    c.seen(20)
    assert [t for t in range(20, 60) if c.due(0, t)] == list(range(20, 50)) + [54, 59]
    assert [t for t in range(60, 64) if c.due(1, t)] == [60, 61, 62, 63]


@pytest.mark.unit
def test_bad_refresh_named():
    with pytest.raises(FasterFSError, match="dashboard.refresh_s"):
        config.load(["dashboard.refresh_s=0"])


# -- the live /kernel view -------------------------------------------------------------------

PIXEL_STATES = """(() => {
  const ctx = document.getElementById('grid').getContext('2d'), L = ffs.layout;
  const d = L.datasets.findIndex(x => x.name === NAME), off = L.offsets[d], n = L.datasets[d].keys.length;
  const names = Object.fromEntries(Object.entries(L.rgb).map(([c, rgb]) => [rgb.join(','), L.states[c].name]));
  return L.nodes.map((_, h) => Array.from({length: n}, (_, i) => {
    const [x, y] = ffs.cellXY(h, off + i), p = ctx.getImageData(x, y, 1, 1).data;
    return names[[p[0], p[1], p[2]].join(',')] || 'shaded';
  }));
})()"""


def _pixels(b, name: str) -> list[list[str]]:
    """Each host's cells of dataset `name`, by the colour drawn on the canvas."""
    return b.js(PIXEL_STATES.replace("NAME", json.dumps(name)))


def test_kernel_view_live_in_a_browser(ingest_as, live_cluster, overrides, tmp_path):
    """Demo A (the suite's one run of it; its main in this process, as a notebook would run it),
    while headless Chromium shows /kernel: Demo A's passes and the kernel's counts; the canvas' pixels go
    from every chunk unread to chunks cached; the readers' latency timeline drops when reads come
    from the cache; the page reconnects by itself after the dashboard actor restarts."""
    from browser import Browser

    manifest = ingest_as("csv", reuse=True)
    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])  # Demo A clears them too: the page must see them empty
    b = Browser()
    try:
        b.log_in(live_cluster)
        b.open(f"{live_cluster.web_url}/kernel")
        b.wait("window.ffs && ffs.frames > 1 && ffs.layout", 60, "the first frames")
        before = _pixels(b, manifest.name)
        b.screenshot(tmp_path / "kernel-before.png")
        assert [len(h) for h in before] == [len(manifest)] * len(live_cluster.nodes)
        assert {s for h in before for s in h} == {"not read"}, before
        result = load_job("demo_a").main(overrides)
        passes = result["passes"]
        assert set(passes) == set(load_job("demo_a").PASSES)
        # every chunk (as the MinIO servers list them) was read twice from MinIO (cold, warm): the
        # kernels made each hot exactly once, and the nodes cached each
        chunks = sum(len(objs) for objs in minio_holdings(live_cluster, manifest).values())
        assert sum(k["hot_events"] for k in result["kernel"]) == chunks
        assert sum(k["hot_events_received"] for k in result["kernel"]) == chunks
        assert result["filled_after_warm"] == chunks
        assert passes["FasterFS hot"]["p50_ms"] < passes["FasterFS cold"]["p50_ms"]
        seen = b.js("ffs.frames")
        b.wait(f"ffs.frames > {seen + 1}", 30, "frames after Demo A")
        after = _pixels(b, manifest.name)
        b.screenshot(tmp_path / "kernel-after.png")
        cached = sum(s == "in this host's cache" for h in after for s in h)
        assert cached >= len(manifest) // 2, after  # Demo A's hot passes read every chunk from a cache
        b.wait("ffs.timeline && ffs.timeline.time.length > 3", 30, "the timeline")
        # each host's line of read p50s, in time order: somewhere it falls (MinIO's reads, then the cache's)
        lines = [[v for v in h if v] for h in b.js("Object.values(ffs.timeline.nodes).map(n => n.read_p50_ms)")]
        assert any(later < earlier for line in lines for earlier, later in pairwise(line)), lines

        # Demo A's run charted on /runs from its own report
        run = next(r for r in api(live_cluster, "/api/runs") if r["job"] == "demo_a")
        reported = api(live_cluster, f"/runs/{run['run']}/demo_a.json")["passes"]  # in the report's order
        assert reported == passes
        b.open(f"{live_cluster.web_url}/runs?job=demo_a")
        b.wait("window.ffsRuns && ffsRuns.shown && ffsRuns.charts.length", 30, "the runs page's charts")
        assert b.js("ffsRuns.shown[0]") == run["run"]
        assert b.js("ffsRuns.charts[0].data[1]") == [p["p50_ms"] for p in reported.values()]
        b.open(f"{live_cluster.web_url}/kernel")
        b.wait("window.ffs && ffs.frames > 1", 60, "the kernel view again")

        dashboard = ray.get_actor("dashboard", namespace=live_cluster.ray_namespace)
        frames = b.js("ffs.frames")
        ray.kill(dashboard, no_restart=False)
        b.wait(f"ffs.reconnects > 0 && ffs.frames > {frames} && document.getElementById('status').textContent"
               " === 'live'", 90, "the page to reconnect to the restarted dashboard")
    finally:
        b.close()
    assert api(live_cluster, "/healthz")["ok"]


def test_kernel_stream_survives_bad_viewers(live_cluster):
    """A viewer that never reads, a hundred viewers, malformed messages, a StorageNode that stops
    answering mid-stream: the stream goes on, the page is told what is missing, and every
    viewer's slot is given back when it leaves."""
    import base64
    import os
    import signal
    import socket

    from websockets.sync.client import connect

    host, port = live_cluster.web_url.split("//")[1].split(":")
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect((host, int(port)))
    auth_lines = "".join(f"{k}: {v}\r\n" for k, v in dashboard_headers(live_cluster).items())
    stuck.sendall((f"GET /ws/kernel HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                   f"Sec-WebSocket-Version: 13\r\n{auth_lines}\r\n").encode())  # and never reads again
    url = live_cluster.web_url.replace("http://", "ws://") + "/ws/kernel"
    viewers = [connect(url, max_size=None, additional_headers=dashboard_headers(live_cluster)).__enter__()
               for _ in range(100)]
    try:
        for ws in viewers[:10]:
            ws.send("{not json")
            ws.send(b"\xff\x00garbage")
        for ws in viewers:  # each gets the missing-list message and a frame
            got = [ws.recv(timeout=30) for _ in range(2)]
            assert any(isinstance(m, bytes) and m[:4] == b"FFSH" for m in got)
        assert api(live_cluster, "/api/kernel/stats")["viewers"] == 101

        node1 = ray.get_actor(cluster.actor_name(1), namespace=live_cluster.ray_namespace)
        pid = ray.get(node1.status.remote())["actor_pid"]
        os.kill(pid, signal.SIGSTOP)  # a StorageNode that stops answering (a restart can be too quick to see)
        try:
            assert wait_until(lambda: "1" in api(live_cluster, "/api/kernel/stats")["missing"], 30,
                              "node 1 named missing")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: not api(live_cluster, "/api/kernel/stats")["missing"], 60, "node 1 back")
    finally:
        for ws in viewers:
            ws.close()
        stuck.close()
    assert wait_until(lambda: api(live_cluster, "/api/kernel/stats")["viewers"] == 0, 30, "every viewer gone")
    assert api(live_cluster, "/healthz")["ok"]
