"""NamespaceStore: the cluster's namespace as the head keeps it, on an Engine.

Each name (a dataset, or a file's path) has one current manifest; every generation a name had is
kept (a replaced one's objects stay until `ingest.keep_old_s` has passed, for readers that
still hold its manifest), and so are the pieces repair moved away and those a write has not yet
published. Every change is one transaction and one new version in the log, and is pushed to the
StorageNodes as the names it changed (`push("apply_changes", Changes)`), after it is stored. The
Registry actor holds one; tests build one on a temporary directory.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..core import gc_pause, stamp
from ..core.errors import FasterFSError
from ..core.manifest import Manifest, decode_many
from .engine import Attrs, Engine

Moves = dict[int, tuple[list[int], list[int]]]  # chunk id -> (its nodes before a repair, after)
Push = Callable[[str, object], list[int]]  # (StorageNode method, its argument) -> the nodes that took it


@dataclass(frozen=True)
class Changes:
    """What changed between two versions: each name's manifest now (None: removed)."""
    since: int
    version: int
    names: dict[str, Manifest | None]


@dataclass(frozen=True)
class Resolved:
    """What a path names at a version: a manifest holding it, or a directory's time, or neither."""
    version: int
    manifest: Manifest | None
    dir_mtime: float | None


@dataclass(frozen=True)
class Listing:
    """One directory of the namespace: its subdirectories (path, mtime) and its names."""
    version: int
    dirs: list[tuple[str, float]]
    names: list[Manifest]


@dataclass(frozen=True)
class AttrsListing:
    """One directory as a file system lists it: its subdirectories (path, mtime), its names' attributes."""
    version: int
    dirs: list[tuple[str, float]]
    names: list[Attrs]


class TextSink(Protocol):
    """Where `whole` puts the store's texts (name -> text): a dict, or a replica's WholeWrite."""
    def clear(self) -> None: ...
    def update(self, pairs: Iterable[tuple[str, str]], /) -> None: ...
    def pop(self, name: str, default: None = None, /) -> object: ...


def whole(version: Callable[[], int], page: Callable[[str], tuple[list[str], str | None]],
          changes: Callable[[int], Changes | None],
          texts: TextSink | None = None) -> tuple[int, dict[str, Manifest]]:
    """Every name's manifest at one version, read a page at a time (the store's lock is not
    held across a whole namespace: changes go on meanwhile) and decoded here, not by the store.
    A name changed while the pages were read is taken as the log says it is after them.
    `texts`, if given, takes each name's text as the store holds it, a page at a time (a
    replica keeps those as they are: encoding a million manifests again cost a node's start 13 s)."""
    while True:
        since, cursor = version(), ""
        manifests: dict[str, Manifest] = {}
        if texts is not None:
            texts.clear()
        with gc_pause.paused():  # the pages' rows are garbage the collector would walk the manifests for
            while True:
                rows, more = page(cursor)
                decoded = decode_many(rows, "the namespace store")
                manifests.update((m.name, m) for m in decoded)
                if texts is not None:
                    texts.update((m.name, text) for m, text in zip(decoded, rows))
                if more is None:
                    break
                cursor = more
        after = changes(since)
        if after is not None:  # else the log moved past `since` while reading: again
            break
    for name, m in after.names.items():
        if texts is not None:
            texts.pop(name, None)
        if m is None:
            manifests.pop(name, None)
        else:
            manifests[name] = m
    return after.version, manifests


