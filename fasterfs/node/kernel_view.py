"""KernelView: what a node's kernel programs saw, as the dashboard and `fasterfs kernel status`
show it: the counts and hot keys (each with whether it reached this node's cache) and this
node's row of the /kernel heatmap, its lookups made once per namespace change."""
from __future__ import annotations

from collections.abc import Callable

from ..meta.follower import Follower
from . import heatmap
from .cache import ChunkCache
from .node_index import NodeIndex
from .node_kernel import NodeKernel


class KernelView:
    def __init__(self, node_kernel: NodeKernel, index: Callable[[], NodeIndex], namespace: Follower,
                 cache: ChunkCache, recent: Callable[[], dict[str, int]], hot_threshold: int):
        self.node_kernel, self.kernel = node_kernel, node_kernel.programs
        self.index, self.namespace, self.cache, self.recent = index, namespace, cache, recent
        self.hot_threshold = hot_threshold
        self._heat: tuple[tuple[str, ...] | None, heatmap.Index] | None = None  # (its names, it)

    def forget(self) -> None:
        """The namespace changed: the heatmap's lookups are made again when next asked."""
        self._heat = None

    def status(self, top: int, **about) -> dict:
        index = self.index()
        snap: dict = dict(self.kernel.snapshot(top, resolve=index.resolve), **about)
        for t in snap["top_keys"]:  # did the hot chunk reach this node's cache?
            chunk = index.by_hash.get(int(t["key"], 16))
            t["cached"] = None if chunk is None else self.cache.contains(chunk.key)
        if self.node_kernel.sockops_skipped:
            snap["sockops"]["skipped"] = self.node_kernel.sockops_skipped
        return snap

    def heat_names(self, cells: int) -> tuple[int, list[tuple[str, int]] | None]:
        """(chunks in the namespace, the names this node would show in `cells` cells with their
        chunks; None: every name fits), heatmap.choose over its kernel's counts and its cache."""
        index, ns = self.index(), self.namespace

        def of_hash(h: int) -> str | None:
            c = index.by_hash.get(h)
            return None if c is None else index.names.get(c.key)

        def size(name: str) -> int:
            m = ns.some([name]).get(name)
            return len(m.chunks) if m is not None else cells + 1

        total = len(index.holders)
        return total, heatmap.choose(total, cells, self.kernel.all_counts() if total > cells else {},
                                     self.cache.newest(cells) if total > cells else [], of_hash,
                                     lambda entry: index.names.get(index.by_entry.get(entry, "")), size)

    def heat(self, names: list[str] | None = None) -> tuple[int, bytes]:
        """This node's row of the kernel heatmap over `names` (None: every name) and the layout it is in."""
        key, made = None if names is None else tuple(names), self._heat
        if made is None or made[0] != key:
            made = self._heat = key, heatmap.Index(self.namespace.snapshot() if names is None
                                                   else self.namespace.some(names))
        index = made[1]
        return index.id, index.cells(self.kernel.all_counts(), self.cache.holds, self.recent(), self.hot_threshold)
