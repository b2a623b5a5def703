"""PathCache: what paths of the namespace name, as a reader found them, kept while the namespace
has not changed them. Bounded (least recently used go first); a change forgets only the paths of
the names it changed, the directories above them and every "no such path" (a new name may fill
one); a consumer too far behind the store's log forgets everything. A dataset's tree is kept
while any of its paths is: its other paths are then found without asking the store (a dataset of
10,000 chunk files is fetched once, not once per chunk file opened)."""
from __future__ import annotations

import collections
import threading

from ..core.namespace import Entry, Tree

MISSING = object()  # not cached (None, cached: no such path)


class PathCache:
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.version = -1  # the namespace version what is cached holds at
        self._found: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._missing: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._by_name: dict[str, set[str]] = {}  # a name -> the paths cached from its manifest
        self._names: dict[str, str] = {}  # ... and back
        self._trees: dict[str, Tree] = {}  # a dataset's name -> its tree, while paths of it are cached
        self._lock = threading.Lock()

    def get(self, path: str):
        """The Entry cached for `path`, None if it is cached as missing, else MISSING."""
        with self._lock:
            if path in self._found:
                self._found.move_to_end(path)
                return self._found[path]
            return None if path in self._missing else MISSING

    def put(self, path: str, entry: Entry | None, version: int, name: str | None = None,
            tree: Tree | None = None) -> None:
        """What `path` named at `version` (kept only if that is still the cache's version); `name`:
        the namespace name whose manifest it was found in (a file, or a dataset and every path in
        it, its directories too), forgotten when that name changes; `tree`: that dataset's."""
        with self._lock:
            if version != self.version:
                return
            if tree is not None and name is not None and entry is not None:
                self._trees[name] = tree
            if entry is None:
                self._missing[path] = None
                if len(self._missing) > self.max_entries:
                    self._missing.popitem(last=False)
                return
            self._keep(path, entry, name)

    def _keep(self, path: str, entry: Entry, name: str | None) -> None:
        self._found[path] = entry
        if name is not None:
            self._by_name.setdefault(name, set()).add(path)
            self._names[path] = name
        while len(self._found) > self.max_entries:
            old, _ = self._found.popitem(last=False)
            owner = self._names.pop(old, None)
            paths = self._by_name.get(owner, set()) if owner is not None else set()
            paths.discard(old)
            if owner is not None and not paths:
                self._by_name.pop(owner, None)
                self._trees.pop(owner, None)

    def within(self, path: str):
        """What `path` names in a dataset whose tree is held (an Entry, kept as `put` keeps it; None:
        the dataset has no such path), else MISSING (ask the store)."""
        with self._lock:
            parts = path.split("/")
            for k in range(len(parts) - 1, 0, -1):
                name = "/".join(parts[:k])
                tree = self._trees.get(name)
                if tree is None:
                    continue
                try:
                    entry = tree.lookup(path)
                except FileNotFoundError:
                    return None  # not cached as missing: a later put of the name may fill it
                self._keep(path, entry, name)
                return entry
            return MISSING

    def changed(self, names: list[str] | None, version: int) -> None:
        """The namespace is at `version`, `names` changed since the cache's (None: unknown)."""
        with self._lock:
            self._missing.clear()
            if names is None:
                self._found.clear()
                self._by_name.clear()
                self._names.clear()
                self._trees.clear()
            for name in names or ():
                self._trees.pop(name, None)
                for path in self._by_name.pop(name, ()):
                    self._found.pop(path, None)
                    self._names.pop(path, None)
                parts = name.split("/")
                for k in range(len(parts)):  # the directories above it, the root first
                    self._found.pop("/".join(parts[:k]), None)
                self._found.pop(name, None)
            self.version = version
