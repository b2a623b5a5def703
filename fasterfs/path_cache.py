"""PathCache: what paths of the namespace name, as a reader found them, kept while the namespace
has not changed them. Bounded (least recently used go first); a change forgets only the paths of
the names it changed, the directories above them and every "no such path" (a new name may fill
one); a consumer too far behind the store's log forgets everything."""
from __future__ import annotations

import collections
import threading

from .namespace import Entry

MISSING = object()  # not cached (None, cached: no such path)


class PathCache:
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.version = -1  # the namespace version what is cached holds at
        self._found: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._missing: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._by_name: dict[str, set[str]] = {}  # a name -> the paths cached from its manifest
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._found) + len(self._missing)

    def get(self, path: str):
        """The Entry cached for `path`, None if it is cached as missing, else MISSING."""
        with self._lock:
            if path in self._found:
                self._found.move_to_end(path)
                return self._found[path]
            return None if path in self._missing else MISSING

    def put(self, path: str, entry: Entry | None, version: int) -> None:
        """What `path` named at `version` (kept only if that is still the cache's version)."""
        with self._lock:
            if version != self.version:
                return
            if entry is None:
                self._missing[path] = None
                if len(self._missing) > self.max_entries:
                    self._missing.popitem(last=False)
                return
            self._found[path] = entry
            if entry.manifest is not None:
                self._by_name.setdefault(entry.manifest.name, set()).add(path)
            while len(self._found) > self.max_entries:
                old, gone = self._found.popitem(last=False)
                if gone.manifest is not None:
                    paths = self._by_name.get(gone.manifest.name, set())
                    paths.discard(old)
                    if not paths:
                        self._by_name.pop(gone.manifest.name, None)

    def changed(self, names: list[str] | None, version: int) -> None:
        """The namespace is at `version`, `names` changed since the cache's (None: unknown)."""
        with self._lock:
            self._missing.clear()
            if names is None:
                self._found.clear()
                self._by_name.clear()
            for name in names or ():
                for path in self._by_name.pop(name, ()):
                    self._found.pop(path, None)
                parts = name.split("/")
                for k in range(len(parts)):  # the directories above it, the root first
                    self._found.pop("/".join(parts[:k]), None)
                self._found.pop(name, None)
            self.version = version
