"""The agent-daemon protocol has one definition (native/ffs-mount/protocol.json), and both sides
are checked against it: every message name and field either side's source writes or reads is
in it, and every one in it is used by both (the daemon's counters by the daemon alone). A field
one side adds and the other lacks fails here. Each message is typed there: the agent holds what
it sends and receives to those types (fasterfs.read.wire), checked here message by message.

Read from the sources as they are written: the daemon reads a message's fields with
`.get("name")` (or a helper called with the name), indexes with `["name"]`, matches keys and ops
with `"name" =>`, and writes with `json!({"name": ...})`; the agent writes dict literals and
reads `m["name"]` / `m.get("name")`, in its Agent and Backings classes and in Client.presigned
(a fetch plan's chunks).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO

ROOT = Path(__file__).resolve().parents[1]
DAEMON = ROOT / "native" / "ffs-mount"
NAME = r"[a-z_][a-z0-9_]*"


def spec() -> dict:
    return json.loads((DAEMON / "protocol.json").read_text())


def spec_names(daemon_side: bool) -> set[str]:
    p = spec()
    names = set(p["to_daemon"]) | set(p["to_agent"])  # the ops
    names |= {f for fields in p["to_daemon"].values() for f in fields}
    names |= {f for m in p["to_agent"].values() for f in [*m["request"], *m["reply"]]}
    names |= {f for fields in p["objects"].values() for f in fields}
    names |= set(p["stats_reply"]["fields"])
    if daemon_side:
        names |= set(p["stats_reply"]["stats"]) | set(p["stats_reply"]["fetch"])
    return names


def daemon_names() -> set[str]:
    names: set[str] = set()
    for src in sorted((DAEMON / "src").glob("*.rs")):
        if src.name == "http.rs":  # HTTP to MinIO, not this protocol
            continue
        code = re.split(r"#\[cfg\(test\)\]\s*mod tests", src.read_text())[0]
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("//"))
        for pattern in (rf'\b\w+\("({NAME})"\)',        # .get("name"), f("name")
                        rf'\["({NAME})"\]',              # v["name"]
                        rf'"({NAME})"\s*:',              # json!({"name": ..}), br#"{"op":..
                        rf'"({NAME})"\s*(?:=>|\|)',      # match arms: keys, ops
                        rf'"op"\s*:\s*"({NAME})"'):      # an op written
            names |= set(re.findall(pattern, code))
    return names


class _AgentNames(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def _const(self, node) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(NAME, node.value):
            self.names.add(node.value)

    def visit_Dict(self, node: ast.Dict) -> None:
        for k, v in zip(node.keys, node.values):
            self._const(k)
            if isinstance(k, ast.Constant) and k.value == "op":
                self._const(v)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._const(node.slice)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
            self._const(node.args[0])
        if (isinstance(f, ast.Attribute) and f.attr == "update") or (isinstance(f, ast.Name) and f.id == "dict"):
            self.names |= {k.arg for k in node.keywords if k.arg}
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:  # op == "open"
        if isinstance(node.left, ast.Name) and node.left.id == "op":
            for c in node.comparators:
                self._const(c)
        self.generic_visit(node)


def agent_names() -> set[str]:
    v = _AgentNames()
    for module, cls in (("mount_agent.py", "Agent"), ("mount_tree.py", "TreeSender")):
        tree = ast.parse((ROOT / "fasterfs" / "read" / module).read_text())
        agent = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        for fn in agent.body:
            if isinstance(fn, ast.FunctionDef) and fn.name not in ("__init__", "_write_stats"):  # not the wire
                v.visit(fn)
    tree = ast.parse((ROOT / "fasterfs" / "read" / "mount_tree.py").read_text())
    v.visit(next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "entry"))
    backings = ast.parse((ROOT / "fasterfs" / "read" / "backings.py").read_text())
    v.visit(next(n for n in backings.body if isinstance(n, ast.ClassDef) and n.name == "Backings"))
    client = ast.parse((ROOT / "fasterfs" / "read" / "client.py").read_text())
    v.visit(next(n for n in ast.walk(client) if isinstance(n, ast.FunctionDef) and n.name == "presigned"))
    return v.names


def test_the_daemon_uses_exactly_the_protocols_names():
    used, defined = daemon_names(), spec_names(daemon_side=True)
    assert not used - defined, f"the daemon uses names protocol.json lacks: {sorted(used - defined)}"
    assert not defined - used, f"protocol.json has names the daemon never uses: {sorted(defined - used)}"


def test_the_agent_uses_exactly_the_protocols_names():
    used, defined = agent_names(), spec_names(daemon_side=False)
    assert not used - defined, f"the agent uses names protocol.json lacks: {sorted(used - defined)}"
    assert not defined - used, f"protocol.json has names the agent never uses: {sorted(defined - used)}"


def test_a_field_one_side_lacks_fails(tmp_path, monkeypatch):
    """The check itself: a field added to the definition alone is one neither side uses."""
    p = spec()
    p["objects"]["entry"]["owner"] = "str"
    (tmp_path / "src").symlink_to(DAEMON / "src")
    (tmp_path / "protocol.json").write_text(json.dumps(p))
    monkeypatch.setattr(__import__(__name__), "DAEMON", tmp_path)
    assert "owner" in spec_names(daemon_side=True) - daemon_names()
    assert "owner" in spec_names(daemon_side=False) - agent_names()


def test_each_message_is_held_to_its_own_fields_and_types():
    """Written as the daemon (open.rs, inbound.rs) and the agent write them; then each kind of mistake
    the flat vocabulary let through: a field moved to another message, a wrong type, a request
    answered with another op's reply, an object's field missing."""
    from fasterfs.read import wire
    from fasterfs.read.mount_tree import entry as tree_entry

    entry = tree_entry("d/f.bin", False, 5, 1.5, "g1")
    wire.check("to_daemon", {"op": "delta", "since": 1, "version": 2, "entries": [entry], "gone": [], "exact": []})
    wire.check("request", {"op": "open", "path": "d/f.bin", "gen": None, "id": 3})
    wire.check("request", {"op": "read", "handle": 1, "offset": 0, "size": 4096, "id": 4})
    wire.check("reply", {"id": 4, "len": 10, "cached": {"backing": "/c/e", "inode": 7, "ranges": [[0, 10]],
                                                        "fetched_ns": 1}}, "read")
    wire.check("stats_reply", {"id": 0, "stats": {"lookups": 1}})
    wire.check("error_reply", {"id": 5, "errno": 71})
    wrong = [
        ("to_daemon", {"op": "tree", "version": 1, "lazy": True, "entries": [], "gone": []}, None, "'gone'"),
        ("request", {"op": "read", "handle": 1, "offset": "0", "size": 1, "id": 4}, None, "read.offset"),
        ("request", {"op": "read", "handle": 1, "offset": 0, "size": True, "id": 4}, None, "read.size"),
        ("reply", {"id": 4, "len": 10}, "open", "'len'"),
        ("reply", {"id": 4, "handle": 2}, "read", "'handle'"),
        ("to_daemon", {"op": "delta", "since": 1, "version": 2, "entries": [{**entry, "gen": 7}], "gone": [],
                       "exact": []}, None, "entries[0].gen"),
        ("to_daemon", {"op": "delta", "since": 1, "version": 2, "entries": [{"path": "x"}], "gone": [],
                       "exact": []}, None, "'dir' is missing"),
        ("request", {"op": "chmod", "path": "x", "id": 1}, None, "no request 'chmod'"),
        ("request", {"path": "x", "id": 1}, None, "no op"),
        ("error_reply", {"id": 5, "errno": 71, "len": 0}, None, "'len'"),
    ]
    for kind, message, op, why in wrong:
        with pytest.raises(wire.WireError, match=re.escape(why)):
            wire.check(kind, message, op)
