"""The generated tables of docs/, each from its one source: the configuration reference from
conf/'s YAML files (each key's default and the comment written with it), the CLI reference from
the CLI's table of commands (fasterfs.ui.cli.COMMANDS), the benchmark tables from the results the
benchmarks wrote (fasterfs.ui.bench_tables).

    python -m fasterfs.ui.reference           rewrite the tables in docs/
    python -m fasterfs.ui.reference --check   exit 1 naming each page whose tables are not current
    python -m fasterfs.ui.reference --result RESULT.json [--as NAME]
                                              keep a benchmark's result for the docs, then rewrite

A table stands between `<!-- reference: WHAT -->` and `<!-- end reference -->`, WHAT being
`conf/<file>.yaml [TOP-LEVEL KEY...]` (one file, or several of one group side by side) or
`commands NAME...`. The prose around the tables is written by hand.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.config import CONF_DIR, PROJECT_DIR
from ..core.errors import FasterFSError
from . import bench_tables

DOCS = PROJECT_DIR / "docs"
BLOCK = re.compile(r"(<!-- reference: (?P<what>[^>]*?) -->\n)(?P<table>.*?)(<!-- end reference -->)", re.S)
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):"
                 r"(?:[ \t]+(?P<value>[^#\n]*?))?[ \t]*(?:#[ \t]?(?P<note>.*))?$")
COMMENT = re.compile(r"^(?P<indent> *)#[ \t]?(?P<text>.*)$")
DOC_LINK = re.compile(r"docs/(?P<page>[\w-]+\.md)(?P<anchor>#[\w-]+)?")


@dataclass(frozen=True)
class Option:
    key: str      # dotted, as an override names it
    default: str  # as written in the file
    meaning: str  # the comment written with it: the lines just above, on its line, and indented below


def options(path: Path, prefix: str = "") -> list[Option]:
    """Every leaf key of a conf/ YAML file in file order, with its comment. A comment above a
    mapping (a section) or after a blank line belongs to no key."""
    found: list[Option] = []
    stack: list[tuple[int, str]] = []
    above: list[str] = []
    follows: int | None = None  # the indent of the leaf just read: deeper comments continue it
    for line in path.read_text().splitlines():
        if not line.strip():
            above, follows = [], None
            continue
        if c := COMMENT.match(line):
            if follows is not None and len(c["indent"]) > follows:
                last = found[-1]
                found[-1] = Option(last.key, last.default, f"{last.meaning} {c['text'].strip()}".strip())
            else:
                above.append(c["text"].strip())
                follows = None
            continue
        m = KEY.match(line)
        if m is None:  # a list item or a block scalar's text
            above, follows = [], None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([prefix] * bool(prefix) + [k for _, k in stack] + [m["key"]])
        value = (m["value"] or "").strip()
        if not value or value[0] in "|>":  # a mapping, or a block scalar (Hydra's help text)
            stack.append((indent, m["key"]))
            follows = None
        else:
            found.append(Option(key, value, " ".join(above + [(m["note"] or "").strip()]).strip()))
            follows = indent
        above = []
    return found


def _cell(text: str, page: str) -> str:
    """A table cell: docs/<page>.md[#anchor] in a comment becomes a link; '|' is escaped."""
    def link(m: re.Match) -> str:
        if m["page"] == page and m["anchor"]:  # this page's own section: named by its words
            return f"[{m['anchor'][1:].replace('-', ' ')}]({m['anchor']})"
        return f"[{m['page']}]({m['page']}{m['anchor'] or ''})"

    return DOC_LINK.sub(link, text).replace("|", "\\|")


def config_table(what: list[str], page: str) -> str:
    files = [CONF_DIR.parent / w for w in what if w.endswith(".yaml")]
    tops = [w for w in what if not w.endswith(".yaml")]
    prefix = "" if files[0].parent == CONF_DIR else files[0].parent.name
    columns = [{o.key: o for o in options(f, prefix)} for f in files]
    keys = list(dict.fromkeys(k for col in columns for k in col))
    if tops:
        keys = [k for k in keys if k.split(".")[0] in tops]
        if missing := [t for t in tops if not any(k.split(".")[0] == t for k in keys)]:
            raise FasterFSError(f"{page}: no key {', '.join(missing)} in {what[0]}")
    rows, silent = [], []
    for key in keys:
        meaning = next((col[key].meaning for col in columns if key in col and col[key].meaning), "")
        if not meaning:
            silent.append(key)
        values = [f"`{col[key].default}`".replace("|", "\\|") if key in col else "—" for col in columns]
        rows.append(f"| `{key}` | {' | '.join(values)} | {_cell(meaning, page)} |")
    if silent:
        raise FasterFSError(f"conf/: no comment says what {', '.join(silent)} means (write one with the key)")
    heads = ["default"] if len(files) == 1 else [f"`{f.stem}`" for f in files]
    return "\n".join([f"| key | {' | '.join(heads)} | meaning |", "|---" * (len(heads) + 2) + "|", *rows]) + "\n"


def _arguments(command) -> str:
    parts = []
    for _, spec in command.args:
        name = spec.get("metavar", "")
        name = f"[{name}]" if spec.get("nargs") == "?" else f"{name}…" if spec.get("nargs") in ("+", "*") else name
        parts.append(f"`{name}`: {spec['help']}")
    for flag, spec in command.flags:
        shown = f"{flag} {spec['metavar']}" if "metavar" in spec else flag
        said = " (required)" if spec.get("required") else (
            f" (default {spec['default']})" if spec.get("default") is not None else "")
        parts.append(f"`{shown}`: {spec['help']}{said}")
    return "; ".join(parts) or "overrides"


def commands_table(names: list[str], page: str) -> str:
    from .cli import COMMANDS

    if unknown := [n.replace("_", " ") for n in names if n.replace("_", " ") not in COMMANDS]:
        raise FasterFSError(f"{page}: no command {', '.join(unknown)} in fasterfs.ui.cli.COMMANDS")
    rows = []
    for name in (n.replace("_", " ") for n in names):
        c = COMMANDS[name]
        cells = [f"`fasterfs {name}`", _arguments(c), c.about or c.help, f"`{c.example}`"]
        rows.append("| " + " | ".join(_cell(x, page) for x in cells) + " |")
    return "\n".join(["| command | arguments | what it does | example |", "|---|---|---|---|", *rows]) + "\n"


def render(text: str, page: str) -> str:
    """The page with each of its tables made again from the sources."""
    def table(m: re.Match) -> str:
        kind, *what = m["what"].split()
        made = commands_table(what, page) if kind == "commands" else config_table([kind, *what], page)
        return m.group(1) + made + m.group(4)

    return bench_tables.render(BLOCK.sub(table, text), page)


def pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md"))


def stale_pages() -> list[str]:
    return [p for p in pages() if render((DOCS / p).read_text(), p) != (DOCS / p).read_text()]


def documented_keys() -> set[str]:
    """The keys the configuration page's tables show."""
    return {m.group(1) for m in re.finditer(r"^\| `([\w.-]+)` \|", (DOCS / "configuration.md").read_text(), re.M)}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fasterfs.ui.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming each page whose tables are not current")
    parser.add_argument("--result", type=Path, help="a benchmark's JSON result to keep in docs/results/")
    parser.add_argument("--as", dest="name", help="the name the docs' templates give the result (default: its stem)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            if stale := stale_pages():
                print(f"not current: {', '.join('docs/' + p for p in stale)} (python -m fasterfs.ui.reference)",
                      file=sys.stderr)
                return 1
            return 0
        if args.result:
            print(f"kept {bench_tables.keep(args.result, args.name).relative_to(PROJECT_DIR)}")
        made = {page: render((DOCS / page).read_text(), page) for page in pages()}  # every page, before any is written
    except FasterFSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for page, text in made.items():
        if text != (DOCS / page).read_text():
            (DOCS / page).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
