"""`fasterfs://`: the namespace as a read-only fsspec filesystem (registered through the
`fsspec.specs` entry point), so pandas, pyarrow, polars and dask read it unchanged:

    pandas.read_csv("fasterfs://AAPL_2012-06-21_L1/chunks/chunk-00003.csv", header=None)

Reads go through the client's path (this host's cache, else a holder's MinIO).
Options (storage_options=...): root, overrides (Hydra overrides naming the cluster, e.g.
["cluster.ray_address=10.0.0.5:6379"]), use_cache.
"""
from __future__ import annotations

import errno
import hashlib
from datetime import UTC, datetime

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from ..core import config
from ..core.namespace import Entry
from .reader import Namespace


class FasterFileSystem(AbstractFileSystem):
    protocol = "fasterfs"
    root_marker = ""

    def __init__(self, root=None, overrides=(), use_cache: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.ns = Namespace(config.load(list(overrides)), root, use_cache)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("fasterfs://"):
            path = path[len("fasterfs://"):]
        return path.strip("/")

    @staticmethod
    def _details(entry: Entry) -> dict:
        m = entry.manifest
        return {"name": entry.path, "size": entry.size, "type": "directory" if entry.is_dir else "file",
                "mtime": entry.mtime, "created": m.created if m else entry.mtime, "chunks": len(entry.chunk_ids),
                "generation": m.generation if m else None}

    # What tools ask beyond ls/info/cat (DuckDB's register_filesystem, fsspec's caches):
    # times from the manifest; identity and checksum from what the file is made of.
    def modified(self, path):
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=UTC)

    def created(self, path):
        return datetime.fromtimestamp(self.info(path)["created"], tz=UTC)

    def invalidate_cache(self, path=None):
        """Forget the namespace this filesystem holds (it is refreshed every
        namespace.refresh_s otherwise): the next call sees every put and rm so far."""
        self.ns.refresh(force=True)

    def ukey(self, path):
        """Changes whenever the file's bytes may have: a new generation of its manifest."""
        entry = self._lookup(self._strip_protocol(path))
        generation = entry.manifest.generation if entry.manifest else ""
        return hashlib.sha256(f"{entry.path}\0{generation}".encode()).hexdigest()

    def checksum(self, path):
        """Of the bytes alone: the xxh3 of each chunk the file is made of (the manifest's), in order."""
        entry = self._lookup(self._strip_protocol(path))
        if entry.is_dir:
            raise IsADirectoryError(path)
        digest = hashlib.sha256(b"".join(entry.manifest.chunks[i].xxh3.to_bytes(8, "little") for i in entry.chunk_ids))
        return int.from_bytes(digest.digest()[:8], "little")

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        entry = self._lookup(path)
        entries = self.ns.listdir(path) if entry.is_dir else [entry]
        return [self._details(e) for e in entries] if detail else [e.path for e in entries]

    def info(self, path, **kwargs):
        return self._details(self._lookup(self._strip_protocol(path)))

    def _lookup(self, path: str) -> Entry:
        return self.ns.lookup(path)  # FileNotFoundError names the path

    def cat_file(self, path, start=None, end=None, **kwargs):
        entry = self._lookup(self._strip_protocol(path))
        if entry.is_dir:
            raise IsADirectoryError(path)
        size = entry.size
        start = 0 if start is None else (max(size + start, 0) if start < 0 else start)
        end = size if end is None else (max(size + end, 0) if end < 0 else min(end, size))
        return self.ns.open(entry.path).read(start, max(end - start, 0))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise OSError(errno.EROFS, f"fasterfs:// is read-only (mode {mode!r})", path)
        return FasterFile(self, self._strip_protocol(path), mode, block_size or 4 * 1024 * 1024,
                          cache_options=cache_options, **kwargs)

    # Read-only: every way to change it names the CLI command that does.
    def _read_only(self, path, *args, **kwargs):
        raise OSError(errno.EROFS, "fasterfs:// is read-only: change the namespace with `fasterfs put` / "
                                   "`fasterfs rm`", path)

    _rm = rm_file = rmdir = mkdir = makedirs = touch = pipe_file = put_file = cp_file = mv = _read_only


class FasterFile(AbstractBufferedFile):
    def __init__(self, fs: FasterFileSystem, path: str, mode: str, block_size: int, **kwargs):
        self._file = fs.ns.open(path)
        super().__init__(fs, path, mode, block_size, size=self._file.entry.size, **kwargs)

    def _fetch_range(self, start, end):
        return self._file.read(start, end - start)
