"""Running FasterFS's commands as a user does, from a shell without the virtualenv: the
helpers both command-line test modules share."""
from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import CLEAN_ENV

from fasterfs.core.config import PROJECT_DIR

PYTHON = str(PROJECT_DIR / ".venv/bin/python")
JOBS = sorted(p.stem for p in (PROJECT_DIR / "jobs").glob("*.py"))


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=CLEAN_ENV, cwd="/", capture_output=True, text=True, timeout=timeout)


def run_all(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Each command as `run` does, side by side (each spends most of a second importing)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: run(*c), commands))


def run_in_roots(tmp_path: Path, commands: list[list[str]]) -> list[tuple[Path, subprocess.CompletedProcess]]:
    """Each command with an empty cluster.root of its own (what it leaves there is checked), side by side."""
    where = [tmp_path / str(i) for i in range(len(commands))]
    for root in where:
        root.mkdir()
    return list(zip(where, run_all(*([*c, f"cluster.root={root}"] for c, root in zip(commands, where)))))


def one_line_error(out: subprocess.CompletedProcess, code: int, culprit: str, case: object = None) -> None:
    assert out.returncode == code, (case, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0] and lines[0].startswith("fasterfs"), (case, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, case
