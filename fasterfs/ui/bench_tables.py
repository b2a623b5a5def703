"""The docs' benchmark tables, generated from the results the benchmarks wrote: each bench and job
writes its figures as JSON with where and how they were measured (fasterfs.control.report), a
result is kept in docs/results/<name>.json, and each table is made from a template written beside
it in the page, so no figure is ever copied by hand.

In a page, a table stands between its template and `<!-- end bench -->`:

    <!-- bench
    | layout | read p50 |
    |---|---|
    | ec 2+1 | {erasure.ec.read_p50_ms:.1f} ms |
    -->
    (the table made from it, and a line per result saying how it was measured)
    <!-- end bench -->

`{NAME.PATH:FORMAT}` is the value at PATH (keys and list indices joined by dots; a key that is
not letters, digits, '_' and '-' in double quotes: `{m.paths."local copy".p50_ms}`) in
docs/results/NAME.json, formatted with Python's format spec; two values or a value and a number
with `*` or `/` between them make one (`{r.read_s * 1000:.1f}` for milliseconds,
`{m.mount.p50_ms / m.local.p50_ms:.2f}x`); a list of numbers is formatted item by item, joined
by " / ".
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..core.config import PROJECT_DIR
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write_json

RESULTS = PROJECT_DIR / "docs" / "results"
BLOCK = re.compile(r"(<!-- bench\n(?P<template>.*?)\n-->\n)(?P<made>.*?)(<!-- end bench -->)", re.S)
FIELD = re.compile(r'\{(?P<expr>(?:[^{}:"]|"[^"{}]*")+)(?::(?P<fmt>[^{}]*))?\}')
KEY = r'(?:[\w-]+|"[^"{}]*")'  # a quoted key may hold spaces, dots, colons, slashes
TERM = rf"(?:[A-Za-z][\w-]*(?:\.{KEY})+|\d+(?:\.\d+)?)"
PART = re.compile(r'"(?P<quoted>[^"]*)"|(?P<plain>[\w-]+)')
EXPR = re.compile(rf"^\s*(?P<a>{TERM})\s*(?:(?P<op>[*/])\s*(?P<b>{TERM})\s*)?$")
NAME = re.compile(r"^[\w-]+$")


def load(name: str, cache: dict[str, dict]) -> dict:
    if name not in cache:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            raise FasterFSError(f"no result {name!r}: {path} does not exist (run the "
                                f"benchmark, then python -m fasterfs.ui.reference --result <its JSON> --as {name})")
        cache[name] = json.loads(path.read_text())
    return cache[name]


def lookup(result: dict, name: str, path: str):
    value = result
    for m in PART.finditer(path):
        part = m["plain"] if m["quoted"] is None else m["quoted"]
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise FasterFSError(f"docs/results/{name}.json has no {path!r} (no {part!r} there)") from None
    return value


def fmt(value, spec: str) -> str:
    if isinstance(value, list):
        return " / ".join(fmt(v, spec) for v in value)
    if value is None:
        return "—"
    return format(value, spec) if spec else str(value)


def provenance_line(name: str, result: dict) -> str:
    p = result.get("provenance")
    if p is None:
        raise FasterFSError(f"docs/results/{name}.json says nothing of how it was measured (no 'provenance': "
                            f"written by fasterfs.control.report.write_json)")
    return (f"<small>`{name}`: `{p['command']}` on {p['date']}, {p['cores']} cores ({p['cpu']}), "
            f"{p['memory_gib']} GiB, {p['os']}, kernel {p['kernel']}, commit {p['commit']}</small>")


def apply(op: str, a, b):
    """a op b, item by item where either is a list."""
    if isinstance(a, list) or isinstance(b, list):
        pairs = zip(a, b, strict=True) if isinstance(a, list) and isinstance(b, list) else \
            ((x, b) for x in a) if isinstance(a, list) else ((a, y) for y in b)
        return [apply(op, x, y) for x, y in pairs]
    return a * b if op == "*" else a / b


def make(template: str, cache: dict[str, dict]) -> str:
    names: list[str] = []

    def term(text: str):
        if text[0].isdigit():
            return float(text)
        name, path = text.split(".", 1)
        result = load(name, cache)
        if name not in names:
            names.append(name)
        return lookup(result, name, path)

    def field(m: re.Match) -> str:
        e = EXPR.match(m["expr"])
        if e is None:
            raise FasterFSError(f"{m.group(0)}: not NAME.PATH, or two of them (or a number) joined by * or /")
        value = term(e["a"])
        try:
            if e["op"]:
                value = apply(e["op"], value, term(e["b"]))
            return fmt(value, m["fmt"] or "")
        except (ValueError, TypeError, ZeroDivisionError) as err:
            raise FasterFSError(f"{m.group(0)}: {value!r} cannot be made or formatted: {err}") from None

    table = FIELD.sub(field, template)
    return table + "\n\n" + "<br>\n".join(provenance_line(n, cache[n]) for n in names) + "\n"


def render(text: str, page: str) -> str:
    """The page with each benchmark table made again from its results."""
    cache: dict[str, dict] = {}

    def block(m: re.Match) -> str:
        try:
            return m.group(1) + make(m["template"], cache) + m.group(4)
        except FasterFSError as e:
            line = text.count("\n", 0, m.start()) + 1
            raise FasterFSError(f"docs/{page}:{line}: {e}") from None

    return BLOCK.sub(block, text)


BULK = 32_000  # bytes: a result's top-level entry larger than this (a read log) is left out of the kept copy


def keep(source: Path, name: str | None = None) -> Path:
    """A result kept for the docs under docs/results/<name>.json (the file's stem by default). Its
    bulky raw entries (per-read logs) are left out and named under "left_out" with their size; the
    whole result stays where the benchmark wrote it."""
    name = name or source.stem
    if not NAME.match(name):
        raise FasterFSError(f"--as {name!r}: a result's name is letters, digits, '_' and '-'")
    result = json.loads(source.read_text())
    if "provenance" not in result:
        raise FasterFSError(f"{source}: no 'provenance' (written before results said how they were measured); "
                            f"run the benchmark again")
    sizes = {k: len(json.dumps(v)) for k, v in result.items()}
    kept = {k: v for k, v in result.items() if sizes[k] <= BULK or k == "provenance"}
    if left_out := {k: sizes[k] for k in result if k not in kept}:
        kept["left_out"] = {"bytes": left_out, "whole_result": str(source)}
    RESULTS.mkdir(exist_ok=True)
    return atomic_write_json(RESULTS / f"{name}.json", kept)
