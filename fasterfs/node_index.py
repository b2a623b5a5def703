"""NodeIndex: what a StorageNode looks up about the namespace, updated with each change.

A kernel event names an object by the hash of its request path; the cache names entries by
file name; fills, repair and the scrub need a chunk's holders, its shards and this node's own
objects. All of it derives from the current manifests; a change makes a new index from the
last (the changed names' chunks out and in) and replaces it whole: a thread that takes
`node.index` once sees one version throughout (a manifest switched meanwhile cannot turn half
its lookups into KeyErrors).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .bpf.events import key_hash
from .cache_entry import Place, entry_name, places
from .erasure import shard_key
from .manifest import ChunkInfo, Manifest


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


@dataclass(frozen=True)
class NodeIndex:
    node: int
    by_hash: Mapping[int, ChunkInfo]    # hash of /bucket/key of a chunk or one of its shards -> the chunk
    by_entry: Mapping[str, str]         # cache entry name -> chunk key
    holders: Mapping[str, list[int]]    # chunk key -> its nodes (owner first; ec: shard i's node is [i])
    shards: Mapping[str, Shard]         # shard key -> its chunk and slot
    coded: Mapping[str, Coded]          # chunk key -> its code, for erasure-coded chunks
    pieces: Mapping[str, Piece]         # this node's own objects, for the scrub
    places: Mapping[str, Place]         # chunk key -> its place in its file's cache entry (files of several chunks)

    @classmethod
    def build(cls, manifests: Mapping[str, Manifest], node: int) -> NodeIndex:
        return cls(node, *({} for _ in range(7))).updated([(m.name, None, m) for m in manifests.values()])

    def updated(self, changed: list[tuple[str, Manifest | None, Manifest | None]]) -> NodeIndex:
        """A new index with these names changed, (name, before, now): this one's maps copied
        (at C speed) and only the changed names' chunks taken out and put in."""
        by_hash, by_entry, holders, shards, coded, pieces, where = (
            dict(self.by_hash), dict(self.by_entry), dict(self.holders), dict(self.shards), dict(self.coded),
            dict(self.pieces), dict(self.places))
        for before in (old for _, old, _ in changed if old is not None):
            for c in before.chunks:
                for k in {c.key, *before.object_keys(c)}:
                    by_hash.pop(key_hash(f"/{before.bucket}/{k}"), None)
                    shards.pop(k, None)
                by_entry.pop(entry_name(c.key), None)
                for table in (holders, coded, where):
                    table.pop(c.key, None)
                for _, k in before.pieces(c):
                    pieces.pop(k, None)
        for m in (now for _, _, now in changed if now is not None):
            for c, place in zip(m.chunks, places(m)):
                keys = m.object_keys(c)
                for k in {c.key, *keys}:  # a shard's request names its chunk too
                    by_hash[key_hash(f"/{m.bucket}/{k}")] = c
                by_entry[entry_name(c.key)] = c.key
                holders[c.key] = c.nodes
                if m.layout == "ec":
                    coded[c.key] = Coded(c, m.ec_data, m.ec_parity)
                    shards.update((k, Shard(c.key, s)) for s, k in enumerate(keys))
                for slot, (n, k) in enumerate(m.pieces(c)):
                    if n == self.node:
                        pieces[k] = Piece(m.name, c.id, c.shards[slot] if m.layout == "ec" else None)
                if place is not None:
                    where[c.key] = place
        frozen = MappingProxyType
        return NodeIndex(self.node, frozen(by_hash), frozen(by_entry), frozen(holders), frozen(shards), frozen(coded),
                         frozen(pieces), frozen(where))

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
