"""JupyterLab beside the dashboards: `fasterfs notebook` (`make notebook`) starts it on the
head's address, in the cluster's cgroup, behind the cluster's Ray token (fasterfs.control.auth; on a
cluster without one, a token generated here, kept 0600 under the cluster root), handed over
in the environment, never on a command line. The server runs from an environment of its own
(`make setup` puts it in .deps/jupyterlab: its dependencies would slow every Ray worker's
`import ray` here); its kernels run in the project's environment with FASTERFS_CLUSTER and
FASTERFS_ROOT set, so `fasterfs.connect()` finds the running cluster. `fasterfs down` stops it by its PID."""
from __future__ import annotations

import json
import os
import secrets
import sys
import time
import urllib.request
from pathlib import Path

from ..control import auth
from ..control.state import ClusterState
from ..core import process
from ..core.cgroup import ProjectCgroup
from ..core.config import PROJECT_DIR
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write


def _dir(state: ClusterState) -> Path:
    return Path(state.root) / "jupyter"


def token_file(state: ClusterState) -> Path:
    return _dir(state) / "token"


def server_binary() -> Path:
    path = PROJECT_DIR / ".deps" / "jupyterlab" / "bin" / "jupyter-lab"
    if not path.exists():
        raise FasterFSError(f"JupyterLab not found at {path}: run `make setup` (installs it there)")
    return path


def _write_kernel_spec(path_dir: Path) -> None:
    """The server's "python3" kernel: this (the project's) interpreter. Under $JUPYTER_PATH,
    which Jupyter searches first (its own virtualenv's kernel comes before its data directory)."""
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (FasterFS)", "language": "python", "metadata": {"debugger": True}}
    atomic_write(path_dir / "kernels" / "python3" / "kernel.json", json.dumps(spec, indent=1).encode())


def is_running(state: ClusterState) -> bool:
    pid = (state.notebook or {}).get("pid")
    if not pid:
        return False
    try:
        return "jupyter" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def start(cfg, state: ClusterState) -> dict:
    """Start JupyterLab for the cluster (or return the one running): {url, pid, token_file}."""
    if is_running(state):
        assert state.notebook is not None  # is_running found its pid there
        return state.notebook
    host = state.head_address  # the lab's head is on its bridge, in this machine's namespace
    port = int(cfg.notebook.port)
    home = _dir(state)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    token, where = auth.current_token(state.root), auth.token_file(state.root)
    if token is None:  # attached to a Ray cluster without auth (cluster.insecure): one of its own
        token, where = secrets.token_urlsafe(32), token_file(state)
        atomic_write(where, token.encode(), mode=0o600)
    server = server_binary()
    _write_kernel_spec(home / "path")
    venv_bin = str(Path(sys.prefix) / "bin")  # first on the kernels' PATH: `!fasterfs status` in a cell
    env = dict(os.environ, JUPYTER_TOKEN=token, FASTERFS_CLUSTER=state.name, FASTERFS_ROOT=state.root,
               VIRTUAL_ENV=sys.prefix, PATH=os.pathsep.join([venv_bin, os.environ.get("PATH", os.defpath)]),
               JUPYTER_PATH=str(home / "path"), JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"))
    env.pop("RAY_ADDRESS", None)  # kernels find the cluster from FASTERFS_ROOT, as a driver on the head does
    args = [str(server), "--no-browser", "--allow-root", f"--ip={host}", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={PROJECT_DIR / 'notebooks'}",
            # no calls to the internet: no update checks, no news feed
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None"]
    log = Path(state.root) / "logs" / "jupyterlab.log"
    proc = ProjectCgroup.from_dict(state.cgroup).spawn(args, log, env, child="jupyter")
    url = f"http://{host}:{port}/lab"
    state.notebook = {"pid": proc.pid, "url": url, "token_file": str(where)}
    state.save()
    deadline = time.monotonic() + float(cfg.notebook.start_timeout_s)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            state.notebook = None
            state.save()
            raise FasterFSError(f"JupyterLab exited with {proc.returncode} (port {port} on {host} taken? "
                                f"notebook.port=...); see {log}")
        try:
            request = urllib.request.Request(f"http://{host}:{port}/api/status",
                                             headers={"Authorization": f"token {token}"})
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=2):
                return state.notebook
        except OSError:
            time.sleep(0.5)
    stop(state)
    raise FasterFSError(f"JupyterLab did not answer on {url} within notebook.start_timeout_s="
                        f"{cfg.notebook.start_timeout_s}; see {log}")


def stop(state: ClusterState, timeout: float = 15.0) -> bool:
    """Stop the JupyterLab this cluster started (by its PID); True if one was running."""
    if not is_running(state):
        state.notebook = None
        return False
    assert state.notebook is not None  # is_running found its pid there
    process.terminate(state.notebook["pid"], timeout)  # jupyter shuts its kernels down on SIGTERM
    state.notebook = None
    return True
