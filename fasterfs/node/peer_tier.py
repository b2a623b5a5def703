"""PeerTier: the nodes' caches as one more copy of the data.

Each node tells the others what its cache gained and lost since it last told them (the cache's
change log), so every node keeps the whole index, each peer's as a counting Bloom filter (~12
bytes a name, room included: a set of names took ~128), and a reader whose chunk's holders are
all down asks one node where a cached copy is (rarely, a peer named then has no copy: the reader
goes on). What crosses grows with the changes, not with what the caches hold: nothing at all
while they do not change. A node tells everything (a snapshot) only to a peer that asks: one that started, heard a
change that does not follow the last it has (a message lost, or the teller restarted: its
cache's epoch is new), or outgrew the filter it keeps for the teller.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..read.cache_entry import entry_name
from .counting_bloom import CountingBloom, digest


@dataclass(frozen=True)
class CacheNews:
    """What node `node`'s cache (incarnation `epoch`) holds at `version`: with `since` None, all of
    it (`added`); else what changed since version `since`."""
    node: int
    epoch: str
    since: int | None
    version: int
    added: frozenset[str]
    removed: frozenset[str] = frozenset()


class CacheIndex(Protocol):
    """What the peer tier needs of a cache (ChunkCache; the simulation's RecordingCache)."""

    @property
    def epoch(self) -> str: ...

    def snapshot(self) -> tuple[int, frozenset[str]]: ...

    def changes_since(self, version: int) -> tuple[int, list[str], list[str]] | None: ...

    def holds(self, name: str) -> bool: ...

    def read(self, key: str) -> bytes | str | None: ...


class PeerTier:
    """`tell(news, to)` sends this node's news to node `to`, or to every other node (None), fire
    and forget; `ask(node)` asks node `node` (every other node: None) to tell this one everything;
    `reconnect()` is called every `reconnect_s`, as a peer that came back is a new actor."""

    def __init__(self, node: int, cache: CacheIndex, tell: Callable[[CacheNews, int | None], None],
                 ask: Callable[[int | None], None] = lambda node: None,
                 reconnect: Callable[[], None] = lambda: None, reconnect_s: float = 30.0):
        self.node, self.cache, self.tell, self.ask = node, cache, tell, ask
        self.reconnect, self.reconnect_s = reconnect, reconnect_s
        self.peers: dict[int, tuple[str, int, CountingBloom]] = {}  # node -> its cache's epoch, version, names
        self._behind: set[int] = set()  # peers whose news did not follow their view: asked, not yet told all
        self._sent: int | None = None  # the version the others were told of
        self._reconnected: float | None = None

    def share(self, now: float | None = None) -> bool:
        """Tell the others what changed since they were last told (at the first call: ask them
        for theirs, and tell them everything); whether anything was told."""
        now = time.monotonic() if now is None else now
        if self._reconnected is None or now - self._reconnected >= self.reconnect_s:
            self.reconnect()
            if self._reconnected is None:
                self.ask(None)
            self._reconnected = now
        got = self.cache.changes_since(self._sent) if self._sent is not None else None
        if got is None:
            version, names = self.cache.snapshot()
            self.tell(CacheNews(self.node, self.cache.epoch, None, version, names), None)
        else:
            version, added, removed = got
            if version == self._sent:
                return False
            self.tell(CacheNews(self.node, self.cache.epoch, self._sent, version, frozenset(added),
                                frozenset(removed)), None)
        self._sent = version
        return True

    def tell_all(self, to: int) -> None:
        """Node `to` asked: everything this cache holds, to it alone."""
        version, names = self.cache.snapshot()
        self.tell(CacheNews(self.node, self.cache.epoch, None, version, names), to)

    def heard(self, news: CacheNews) -> None:
        if news.since is None:
            self.peers[news.node] = (news.epoch, news.version, CountingBloom.sized_for(news.added))
            self._behind.discard(news.node)
            return
        known = self.peers.get(news.node)
        if known is None or known[:2] != (news.epoch, news.since):  # missed some, or a new incarnation
            self._behind.add(news.node)
            self.ask(news.node)
            return
        names = known[2]
        was_full = names.full()
        names.remove(news.removed)
        names.add(news.added)
        self.peers[news.node] = (news.epoch, news.version, names)
        if names.full() and not was_full:  # grown past its filter's size: everything again, into a bigger one
            self.ask(news.node)

    def holders(self, key: str) -> list[int]:
        """The nodes whose caches hold `key`, this one first if it does."""
        name = entry_name(key)
        here = [self.node] if self.cache.holds(name) else []
        return here + sorted(n for n, (_, _, names) in self.peers.items() if name in names)

    def may_hold(self, name: str, nodes: Iterable[int]) -> list[int]:
        """Those of `nodes` whose caches may hold entry `name`: their views say so (or err so), or
        there is no view to trust (never told everything, or news missed since)."""
        hashed = digest(name)
        at: dict[int, list[int]] = {}  # a filter's size -> the name's counters in it
        out = []
        for n in nodes:
            view = self.peers.get(n)
            if view is None or n in self._behind or view[2].holds(hashed, at):
                out.append(n)
        return out

    def read(self, key: str) -> bytes | None:
        """`key`'s bytes from this node's cache (checked), None if not cached."""
        got = self.cache.read(key)
        return got if isinstance(got, bytes) else None
