"""What watching costs, measured in one run on a running cluster (`fasterfs up`):

1. a file of bench.dashboard_chunks tiny chunks is stored, so the heatmap has that many cells
   per host (plus whatever the namespace holds);
2. CPU (share of one core, from /proc) and resident memory of the dashboard actor and of every StorageNode over
   bench.dashboard_window_s, with 0, 1 and 10 viewers. A viewer is a WebSocket client that
   takes every heatmap frame and fetches /api/timeline every 2 s, as the /kernel page does;
3. heatmap frame size and rate, and the sampler's time per frame;
4. page load to first frame in headless Chromium (navigation start to the first frame drawn).

    python bench/dashboard.py [bench.dashboard_chunks=10000] [overrides]

Writes dashboard.json to <output_dir>/bench-dashboard-<time>/.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fasterfs.control import auth, registry, report
from fasterfs.core import config
from fasterfs.ops import cluster
from fasterfs.write.ingest import put, remove

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def actor_pids(state) -> dict[str, int]:
    from ray.util.state import list_actors

    wanted = {"dashboard"} | {cluster.actor_name(n.index) for n in state.nodes}
    return {a.name: a.pid for a in list_actors(address=state.dashboard_url, filters=[("state", "=", "ALIVE")],
                                               limit=1000, timeout=120)
            if a.name in wanted and a.ray_namespace == state.ray_namespace}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def viewer(url: str, web: str, headers: dict, stop: threading.Event, frames: list) -> None:
    from websockets.sync.client import connect

    with connect(url, max_size=None, additional_headers=headers) as ws:
        last = 0.0
        while not stop.is_set():
            try:
                m = ws.recv(timeout=0.5)
            except TimeoutError:
                m = None
            if isinstance(m, bytes):
                frames.append((time.monotonic(), len(m)))
            if time.monotonic() - last >= 2:
                timeline = urllib.request.Request(f"{web}/api/timeline", headers=headers)
                urllib.request.urlopen(timeline, timeout=10).read()
                last = time.monotonic()


def measure(state, pids: dict[str, int], viewers: int, window: float) -> dict:
    url = state.web_url.replace("http://", "ws://") + "/ws/kernel"
    stop, frames = threading.Event(), []
    headers = auth.bearer(state.root)
    threads = [threading.Thread(target=viewer, args=(url, state.web_url, headers, stop, frames))
               for _ in range(viewers)]
    for t in threads:
        t.start()
    time.sleep(3)  # connected, first frames sent
    frames.clear()
    before, t0 = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
    time.sleep(window)
    used, dt = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}, time.monotonic() - t0
    stats = json.loads(urllib.request.urlopen(urllib.request.Request(f"{state.web_url}/api/kernel/stats",
                                                                     headers=headers), timeout=10).read())
    stop.set()
    for t in threads:
        t.join(10)
    sizes = [n for _, n in frames]
    return {"viewers": viewers, "dashboard_cpu_pct": 100 * used["dashboard"] / dt,
            "storage_node_cpu_pct": {k: 100 * v / dt for k, v in used.items() if k != "dashboard"},
            "frames_per_s_per_viewer": len(frames) / dt / viewers if viewers else 0.0,
            "frame_bytes": max(sizes) if sizes else None, "sample_ms": stats["sample_ms"],
            "rss_mb": {name: round(rss_mb(pid), 1) for name, pid in pids.items()}}


def first_frame_ms(state) -> float:
    from browser import Browser

    b = Browser()
    try:
        b.log_in(state)
        b.open(f"{state.web_url}/kernel")
        return b.wait("window.ffs && ffs.firstFrameMs", 60, "the first frame")
    finally:
        b.close()


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    n = int(cfg.bench.dashboard_chunks)
    window = float(cfg.bench.dashboard_window_s)
    name = "bench/dashboard-cells.bin"
    with tempfile.NamedTemporaryFile(dir="/var/tmp", prefix="ffs-bench-dash-") as src:
        src.write(os.urandom(n * 1024))
        src.flush()
        t = time.perf_counter()
        put(config.load(argv + ["files.chunk_mb=0.0009765625", "replicas=1"]), src.name, name, force=True)
        stored_s = time.perf_counter() - t
    try:
        layout = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"{state.web_url}/api/kernel/layout", headers=auth.bearer(state.root)), timeout=60).read())
        cells = sum(len(d["keys"]) for d in layout["datasets"])
        pids = actor_pids(state)
        runs = [measure(state, pids, v, window) for v in (0, 1, 10)]
        load_ms = first_frame_ms(state)
    finally:
        remove(cfg, name)
    result = {"cells_per_host": cells, "hosts": len(state.nodes), "stored_s": stored_s, "window_s": window,
              "runs": runs, "page_load_to_first_frame_ms": load_ms,
              "targets": {"dashboard <= 2% of a core with one page": runs[1]["dashboard_cpu_pct"] <= 2.0}}
    out = report.run_dir(cfg, "bench-dashboard")
    report.write_json(out, "dashboard.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'dashboard.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
