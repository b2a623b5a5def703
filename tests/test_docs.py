"""The README and docs/: every configuration key documented, every link resolving, no diary in the README.

Expected values come from elsewhere than the generator (fasterfs.ui.reference): the configuration as
Hydra composes it, the parser argparse builds, the links' targets on disk and their headings turned
into GitHub's anchors."""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

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


def test_the_references_are_current():
    """docs/'s tables are what fasterfs.ui.reference makes of conf/ and the CLI's table today."""
    from fasterfs.ui import reference

    assert not reference.stale_pages(), "docs/ tables not current: run python -m fasterfs.ui.reference"


def test_a_table_edited_by_hand_is_made_again():
    """The check above can fail: a default changed in the page's table is put back from conf/."""
    from fasterfs.ui import reference

    page = (ROOT / "docs" / "configuration.md").read_text()
    edited = page.replace("| `cluster.ray_port` | `6391` |", "| `cluster.ray_port` | `6392` |")
    assert edited != page and reference.render(edited, "configuration.md") == page


def test_a_benchmark_table_shows_its_results_figures_and_how_they_were_measured(tmp_path, monkeypatch):
    """A table made from a kept result: its figures are the result's, read here with json and
    formatted here; a bulky raw entry is left out of the kept copy and named; a figure edited by
    hand is put back; a path the result lacks is named."""
    import json

    from fasterfs.control import report
    from fasterfs.core.errors import FasterFSError
    from fasterfs.ui import bench_tables

    log = list(range(20_000))  # a raw per-read log: past bench_tables.BULK, left out of the kept copy
    written = report.write_json(tmp_path / "run", "demo.json",
                                {"reads": {"p50_ms": [0.0913, 0.1249]}, "files": 1234, "read_log": log})
    monkeypatch.setattr(bench_tables, "RESULTS", tmp_path / "results")
    kept = bench_tables.keep(written)
    result = json.loads(kept.read_text())
    assert "read_log" not in result and result["left_out"]["bytes"] == {"read_log": len(json.dumps(log))}
    assert result["files"] == 1234 and result["reads"] == {"p50_ms": [0.0913, 0.1249]}
    # the machine as the kernel tells it, not through the code under test
    assert result["provenance"]["kernel"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert result["provenance"]["cores"] == sum(line.startswith("processor") for line in
                                                Path("/proc/cpuinfo").read_text().splitlines())
    page = ("<!-- bench\n| files | p50 |\n|---|---|\n"
            "| {demo.files:,} | {demo.reads.p50_ms * 1000:.0f} µs ({demo.files / 617:.1f}x) |\n-->\n"
            "<!-- end bench -->\n")
    made = bench_tables.render(page, "x.md")
    assert "| 1,234 | 91 / 125 µs (2.0x) |" in made
    assert f"`{result['provenance']['command']}` on {result['provenance']['date']}" in made
    assert bench_tables.render(made.replace("1,234", "1,235"), "x.md") == made
    with pytest.raises(FasterFSError, match=r"x.md:1: docs/results/demo.json has no 'reads.p99_ms'"):
        bench_tables.render(page.replace("p50_ms", "p99_ms"), "x.md")
    with pytest.raises(FasterFSError, match="no result 'other'"):
        bench_tables.render(page.replace("demo.files", "other.files"), "x.md")


def test_every_kept_result_is_shown_and_says_how_it_was_measured():
    """docs/results/: each result is used by a table of docs/ and names its command, date and machine."""
    import json

    used = {m for page in DOCS for m in re.findall(r"\{([\w-]+)\.", "".join(
        re.findall(r"<!-- bench\n(.*?)\n-->", page.read_text(), re.S)))}
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        p = json.loads(path.read_text())["provenance"]
        assert p["command"].startswith(("python bench/", "python jobs/")), path.name
        assert p["date"] and p["kernel"] and p["cores"], path.name
        assert path.stem in used, f"{path.name} is shown by no table"


def test_every_config_key_is_documented():
    """Every key Hydra composes (the lab group too; Hydra's own settings aside) has its row."""
    from omegaconf import OmegaConf

    from fasterfs.core import config
    from fasterfs.ui import reference

    composed = OmegaConf.to_container(config.load([], lab=True), resolve=False)
    keys = [key for top, value in composed.items() if top != "hydra" for key in leaf_keys(value, top)]
    assert len(keys) > 100, keys  # the whole configuration
    missing = sorted(set(keys) - reference.documented_keys())
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
            names = action.option_strings or [action.metavar]
            for option in names:
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
