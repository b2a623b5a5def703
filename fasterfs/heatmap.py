"""The kernel heatmap: every chunk of the namespace, per host, as one byte.

A StorageNode encodes what it knows of each chunk in the namespace's canonical order
(names sorted, then chunk id): the state in the top 3 bits, the kernel's GET count this
epoch (capped at 31) in the low 5. An erasure-coded chunk counts as its busiest shard.
The dashboard joins every node's row into one binary frame (`frame`) and pushes it to the
/kernel page, which draws it on one canvas; the layout (names, chunk counts, holders)
travels once, as JSON, and each frame names the layout it belongs to.
"""
from __future__ import annotations

import struct

import xxhash

from .bpf.events import key_hash
from .cache_entry import entry_name

NOT_READ, COUNTED, HOT, CACHED, EVICTED, STALE = range(6)
STATES = {  # code: (name, colour on the page)
    NOT_READ: ("not read", "#1b2333"),
    COUNTED: ("counted", "#f59e0b"),   # shaded by the count
    HOT: ("HOT", "#ef4444"),
    CACHED: ("in this host's cache", "#22c55e"),
    EVICTED: ("evicted", "#8b5cf6"),
    STALE: ("stale, dropped", "#38bdf8"),
}
COUNT_MAX = 31
MAGIC = b"FFSH"
HEADER = struct.Struct("<4sIIHI")  # magic, sequence, layout id, nodes, cells; then per node: present, cells


def ordered(manifests: dict) -> list:
    return [manifests[name] for name in sorted(manifests)]


def layout_id(manifests: dict) -> int:
    """32 bits naming the namespace's current generations: a frame and its layout must agree."""
    return xxhash.xxh32_intdigest(";".join(f"{m.name}:{m.generation}:{len(m.chunks)}" for m in ordered(manifests)))


def layout(manifests: dict, nodes: list[dict], threshold: int) -> dict:
    """What the page needs once per layout: the datasets in cell order, each chunk's holders."""
    return {"id": layout_id(manifests), "nodes": nodes, "hot_threshold": threshold,
            "states": {code: {"name": n, "color": c} for code, (n, c) in STATES.items()},
            "count_max": COUNT_MAX,
            "datasets": [{"name": m.name, "kind": m.kind, "generation": m.generation, "layout": m.redundancy(),
                          "keys": [c.key.rsplit("/", 1)[-1] for c in m.chunks],
                          "holders": [c.nodes for c in m.chunks]} for m in ordered(manifests)]}


class Index:
    """A node's lookups for its row, computed once per namespace change (hashing every key
    each second would cost more than the whole view should)."""

    def __init__(self, manifests: dict):
        self.id = layout_id(manifests)
        self.chunks = [(tuple(key_hash(f"/{m.bucket}/{k}") for k in m.object_keys(c)), entry_name(c.key))
                       for m in ordered(manifests) for c in m.chunks]

    def cells(self, counts: dict[int, int], cached: frozenset[str], recent: dict[str, int], threshold: int) -> bytes:
        """One node's row: counts are the kernel's (key hash -> GETs this epoch), cached the
        entry names in its cache, recent the entries it evicted or dropped as stale since."""
        out = bytearray(len(self.chunks))
        get = counts.get
        for i, (hashes, name) in enumerate(self.chunks):
            count = max(get(h, 0) for h in hashes)
            if name in cached:
                state = CACHED
            elif count == 0 and name in recent:
                state = recent[name]
            elif count >= threshold:
                state = HOT
            else:
                state = COUNTED if count else NOT_READ
            out[i] = state << 5 | min(count, COUNT_MAX)
        return bytes(out)


def frame(seq: int, layout: int, rows: list[bytes | None], ncells: int) -> bytes:
    """The nodes' rows in one binary message; a node that did not answer (None) or is still on
    another layout is sent as absent, and the page says so."""
    parts = [HEADER.pack(MAGIC, seq, layout, len(rows), ncells)]
    for row in rows:
        if row is not None and len(row) == ncells:
            parts += [b"\x01", row]
        else:
            parts += [b"\x00", bytes(ncells)]
    return b"".join(parts)
