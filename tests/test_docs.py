"""The README and docs/: every configuration key documented, every link resolving, no diary in the README.

Expected values come from the files themselves: conf/config.yaml parsed by PyYAML, the links' targets
on disk and their headings turned into GitHub's anchors."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def leaf_keys(node, prefix: str = ""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix


def config_keys() -> list[str]:
    """conf/config.yaml's keys, and those of its groups composed by default that stand alone (bench)."""
    config = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    config["bench"] = yaml.safe_load((ROOT / "conf" / "bench" / "default.yaml").read_text())
    return [key for top, value in config.items() if top not in ("defaults", "hydra")
            for key in leaf_keys(value, top)]


def prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_slug_follows_github():
    assert slug("How it fits together") == "how-it-fits-together"
    assert slug("Real machines: `cluster.yaml`") == "real-machines-clusteryaml"
    assert slug("The data group (`conf/data/`)") == "the-data-group-confdata"
    assert slug("Hydra's own settings") == "hydras-own-settings"


def test_every_config_key_is_documented():
    keys = config_keys()
    assert len(keys) > 100, keys  # the parse found the whole file
    documented = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key in keys if not re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", documented)]
    assert not missing, f"conf/ keys missing from docs/configuration.md: {', '.join(missing)}"


def test_every_command_and_option_is_documented():
    """Each subcommand of the parser has its row in docs/commands.md naming its own options."""
    from fasterfs.ui import cli

    _, parsers = cli._parser()
    assert len(parsers) > 20, parsers  # the parser's whole table
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `fasterfs ([a-z -]+)` \|.*$",
                                                         (ROOT / "docs" / "commands.md").read_text(), re.M)}
    missing = []
    for name, parser in parsers.items():
        if name not in rows:
            missing.append(f"fasterfs {name}")
            continue
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help", "--nodes", "--cfg") and not re.search(
                        rf"(?<![\w-]){re.escape(option)}(?![\w-])", rows[name]):
                    missing.append(f"fasterfs {name} {option}")
    assert not missing, f"missing from docs/commands.md: {', '.join(missing)}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {'; '.join(broken)}"


def test_docs_exist():
    names = {p.name for p in DOCS}
    for name in ("commands.md", "configuration.md", "architecture.md", "benchmarks.md", "availability.md"):
        assert name in names


def test_readme_is_no_diary():
    text = README.read_text()
    dates = re.findall(r"20\d\d-\d\d-\d\d", text)
    assert not dates, f"README.md carries dates: {dates[:5]}"
    assert "UTC" not in text, "README.md mentions UTC"


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= 500, f"README.md has {lines} lines (at most 500)"
