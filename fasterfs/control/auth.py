"""Who may use a cluster: Ray's token authentication on every cluster FasterFS starts, and
the same token in front of FasterFS's dashboard and JupyterLab.

The token is generated at `fasterfs up` and kept 0600 at <cluster root>/ray_token on the
head, and on every other host's own disk (as one copies it to each machine of a real
cluster). Every `ray start` gets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH in its
environment, never the token on a command line; Ray then checks it on every gRPC and HTTP
entry point (GCS, raylets, workers, its dashboard and jobs API), and every worker and job
driver it starts inherits the same environment."""
from __future__ import annotations

import hmac
import os
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write, owned

TOKEN_FILE = "ray_token"
RAY_DEFAULT_TOKEN = Path.home() / ".ray" / "auth_token"  # where Ray itself looks last
COOKIE = "fasterfs_token"  # the dashboard's login cookie


def token_file(root: str | os.PathLike) -> Path:
    return Path(root) / TOKEN_FILE


def create(path: Path, rotate: bool = False) -> str:
    """The cluster's token: the one in `path`, or a new one (also when `rotate`)."""
    if path.exists() and not rotate:
        return read(path)
    token = secrets.token_urlsafe(32)
    atomic_write(path, token.encode(), mode=0o600)
    return token


def read(path: Path) -> str:
    owned(path, "Ray token file")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise FasterFSError(f"Ray token file {path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    token = path.read_text().strip()
    if not token:
        raise FasterFSError(f"Ray token file {path} is empty")
    return token


def bearer(root: str | os.PathLike) -> dict[str, str]:
    """The header a script sends FasterFS's dashboard (and Ray's) for the cluster under `root`."""
    return {"Authorization": f"Bearer {read(token_file(root))}"}


def ray_env(path: Path) -> dict[str, str]:
    """What a `ray start` (and so every Ray process of its node) needs to take part."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def prepare_driver(root: str | os.PathLike | None) -> None:
    """Before this process joins a cluster as a driver: hand Ray the token. The cluster's
    token file under `root` if this host has one, else what Ray itself reads (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token). Without any, Ray connects unauthenticated, which
    only a cluster without auth (cluster.insecure) accepts."""
    own = token_file(root) if root else None
    if own is not None and own.exists():
        read(own)  # refuses a file others can read
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(own)
    elif not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or RAY_DEFAULT_TOKEN.exists()):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if "ray._raylet" in sys.modules:
        # Ray reads RAY_AUTH_* when it loads and caches the token: make it read them again
        # (what Ray's own tests do between clusters). Only ever before ray.init.
        from ray._raylet import (  # type: ignore[attr-defined]  # Ray's _raylet.pyi omits these
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


# A driver with no token: exit 0 if it joins, 3 if the GCS refuses it for want of a token, else 1
# (not answering in time, say, on a loaded machine: that says nothing either way).
_PROBE = """
import logging, sys, traceback, ray
try:
    ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], logging_level=logging.ERROR, log_to_driver=False)
except Exception as e:
    sys.exit(3 if "InvalidAuthToken" in "".join(traceback.format_exception(e)) else 1)
"""
REFUSED = 3


def cluster_is_open(ray_address: str, node_ip: str, timeout: float = 60.0) -> bool:
    """True if the Ray cluster at `ray_address` lets in a driver that has no token, False if it
    refuses one; asked again until it says which, for up to `timeout` seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_AUTH_MODE="disabled", HOME="/nonexistent")  # not even Ray's default token file
    # Ray tries the GCS once a second, 20 times by default, before it gives up on a refusal: 3 say as much
    env["RAY_gcs_server_port_wait_time_s"] = "3"
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            probe = subprocess.run([sys.executable, "-c", _PROBE, ray_address, node_ip], env=env, timeout=left,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            break
        if probe.returncode in (0, REFUSED):
            return probe.returncode == 0
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise FasterFSError(f"the Ray cluster at {ray_address} neither let in nor refused a driver without a token "
                        f"within {timeout:.0f} s: is it up, and reachable from {node_ip}?")


def current_token(root: str | os.PathLike | None = None) -> str | None:
    """The token this process holds for its cluster: the file under `root`, else Ray's own
    sources (as a Ray worker of the cluster has them in its environment); None without one."""
    if root and token_file(root).exists():
        return read(token_file(root))
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), RAY_DEFAULT_TOKEN):
        if path and Path(path).exists():
            return read(Path(path))
    return None


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("localhost", "::1")


