"""NodeIndex: what a StorageNode looks up about the namespace, updated with each change.

A kernel event names an object by the hash of its request path; the cache names entries by
file name; fills, repair and the scrub need a chunk's holders, its shards and this node's own
objects. All of it derives from the current manifests; a change makes a new index from the
last in persistent maps (the changed names' chunks out and in, at a cost of what changed) and
replaces it whole: a thread that takes `node.index` once sees one version throughout (a
manifest switched meanwhile cannot turn half its lookups into KeyErrors).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import immutables

from ..bpf.events import key_hashes
from ..core import gc_pause
from ..core.erasure import fragment_size, shard_key
from ..core.manifest import ChunkInfo, Manifest
from ..read.cache_entry import Place, entry_name, places


@dataclass(frozen=True)
class Coded:
    """An erasure-coded chunk and its code: a fill gathers it from `data` of its shards."""
    chunk: ChunkInfo
    data: int
    parity: int


@dataclass(frozen=True)
class Piece:
    """One object this node stores: which chunk of which name it belongs to, and the xxh3 its
    bytes must have (a shard's, from the manifest; None for a replica: its object's metadata says)."""
    name: str
    chunk_id: int
    xxh3: int | None


@dataclass(frozen=True)
class Shard:
    chunk_key: str
    slot: int


def _object_bytes(m: Manifest, c: ChunkInfo) -> int:
    """What one of a chunk's objects holds: the chunk (a replica), or one shard."""
    return fragment_size(c.bytes, m.ec_data, m.ec_parity) if m.layout == "ec" else c.bytes


def _requested(m: Manifest, c: ChunkInfo) -> list[str]:
    """The keys a request for chunk `c` may name: its own, and its shards' (a shard's request
    names its chunk too)."""
    return list(dict.fromkeys([c.key, *m.object_keys(c)]))


@dataclass(frozen=True)
class NodeIndex:
    node: int
    by_hash: immutables.Map[int, ChunkInfo]    # hash of /bucket/key of a chunk or one of its shards -> the chunk
    by_entry: immutables.Map[str, str]         # cache entry name -> chunk key
    holders: immutables.Map[str, list[int]]    # chunk key -> its nodes (owner first; ec: shard i's node is [i])
    shards: immutables.Map[str, Shard]         # shard key -> its chunk and slot
    coded: immutables.Map[str, Coded]          # chunk key -> its code, for erasure-coded chunks
    pieces: immutables.Map[str, Piece]         # this node's own objects, for the scrub
    places: immutables.Map[str, Place]         # chunk key -> its place in its file's entry (files of several chunks)
    names: immutables.Map[str, str]            # chunk key -> the name it belongs to (the heatmap's choice of names)
    placed_bytes: int = 0                      # what `pieces` hold: the namespace's view, kept by each change

    @classmethod
    def build(cls, manifests: Mapping[str, Manifest], node: int) -> NodeIndex:
        with gc_pause.paused():  # at 1M names: 12 s instead of 40 (gc_pause)
            empty: immutables.Map = immutables.Map()  # immutable: one for every map
            return cls(node, empty, empty, empty, empty, empty, empty, empty, empty).updated(
                [(m.name, None, m) for m in manifests.values()])

    def updated(self, changed: list[tuple[str, Manifest | None, Manifest | None]]) -> NodeIndex:
        """A new index with these names changed, (name, before, now): persistent maps (HAMTs),
        so only the changed names' chunks are taken out and put in, and this index stays as it
        was for whoever holds it."""
        by_hash, by_entry, holders = self.by_hash.mutate(), self.by_entry.mutate(), self.holders.mutate()
        shards, coded, pieces = self.shards.mutate(), self.coded.mutate(), self.pieces.mutate()
        where, names = self.places.mutate(), self.names.mutate()
        placed_bytes = self.placed_bytes
        gone = [old for _, old, _ in changed if old is not None]
        new = [now for _, _, now in changed if now is not None]
        hashes = iter(key_hashes([f"/{m.bucket}/{k}" for m in gone + new for c in m.chunks for k in _requested(m, c)]))
        for before in gone:
            for c in before.chunks:
                for k in _requested(before, c):
                    by_hash.pop(next(hashes), None)
                    shards.pop(k, None)
                by_entry.pop(entry_name(c.key), None)
                holders.pop(c.key, None)
                coded.pop(c.key, None)
                where.pop(c.key, None)
                names.pop(c.key, None)
                for n, k in before.pieces(c):
                    if n == self.node and pieces.pop(k, None) is not None:
                        placed_bytes -= _object_bytes(before, c)
        for m in new:
            for c, place in zip(m.chunks, places(m)):
                keys = m.object_keys(c)
                for _ in _requested(m, c):
                    by_hash[next(hashes)] = c
                by_entry[entry_name(c.key)] = c.key
                holders[c.key] = c.nodes
                names[c.key] = m.name
                if m.layout == "ec":
                    coded[c.key] = Coded(c, m.ec_data, m.ec_parity)
                    for s, k in enumerate(keys):
                        shards[k] = Shard(c.key, s)
                for slot, (n, k) in enumerate(m.pieces(c)):
                    if n == self.node:
                        placed_bytes += 0 if k in pieces else _object_bytes(m, c)
                        pieces[k] = Piece(m.name, c.id, c.shards[slot] if m.layout == "ec" else None)
                if place is not None:
                    where[c.key] = place
        return NodeIndex(self.node, by_hash.finish(), by_entry.finish(), holders.finish(), shards.finish(),
                         coded.finish(), pieces.finish(), where.finish(), names.finish(), placed_bytes)

    def object_keys(self, key: str) -> list[str]:
        """The objects behind a cached chunk key: its shards when erasure-coded, else itself."""
        c = self.coded.get(key)
        return [shard_key(key, s) for s in range(c.data + c.parity)] if c else [key]

    def resolve(self, hashed: int) -> str | None:
        """The chunk a key hash names in the current generations, as a person reads it."""
        c = self.by_hash.get(hashed)
        return None if c is None else f"chunk {c.id} ({c.key})"

    def home_of(self, key: str, default: int) -> int:
        """Where a fill of `key` goes when each node counts only its own MinIO's requests: a
        file's chunks all at its home (one passthrough backing); any other chunk at `default`."""
        place = self.places.get(key)
        return place.home if place is not None else default