class NamespaceStore:
    def __init__(self, engine: Engine, cluster_name: str, push: Push):
        self.engine, self.cluster_name, self.push = engine, cluster_name, push
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        with self._lock:
            return self.engine.version()

    # -- reading ----------------------------------------------------------------------------
    def manifest(self, name: str | None = None) -> Manifest | None:
        """The manifest of `name`; None: the dataset ingested last (what `connect()` reads)."""
        with self._lock:
            return self.engine.get(name) if name is not None else self.engine.latest_dataset()

    def manifests_of(self, names: list[str]) -> dict[str, Manifest]:
        """The manifests of those of `names` that exist."""
        with self._lock:
            return {n: m for n in names if (m := self.engine.get(n)) is not None}

    def manifests(self, texts: TextSink | None = None) -> tuple[int, dict[str, Manifest]]:
        """The whole namespace and its version: for a consumer that has nothing yet (`texts` as `whole`'s)."""
        return whole(lambda: self.version, self.page, self.changes, texts)

    def page(self, cursor: str) -> tuple[list[str], str | None]:
        """A page of the whole namespace, as texts (`Engine.page`); `whole` reads them all."""
        with self._lock:
            return self.engine.page(cursor)

    # More changed names than this and a consumer reloads by pages instead: one answer of a million
    # manifests (a node starting beside names written since its copy) outlasted the caller's timeout.
    CHANGES_MOST = 20_000

    def changes(self, since: int, manifests: bool = True) -> Changes | None:
        """The names changed after version `since`, as they are now (without `manifests`: each
        None, the names alone); None when the log no longer reaches back that far, or names more
        than CHANGES_MOST (the consumer reloads with `manifests()`, by pages)."""
        with self._lock:
            names = self.engine.changed_since(since)
            if names is None or len(names) > self.CHANGES_MOST:
                return None
            return Changes(since, self.engine.version(),
                           {n: self.engine.get(n) if manifests else None for n in names})

    def resolve(self, path: str) -> Resolved:
        """What `path` names: a name's manifest (a file, a dataset, or a path within a dataset:
        the dataset's), else a directory's time, else nothing."""
        with self._lock:
            version = self.engine.version()
            m = self.engine.get(path)
            if m is not None:
                return Resolved(version, m, None)
            mtime = self.engine.dir_mtime(path)
            if mtime is not None:
                return Resolved(version, None, mtime)
            top = self.engine.get(path.split("/")[0]) if "/" in path else None
            return Resolved(version, top if top is not None and top.kind == "dataset" else None, None)

    def listdir(self, path: str) -> Listing | None:
        """One directory (None: no such directory)."""
        with self._lock:
            if not self.engine.is_dir(path):
                return None
            dirs, names = self.engine.listdir(path)
            return Listing(self.engine.version(), dirs, names)

    def attrs(self, path: str) -> AttrsListing | None:
        """`listdir` with each name's attributes instead of its manifest (None: no such directory)."""
        with self._lock:
            if not self.engine.is_dir(path):
                return None
            dirs, names = self.engine.attrs(path)
            return AttrsListing(self.engine.version(), dirs, names)

    def count(self) -> int:
        with self._lock:
            return self.engine.count()

    def conflict(self, name: str, kind: str) -> str | None:
        """Why `name` cannot be stored as a `kind` (None if it can; one of the same name and kind
        is replaced)."""
        with self._lock:
            return self._conflict(name, kind)

    def _conflict(self, name: str, kind: str) -> str | None:
        old = self.engine.get(name)
        if old is not None:
            return None if old.kind == kind else f"{name!r} is already a {old.kind}"
        parts = name.split("/")
        top = self.engine.get(parts[0]) if len(parts) > 1 else None
        if top is not None and top.kind == "dataset":
            return f"{parts[0]!r} is a dataset"
        if kind == "dataset" and self.engine.is_dir(parts[0]):
            return f"{parts[0]!r} is already a directory of files"
        if self.engine.is_dir(name):
            return f"{name!r} is a directory"
        for k in range(1, len(parts)):
            above = "/".join(parts[:k])
            if self.engine.get(above) is not None:
                return f"{above!r} is a file"
        return None

    # -- writing ----------------------------------------------------------------------------
    def publish(self, manifest: Manifest, prefix: str) -> list[int]:
        """Make `manifest` the current generation of its name (its objects under `prefix`):
        stored, then pushed. Returns the nodes that took it."""
        return self.publish_batch([(manifest, prefix)])[1]

    def publish_batch(self, items: list[tuple[Manifest, str]], pending: bool = False) -> tuple[int, list[int]]:
        """Make every manifest of `items` (each with its objects' prefix) current, all in one
        transaction and one version, or none: a name that conflicts fails the whole batch, naming
        it. `pending`: the batch's pieces were recorded first (`pending_write`); a piece whose record
        is gone (its write outlived keep_old_s and was collected) fails the batch. Returns
        (the new version, the nodes that took it)."""
        with self._lock:
            with self.engine.transaction():
                self.engine.read_ahead([m.name for m, _ in items],
                                       [p for m, _ in items for c in m.chunks for p in m.pieces(c)] if pending else [])
                seen: set[str] = set()
                for m, prefix in items:
                    why = self._conflict(m.name, m.kind) or (f"{m.name!r} twice in one batch" if m.name in seen
                                                             else None)
                    if why:
                        raise FasterFSError(f"cannot store {m.kind} {m.name!r} in the namespace: {why}")
                    seen.add(m.name)
                    self.engine.replace_generations(m.name, stamp.now())
                    self.engine.add_generation(m.name, m.generation, prefix)
                    self.engine.put(m)
                    if pending:
                        pieces = [p for c in m.chunks for p in m.pieces(c)]
                        if self.engine.forget_retired(pieces) != len(pieces):
                            raise FasterFSError(f"the write of {m.name!r} took longer than ingest.keep_old_s and its "
                                                "objects were collected: store it again")
                changes = self._logged(list(seen))
        return changes.version, self.push("apply_changes", changes)

    def adopt(self, manifests: list[Manifest], generations: list[dict], retired: list[dict],
              version: int | None = None) -> None:
        """An earlier FasterFS's namespace (fasterfs.meta.legacy), or a storage host's copy at
        `version` (fasterfs.control.head_recovery), into this empty store, in one transaction: every name,
        the generations whose objects are not yet deleted, the pieces awaiting deletion. Not
        pushed: nodes that start later fetch it whole, or, at `version`, what changed since theirs."""
        with self._lock, self.engine.transaction():
            if self.engine.count():
                raise FasterFSError("the namespace store already holds names: nothing adopted")
            for g in generations:
                when = g["replaced"]
                self.engine.add_generation(g["dataset"], g["generation"], g["prefix"],
                                           when if isinstance(when, dict) or when is None else {"wall": when})
            for m in manifests:
                self.engine.put(m)
            for r in retired:
                when = r["retired"]
                self.engine.retire([(r["node"], r["key"], "")], when if isinstance(when, dict) else {"wall": when})
            if version is None:
                self._logged([m.name for m in manifests])
            else:
                self.engine.resume_log(version)

    def pending_write(self, pieces: list[tuple[int, str, str]]) -> None:
        """(node, key, name) a write is about to store: collected after keep_old_s unless a
        publish names them first (a write killed mid-way leaves no orphan for good)."""
        with self._lock, self.engine.transaction():
            self.engine.read_ahead([], [(node, key) for node, key, _ in pieces])
            self.engine.retire(pieces, stamp.now())

    def _logged(self, names: list[str]) -> Changes:
        """A new version for `names` (within the caller's transaction), and what it changed."""
        since = self.engine.version()
        version = self.engine.log(names)
        return Changes(since, version, {n: self.engine.get(n) for n in names})

    def update_chunks(self, name: str, generation: str, moves: Moves, refused: bool = False) -> list[int]:
        """`update_chunks_many` of one name."""
        return self.update_chunks_many([(name, generation, moves)], refused)[name]

    def update_chunks_many(self, items: list[tuple[str, str, Moves]], refused: bool = False) -> dict[str, list[int]]:
        """Repair moved pieces of these names' chunks: (name, generation, {chunk id: (nodes before,
        nodes now)}), in one transaction and one push (a node's loss repairs every file it held).
        Applied to the chunks still as the repair saw them, only in the generation it repaired (a
        re-ingest meanwhile wins; its orphans go with the generation); pushed like a new
        generation. A chunk another repair already put where this one did counts as applied.
        The pieces no reader of the current manifest reads are retired: those moved away, and
        what a repair that lost (or was `refused`: fenced off) wrote. Returns each name's chunk
        ids applied."""
        changes, out = None, {}  # type: Changes | None, dict[str, list[int]]
        with self._lock:
            with self.engine.transaction():
                self.engine.read_ahead([name for name, _, _ in items], [])
                changed, retired = [], set()
                for name, generation, moves in items:
                    out[name] = []
                    current = self.engine.get(name)
                    if current is None or current.generation != generation:
                        continue
                    chunks = list(current.chunks)
                    for cid, (before, after) in moves.items():
                        now = chunks[cid]
                        wrote = set(current.pieces(dataclasses.replace(now, nodes=list(after))))
                        if not refused and now.nodes == list(before):
                            chunks[cid] = dataclasses.replace(now, nodes=list(after))
                            retired |= {(n, k, name) for n, k in set(current.pieces(now)) - wrote}
                            out[name].append(cid)
                        elif not refused and now.nodes == list(after):
                            out[name].append(cid)  # the same move, made by another repair: it retired the old pieces
                        else:
                            retired |= {(n, k, name) for n, k in wrote - set(current.pieces(now))}
                    if chunks != current.chunks:
                        self.engine.put(dataclasses.replace(current, chunks=chunks, moved=True))
                        changed.append(name)
                if changed:
                    changes = self._logged(changed)
                self.engine.retire(sorted(retired), stamp.now())
        if changes is not None:
            self.push("apply_changes", changes)
        return out

    def spread(self, node_count: int, batch: int = 1000) -> list[str]:
        """Every name placed on fewer than `node_count` nodes is placed on them all from now on
        (nodes joined): its manifest's node count raised and marked moved, so repair moves what
        the new placement gives the new nodes, as it moves any piece home (rendezvous: about
        1/N of the pieces); until then every piece is read where it is. A batch of names per
        transaction and push; returns the names spread."""
        _, every = self.manifests()
        names = sorted(n for n, m in every.items() if m.node_count < node_count)
        for at in range(0, len(names), batch):
            changes = None
            with self._lock:
                with self.engine.transaction():
                    self.engine.read_ahead(names[at:at + batch], [])
                    changed = []
                    for name in names[at:at + batch]:
                        current = self.engine.get(name)
                        if current is not None and current.node_count < node_count:
                            self.engine.put(dataclasses.replace(current, node_count=node_count, moved=True))
                            changed.append(name)
                    if changed:
                        changes = self._logged(changed)
            if changes is not None:
                self.push("apply_changes", changes)
        return names

    def expired_pieces(self, keep_old_s: float) -> list[tuple[int, str]]:
        """Pieces retired more than keep_old_s ago, forgotten here: they can go. One its name's
        current manifest names again (moved back since, or a write's piece published) is only
        forgotten."""
        with self._lock:
            gone = [p for p in self.engine.retired() if stamp.age(p["retired"]) >= keep_old_s]
            if not gone:
                return []
            live: dict[str, set[tuple[int, str]]] = {}
            for p in gone:
                if p["name"] not in live:
                    m = self.engine.get(p["name"])
                    live[p["name"]] = {piece for c in m.chunks for piece in m.pieces(c)} if m else set()
            with self.engine.transaction():
                self.engine.forget_retired([(p["node"], p["key"]) for p in gone])
            return [(p["node"], p["key"]) for p in gone if (p["node"], p["key"]) not in live[p["name"]]]

    def remove(self, name: str) -> Manifest:
        """Take `name` out of the namespace. Its objects stay for readers that hold its manifest
        until ingest.keep_old_s has passed (`expired` then names them)."""
        with self._lock:
            manifest = self.engine.get(name)
            if manifest is None:
                raise FasterFSError(f"{name!r}: no such dataset or file in cluster {self.cluster_name!r}")
            with self.engine.transaction():
                self.engine.replace_generations(name, stamp.now())
                self.engine.delete(name)
                changes = self._logged([name])
        self.push("apply_changes", changes)
        return manifest

    def expired(self, keep_old_s: float) -> list[dict]:
        """Generations replaced (or removed) more than keep_old_s ago, forgotten here: their
        objects can go. Each as {dataset, generation, prefix}."""
        with self._lock:
            gone = [g for g in self.engine.replaced() if stamp.age(g["replaced"]) >= keep_old_s]
            with self.engine.transaction():
                for g in gone:
                    self.engine.forget_generation(g["dataset"], g["generation"])
            return gone

    def generations(self, dataset: str) -> list[str]:
        """The generations of `dataset` whose objects are kept: the current one and those not yet
        expired (readers may still hold their manifests)."""
        with self._lock:
            return self.engine.generations(dataset)
