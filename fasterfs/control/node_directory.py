"""NodeDirectory: one cluster's StorageNode actors by node index, looked up once and remembered.

Every caller that talks to StorageNodes (peers, readers, the monitor, the CLI) goes through one
of these, so there is one lookup and one caching rule: a handle is kept until `forget`, which a
caller uses when a node may have come back as a new actor.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from ..core.errors import FasterFSError

# Ray concurrency group of the StorageNode calls that may take minutes (a survey at a million
# objects, a rebuild, a scrub): on threads of their own, so that status, stop and the namespace's
# pushes never wait behind them on the actor's one thread. Callers pick it:
# `.options(concurrency_group=LONG)`.
LONG = "long"
LONG_THREADS = 2

Lookup = Callable[[str, str], object | None]  # (actor name, Ray namespace) -> handle, None if not running


def actor_name(index: int) -> str:
    """The name node `index`'s StorageNode actor is registered under (in its cluster's Ray namespace)."""
    return f"storage-node-{index}"


def ray_lookup(name: str, namespace: str) -> object | None:
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


class NodeDirectory:
    def __init__(self, ray_namespace: str, lookup: Lookup = ray_lookup):
        self.ray_namespace = ray_namespace
        self._lookup = lookup
        self._handles: dict[int, object] = {}
        self._lock = threading.Lock()

    def get(self, index: int):
        """Node `index`'s StorageNode actor, None if it is not running."""
        with self._lock:
            handle = self._handles.get(index)
        if handle is None:
            handle = self._lookup(actor_name(index), self.ray_namespace)
            if handle is not None:
                with self._lock:
                    self._handles[index] = handle
        return handle

    def require(self, index: int):
        """Node `index`'s actor, or an error naming the node."""
        handle = self.get(index)
        if handle is None:
            raise FasterFSError(f"node {index}'s StorageNode is not running in Ray namespace {self.ray_namespace}")
        return handle

    def all(self, indices) -> list:
        """The running actors among `indices`, in their order."""
        return [h for i in indices if (h := self.get(i)) is not None]

    def forget(self, index: int | None = None) -> None:
        """Look node `index` (None: every node) up again next time: it may be a new actor."""
        with self._lock:
            if index is None:
                self._handles.clear()
            else:
                self._handles.pop(index, None)
