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
MAX_COMPONENT = 255  # bytes of one name in a path (NAME_MAX)
MAX_PATH = 4095     # bytes of a whole path (PATH_MAX less its NUL)


def check_dataset_name(name: str) -> str:
    if not isinstance(name, str) or not DATASET_NAME.fullmatch(name) or name in RESERVED or len(name) > 100:
        raise FasterFSError(f"dataset name {name!r}: use letters, digits, '.', '_' and '-' (no '/', '..' or NUL, "
                            f"at most 100 characters, not {sorted(RESERVED)})")
    return name


def check_path(path: str) -> str:
    """A file's path in the namespace, normalised ('a/b.csv'): non-empty components of at most
    MAX_COMPONENT bytes, without '.', '..', NUL or control characters, valid UTF-8, at most
    MAX_PATH bytes in all (what a POSIX file system takes)."""
    if not isinstance(path, str):
        raise FasterFSError(f"path {path!r}: must be a string")
    clean = path.strip("/")
    parts = clean.split("/")
    if not clean or any(p in ("", ".", "..") or any(ord(ch) < 32 for ch in p) for p in parts):
        raise FasterFSError(f"path {path!r}: give a relative path of non-empty components, without '.', '..', "
                            "NUL or control characters")
    try:
        size = len(clean.encode())
    except UnicodeEncodeError:  # a name read from disk that is not UTF-8 (os.fsdecode's surrogates)
        raise FasterFSError(f"path {path!r}: not valid UTF-8; rename it") from None
    long = next((p for p in parts if len(p.encode()) > MAX_COMPONENT), None)
    if long is not None:
        raise FasterFSError(f"path {path!r}: its component {long[:40]!r}... is {len(long.encode())} bytes, "
                            f"over the {MAX_COMPONENT} a file name may have")
    if size > MAX_PATH:
        raise FasterFSError(f"path {path[:60]!r}...: {size} bytes, over the {MAX_PATH} a path may have")
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
    """The paths of a set of manifests (name -> Manifest) at a namespace version (`version`:
    the Registry's number for them, -1 if none), kept current by `apply`: a change costs the
    paths of the names it changes, not the tree's size."""

    def __init__(self, manifests: dict[str, Manifest], version: int = -1):
        self.manifests: dict[str, Manifest] = {}
        self.version = version
        self._children: dict[str, dict[str, Entry]] = {"": {}}
        self._entries: dict[str, Entry] = {"": Entry("", True)}
        self.apply(dict(sorted(manifests.items())), version)

    def apply(self, names: dict[str, Manifest | None], version: int) -> tuple[list[Entry], list[str]]:
        """Each name's manifest now (None: removed). Returns what changed for one who mirrors the
        tree: the entries added or changed (a directory whose time moved included), and the paths
        gone."""
        touched: set[str] = set()
        gone: set[str] = set()
        for name, m in names.items():
            old = self.manifests.pop(name, None)
            if old is not None:
                gone |= self._drop(name, old)
            if m is not None:
                self.manifests[name] = m
                touched |= self._add_manifest(name, m)
        self.version = version
        return [self._entries[p] for p in sorted(touched) if p in self._entries], sorted(gone - touched)

    @staticmethod
    def _paths(name: str, m: Manifest) -> list[tuple[str, tuple[int, ...] | None]]:
        """The paths a manifest shows, parents before children: (path, its chunk ids; None: a directory)."""
        if m.kind == "file":
            return [(name, tuple(range(len(m.chunks))))]
        out: list[tuple[str, tuple[int, ...] | None]] = [(name, None), (f"{name}/chunks", None)]
        out += [(f"{name}/chunks/{c.key.rsplit('/', 1)[-1]}", (c.id,)) for c in m.chunks]
        if m.format == "csv":
            out.append((f"{name}/{name}.csv", tuple(range(len(m.chunks)))))
        return out

    def _add_manifest(self, name: str, m: Manifest) -> set[str]:
        touched = {""} if m.created > self._entries[""].mtime else set()
        if touched:
            self._entries[""] = Entry("", True, mtime=m.created)
        for path, chunk_ids in self._paths(name, m):
            touched |= self._add(path, m, chunk_ids)
        return touched

    def _add(self, path: str, m: Manifest, chunk_ids: tuple[int, ...] | None) -> set[str]:
        touched = {path}
        parts = path.split("/")
        for k in range(1, len(parts)):  # the directories on the way, dated by their newest content
            d = "/".join(parts[:k])
            old = self._entries.get(d)
            if old is None or old.mtime < m.created:
                self._entries[d] = Entry(d, True, mtime=max(m.created, old.mtime if old else 0))
                self._children.setdefault("/".join(parts[:k - 1]), {})[parts[k - 1]] = self._entries[d]
                touched.add(d)
            self._children.setdefault(d, {})
        if chunk_ids is None:
            entry = Entry(path, True, mtime=m.created)
            self._children.setdefault(path, {})
        else:
            starts = tuple(itertools.accumulate((m.chunks[i].bytes for i in chunk_ids[:-1]), initial=0))
            entry = Entry(path, False, sum(m.chunks[i].bytes for i in chunk_ids), m.created, m, chunk_ids, starts)
        self._entries[path] = entry
        self._children.setdefault("/".join(parts[:-1]), {})[parts[-1]] = entry
        return touched

    def _drop(self, name: str, m: Manifest) -> set[str]:
        """The paths of `m` gone, and the directories above left empty."""
        gone = set()
        for path, _ in reversed(self._paths(name, m)):  # children before their directory
            self._entries.pop(path, None)
            self._children.pop(path, None)
            parent, _, leaf = path.rpartition("/")
            self._children.get(parent, {}).pop(leaf, None)
            gone.add(path)
        d = name.rpartition("/")[0]
        while d and not self._children.get(d):
            self._entries.pop(d, None)
            self._children.pop(d, None)
            parent, _, leaf = d.rpartition("/")
            self._children.get(parent, {}).pop(leaf, None)
            gone.add(d)
            d = parent
        return gone

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
