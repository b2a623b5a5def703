"""The agent-daemon wire, typed: native/ffs-mount/protocol.json gives every message's fields with
their types, and the mount's agent holds each message it sends and receives to them. A field
moved to another message, a wrong type, a request answered with another op's reply fail at once,
naming the message and the field, instead of reaching the other side as a default."""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from ..core.errors import FasterFSError

SPEC = Path(__file__).resolve().parents[2] / "native" / "ffs-mount" / "protocol.json"
SCALARS = {"str": str, "int": int, "bool": bool, "null": type(None)}


class WireError(FasterFSError):
    """A message that breaks protocol.json."""


@cache
def spec(path: Path = SPEC) -> dict:
    return json.loads(path.read_text())


def shape(kind: str, op: str | None = None) -> dict[str, str]:
    """The fields of one message: kind "to_daemon" (by op), "request" or "reply" (of an op the
    daemon asks the agent), "error_reply" (to any request) or "stats_reply"."""
    p = spec()
    try:
        if kind == "to_daemon":
            return p["to_daemon"][op]
        if kind in ("request", "reply"):
            return p["to_agent"][op][kind]
        if kind in ("stats_reply", "error_reply"):
            return p[kind]["fields"]
    except KeyError:
        raise WireError(f"protocol.json has no {kind} {op!r}") from None
    raise ValueError(kind)


def _fits(value, typ: str, where: str) -> None:
    for alternative in typ.split("|"):
        try:
            _one(value, alternative, where)
            return
        except WireError as e:
            why = e
    if "|" in typ:
        raise WireError(f"{where}: {value!r:.60} is none of {typ}")
    raise why


def _one(value, typ: str, where: str) -> None:
    if typ in SCALARS:
        # bool is an int to Python; neither stands for the other on the wire
        if not isinstance(value, SCALARS[typ]) or (typ == "int" and isinstance(value, bool)):
            raise WireError(f"{where}: {value!r:.60} is not {typ}")
    elif m := re.fullmatch(r"\[(.+)\]", typ):
        if not isinstance(value, list):
            raise WireError(f"{where}: {value!r:.60} is not an array of {m.group(1)}")
        for i, item in enumerate(value):
            _fits(item, m.group(1), f"{where}[{i}]")
    elif typ == "{}":
        if not isinstance(value, dict):
            raise WireError(f"{where}: {value!r:.60} is not an object")
    else:
        fields(value, spec()["objects"][typ], where)


def fields(message, declared: dict[str, str], where: str) -> None:
    """`message` has exactly the `declared` fields (those ending in ? may be absent), each of its type."""
    if not isinstance(message, dict):
        raise WireError(f"{where}: {message!r:.60} is not an object")
    unknown = set(message) - set(declared)
    if unknown:
        raise WireError(f"{where}: fields {sorted(unknown)} are not in protocol.json's {sorted(declared)}")
    for name, typ in declared.items():
        if name in message:
            _fits(message[name], typ.removesuffix("?"), f"{where}.{name}")
        elif not typ.endswith("?"):
            raise WireError(f"{where}: field {name!r} is missing")


def check(kind: str, message: dict, op: str | None = None) -> dict:
    """`message` as protocol.json has it (its op read from it where it carries one), else WireError."""
    if kind in ("to_daemon", "request"):
        op = message.get("op") if isinstance(message, dict) else None
        if not isinstance(op, str):
            raise WireError(f"{kind} {message!r:.80}: no op")
    fields(message, shape(kind, op), f"{kind} {op or ''}".strip())
    return message
