"""Reading the namespace by path and byte range: what the mount, `fasterfs://` and
`fasterfs cat` share.

Every chunk is read whole through the client (this host's cache first, else a holder's
MinIO), so the kernel counts one GET per chunk read exactly as for `read_chunk`, makes it
hot and fills the cache. An open file keeps the chunk it read last: the mount's 128 KiB
requests and a file object's buffered reads of one chunk cost one chunk read, not dozens.
"""
from __future__ import annotations

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
        return f.read(start, (f.entry.size if end is None else end) - start)

    def cached_locally(self, entry: Entry) -> tuple | None:
        """If every chunk of the file is in a cache on this host, what identifies those
        copies (key, fill time) — the same tuple means the same bytes; else None."""
        client = self.client(entry.manifest)
        ident = []
        for i in entry.chunk_ids:
            for node in client._caches[i]:
                header = cache.entry_header(client.cache_path(node, i), client._stale_mark(node, i))
                if header is not None:
                    ident.append((entry.manifest.chunks[i].key, header.fetched_ns))
                    break
            else:
                return None
        return tuple(ident)


class OpenFile:
    """One open file: reads byte ranges, keeping the last chunk it read."""

    def __init__(self, entry: Entry, client: Client):
        self.entry, self.client = entry, client
        self._lock = threading.Lock()
        self._held: tuple[int, bytes] | None = None

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise FasterFSError(f"{self.entry.path}: bad range offset={offset} length={length}")
        out = []
        for i, start, stop in self.entry.pieces(offset, length):
            out.append(memoryview(self._chunk(i))[start:stop])
        return b"".join(out)

    def _chunk(self, i: int) -> bytes:
        with self._lock:
            if self._held is None or self._held[0] != i:
                self._held = (i, self.client.read_chunk(i))
            return self._held[1]
