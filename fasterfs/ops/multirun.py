"""A `--multirun` sweep's runs side by side: a Hydra callback (conf/config.yaml) that
collects each run's overrides, output directory and figures (the numbers a job puts in its
report's "figures"), then writes summary.md, sweep.json and sweep.png to the sweep directory."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback

from .job import failure


class MultirunSummary(Callback):
    def __init__(self) -> None:
        self.runs: list[dict] = []
        self._started = 0.0

    def on_job_start(self, config, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        out = job_return.hydra_cfg.hydra.runtime.output_dir if job_return.hydra_cfg else ""
        run = {"overrides": list(job_return.overrides or []), "dir": str(out),
               "seconds": time.perf_counter() - self._started, "figures": {}, "failed": None}
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return._return_value, dict):
            result = job_return._return_value
            run["figures"] = {k: v for k, v in (result.get("figures") or {}).items() if isinstance(v, (int, float))}
            run["failed"] = failure(result)
        elif job_return.status == JobStatus.FAILED:
            run["failed"] = f"{type(job_return._return_value).__name__}: {job_return._return_value}"
        self.runs.append(run)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        if not self.runs:
            return
        from ..control import report

        out = Path(config.hydra.sweep.dir)
        out.mkdir(parents=True, exist_ok=True)
        swept = _swept(self.runs)
        names = list(dict.fromkeys(k for r in self.runs for k in r["figures"]))
        failed = [r for r in self.runs if r["failed"]]
        summary = {"job": config.hydra.job.name, "runs": self.runs, "swept": swept,
                   "headline": {"runs": f"{len(self.runs)} ({len(failed)} failed)",
                                "swept": ", ".join(swept) or "-"}}
        report.write_json(out, "sweep.json", summary)
        (out / "summary.md").write_text(_table(self.runs, swept, names))
        if names and len(failed) < len(self.runs):
            _chart(self.runs, swept, names, out / "sweep.png", summary["job"])
        print(f"sweep of {len(self.runs)} runs ({len(failed)} failed): {out / 'summary.md'}")
        print(_table(self.runs, swept, names))


def _swept(runs: list[dict]) -> list[str]:
    """The keys whose value differs between runs, in the order given."""
    values: dict[str, set] = {}
    for r in runs:
        for o in r["overrides"]:
            k, _, v = o.partition("=")
            values.setdefault(k, set()).add(v)
    return [k for k, v in values.items() if len(v) > 1 or len(runs) == 1]


def _label(run: dict, swept: list[str]) -> str:
    picked = [o for o in run["overrides"] if o.partition("=")[0] in swept]
    return " ".join(picked) or "defaults"


def _table(runs: list[dict], swept: list[str], names: list[str]) -> str:
    head = ["run", *names, "seconds", "output"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [_label(r, swept)]
        cells += [f"{r['figures'][n]:.4g}" if n in r["figures"] else "-" for n in names]
        cells += [f"{r['seconds']:.1f}", f"FAILED: {r['failed']}" if r["failed"] else Path(r["dir"]).name]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _chart(runs: list[dict], swept: list[str], names: list[str], path: Path, job: str) -> None:
    from ..control import report

    fig, axes = report.figure(len(names), 1, figsize=(max(6, 1.2 * len(runs) + 3), 2.4 * len(names)), squeeze=False)
    labels = [_label(r, swept) for r in runs]
    for ax, name in zip(axes[:, 0], names):
        ax.bar(range(len(runs)), [r["figures"].get(name, 0) for r in runs],
               color=["#c33" if r["failed"] else "#06c" for r in runs])
        ax.set_ylabel(name, fontsize=8)
        ax.set_xticks(range(len(runs)), labels, fontsize=7, rotation=20, ha="right")
    axes[0, 0].set_title(f"{job}: {len(runs)} runs of a sweep over {', '.join(swept) or 'nothing'}")
    report.save_figure(fig, path)
