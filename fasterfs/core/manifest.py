"""The manifest: which chunks a dataset (or a file stored with `put`) has, where each one
lives, and how to check it. One manifest per name in the cluster's namespace.

It is small (one entry per chunk) and derived entirely from the ingest, so there
is no namespace service to become a bottleneck. Ingest writes it last, atomically:
a reader sees the previous complete dataset or the new one.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, fields
from operator import attrgetter

import xxhash

from . import gc_pause
from .erasure import shard_key
from .errors import FasterFSError

HASHED = "files/"  # a file's objects: HASHED + the 16 hex digits of a hash of its path + "/"


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    id: int
    key: str            # object key in every holding node's bucket
    nodes: list[int]    # replicas: holding nodes, preferred owner first; ec: shard i's node is nodes[i]
    bytes: int
    rows: int           # LOBSTER rows (0 for a file's chunks)
    first_row: int
    first_time: float
    last_time: float
    xxh3: int           # xxh3_64 of the chunk's bytes (also in its object's metadata)
    shards: list[int] = field(default_factory=list)  # ec: xxh3_64 of each shard, in shard order

    def __reduce__(self) -> tuple:
        return ChunkInfo, _chunk_state(self)


@dataclass(slots=True)
class Manifest:
    dataset: str        # its name in the namespace: a dataset's name, or a file's path
    format: str         # csv | arrow (LOBSTER datasets) | bytes (files)
    level: int
    rows_per_chunk: int
    rows: int
    replicas: int
    node_count: int
    bucket: str
    generation: str
    chunks: list[ChunkInfo]
    created: float = field(default_factory=time.time)
    kind: str = "dataset"  # dataset (LOBSTER rows) | file (any bytes, stored with `put`)
    layout: str = "replicas"  # replicas (whole copies) | ec (Reed-Solomon shards, fasterfs.core.erasure)
    ec_data: int = 0
    ec_parity: int = 0
    moved: bool = False  # repair put pieces away from where ingest placed them: surveys check their homes

    @property
    def name(self) -> str:
        return self.dataset

    def __reduce__(self) -> tuple:
        return Manifest, _manifest_state(self)

    def redundancy(self) -> str:
        """The layout as a user names it: replicas=2, or ec=4+2."""
        return f"ec={self.ec_data}+{self.ec_parity}" if self.layout == "ec" else f"replicas={self.replicas}"

    def chunk(self, i: int) -> ChunkInfo:
        if not isinstance(i, int) or not 0 <= i < len(self.chunks):
            raise FasterFSError(f"chunk {i!r} does not exist in dataset {self.dataset}: "
                                f"valid ids are 0..{len(self.chunks) - 1}")
        return self.chunks[i]

    def __len__(self) -> int:
        return len(self.chunks)

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.chunks)

    def offsets(self) -> list[int]:
        """Where each chunk starts in the whole (the chunks concatenated), and the total last."""
        out = [0]
        for c in self.chunks:
            out.append(out[-1] + c.bytes)
        return out

    def pieces(self, c: ChunkInfo) -> list[tuple[int, str]]:
        """(node, object key) of each stored piece of chunk c, in slot order: the one place a
        chunk is expanded into the objects behind it (ec: slot i is shard i on nodes[i])."""
        if self.layout == "ec":
            return [(node, shard_key(c.key, s)) for s, node in enumerate(c.nodes)]
        return [(node, c.key) for node in c.nodes]

    def object_keys(self, c: ChunkInfo) -> list[str]:
        """The distinct object keys behind chunk c (its shards, or its one key)."""
        return [shard_key(c.key, s) for s in range(len(c.nodes))] if self.layout == "ec" else [c.key]

    def on_node(self, index: int) -> list[ChunkInfo]:
        return [c for c in self.chunks if index in c.nodes]

    def to_dict(self) -> dict:
        """As JSON keeps it (asdict's deep copies cost 5x more per chunk)."""
        return dict(zip(_MANIFEST_FIELDS, _manifest_state(self)),
                    chunks=[dict(zip(_CHUNK_FIELDS, _chunk_state(c))) for c in self.chunks])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict, where: str) -> Manifest:
        try:
            # a manifest from before `moved` was recorded may have pieces away from home
            m = cls(**{"moved": True, **data, "chunks": [ChunkInfo(**c) for c in data["chunks"]]})
            # one copy of the words every manifest repeats (JSON decodes each anew: ~230 B a name)
            m.format, m.bucket, m.kind, m.layout = map(sys.intern, (m.format, m.bucket, m.kind, m.layout))
            return m
        except (TypeError, KeyError) as e:
            raise FasterFSError(f"manifest {where} is not one this FasterFS can read ({e}); "
                                "re-run `fasterfs ingest`") from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        return cls.from_dict(json.loads(text), where)


def decode_many(texts: list[str], where: str) -> list[Manifest]:
    """Manifests from their JSON texts, as one JSON array (one call into the C decoder instead of
    one per text) with the cycle collector paused."""
    with gc_pause.paused():
        try:
            data = json.loads("[" + ",".join(texts) + "]")
        except ValueError:
            for text in texts:
                try:
                    json.loads(text)
                except ValueError as e:
                    raise FasterFSError(f"a manifest in {where} is not JSON ({e}): {text[:80]!r}") from None
            raise
        return [Manifest.from_dict(d, f"{d.get('dataset')!r} in {where}") for d in data]


# Both classes have slots (a fifth less memory: a StorageNode keeps every name's manifest) and
# pickle as their fields in order, rebuilt by the constructor (1.6x faster to unpickle than
# slots' default, measured at 1M manifests).
_CHUNK_FIELDS = [f.name for f in fields(ChunkInfo)]
_MANIFEST_FIELDS = [f.name for f in fields(Manifest)]
_chunk_state = attrgetter(*_CHUNK_FIELDS)
_manifest_state = attrgetter(*_MANIFEST_FIELDS)

def object_prefix(name: str, kind: str) -> str:
    """Where the objects of `name` live: a dataset under its name, a file under a hash of
    its path (paths may hold characters a key should not)."""
    return f"{name}/" if kind == "dataset" else f"{HASHED}{xxhash.xxh3_64_hexdigest(name.encode())}/"
