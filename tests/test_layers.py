"""The package's folders are its layers, and each imports only those below it (docs/architecture.md):
read from the package's own import statements with the standard library's parser. And every source
file is of a size a reader takes in: at most 400 lines (Rust's without its unit tests)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fasterfs"
ORDER = ["core", "meta", "control", "bpf", "read", "write", "node", "hosts", "dashboard", "ops", "ui"]


def imported(path: Path) -> set[str]:
    """The fasterfs layers `path` imports (at module level or inside a function)."""
    here = ["fasterfs", *path.relative_to(PACKAGE).parts[:-1]]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else [])).split(".")
            if module[0] != "fasterfs":
                continue
            names = [module[1]] if len(module) > 1 else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("fasterfs.")]
        else:
            continue
        out |= {n for n in names if n in ORDER}
    return out


def test_every_module_lives_in_a_layer_folder():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(ORDER)


def test_each_layer_imports_only_the_layers_below_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = path.relative_to(PACKAGE).parts[0]
        if layer not in ORDER:
            continue
        for other in imported(path):
            if ORDER.index(other) > ORDER.index(layer):
                upward.append(f"{path.relative_to(PACKAGE.parent)} imports fasterfs.{other}")
    assert not upward, "\n".join(upward)
    # the check sees imports at all: the node's actor imports the readers' and the core's
    assert {"core", "read"} <= imported(PACKAGE / "node" / "storage_node.py")


def lines_of(path: Path) -> int:
    text = path.read_text()
    if path.suffix == ".rs":  # a module's unit tests, inline at its end, are not its code
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)[0]
    return len(text.splitlines())


def test_every_source_file_is_at_most_400_lines():
    daemon = ROOT / "native" / "ffs-mount" / "src"  # its src/tests/: test code alone
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "jobs").glob("*.py"), *daemon.glob("*.rs")]
    assert len(sources) > 100
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := lines_of(p)) > 400}
    assert not long, long
    # the count sees tests apart: a file with a test module counts less than its lines
    change = daemon / "change.rs"
    assert lines_of(change) < len(change.read_text().splitlines())