# -- the dashboard's gate ---------------------------------------------------------------

class HostCheck:
    """ASGI middleware against DNS rebinding and cross-site WebSockets: a request's Host must name
    the address the dashboard listens on, or this machine's loopback (an SSH tunnel), on any port;
    a WebSocket's Origin, when a browser sends one, the same. Anything else: 403."""

    def __init__(self, app, address: str):
        self.app, self.address = app, address

    def allowed(self, host: str) -> bool:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # [::1]:8300 -> [::1]
        name = name.strip("[]").lower()
        return name == self.address or is_loopback(name)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        ok = self.allowed(headers.get("host", "")) and (
            scope["type"] == "http" or origin is None or self.allowed(origin.split("://", 1)[-1]))
        if ok:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"this dashboard answers only to its own address"})


def session_value(token: str) -> str:
    """What the login cookie holds: derived from the token, so a leaked cookie is no Ray token."""
    return hmac.new(token.encode(), b"fasterfs dashboard session", "sha256").hexdigest()


def accepts(token: str, authorization: str | None, cookie: str | None) -> bool:
    """A request carrying `Authorization: Bearer <token>` or the cookie /login set."""
    if authorization and authorization.lower().startswith("bearer "):
        return hmac.compare_digest(authorization[7:].strip().encode(), token.encode())
    if not cookie:
        return False
    return hmac.compare_digest(cookie.encode(), session_value(token).encode())


LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>FasterFS: sign in</title></head>
<body style="font:15px system-ui;margin:3em"><h1>FasterFS</h1><p>{message}</p>
<form method="post" action="login"><input type="hidden" name="next" value="{next}">
<label>Cluster token <input type="password" name="token" autofocus size="48"></label>
<button>Sign in</button></form><p style="color:#666">The token is the cluster's Ray token:
<code>&lt;cluster root&gt;/ray_token</code> on the head (0600).</p></body></html>"""


class TokenGate:
    """ASGI middleware: every request but /healthz and /login carries the token (bearer header
    or the login cookie). Pages redirect to /login; APIs, /metrics and WebSockets are refused."""

    OPEN = ("/healthz", "/login")

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    def _cookie(self, headers: dict) -> str | None:
        from http.cookies import SimpleCookie

        jar = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except Exception:
            return None
        return jar[COOKIE].value if COOKIE in jar else None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.OPEN:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if accepts(self.token, headers.get("authorization"), self._cookie(headers)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # the client sees HTTP 403
            return
        from urllib.parse import quote

        page = scope.get("method") == "GET" and "text/html" in headers.get("accept", "")
        if page:
            status, extra = 303, [(b"location", f"/login?next={quote(scope['path'])}".encode())]
        else:
            status, extra = 401, [(b"www-authenticate", b'Bearer realm="fasterfs"')]
        body = b'{"detail": "the cluster token is required (Authorization: Bearer <token>)"}'
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *extra]})
        await send({"type": "http.response.body", "body": body})


def add_login(app, token: str) -> None:
    """/login on a FastAPI app: a form that sets the session cookie (the token never in a URL)."""
    from html import escape
    from urllib.parse import parse_qs

    from fastapi.responses import HTMLResponse, RedirectResponse

    def signed_in(next_path: str):
        target = next_path if next_path.startswith("/") and not next_path.startswith("//") else "/"
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session_value(token), httponly=True, samesite="strict")
        return response

    def form(message: str, next_path: str, status: int = 200):
        return HTMLResponse(LOGIN_PAGE.format(message=escape(message), next=escape(next_path)), status_code=status)

    @app.get("/login", response_class=HTMLResponse)
    def login_page(next: str = "/"):
        return form("Sign in with the cluster's token.", next)

    async def login(request):  # a plain Starlette route: no annotations for FastAPI to resolve
        fields = parse_qs((await request.body()).decode(errors="replace"))
        offered, next_path = fields.get("token", [""])[0], fields.get("next", ["/"])[0]
        if offered and hmac.compare_digest(offered.encode(), token.encode()):
            return signed_in(next_path)
        return form("Wrong token.", next_path, 401)

    app.router.add_route("/login", login, methods=["POST"])
