"""The package's folders are its layers, and each imports only those below it (docs/architecture.md):
import-linter's contract in pyproject.toml, run here and by `make lint`. And every source file is of a
size a reader takes in: at most 400 lines (Rust's without its unit tests)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fasterfs"
CONTRACT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(config: Path, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache", "--config", str(config)], capture_output=True, text=True,
                          cwd=path, env={**os.environ, "PYTHONPATH": str(path)}, timeout=120)


def test_every_module_lives_in_a_layer_folder():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(CONTRACT["layers"])


def test_each_layer_imports_only_the_layers_below_it(tmp_path):
    kept = lint_imports(ROOT / "pyproject.toml", ROOT)
    assert kept.returncode == 0 and "1 kept, 0 broken" in kept.stdout, kept.stdout + kept.stderr
    # the contract fails on an upward import: a package of the same layers whose core imports ui
    for layer in CONTRACT["layers"]:
        (tmp_path / "fasterfs" / layer).mkdir(parents=True)
        (tmp_path / "fasterfs" / layer / "__init__.py").write_text("")
    (tmp_path / "fasterfs" / "__init__.py").write_text("")
    (tmp_path / "fasterfs" / "core" / "config.py").write_text("def f():\n    from ..ui import cli\n")
    (tmp_path / "fasterfs" / "ui" / "cli.py").write_text("")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    broken = lint_imports(tmp_path / "pyproject.toml", tmp_path)
    assert broken.returncode != 0 and "fasterfs.core.config -> fasterfs.ui.cli" in broken.stdout, broken.stdout


def lines_of(path: Path) -> int:
    text = path.read_text()
    if path.suffix == ".rs":  # a module's unit tests, inline at its end, are not its code
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
    return len(text.splitlines())


def test_every_source_file_is_at_most_400_lines():
    daemon = ROOT / "native" / "ffs-mount" / "src"  # its unit tests in src/tests/, each file held to it too
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "jobs").glob("*.py"), *daemon.glob("*.rs"), *daemon.glob("tests/*.rs")]
    assert len(sources) > 100
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := lines_of(p)) > 400}
    assert not long, long
    # the count sees tests apart: a file with a test module counts less than its lines
    change = daemon / "change.rs"
    assert lines_of(change) < len(change.read_text().splitlines())


def test_every_class_is_at_most_300_lines():
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "jobs").glob("*.py")]
    classes = {f"{p.relative_to(ROOT)}:{n.name}": n.end_lineno - n.lineno + 1
               for p in sources for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)}
    assert len(classes) > 50 and max(classes.values()) > 200  # the walk sees the classes and their lengths
    long = {name: n for name, n in classes.items() if n > 300}
    assert not long, long
