"""Follower: a copy of the whole namespace kept current from the store's version log, for
those that need every name at hand (a StorageNode's index, a mount's tree). It takes pushed
changes in order, asks for what it missed when one arrives out of order (or when it polls),
and reloads everything only when the log no longer reaches back to its version. Given a
`replica` (a StorageNode's), every change is written to it before anyone hears of it: a push
is acknowledged only once the host holds it durably."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import gc_pause
from ..core.manifest import Manifest
from .store import Changes, TextSink

if TYPE_CHECKING:
    from .replica import Replica

Change = tuple[str, Manifest | None, Manifest | None]  # (name, before, now)


class Follower:
    def __init__(self, fetch_changes: Callable[[int], Changes | None],
                 fetch_all: Callable[[TextSink | None], tuple[int, dict[str, Manifest]]],
                 on_change: Callable[[list[Change], bool], None] = lambda changed, whole: None,
                 replica: Replica | None = None):
        self.fetch_changes, self.fetch_all, self.on_change, self.replica = fetch_changes, fetch_all, on_change, replica
        self.version, self.manifests = -1, {}  # type: int, dict[str, Manifest]
        self.reloads = 0  # whole namespaces fetched (the first included)
        self._lock = threading.RLock()

    def seed(self, version: int, manifests: dict[str, Manifest]) -> None:
        """Start from a copy at hand (a StorageNode's own Replica, read from its disk): the next
        catch_up asks for the changes since `version`, not for the whole namespace."""
        with self._lock, gc_pause.paused(freeze=True):
            self.version, self.manifests = version, manifests
            self.on_change([(n, None, m) for n, m in manifests.items()], True)

    def snapshot(self) -> dict[str, Manifest]:
        """Every name's manifest now, a copy (the copy here changes under its lock)."""
        with self._lock:
            return dict(self.manifests)

    def some(self, names: list[str]) -> dict[str, Manifest]:
        """The manifests of these names that exist now (a copy of those alone)."""
        with self._lock:
            return {n: self.manifests[n] for n in names if n in self.manifests}

    def apply(self, changes: Changes) -> None:
        """Changes pushed by the store: applied if they follow this copy's version, skipped if
        already seen, else the gap is fetched first."""
        with self._lock:
            if changes.version <= self.version:
                return
            if changes.since != self.version:
                self.catch_up()
                return
            self._apply(changes.names, changes.version)

    def catch_up(self) -> bool:
        """Whatever changed since this copy's version; True if anything did."""
        with self._lock:
            changes = self.fetch_changes(self.version) if self.version >= 0 else None
            if changes is None:
                # from the first page to the index built on them; the pages' texts into the replica
                with gc_pause.paused(freeze=True), \
                        self.replica.whole() if self.replica else contextlib.nullcontext() as texts:
                    version, manifests = self.fetch_all(texts)
                    self.reloads += 1
                    names = {n: manifests.get(n) for n in set(manifests) | set(self.manifests)}
                    return self._apply(names, version, whole=True, texts=texts)
            return self._apply(changes.names, changes.version)

    def _apply(self, names: dict[str, Manifest | None], version: int, whole: bool = False,
               texts=None) -> bool:
        """`whole`: every name was fetched (on_change hears it even if nothing changed: a
        consumer holds its own state to the whole namespace then); `texts`: the replica's rows
        written already (Replica.whole)."""
        if self.replica is not None:
            self.replica.keep(names, version, whole, texts)
        with gc_pause.paused():  # a whole namespace is a million changes at once (catch_up freezes it)
            changed = []
            for name, now in names.items():
                before = self.manifests.get(name)
                if now is None:
                    self.manifests.pop(name, None)
                else:
                    self.manifests[name] = now
                if before is not now and before != now:
                    changed.append((name, before, now))
            self.version = version
            if changed or whole:
                self.on_change(changed, whole)
            return bool(changed)
