"""NamespaceStore: the cluster's namespace as the head keeps it, one manifest per name.

Each name's current manifest is a file in the store's directory; every generation a name had
is in its history (a replaced one's objects stay until `ingest.keep_old_s` has passed, for
readers that still hold its manifest), and so are the pieces repair moved away. Every change
bumps the version (mounts and filesystems poll it) and is pushed to the StorageNodes through
`push(method, argument)` before it returns. The Registry actor holds one; tests build one on a
temporary directory.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from . import stamp
from .errors import FasterFSError
from .fsutil import atomic_write_json, read_json
from .manifest import Manifest

Push = Callable[[str, object], list[int]]  # (StorageNode method, its argument) -> the nodes that took it


class NamespaceStore:
    def __init__(self, directory: Path, cluster_name: str, push: Push):
        self.dir, self.cluster_name, self.push = Path(directory), cluster_name, push
        self.dir.mkdir(parents=True, exist_ok=True)
        self._entries = {m.name: m for m in map(Manifest.load, sorted(self.dir.glob("*.json")))}
        # from the clock, so a restarted Registry never repeats a number a reader saw before
        self.version = time.time_ns()
        # every generation a manifest named: {dataset, generation, prefix, replaced: time or None}
        self._history_file = self.dir.parent / "generations.json"
        self._history = read_json(self._history_file, "generation history") if self._history_file.exists() else []
        # pieces repair moved away from a node ({node, key, retired}): readers holding the manifest
        # from before the move may still read them, so they go only after ingest.keep_old_s
        self._retired_file = self.dir.parent / "retired-pieces.json"
        self._retired = read_json(self._retired_file, "retired pieces") if self._retired_file.exists() else []
        self._lock = threading.Lock()

    def manifest(self, name: str | None = None) -> Manifest | None:
        """The manifest of `name`; None: the dataset ingested last (what `connect()` reads)."""
        if name is not None:
            return self._entries.get(name)
        datasets = [m for m in self._entries.values() if m.kind == "dataset"]
        return max(datasets, key=lambda m: m.created) if datasets else None

    def manifests(self) -> tuple[int, dict[str, Manifest]]:
        """The whole namespace and its version."""
        return self.version, dict(self._entries)

    def _file(self, name: str) -> Path:
        return self.dir / (quote(name, safe="") + ".json")

    def _write(self, path: Path, obj: Manifest | list) -> None:
        """A file of the namespace written whole, or an error naming it (the head's disk full):
        the caller changes nothing in memory then."""
        try:
            obj.save(path) if isinstance(obj, Manifest) else atomic_write_json(path, obj)
        except OSError as e:
            raise FasterFSError(f"the head cannot write {path}: {e.strerror}; the namespace is unchanged") from None

    def _change(self, name: str, manifest: Manifest | None, history: list[dict]) -> None:
        """`name`'s manifest (None: removed) and the generation history, both on disk or neither:
        the manifest first, put back as it was if the history cannot follow (a history naming the
        current generation replaced would have its objects deleted)."""
        path, before = self._file(name), self._entries.get(name)
        if manifest is None:
            path.unlink(missing_ok=True)
        else:
            self._write(path, manifest)
        try:
            self._write(self._history_file, history)
        except FasterFSError:
            if before is not None:
                before.save(path)  # the file it replaced: its room is free again
            else:
                path.unlink(missing_ok=True)
            raise

    def _replaced(self, name: str) -> list[dict]:
        """The history with `name`'s current generation marked replaced now (a copy)."""
        when = stamp.now()
        return [dict(g, replaced=when) if g["dataset"] == name and g["replaced"] is None else g
                for g in self._history]

    def publish(self, manifest: Manifest, prefix: str) -> list[int]:
        """Make `manifest` the current generation of its name (its objects under `prefix`): kept
        on disk, then pushed. Returns the nodes that took it."""
        with self._lock:
            history = self._replaced(manifest.name) + [
                {"dataset": manifest.name, "generation": manifest.generation, "prefix": prefix, "replaced": None}]
            self._change(manifest.name, manifest, history)
            self._entries[manifest.name], self._history = manifest, history
            self.version += 1
            return self.push("set_manifest", manifest)

    def update_chunks(self, name: str, generation: str, moves: dict[int, tuple[list[int], list[int]]],
                      refused: bool = False) -> list[int]:
        """Repair moved pieces of `name`'s chunks: {chunk id: (nodes before, nodes now)}. Applied
        to the chunks still as the repair saw them, only in the generation it repaired (a
        re-ingest meanwhile wins; its orphans go with the generation); pushed like a new
        generation. A chunk another repair already put where this one did counts as applied.
        The pieces no reader of the current manifest reads are retired: those moved away, and
        what a repair that lost (or was `refused`: fenced off) wrote. Returns the chunk ids applied."""
        with self._lock:
            current = self._entries.get(name)
            if current is None or current.generation != generation:
                return []
            chunks, applied, retired = list(current.chunks), [], set()
            for cid, (before, after) in moves.items():
                now, wrote = chunks[cid], set(current.pieces(dataclasses.replace(chunks[cid], nodes=list(after))))
                if not refused and now.nodes == list(before):
                    chunks[cid] = dataclasses.replace(now, nodes=list(after))
                    retired |= set(current.pieces(now)) - wrote
                    applied.append(cid)
                elif not refused and now.nodes == list(after):
                    applied.append(cid)  # the same move, made by another repair: it retired the old pieces
                else:
                    retired |= wrote - set(current.pieces(now))
            if chunks != current.chunks:  # first: a retired piece not yet moved would be deleted
                manifest = dataclasses.replace(current, chunks=chunks)
                self._write(self._file(name), manifest)
                self._entries[name] = manifest
                self.version += 1
                self.push("set_manifest", manifest)
            known = {(p["node"], p["key"]) for p in self._retired}
            if retired - known:  # unwritten (the head's disk full): orphans, never a live piece lost
                at = stamp.now()
                new = self._retired + [{"node": node, "key": key, "retired": at}
                                       for node, key in sorted(retired - known)]
                self._write(self._retired_file, new)
                self._retired = new
            return applied

    def expired_pieces(self, keep_old_s: float) -> list[tuple[int, str]]:
        """Pieces retired more than keep_old_s ago, forgotten here: they can go. One a current
        manifest names again (moved back since) is only forgotten."""
        with self._lock:
            gone = [p for p in self._retired if stamp.age(p["retired"]) >= keep_old_s]
            if not gone:
                return []
            kept = [p for p in self._retired if p not in gone]
            self._write(self._retired_file, kept)
            self._retired = kept
            live = {piece for m in self._entries.values() for c in m.chunks for piece in m.pieces(c)}
            return [(p["node"], p["key"]) for p in gone if (p["node"], p["key"]) not in live]

    def remove(self, name: str) -> Manifest:
        """Take `name` out of the namespace. Its objects stay for readers that hold its manifest
        until ingest.keep_old_s has passed (`expired` then names them)."""
        with self._lock:
            manifest = self._entries.get(name)
            if manifest is None:
                raise FasterFSError(f"{name!r}: no such dataset or file in cluster {self.cluster_name!r}")
            history = self._replaced(name)
            self._change(name, None, history)
            del self._entries[name]
            self._history = history
            self.version += 1
            self.push("drop_manifest", name)
            return manifest

    def expired(self, keep_old_s: float) -> list[dict]:
        """Generations replaced (or removed) more than keep_old_s ago, forgotten here: their
        objects can go. Each as {dataset, generation, prefix}."""
        with self._lock:
            gone = [g for g in self._history if g["replaced"] is not None and stamp.age(g["replaced"]) >= keep_old_s]
            if gone:
                kept = [g for g in self._history if g not in gone]
                self._write(self._history_file, kept)
                self._history = kept
            return gone

    def generations(self, dataset: str) -> list[str]:
        """The generations of `dataset` whose objects are kept: the current one and those not yet
        expired (readers may still hold their manifests)."""
        with self._lock:
            return [g["generation"] for g in self._history if g["dataset"] == dataset]
