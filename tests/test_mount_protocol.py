"""The agent-daemon protocol has one definition (native/ffs-mount/protocol.json), and both sides
are checked against it. The daemon reads and writes every message as a type of its wire module
(native/ffs-mount/src/wire.rs), held here to protocol.json message by message, field by field and
type by type: a field one side adds and the other lacks, a field moved to another message or of
another type fails here. The agent holds what it sends and receives to the same types
(fasterfs.read.wire), checked here too, and its sources use exactly protocol.json's names.

Read from the sources as they are written: wire.rs's structs (the agent's message of op "x" is
`XMsg`, by `Notice::of`; the daemon's request "x" and its reply are the structs `request!` pairs
with "x"; an object "x" is `X`), each field with its Rust type and serde attributes; the agent's
dict literals and its reads `m["name"]` / `m.get("name")`, in its Agent and Backings classes and
in Client.presigned (a fetch plan's chunks).
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


# -- the daemon: wire.rs's types -------------------------------------------------------------------


def wire_source() -> str:
    return (DAEMON / "src" / "wire.rs").read_text()


def code_of(rust: str) -> str:
    """Rust source without its unit tests and comments."""
    code = re.split(r"#\[cfg\(test\)\]\s*mod tests", rust)[0]
    return "\n".join(uncommented(line) for line in code.splitlines())


def uncommented(line: str) -> str:
    """`line` up to its // comment, if any (not one inside a string)."""
    quoted, escaped = False, False
    for i, c in enumerate(line):
        if quoted:
            quoted, escaped = (escaped or c != '"'), (not escaped and c == "\\")
        elif c == '"':
            quoted = True
        elif line.startswith("//", i):
            return line[:i]
    return line


