"""Reading the namespace by path and byte range: what the mount, `fasterfs://` and
`fasterfs cat` share.

Every chunk is read whole through the client (this host's cache first, else a holder's
MinIO), so the kernel counts one GET per chunk read exactly as for `read_chunk`, makes it
hot and fills the cache. An open file keeps the chunks it touched at hand: the mount's
requests and a file object's buffered reads of one chunk cost one chunk read, not dozens,
and a cached chunk is read from its entry file straight into the caller's buffer.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..control import registry
from ..core.errors import HeadUnreachable
from ..core.manifest import Manifest
from ..core.namespace import Entry, Tree
from ..meta import AttrsListing, Resolved
from .client import Client
from .head_link import HeadAway, HeadLink, without_head
from .open_file import CpuPressure, OpenFile
from .path_cache import MISSING, PathCache
from .read_session import ReadSession


class Namespace:
    """The cluster's namespace as this process sees it, checked against the Registry at most
    every `refresh_s`: a lookup asks the store what a path names and keeps the answer in a
    bounded PathCache until the store's log says the name changed; a listing asks for that
    directory alone: connecting and looking up cost the same at any namespace size. Manifests
    of unchanged names keep their clients."""

    def __init__(self, cfg, root=None, use_cache: bool = True, refresh_s: float = 1.0):
        self.cfg, self.use_cache, self.refresh_s = cfg, use_cache, refresh_s
        # the Registry, or this host's copy of the namespace while the head is away
        try:
            self.state = registry.find(cfg, root)
            self._creds = registry.fetch_credentials(self.state.name)
            self.head = HeadLink(self.state.name, self.state.root, float(cfg.namespace.head_timeout_s),
                                 float(cfg.namespace.head_retry_s))
        except HeadUnreachable as e:
            self.state, self._creds, self.head = without_head(cfg, root, e)
        # held while a change is applied: what a watcher sends under it is in version order
        self.lock = threading.RLock()
        self._checked = 0.0
        self.paths = PathCache(int(cfg.namespace.cached_paths))
        self.on_change: Callable[[int, dict[str, Manifest | None] | None], None] | None = None
        self.fetched = {"changes": 0, "names": 0, "resolved": 0, "listed": 0}  # what crossed the wire
        self._clients: dict[str, Client] = {}
        self._kept: dict[str, tuple] = {}  # path -> the cached copies its kept pages were read from
        self._session: ReadSession | None = None
        self.read_ahead = int(cfg.namespace.read_ahead_chunks)
        self._pool = ThreadPoolExecutor(self.read_ahead, "fasterfs-read-ahead") if self.read_ahead > 0 else None
        self._pressure = CpuPressure(float(cfg.namespace.shed_read_ahead_above))
        self.refresh(force=True)

    @property
    def version(self) -> int:
        return self.paths.version

    def refresh(self, force: bool = False) -> None:
        """Catch up with the store (at most every refresh_s unless `force`)."""
        with self.lock:
            now = time.monotonic()
            if not force and now - self._checked < self.refresh_s:
                return
            self._checked = now
            watched = self.on_change is not None
            try:
                changes = self.head.ask("changes", self.version, watched) if self.version >= 0 else None
                version = self.head.ask("namespace_version") if changes is None else changes.version
            except HeadAway:  # this host's copy: no log, so anything may have changed once it moved on
                changes, version = None, self.head.local().summary().version
            if version == self.version:
                return
            if changes is not None:
                self.fetched["changes"] += 1
                self.fetched["names"] += len(changes.names)
            names = None if changes is None else changes.names
            self.paths.changed(None if names is None else list(names), version)
            self._forget_clients(names)
            if self.on_change is not None:
                self.on_change(version, names)

    def _forget_clients(self, names: dict[str, Manifest | None] | None) -> None:
        """Clients of names replaced or removed (None: any name may have been; the next look at
        a client compares its generation)."""
        for n in list(self._clients) if names is None else names:
            c = self._clients.get(n)
            m = None if names is None else names.get(n)
            if c is not None and (names is None or m is None or c.manifest.generation != m.generation):
                del self._clients[n]

    def watch(self, on_change: Callable[[int, dict[str, Manifest | None] | None], None]) -> None:
        """`on_change(version, names)` hears the version now (names: None), then each change as it
        is applied, under `lock`: each name changed with its manifest now (None: removed); names
        None when the store's log no longer reaches back (anything may have changed)."""
        with self.lock:
            on_change(self.version, None)
            self.on_change = on_change

    def version_of(self, entry: Entry) -> int | None:
        """The namespace's version if `entry` is still what its path names at it, else None."""
        try:
            current = self.lookup(entry.path)
        except FileNotFoundError:
            return None
        with self.lock:  # the path cache is of this version while it still holds the entry
            return self.version if current == entry and self.paths.get(entry.path) is current else None

    def client(self, manifest: Manifest) -> Client:
        """The client of `manifest`'s name and generation (one per name, sharing connections)."""
        with self.lock:
            c = self._clients.get(manifest.name)
            if c is None or c.manifest.generation != manifest.generation:
                if self._session is None:
                    # no prefetch hints to the StorageNodes: a node fetching the same chunks as
                    # the reader halved a cold read here (the mount has the kernel's read-ahead;
                    # namespace.read_ahead_chunks loads chunks ahead in this process)
                    self._session = ReadSession(self.state, self._creds, self.cfg, self.use_cache, prefetch=False)
                c = Client(self._session, manifest)
                self._clients[manifest.name] = c
            return c

    def lookup(self, path: str) -> Entry:
        path = path.strip("/")
        self.refresh()
        entry = self.paths.get(path)
        if entry is MISSING:
            entry = self.paths.within(path)
        if entry is MISSING:
            entry = self._resolve(path)[0]
        if entry is None:
            raise FileNotFoundError(f"{path}: no such dataset, file or directory in the namespace")
        return entry

    def _resolve(self, path: str) -> tuple[Entry | None, Resolved]:
        """What the store says `path` names now (kept in the path cache), and the store's answer."""
        found = self.head.read("resolve", path)
        self.fetched["resolved"] += 1
        self._catch_up(found.version)
        m = found.manifest
        tree = Tree({m.name: m}, found.version) if m is not None else None
        entry = _entry_at(path, found, tree)
        self.paths.put(path, entry, found.version, m.name if m is not None else None,
                       tree if m is not None and m.kind == "dataset" else None)
        return entry, found

    def listed(self, path: str) -> AttrsListing | None:
        """Directory `path` of the store with its names' attributes (no manifest crosses); None
        if the store has no such directory (a dataset's are in its manifest: `listdir`)."""
        self.fetched["listed"] += 1
        listing = self.head.read("list_attrs", path)
        if listing is not None:
            self._catch_up(listing.version)
        return listing

    def _catch_up(self, version: int) -> None:
        """The store answered at `version`: if it moved on, this view catches up first, so that
        nothing handed out is newer than it (a watcher hears of the change before)."""
        if version > self.version:
            self.refresh(force=True)

    def is_dir(self, path: str) -> bool:
        """Whether the store has names under `path` now."""
        return self.head.read("resolve", path).dir_mtime is not None

    def listdir(self, path: str) -> list[Entry]:
        self.refresh()
        entry, found = self._resolve(path.strip("/"))  # a listing asks anew: it reads the store anyway
        if entry is None:
            raise FileNotFoundError(f"{path}: no such dataset, file or directory in the namespace")
        if not entry.is_dir:
            raise NotADirectoryError(f"{path}: is a file")
        if found.manifest is not None and found.manifest.kind == "dataset":  # within one: from its manifest
            return Tree({found.manifest.name: found.manifest}).listdir(entry.path)
        listing = self.head.read("listdir", entry.path)
        self.fetched["listed"] += 1
        if listing is not None:
            self._catch_up(listing.version)
        if listing is None:  # gone since the lookup
            raise FileNotFoundError(f"{path}: no such dataset, file or directory in the namespace")
        out = [Entry(d, True, mtime=t) for d, t in listing.dirs]
        out += [Tree({m.name: m}).lookup(m.name) for m in listing.names]
        return sorted(out, key=lambda e: e.path)

    def open(self, path: str) -> OpenFile:
        entry = self.lookup(path)
        if entry.is_dir:
            raise IsADirectoryError(f"{path}: is a directory")
        return self.open_entry(entry)

    def close(self) -> None:
        """Waits for reads ahead still running (their chunks are released as they finish)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def open_entry(self, entry: Entry) -> OpenFile:
        return OpenFile(entry, self.client(entry.file_manifest), self.read_ahead, self._pool, self._pressure)

    def cat(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        f = self.open(path)
        try:
            return f.read(start, (f.entry.size if end is None else end) - start)
        finally:
            f.close()

    def may_keep_pages(self, entry: Entry) -> bool:
        """Whether an open of `entry` may keep the kernel's pages of it: only when all its
        chunks are cached on this host and were, as the same copies, at the previous open of
        it here (else reads must reach the mount, to be counted, and never see old pages)."""
        copies = self._cached_locally(entry)
        with self.lock:
            keep = copies is not None and self._kept.get(entry.path) == copies
            if copies is None:
                self._kept.pop(entry.path, None)
            else:
                self._kept[entry.path] = copies
        return keep

    def was_cached_here(self, entry: Entry) -> bool:
        """Whether every chunk of `entry` was in a cache of this host at its last `may_keep_pages`."""
        with self.lock:
            return entry.path in self._kept

    def _cached_locally(self, entry: Entry) -> tuple | None:
        """If every chunk of the file is in a cache on this host, what identifies those
        copies (key, fill time) — the same tuple means the same bytes; else None."""
        client = self.client(entry.file_manifest)
        ident = []
        for i in entry.chunk_ids:
            got = client.open_cached(i, count=False)
            if got is None:
                return None
            os.close(got[0])
            ident.append((entry.file_manifest.chunks[i].key, got[1].fetched_ns))
        return tuple(ident)


def _entry_at(path: str, found: Resolved, tree: Tree | None) -> Entry | None:
    """The Entry of `path` from what the store said it names (`tree`: its manifest's)."""
    if tree is not None:
        try:
            return tree.lookup(path)
        except FileNotFoundError:  # a path within a dataset that the dataset lacks
            return None
    return Entry(path, True, mtime=found.dir_mtime) if found.dir_mtime is not None else None
