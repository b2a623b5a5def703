"""FillRouter: sends a fill to the node whose cache the chunk belongs in.

Where each node counts only what its own MinIO serves (kernel.watch=own), a stored file's chunks
are all cached at the file's home node, so the whole file is one backing file for the mount's
passthrough: a fill (hot, warm, prefetch, heal) of such a chunk asked of another node is passed
to the home node. Any other chunk is filled where it was asked.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .cache import ChunkCache
from .cache_filler import CacheFiller
from .node_index import NodeIndex


class FillRouter:
    """`index()` is the node's current NodeIndex; `peer(node)` its StorageNode actor or None;
    `wait(refs)` the answers of remote calls (ray.get)."""

    def __init__(self, node: int, cache: ChunkCache, filler: CacheFiller, index: Callable[[], NodeIndex],
                 files_at_home: bool, peer: Callable[[int], object | None], wait: Callable[[list], list]):
        self.node, self.cache, self.filler, self.index = node, cache, filler, index
        self.files_at_home, self.peer, self.wait = files_at_home, peer, wait

    def home_of(self, key: str) -> int:
        return self.index().home_of(key, self.node) if self.files_at_home else self.node

    def by_home(self, keys: Iterable[str]) -> tuple[list[str], dict[int, list[str]]]:
        """`keys` split into those filled here and those filled at another home, by home."""
        here: list[str] = []
        away: dict[int, list[str]] = {}
        for k in keys:
            home = self.home_of(k)
            if home == self.node:
                here.append(k)
            else:
                away.setdefault(home, []).append(k)
        return here, away

    def fill(self, key: str, reason: str) -> None:
        if key not in self.index().holders:
            return  # no chunk of the namespace (a job's scratch object): nothing to check its bytes against
        home = self.home_of(key)
        if home == self.node:
            self.filler.request(key, reason)
        elif (peer := self.peer(home)) is not None:
            peer.fill.remote(key, reason)  # type: ignore[attr-defined]  # a Ray actor handle

    def warm(self, keys: list[str]) -> int:
        """Fill these keys now, each at its home (waits); how many are cached afterwards."""
        here, away = self.by_home(keys)
        refs = [peer.cache_warm.remote(ks) for home, ks in away.items()  # type: ignore[attr-defined]
                if (peer := self.peer(home)) is not None]
        for f in [self.filler.request(k, "warm") for k in here]:
            if f is not None:
                f.result()
        return sum(self.cache.contains(k) for k in here) + sum(self.wait(refs))

    def prefetch(self, keys: list[str]) -> int:
        """Queue fills ahead of a sequential reader, each at its home (shed under load); how many
        were queued here."""
        here, away = self.by_home(keys)
        for home, ks in away.items():
            if (peer := self.peer(home)) is not None:
                peer.prefetch.remote(ks)  # type: ignore[attr-defined]
        return sum(self.filler.request(k, "prefetch") is not None for k in here)