def split_top(text: str) -> list[str]:
    """`text` split at its commas outside brackets (a struct body into its fields)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c in "([<{"
        depth -= c in ")]>}"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p for p in (*parts, text[start:]) if p.strip()]


def rust_wire(rust: str) -> dict:
    """wire.rs's definitions: its structs (name -> derives, and each field's Rust type and serde
    attributes), type aliases, requests (op -> request struct, reply type), notices (op -> struct)."""
    code = code_of(rust)
    structs, struct = {}, r"((?:#\[[^\]]*\]\s*)*)pub struct (\w+)(?:<[^>{]*>)?\s*\{(.*?)\n\}"
    for attrs, name, body in re.findall(struct, code, re.S):
        fields = {}
        for field in split_top(body):
            m = re.fullmatch(r"\s*((?:#\[.*?\]\s*)*)pub (\w+)\s*:\s*(.+?)\s*", field, re.S)
            assert m, f"{name}: cannot read the field {field!r}"
            serde = " ".join(re.findall(r"#\[serde\((.*?)\)\]", m[1], re.S))
            rust_type = re.sub(r"\s+", "", re.sub(r"&\s*('\w+\s+)?", "", m[3]))  # &'a str: str
            fields[m[2]] = (rust_type, set(re.findall(r"\b(default|flatten|skip_serializing_if)\b", serde)))
        structs[name] = {"derive": set(re.findall(r"\b(Serialize|Deserialize)\b", attrs)), "fields": fields}
    return {
        "structs": structs,
        "aliases": dict(re.findall(r"pub type (\w+) = (\w+);", code)),
        "requests": {op: (req, reply) for req, op, reply
                     in re.findall(r'request!\(\s*(\w+)(?:<[^>]*>)?\s*,\s*"(\w+)"\s*,\s*(\w+)\s*\)', code)},
        "notices": {op: f"{variant}Msg" for op, variant in re.findall(r'"(\w+)"\s*=>\s*Notice::(\w+)', code)},
    }


SCALARS = {"String": "str", "str": "str", "bool": "bool", **dict.fromkeys(("u64", "i64", "u32", "i32", "usize"), "int")}


def wire_type(rust: str, w: dict, objects: set[str]) -> str:
    """A Rust field type as protocol.json spells types: Option<T> is T|null, an object's struct
    (`Hot`) its name ("hot"), another struct of wire.rs an object without a definition ("{}")."""
    t = rust
    if m := re.fullmatch(r"Option<(.+)>", t):
        return wire_type(m[1], w, objects) + "|null"
    if m := re.fullmatch(r"Vec<(.+)>", t):
        return f"[{wire_type(m[1], w, objects)}]"
    if m := re.fullmatch(r"\((.+)\)", t):  # a tuple: an array of its one type
        items = {wire_type(i, w, objects) for i in split_top(m[1])}
        return f"[{items.pop()}]" if len(items) == 1 else f"<tuple {t}>"
    t = w["aliases"].get(t, t)
    if t in SCALARS:
        return SCALARS[t]
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", t).lower()
    if snake in objects:
        return snake
    return "{}" if t in w["structs"] else f"<{t}>"


def fields_of(struct: str, w: dict) -> dict:
    """A struct's fields on the wire: a #[serde(flatten)] field's own fields in its place (none
    for a type parameter: `Sent`'s request, checked as itself)."""
    out = {}
    for name, (rust, attrs) in w["structs"][struct]["fields"].items():
        if "flatten" in attrs:
            out.update(fields_of(rust, w) if rust in w["structs"] else {})
        else:
            out[name] = (rust, attrs)
    return out


def type_problem(rust: str, attrs: set[str], declared: str, sent: bool, w: dict, objects: set[str]) -> str | None:
    """Why a field of Rust type `rust` is not protocol.json's `declared`. Read by the daemon: it
    takes exactly the declared types, and absence where "?" allows it (Option, or a default). Sent
    by it: what it writes fits the declared types (an Option skipped when None may be absent)."""
    t = wire_type(rust, w, objects)
    mine, theirs = set(t.split("|")), set(declared.removesuffix("?").split("|"))
    if sent:
        if "skip_serializing_if" in attrs:
            mine.discard("null")
            if not declared.endswith("?"):
                return f"{rust} may be left out, protocol.json's {declared} may not"
        return None if mine <= theirs else f"{rust} ({t}) is not {declared}"
    if mine - {"null"} != theirs - {"null"} or ("null" in theirs and "null" not in mine):
        return f"{rust} ({t}) is not {declared}"
    if declared.endswith("?") and "null" not in mine and "default" not in attrs:
        return f"{rust} must be there, protocol.json's {declared} may be absent"
    return None


def daemon_mismatches(p: dict, rust: str) -> list[str]:
    """Where wire.rs (its source `rust`) and protocol.json `p` differ."""
    w, objects, bad = rust_wire(rust), set(p["objects"]), []

    def held(where: str, struct: str, declared: dict, framing: set[str], sent: bool) -> None:
        struct = w["aliases"].get(struct, struct)
        derive = "Serialize" if sent else "Deserialize"
        if derive not in w["structs"].get(struct, {}).get("derive", ()):
            bad.append(f"{where}: wire.rs has no {struct} with {derive}")
            return
        mine = fields_of(struct, w)
        bad.extend(f"{where}.{f}: not in {struct}" for f in sorted(declared.keys() - framing - mine.keys()))
        bad.extend(f"{where}.{f}: in {struct}, not in protocol.json" for f in sorted(mine.keys() - declared.keys()))
        for f in sorted(mine.keys() & declared.keys() - framing):
            if why := type_problem(*mine[f], declared[f], sent, w, objects):
                bad.append(f"{where}.{f}: {struct}'s {why}")

    # Framing: "op" read off every line (Frame), written with each request's fields and "id" (Sent).
    held("framing", "Frame", {"op": "str?", "id": "int?", "len": "int?"}, set(), sent=False)
    held("framing", "Sent", {"op": "str", "id": "int"}, set(), sent=True)
    if set(w["notices"]) != set(p["to_daemon"]):
        bad.append(f"Notice::of has ops {sorted(w['notices'])}, protocol.json {sorted(p['to_daemon'])}")
    for op, declared in p["to_daemon"].items():
        if declared.get("op") != "str":
            bad.append(f"to_daemon {op}: its op is no str")
        held(f"to_daemon {op}", w["notices"].get(op, "?"), declared, {"op"}, sent=False)
    if set(w["requests"]) != set(p["to_agent"]):
        bad.append(f"request! has ops {sorted(w['requests'])}, protocol.json {sorted(p['to_agent'])}")
    for op, m in p["to_agent"].items():
        request, reply = w["requests"].get(op, ("?", "?"))
        if (m["request"].get("op"), m["request"].get("id")) != ("str", "int"):
            bad.append(f"{op} request: its op and id are no str and int")
        held(f"{op} request", request, m["request"], {"op", "id"}, sent=True)
        held(f"{op} reply", reply, m["reply"], set(), sent=False)
        struct = w["aliases"].get(reply, reply)
        for f, declared in p["error_reply"]["fields"].items():  # any reply may be an error reply
            mine = fields_of(struct, w).get(f) if struct in w["structs"] else None
            if why := "not there" if mine is None else type_problem(*mine, declared, False, w, objects):
                bad.append(f"{op} reply: an error reply's {f} ({declared}): {why}")
    for name, declared in p["objects"].items():
        held(f"object {name}", "".join(part.title() for part in name.split("_")), declared, set(), sent=False)
    stats = p["stats_reply"]
    held("stats_reply", "StatsReply", stats["fields"], set(), sent=True)
    counters = {**dict.fromkeys(stats["stats"], "int|bool"), "fetch": "{}"}
    held("stats_reply.stats", "Counters", counters, set(), sent=True)
    held("stats_reply.stats.fetch", "FetchCounters", dict.fromkeys(stats["fetch"], "int"), set(), sent=True)
    return bad


def test_the_daemons_wire_types_are_the_protocols():
    assert not daemon_mismatches(spec(), wire_source())


def test_no_other_daemon_module_reads_the_wire_by_hand():
    """Every field is wire.rs's: the others hold typed messages (http.rs speaks HTTP to MinIO)."""
    by_hand = r'serde_json::(Value|json|from_)|\bValue::|json!\(|\.get\("|\["\w+"\]|\.as_(u64|i64|bool|array|object)\('
    found = {src.name: m.group(0) for src in (DAEMON / "src").glob("*.rs") if src.name not in ("wire.rs", "http.rs")
             if (m := re.search(by_hand, code_of(src.read_text())))}
    assert not found, found
    assert re.search(by_hand, code_of(wire_source())), "the pattern sees serde_json"


def test_the_check_sees_each_kind_of_daemon_mistake():
    """A field added, moved to another message, of another type, or present where protocol.json
    lets it be absent; a request paired with another's reply, an op dropped: each found."""
    p, rust = spec(), wire_source()

    def found(p: dict, rust: str, *want: str) -> None:
        bad = "\n".join(daemon_mismatches(p, rust))
        for w in want:
            assert w in bad, f"{w!r} not in:\n{bad}"

    q = json.loads(json.dumps(p))
    q["to_daemon"]["tree"]["since"] = q["to_daemon"]["delta"].pop("since")
    found(q, rust, "to_daemon tree.since: not in TreeMsg", "to_daemon delta.since: in DeltaMsg, not in protocol.json")
    q = json.loads(json.dumps(p))
    q["to_agent"]["read"]["request"]["offset"] = "str"
    q["to_agent"]["cached"]["reply"]["len"] = q["to_agent"]["read"]["reply"].pop("len")
    q["objects"]["entry"]["owner"] = "str"
    q["stats_reply"]["fetch"].append("misses")
    found(q, rust, "read request.offset: ReadRequest's u64 (int) is not str", "read reply.len: in ReadReply",
          "cached reply.len: not in CachedReply", "object entry.owner: not in Entry",
          "stats_reply.stats.fetch.misses: not in FetchCounters")
    for old, new, want in [
        ("pub mtime_ns: i64", "pub mtime_ns: String", "object entry.mtime_ns: Entry's String (str) is not int"),
        ("#[serde(default)]\n    pub keep_cache", "pub keep_cache", "open reply.keep_cache: OpenReply's bool must be"),
        ('"read", ReadReply', '"read", CachedReply', "read reply.len: not in CachedReply"),
        ('"hot" => Notice::Hot,', "", "Notice::of has ops"),
        ("pub handle: Option<u64>,\n}", "pub handle: Option<String>,\n}", "release request.handle"),
        ("pub size: u32", "pub size: Option<u32>", "read request.size: ReadRequest's Option<u32> (int|null)"),
        ('#[serde(skip_serializing_if = "Option::is_none")]\n    pub why', "pub why", "refresh request.why"),
        ("pub kernel_held: u64,", "pub kernel_held: u64,\n    pub misses: u64,", "stats.misses: in Counters"),
    ]:
        assert old in rust, old
        found(p, rust.replace(old, new), want)
    assert not daemon_mismatches(p, rust.replace("pub ranges: Vec<(u64, u64)>", "pub ranges: Vec<Vec<u64>>"))


# -- the agent: its sources' names -----------------------------------------------------------------


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


def test_the_agent_uses_exactly_the_protocols_names():
    used, defined = agent_names(), spec_names(daemon_side=False)
    assert not used - defined, f"the agent uses names protocol.json lacks: {sorted(used - defined)}"
    assert not defined - used, f"protocol.json has names the agent never uses: {sorted(defined - used)}"


def test_a_field_one_side_lacks_fails():
    """The check itself: a field added to the definition alone is one neither side has."""
    p = spec()
    p["objects"]["entry"]["owner"] = "str"
    assert "object entry.owner: not in Entry" in daemon_mismatches(p, wire_source())
    assert "owner" in {f for fields in p["objects"].values() for f in fields} - agent_names()


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
