"""Peers: the other storage nodes as one node reaches them. The cluster's state, kept and looked
up again when a peer comes back (a new actor on a new Ray node) or a new generation may place
data on nodes that joined since; and the calls to their actors, fire and forget (a peer that is
down has no cache to serve or to drop)."""
from __future__ import annotations

from ..control import registry
from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState
from .invalidation import Write
from .peer_tier import CacheNews


class Peers:
    def __init__(self, index: int, cluster_name: str, nodes: NodeDirectory):
        self.index, self.cluster_name, self.nodes = index, cluster_name, nodes
        self._state: ClusterState | None = None

    def state(self, refresh: bool = False) -> ClusterState:
        if self._state is None or refresh:
            self._state = registry.find_in_ray(self.cluster_name)
        return self._state

    def reconnect(self) -> None:
        """A peer that came back is a new actor on a new Ray node."""
        self.nodes.forget()
        self.state(refresh=True)

    def others(self) -> list[int]:
        return [n.index for n in self.state().nodes if n.index != self.index]

    def actors(self, node: int | None) -> list:
        """Node `node`'s actor (none if it is not running), or every other node's."""
        if node is None:
            return self.nodes.all(self.others())
        return [a for a in [self.nodes.get(node)] if a is not None]

    def tell_writes(self, node: int, writes: list[Write], ages_s: list[float] | None = None) -> None:
        for peer in self.actors(node):
            peer.invalidate.remote(writes, ages_s)

    def tell_cache_news(self, news: CacheNews, to: int | None) -> None:
        for peer in self.actors(to):
            peer.peer_cache.remote(news)

    def ask_cache_news(self, node: int | None) -> None:
        for peer in self.actors(node):
            peer.tell_cache_index.remote(self.index)
