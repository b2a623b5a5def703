"""Job reports: a run directory per job run holding its JSON result (and charts)."""
from __future__ import annotations

import time
from pathlib import Path

from .fsutil import atomic_write_json


def run_dir(cfg, job: str) -> Path:
    path = Path(cfg.output_dir) / f"{job}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(directory: Path, name: str, result: dict) -> Path:
    return atomic_write_json(directory / name, result)
