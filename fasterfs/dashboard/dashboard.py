"""FasterFS's web dashboard: a FastAPI app served by a Ray actor on the head node.

One page shows what the cluster is doing now — each node's MinIO, what its kernel
programs counted and made hot, which socket options they set (and which the kernel
refused), its cache and how often readers hit it — and the reports of past job runs
with their charts. The page is rendered on the server and refreshes itself; the same
figures are at /api/snapshot (JSON) and /metrics (Prometheus). Every figure comes from
a StorageNode when asked (fasterfs.dashboard.monitor); nothing is invented when a node is silent.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from fastapi import WebSocket  # at module level: FastAPI resolves the handler's annotation here

from ..control import auth
from ..core.errors import FasterFSError
from .dashboard_page import insecure_banner, ray_jobs, render_live, render_page
from .heat import Heat
from .metrics import RayMetrics
from .monitor import Cadence, Monitor

log = logging.getLogger("fasterfs.dashboard.dashboard")
ACTOR_NAME = "dashboard"
WEB = Path(__file__).parent / "web"
STATIC = {"kernel.js": "text/javascript", "runs.js": "text/javascript", "vendor/uPlot.iife.min.js": "text/javascript",
          "vendor/uPlot.min.css": "text/css", "vendor/LICENSE-uPlot": "text/plain", "vendor/VENDORED.md": "text/plain"}
SEND_TIMEOUT_S = 10.0


def create_app(monitor: Monitor, heat: Heat, refresh_s: float = 2.0, max_viewers: int = 200,
               token: str | None = None, cadence: Cadence | None = None, address: str | None = None):
    """The dashboard's routes; with a `token`, every one but /healthz needs it (fasterfs.control.auth);
    with an `address`, only requests naming it or loopback as their Host (and Origin) are served.
    Every request but a health check or a metrics scrape tells `cadence` someone watches."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import FileResponse, HTMLResponse, Response

    app = FastAPI(title="FasterFS", docs_url="/api/docs", redoc_url=None)
    if address is not None:
        app.add_middleware(auth.HostCheck, address=address)
    if token:
        app.add_middleware(auth.TokenGate, token=token)
        auth.add_login(app, token)
    if cadence is not None:
        @app.middleware("http")
        async def watching(request, call_next):
            if request.url.path not in ("/healthz", "/metrics"):
                cadence.seen()
            return await call_next(request)

    @app.get("/kernel", response_class=HTMLResponse)
    def kernel_page():
        return (WEB / "kernel.html").read_text().replace("<body>", "<body>" + insecure_banner(monitor.state), 1)

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page():
        return (WEB / "runs.html").read_text().replace("<body>", "<body>" + insecure_banner(monitor.state), 1)

    @app.get("/static/{name:path}")
    def static(name: str):
        if name not in STATIC:  # an allow-list: never a path from the request
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(WEB / name, media_type=STATIC[name])

    @app.get("/api/kernel/layout")
    def kernel_layout():
        return heat.current_layout()

    @app.get("/api/kernel/stats")
    def kernel_stats():
        seq, frame = heat.frame
        return {"viewers": heat.viewers, "frame": seq, "frame_bytes": len(frame), "sample_ms": heat.sample_ms,
                "missing": heat.missing}

    @app.get("/api/timeline")
    def timeline(since: float = 0.0):
        return monitor.timeline(since)

    @app.get("/api/jobs")
    def jobs():
        return ray_jobs(monitor.state.dashboard_url)

    @app.websocket("/ws/kernel")
    async def kernel_stream(ws: WebSocket):
        await stream_heat(ws, heat, max_viewers)

    @app.get("/", response_class=HTMLResponse)
    def page():
        return render_page(monitor, refresh_s)

    @app.get("/fragment", response_class=HTMLResponse)
    def fragment():
        return render_live(monitor)

    @app.get("/api/snapshot")
    def snapshot():
        return monitor.snapshot()

    @app.get("/api/runs")
    def runs():
        return monitor.runs()

    @app.get("/runs/{run}/{name}")
    def run_file(run: str, name: str):
        path = monitor.run_file(run, name)
        if path is None:
            raise HTTPException(404, f"no report file {name!r} in job run {run!r} under {monitor.output_dir()}")
        return FileResponse(path)

    @app.get("/metrics")
    def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(monitor.metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz():
        return {"ok": True, "cluster": monitor.state.name}

    return app


async def stream_heat(ws, heat: Heat, max_viewers: int) -> None:
    """Push the latest heatmap frame to one page as it comes; what the page sends is read and
    ignored. A viewer that does not take a frame within SEND_TIMEOUT_S is dropped (its page
    reconnects); frames made while one is being sent are skipped, never queued."""
    import asyncio
    import json

    from starlette.websockets import WebSocketDisconnect

    await ws.accept()
    if heat.viewers >= max_viewers:
        await ws.close(code=1013, reason=f"more than {max_viewers} viewers")
        return
    heat.watch(+1)
    closed = asyncio.Event()

    async def drain():  # a malformed or unexpected message is no reason to stop
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            closed.set()

    reader = asyncio.create_task(drain())
    sent, missing = 0, None
    try:
        while not closed.is_set():
            seq, frame = heat.frame
            if heat.missing != missing:
                missing = dict(heat.missing)
                await asyncio.wait_for(ws.send_text(json.dumps({"missing": missing})), SEND_TIMEOUT_S)
            if seq != sent and frame:
                await asyncio.wait_for(ws.send_bytes(frame), SEND_TIMEOUT_S)
                sent = seq
            try:
                await asyncio.wait_for(closed.wait(), 0.2)
            except TimeoutError:
                pass
    except (TimeoutError, WebSocketDisconnect, RuntimeError, OSError):
        pass  # slow or gone: drop it
    finally:
        heat.watch(-1)
        reader.cancel()
        try:
            await ws.close()
        except Exception:
            pass


class DashboardServer:
    """The Ray actor that serves the dashboard: uvicorn in a thread, on the head's address, and
    a sampler thread that keeps the timelines' history."""

    def __init__(self, root: str, address: str, port: int, refresh_s: float, require_token: str = "auto",
                 sample_s: float = 1.0, heat_cells: int = 50_000):
        import uvicorn

        self.where = f"{address}:{port}"
        self.monitor = Monitor(root, min_interval=sample_s * 0.9)
        self.heat = Heat(self.monitor.state, sample_s, heat_cells)
        self.cadence = Cadence()
        self._stopping = threading.Event()
        # the cluster's Ray token, as this worker holds it; not needed on a loopback-only address
        token = auth.current_token(root) if require_token == "always" or not auth.is_loopback(address) else None
        self.gated = token is not None
        config = uvicorn.Config(create_app(self.monitor, self.heat, refresh_s, token=token, cadence=self.cadence,
                                           address=address),
                                host=address, port=port,
                                log_level="warning", access_log=False, lifespan="off", ws="websockets-sansio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dashboard", daemon=True)
        self.thread.start()
        threading.Thread(target=self._sample, args=(sample_s,), name="timeline", daemon=True).start()

    def _sample(self, every: float, export_s: float = 5.0) -> None:
        ray_metrics, exported = RayMetrics(), 0.0
        while not self._stopping.wait(every):
            if not self.cadence.due(self.heat.viewers):
                continue
            try:
                snap = self.monitor.snapshot()
                if time.monotonic() - exported >= export_s:
                    exported = time.monotonic()
                    ray_metrics.export(snap)
            except Exception:  # a node or Ray itself briefly gone: the timeline shows a gap
                log.debug("sample failed", exc_info=True)

    def ready(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():  # uvicorn exits when it cannot bind
                raise FasterFSError(f"the FasterFS dashboard could not listen on {self.where} (option dashboard.port)")
            if time.monotonic() > deadline:
                raise FasterFSError(f"the FasterFS dashboard on {self.where} did not start within {timeout:.0f} s")
            time.sleep(0.05)
        return f"http://{self.where}"

    def stop(self) -> None:
        self._stopping.set()
        self.server.should_exit = True
        self.thread.join(10)
