"""What a node cache's peers see of it (fasterfs.node.peer_tier's CacheIndex): the entries
readable now, not those being written, and what they gained and lost by version (its ChangeLog).
ChunkCache is one: its owner's side keeps the state read here, under its lock."""
from __future__ import annotations

import itertools
import threading

from .change_log import ChangeLog


class ReadableEntries:
    """The readable side of ChunkCache, over its entry sizes, its fills under way and its log."""

    _lock: threading.Lock
    _sizes: dict[str, int]  # entry name -> bytes on disk (or reserved for a fill)
    _writing: set[str]      # fills under way: not readable yet
    changes: ChangeLog

    @property
    def epoch(self) -> str:
        return self.changes.epoch

    def snapshot(self) -> tuple[int, frozenset[str]]:
        """The version and the entries readable at it."""
        with self._lock:
            return self.changes.version, self._readable()

    def _readable(self) -> frozenset[str]:
        return frozenset(n for n in self._sizes if n not in self._writing)

    def changes_since(self, version: int) -> tuple[int, list[str], list[str]] | None:
        """(version now, entries readable since `version`, entries gone since), or None when the
        log no longer reaches back that far: take a `snapshot`."""
        with self._lock:
            return self.changes.since(version)

    def holds(self, name: str) -> bool:
        """Whether entry `name` is readable now (not being written); O(1)."""
        with self._lock:
            return name in self._sizes and name not in self._writing

    def names(self) -> frozenset[str]:
        """The entries readable now (not those being written)."""
        with self._lock:
            return self._readable()

    def newest(self, limit: int) -> list[str]:
        """At most `limit` readable entries, the latest admitted first (a cost of `limit`, not
        of the cache)."""
        with self._lock:
            return list(itertools.islice((n for n in reversed(self._sizes) if n not in self._writing), limit))
