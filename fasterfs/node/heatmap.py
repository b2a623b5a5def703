"""The kernel heatmap: the namespace's chunks, per host, as one byte.

It shows every chunk while the namespace holds at most `dashboard.heat_cells` of them; past
that (a million files), the names whose chunks a host's kernel counted this epoch, busiest
first, then those a host caches, until the cells are spent (`choose`): what is being read is
what a viewer watches, and the page's cost stays the cells', not the namespace's. The page
says how many chunks the namespace holds beside how many it shows.

A StorageNode encodes what it knows of each shown chunk in canonical order
(names sorted, then chunk id): the state in the top 3 bits, the kernel's GET count this
epoch (capped at 31) in the low 5. An erasure-coded chunk counts as its busiest shard.
The dashboard joins every node's row into one binary frame (`frame`) and pushes it to the
/kernel page, which draws it on one canvas; the layout (names, chunk counts, holders)
travels once, as JSON, and each frame names the layout it belongs to.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

import xxhash

from ..bpf.events import key_hash
from ..read.cache_entry import entry_name

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


def choose(total: int, cells: int, counts: dict[int, int], cached: Iterable[str],
           name_of_hash: Callable[[int], str | None], name_of_entry: Callable[[str], str | None],
           size: Callable[[str], int]) -> list[tuple[str, int]] | None:
    """The names one host would show in at most `cells` cells, each with its chunks: None
    (every name) while the namespace's `total` chunks fit; else the names of the chunks its
    kernel counted, busiest first, then of the entries it caches (`cached`, newest first), each
    name whole (`size` chunks) while it fits. The cost is the counting map's and the cells',
    never the namespace's."""
    if total <= cells:
        return None
    chosen: dict[str, int] = {}
    left = cells

    def take(name: str | None) -> bool:
        nonlocal left
        if name is not None and name not in chosen:
            n = size(name)
            if n <= left:
                chosen[name] = n
                left -= n
        return left > 0

    if all(take(name_of_hash(h)) for h, _ in sorted(counts.items(), key=lambda kv: -kv[1])):
        all(take(name_of_entry(e)) for e in cached)
    return list(chosen.items())


def merge(choices: list[list[tuple[str, int]]], cells: int) -> list[str]:
    """The hosts' choices taken in turn (each host's busiest first), within `cells` in all."""
    chosen: set[str] = set()
    left = cells
    for rank in range(max((len(c) for c in choices), default=0)):
        for c in choices:
            if rank < len(c) and c[rank][0] not in chosen and c[rank][1] <= left:
                chosen.add(c[rank][0])
                left -= c[rank][1]
    return sorted(chosen)


def layout(manifests: dict, nodes: list[dict], threshold: int, total: int | None = None) -> dict:
    """What the page needs once per layout: the datasets in cell order, each chunk's holders,
    and how many chunks the namespace holds (`total`; those shown when it is every one)."""
    shown = sum(len(m.chunks) for m in manifests.values())
    return {"id": layout_id(manifests), "nodes": nodes, "hot_threshold": threshold,
            "total_chunks": shown if total is None else total,
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

    def cells(self, counts: dict[int, int], cached: Callable[[str], bool], recent: dict[str, int],
              threshold: int) -> bytes:
        """One node's row: counts are the kernel's (key hash -> GETs this epoch), cached says
        whether an entry is in its cache, recent the entries it evicted or dropped as stale since."""
        out = bytearray(len(self.chunks))
        get = counts.get
        for i, (hashes, name) in enumerate(self.chunks):
            count = max(get(h, 0) for h in hashes)
            if cached(name):
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
