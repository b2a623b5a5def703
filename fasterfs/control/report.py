"""Job reports and the measuring helpers the jobs share: a run directory per job run with
its JSON result and charts, per-read latencies, and waiting for kernel-triggered fills."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..core.fsutil import atomic_write_json


def console():
    """A rich console; wide when writing to a file or a job log, so tables stay readable."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


def fmt_writes_told(w: dict[str, int]) -> str:
    """A node's WriteRouter counters: writes its kernel saw / tells to peers they took (of them
    after a peer gained the key)."""
    return f"{w['writes']:,} / {w['told']:,} ({w['told_late']:,})"


def fmt_speedup(x: float, digits: int = 2) -> str:
    """A measured ratio (baseline time / ours) as a reader says it: "1.19x faster", or
    "1.04x slower" where ours lost (never "0.96x faster")."""
    return f"{x:.{digits}f}x faster" if x >= 1 else f"{1 / x:.{digits}f}x slower"


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


CLUSTER_FILE = ".cluster"  # in a run directory: the name of the cluster its reports go to


def run_dir(cfg, job: str) -> Path:
    """<output_dir>/<job>-<time>/, or the one Hydra made for this run (`python jobs/<job>.py`)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    # a compose() in this process (a test calling main()) sets HydraConfig without a run's output_dir
    hydra_run = HydraConfig.initialized() and HydraConfig.get().job.name == job
    if hydra_run and not OmegaConf.is_missing(HydraConfig.get().runtime, "output_dir"):
        path = Path(HydraConfig.get().runtime.output_dir)
    else:
        path = Path(cfg.output_dir) / f"{job}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    (path / CLUSTER_FILE).write_text(cfg.cluster.name)
    return path


def provenance() -> dict:
    """What a result was measured on and how, for the docs' tables (fasterfs.ui.bench_tables):
    the date, the command line, the machine, its kernel and the code's commit."""
    import os
    import platform
    import shlex
    import subprocess
    import sys

    from ..core.config import PROJECT_DIR

    def first(path: str, key: str, sep: str = ":") -> str:
        """The value of the first `key<sep>value` line of a file."""
        try:
            return next(line.split(sep, 1)[1].strip().strip('"') for line in Path(path).read_text().splitlines()
                        if line.split(sep, 1)[0].strip() == key)
        except (OSError, StopIteration, IndexError):
            return "unknown"

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(PROJECT_DIR), *args], capture_output=True, text=True, timeout=10)

    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    shown = str(script.relative_to(PROJECT_DIR)) if script and script.is_relative_to(PROJECT_DIR) else sys.argv[0]
    commit = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    if commit != "unknown" and git("diff", "--quiet", "HEAD").returncode != 0:
        commit += " with uncommitted changes"
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": shlex.join(["python", shown, *sys.argv[1:]]),
            "cores": os.cpu_count(),
            "memory_gib": round(int(first("/proc/meminfo", "MemTotal").split()[0]) / 2**20, 1),
            "cpu": first("/proc/cpuinfo", "model name"),
            "os": first("/etc/os-release", "PRETTY_NAME", "="),
            "kernel": platform.release(),
            "commit": commit}


def write_json(directory: Path, name: str, result: dict) -> Path:
    """A run's result, with where and how it was measured under "provenance"."""
    path = atomic_write_json(directory / name, {**result, "provenance": provenance()})
    publish(path)
    return path


def publish(path: Path) -> None:
    """A report file written on a host other than the head goes to the head too (through the
    Registry), where the dashboard lists it: hosts share no files."""
    try:
        cluster_name = (path.parent / CLUSTER_FILE).read_text()
    except FileNotFoundError:
        return  # not a run directory of run_dir's
    import ray

    from . import registry
    from .state import host_id

    if not ray.is_initialized():
        return
    reg = registry.handle(cluster_name)
    if ray.get(reg.ready.remote(), timeout=60) != host_id():
        ray.get(reg.put_report.remote(path.parent.name, path.name, path.read_bytes()), timeout=120)


def figure(*args, **kwargs):
    """A matplotlib figure drawn off-screen (jobs run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    publish(Path(path))


def timed(fn: Callable[[int], object], ids: Iterable[int]) -> list[float]:
    """Seconds each call fn(i) took."""
    out = []
    for i in ids:
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def quantiles(xs: list[float]) -> dict:
    """p50/p95/p99 in milliseconds."""
    s = sorted(xs)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1e3  # noqa: E731
    return {"p50_ms": statistics.median(s) * 1e3, "p95_ms": pick(0.95), "p99_ms": pick(0.99), "n": len(s)}


def wait_for_fills(actors, expected: int, timeout: float = 60.0) -> int:
    """Wait (bounded) until the nodes' caches hold `expected` entries and no fill is pending;
    returns the entries cached."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        rows = ray.get([a.cache_status.remote() for a in actors])
        entries = sum(r["entries"] for r in rows)
        if (entries >= expected and not any(r["fills_pending"] for r in rows)) or time.monotonic() > deadline:
            return entries
        time.sleep(0.1)
