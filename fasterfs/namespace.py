"""The namespace: every dataset and file of a cluster under its name, and the tree of paths
the CLI, the `fasterfs://` filesystem and the mount all show.

    <dataset>/chunks/chunk-00003.csv    each chunk of a LOBSTER dataset, as stored
    <dataset>/<dataset>.csv             the whole dataset: its CSV chunks concatenated
    team/research/book.parquet          a file stored with `fasterfs put`, at its path

Arrow datasets show their chunks only: Arrow IPC files do not concatenate into one.
Names are checked here, once, for every way in.
"""
from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass

from .errors import FasterFSError
from .manifest import Manifest

DATASET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")  # also an object key prefix: no escaping needed
RESERVED = {"files"}  # the object key prefix of files stored with `put`


def check_dataset_name(name: str) -> str:
    if not isinstance(name, str) or not DATASET_NAME.fullmatch(name) or name in RESERVED or len(name) > 100:
        raise FasterFSError(f"dataset name {name!r}: use letters, digits, '.', '_' and '-' (no '/', '..' or NUL, "
                            f"at most 100 characters, not {sorted(RESERVED)})")
    return name


def check_path(path: str) -> str:
    """A file's path in the namespace, normalised ('a/b.csv'); refuses '..', '.', NUL and
    control characters, and empty components."""
    if not isinstance(path, str):
        raise FasterFSError(f"path {path!r}: must be a string")
    clean = path.strip("/")
    parts = clean.split("/")
    if not clean or any(p in ("", ".", "..") or any(ord(ch) < 32 for ch in p) for p in parts) or len(clean) > 1000:
        raise FasterFSError(f"path {path!r}: give a relative path of non-empty components, without '.', '..', "
                            "NUL or control characters")
    return clean


@dataclass(frozen=True)
class Entry:
    """What a path names: a directory, or a file made of chunks of one manifest."""
    path: str
    is_dir: bool
    size: int = 0
    mtime: float = 0.0
    manifest: Manifest | None = None
    chunk_ids: tuple[int, ...] = ()  # the file's bytes are these chunks, concatenated
    starts: tuple[int, ...] = ()     # where each of them starts in the file

    @property
    def file_manifest(self) -> Manifest:
        """The manifest of a file's chunks (every file has one; a directory none)."""
        if self.manifest is None:
            raise IsADirectoryError(f"{self.path}: is a directory")
        return self.manifest

    def spans(self, offset: int, length: int) -> list[tuple[int, int, int]]:
        """(k, start, stop) within each chunk covering bytes [offset, offset+length): k is the
        chunk's place in the file (its id is chunk_ids[k])."""
        out = []
        end = min(offset + max(length, 0), self.size)
        k = max(bisect.bisect_right(self.starts, offset) - 1, 0)
        while k < len(self.chunk_ids) and self.starts[k] < end:
            i, pos = self.chunk_ids[k], self.starts[k]
            size = self.file_manifest.chunks[i].bytes
            if pos + size > offset:
                out.append((k, max(offset - pos, 0), min(end - pos, size)))
            k += 1
        return out


class Tree:
    """The paths of a set of manifests (name -> Manifest), built once per namespace version
    (`version`: the Registry's number for them, -1 if none)."""

    def __init__(self, manifests: dict[str, Manifest], version: int = -1):
        self.manifests, self.version = manifests, version
        self._children: dict[str, dict[str, Entry]] = {"": {}}
        self._entries: dict[str, Entry] = {"": Entry("", True)}
        for name, m in sorted(manifests.items()):
            if m.kind == "file":
                self._add(name, m, tuple(range(len(m.chunks))))
                continue
            self._add(f"{name}/chunks", m, None)
            for c in m.chunks:
                self._add(f"{name}/chunks/{c.key.rsplit('/', 1)[-1]}", m, (c.id,))
            if m.format == "csv":
                self._add(f"{name}/{name}.csv", m, tuple(range(len(m.chunks))))
        self._entries[""] = Entry("", True, mtime=max((m.created for m in manifests.values()), default=0.0))

    def _add(self, path: str, m: Manifest, chunk_ids: tuple[int, ...] | None) -> None:
        parts = path.split("/")
        for k in range(1, len(parts)):  # the directories on the way, dated by their newest content
            d = "/".join(parts[:k])
            old = self._entries.get(d)
            if old is None or old.mtime < m.created:
                self._entries[d] = Entry(d, True, mtime=max(m.created, old.mtime if old else 0))
            self._children.setdefault("/".join(parts[:k - 1]), {})[parts[k - 1]] = self._entries[d]
            self._children.setdefault(d, {})
        if chunk_ids is None:
            entry = Entry(path, True, mtime=m.created)
            self._children.setdefault(path, {})
        else:
            starts = tuple(itertools.accumulate((m.chunks[i].bytes for i in chunk_ids[:-1]), initial=0))
            entry = Entry(path, False, sum(m.chunks[i].bytes for i in chunk_ids), m.created, m, chunk_ids, starts)
        self._entries[path] = entry
        self._children.setdefault("/".join(parts[:-1]), {})[parts[-1]] = entry

    def lookup(self, path: str) -> Entry:
        entry = self._entries.get(path.strip("/"))
        if entry is None:
            raise FileNotFoundError(f"{path}: no such dataset, file or directory in the namespace")
        return entry

    def all_entries(self) -> list[Entry]:
        """Every directory and file, the root ("") first."""
        return list(self._entries.values())

    def listdir(self, path: str) -> list[Entry]:
        entry = self.lookup(path)
        if not entry.is_dir:
            raise NotADirectoryError(f"{path}: is a file")
        return [self._entries[f"{entry.path}/{n}" if entry.path else n] for n in sorted(self._children[entry.path])]

    def conflict(self, name: str, kind: str) -> str | None:
        """Why `name` cannot be added as a `kind` (None if it can; an entry of the same name
        and kind is replaced)."""
        old = self.manifests.get(name)
        if old is not None:
            return None if old.kind == kind else f"{name!r} is already a {old.kind}"
        top = name.split("/")[0]
        if top in self.manifests and self.manifests[top].kind == "dataset":
            return f"{top!r} is a dataset"
        if kind == "dataset" and top in self._entries:
            return f"{top!r} is already a directory of files"
        if name in self._entries:
            return f"{name!r} is a directory"
        parts = name.split("/")
        for k in range(1, len(parts)):
            above = self._entries.get("/".join(parts[:k]))
            if above is not None and not above.is_dir:
                return f"{above.path!r} is a file"
        return None
