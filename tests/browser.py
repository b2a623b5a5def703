"""Headless Chromium driven over the DevTools protocol (a WebSocket on loopback): open a page,
evaluate JavaScript in it, take screenshots. Debian's chromium, started and stopped by PID."""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    def __init__(self, width: int = 1400, height: int = 1000):
        binary = shutil.which("chromium")
        assert binary, "chromium is missing: `make setup` installs it"
        self.profile = tempfile.mkdtemp(prefix="ffs-chromium-")
        port = _free_port()
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "--remote-debugging-address=127.0.0.1",
             f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2).read())
                page = next(t for t in targets if t["type"] == "page")
                break
            except Exception as e:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("headless chromium did not start") from e
                time.sleep(0.2)
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None).__enter__()
        self._ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        n = next(self._ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def log_in(self, state) -> None:
        """Logged in to FasterFS's dashboard of cluster `state`, as its /login form leaves a
        browser: the session cookie made from the cluster's token (its file, 0600)."""
        from fasterfs.control import auth

        value = auth.session_value(auth.read(auth.token_file(state.root)))
        self.call("Network.setCookie", name=auth.COOKIE, value=value, url=state.web_url)

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def js(self, expression: str):
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression[:80]}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait(self, expression: str, timeout: float = 30.0, what: str = ""):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
                if value:
                    return value
            except RuntimeError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what or expression}")

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: chromium and its helpers
            self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)
