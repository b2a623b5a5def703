"""PeerTier: the nodes' caches as one more copy of the data.

Each node tells the others what its cache holds when that changes (and every `resend_s`, for a
peer that restarted and lost what it was told), so every node keeps the whole index and a reader
whose chunk's holders are all down asks one node where a cached copy is.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .cache import ChunkCache
from .cache_entry import entry_name


class PeerTier:
    """`tell(names)` sends this node's entry names to the other nodes (fire and forget);
    `reconnect()` is called before a resend, as a peer that came back is a new actor."""

    def __init__(self, node: int, cache: ChunkCache, tell: Callable[[frozenset[str]], None],
                 reconnect: Callable[[], None] = lambda: None, resend_s: float = 30.0):
        self.node, self.cache, self.tell, self.reconnect, self.resend_s = node, cache, tell, reconnect, resend_s
        self.peers: dict[int, frozenset[str]] = {}  # node -> entry names in its cache, as it last told
        self._sent: frozenset[str] | None = None
        self._last = float("-inf")

    def share(self, now: float | None = None) -> bool:
        """Tell the others what this cache holds if it changed or is due again; whether it told."""
        now = time.monotonic() if now is None else now
        names = self.cache.names()
        due = now - self._last >= self.resend_s
        if names == self._sent and not due:
            return False
        if due:
            self.reconnect()
        self.tell(names)
        self._sent, self._last = names, now
        return True

    def heard(self, node: int, names: frozenset[str]) -> None:
        self.peers[node] = names

    def holders(self, key: str) -> list[int]:
        """The nodes whose caches hold `key`, this one first if it does."""
        name = entry_name(key)
        here = [self.node] if self.cache.holds(name) else []
        return here + sorted(n for n, names in self.peers.items() if name in names)

    def read(self, key: str) -> bytes | None:
        """`key`'s bytes from this node's cache (checked), None if not cached."""
        got = self.cache.read(key)
        return got if isinstance(got, bytes) else None
