"""Reading the namespace by path and byte range: what the mount, `fasterfs://` and
`fasterfs cat` share.

Every chunk is read whole through the client (this host's cache first, else a holder's
MinIO), so the kernel counts one GET per chunk read exactly as for `read_chunk`, makes it
hot and fills the cache. An open file keeps the chunks it touched at hand: the mount's
requests and a file object's buffered reads of one chunk cost one chunk read, not dozens,
and a cached chunk is read from its entry file straight into the caller's buffer.
"""
from __future__ import annotations

import collections
import os
import threading
import time

from . import cache, registry
from .client import Client
from .errors import FasterFSError
from .manifest import Manifest
from .namespace import Entry, Tree


class Namespace:
    """The cluster's namespace as this process sees it, refreshed from the Registry at most
    every `refresh_s` (a new version re-reads it; manifests of unchanged names keep their
    clients)."""

    def __init__(self, cfg, root=None, use_cache: bool = True, refresh_s: float = 1.0):
        self.state = registry.find(cfg, root)
        self.cfg, self.use_cache, self.refresh_s = cfg, use_cache, refresh_s
        self._creds = registry.fetch_credentials(self.state.name)
        self._lock = threading.Lock()
        self._checked = 0.0
        self.version = -1
        self.tree = Tree({})
        self._clients: dict[str, Client] = {}
        self._base: Client | None = None
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> Tree:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < self.refresh_s:
                return self.tree
            self._checked = now
            if registry.namespace_version(self.state.name) == self.version:
                return self.tree
            self.version, manifests = registry.fetch_manifests(self.state.name)
            self.tree = Tree(manifests)
            self._clients = {n: c for n, c in self._clients.items()
                             if n in manifests and c.manifest.generation == manifests[n].generation}
            return self.tree

    def client(self, manifest: Manifest) -> Client:
        """The client of `manifest`'s name and generation (one per name, sharing connections)."""
        with self._lock:
            c = self._clients.get(manifest.name)
            if c is None or c.manifest.generation != manifest.generation:
                if self._base is None:
                    self._base = Client(self.state, self._creds, manifest, self.cfg, self.use_cache)
                    c = self._base
                else:
                    c = self._base.sibling(manifest)
                self._clients[manifest.name] = c
            return c

    def lookup(self, path: str) -> Entry:
        try:
            return self.refresh().lookup(path)
        except FileNotFoundError:  # perhaps written since the last look: ask now
            return self.refresh(force=True).lookup(path)

    def listdir(self, path: str) -> list[Entry]:
        self.lookup(path)
        return self.tree.listdir(path)

    def open(self, path: str) -> "OpenFile":
        entry = self.lookup(path)
        if entry.is_dir:
            raise IsADirectoryError(f"{path}: is a directory")
        return OpenFile(entry, self.client(entry.manifest))

    def cat(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        f = self.open(path)
        try:
            return f.read(start, (f.entry.size if end is None else end) - start)
        finally:
            f.close()

    def cached_locally(self, entry: Entry) -> tuple | None:
        """If every chunk of the file is in a cache on this host, what identifies those
        copies (key, fill time) — the same tuple means the same bytes; else None."""
        client = self.client(entry.manifest)
        ident = []
        for i in entry.chunk_ids:
            got = client.open_cached(i, count=False)
            if got is None:
                return None
            os.close(got[0])
            ident.append((entry.manifest.chunks[i].key, got[1].fetched_ns))
        return tuple(ident)


class OpenFile:
    """One open file: reads byte ranges. A chunk found in this host's cache is read from its
    entry file by descriptor (checked once, when the file first touches the chunk; an open
    file keeps the copy it started on); a chunk read from MinIO is read whole (one GET,
    counted by the kernel) and kept. A few chunks stay at hand for reads that jump about."""

    KEEP = 8  # chunks at hand per open file: entry descriptors, or at most 2 fetched chunks

    def __init__(self, entry: Entry, client: Client):
        self.entry, self.client = entry, client
        self._lock = threading.Lock()
        self._at_hand: collections.OrderedDict[int, int | bytes] = collections.OrderedDict()

    def read(self, offset: int, length: int) -> bytes:
        """The bytes at [offset, offset+length), copied once."""
        if offset < 0 or length < 0:
            raise FasterFSError(f"{self.entry.path}: bad range offset={offset} length={length}")
        parts = []
        for i, start, stop in self.entry.pieces(offset, length):
            src = self._chunk(i)
            if isinstance(src, int):
                parts.append(os.pread(src, stop - start, cache.HEADER.size + start))
                if len(parts[-1]) != stop - start:
                    raise FasterFSError(f"{self.entry.path}: cache entry of chunk {i} shorter than its header says")
            else:
                parts.append(src if (start, stop) == (0, len(src)) else src[start:stop])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_into(self, offset: int, buf: memoryview) -> int:
        """Fill `buf` with the bytes at `offset`; returns how many (fewer at the end of the file)."""
        if offset < 0:
            raise FasterFSError(f"{self.entry.path}: bad offset {offset}")
        pos = 0
        for i, start, stop in self.entry.pieces(offset, len(buf)):
            src = self._chunk(i)
            if isinstance(src, int):
                got = os.preadv(src, [buf[pos:pos + stop - start]], cache.HEADER.size + start)
                if got != stop - start:
                    raise FasterFSError(f"{self.entry.path}: cache entry of chunk {i} shorter than its header says")
            else:
                buf[pos:pos + stop - start] = memoryview(src)[start:stop]
            pos += stop - start
        return pos

    def _chunk(self, i: int) -> int | bytes:
        with self._lock:
            src = self._at_hand.get(i)
            if src is None:
                # cached here: a descriptor, checked once per open file; else the holder's
                # MinIO, one GET (counted by the kernel)
                got = self.client.open_cached(i)
                src = got[0] if got is not None else self.client.read_chunk(i)
                self._at_hand[i] = src
                while True:  # the least recently used go: beyond KEEP, or fetched bytes beyond 2
                    fetched = [k for k, v in self._at_hand.items() if isinstance(v, bytes)]
                    if len(self._at_hand) <= self.KEEP and len(fetched) <= 2:
                        break
                    self._release(self._at_hand.pop(fetched[0] if len(fetched) > 2 else next(iter(self._at_hand))))
            else:
                self._at_hand.move_to_end(i)
            return src

    @staticmethod
    def _release(src) -> None:
        if isinstance(src, int):
            os.close(src)

    def close(self) -> None:
        with self._lock:
            for src in self._at_hand.values():
                self._release(src)
            self._at_hand.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
