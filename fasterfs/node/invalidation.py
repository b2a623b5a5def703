"""Invalidation: what a node does when its kernel sees a request for a chunk, or a peer tells it
of a write.

HOT (a chunk crossed the kernel's threshold) becomes a fill. STALE and COMMITTED (a write's
request line, its completion) drop the cached copy, reset the key's count so it can become hot
again, and queue the write for the other nodes, whose caches may hold a copy too: `send` passes
what piled up to them in one call per peer. A node told of a write by a peer marks the key stale
in its own kernel map (readers check that mark on every hit) and drops its copy. WriteRouter
picks the peers: those whose caches may hold the key, not every node.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from ..bpf.backend import KernelBackend
from ..bpf.events import key_hash
from ..control import s3
from ..read.cache_entry import entry_name
from . import heatmap
from .cache import ChunkCache
from .fill_sources import ShardedGetter
from .node_index import NodeIndex
from .peer_tier import CacheNews, PeerTier

log = logging.getLogger("fasterfs.node.invalidation")

Write = tuple[int, str | None]  # (hash of /bucket/key, the key; None: a write nobody could name)
UNNAMED: Write = (0, None)     # told where the writes a peer must hear can no longer be named
NOBODY: frozenset[int] = frozenset()
RECENT_MAX = 100_000
GONE = "(none: deleted)"  # what revalidate finds where every holder answers that the object is gone


class Invalidations:
    """`kernel` is either kernel backend; `filler` is what cancels queued fills of a key that
    changed; `fill(key, reason)` asks for a fill at the chunk's home; `tell(batch, seen)` sends
    writes, each last seen at `seen` (time.monotonic), to the other nodes (fire and forget: a dead
    peer has no cache to serve); `suspect(from_peer)`
    has every entry checked before it is served again (MarkKeeper); `verify(keys)` checks those
    keys' entries against their holders' ETags, dropping what changed or cannot be vouched for."""

    def __init__(self, node: int, bucket: str, kernel: KernelBackend, cache: ChunkCache, filler, watch_any: bool,
                 fill: Callable[[str, str], None], tell: Callable[[list[Write], list[float]], None],
                 suspect: Callable[[bool], None], verify: Callable[[list[str]], object] = lambda keys: None):
        self.node, self.bucket, self.kernel, self.cache, self.filler = node, bucket, kernel, cache, filler
        self.watch_any, self.fill, self.tell, self.suspect, self.verify = watch_any, fill, tell, suspect, verify
        self.last: float | None = None  # when this host last learnt of a write (own kernel or a peer's)
        self.recent: dict[str, int] = {}  # entry -> heatmap.EVICTED or STALE, oldest first (bounded)
        self._outbox: dict[Write, float] = {}  # write -> when last seen (time.monotonic)
        self._lock = threading.Lock()
        self._ready = threading.Event()

    def on_kernel_event(self, event: dict, index: NodeIndex) -> None:
        if event["path"] == f"/{self.bucket}" and event["method"] == "POST":
            self.suspect(False)  # DeleteObjects: its keys are in the body; the kernel marked the bucket suspect
            return
        elif event["path"].startswith(f"/{self.bucket}/") and event["key"] == key_hash(event["path"]):
            key = event["path"][len(self.bucket) + 2:]
        else:
            return  # another bucket, or a path cut at the kernel's bound: not one of ours to resolve
        hashed = event["key"]
        shard = index.shards.get(key) if key is not None else None
        if shard is not None:  # a shard of an erasure-coded chunk: the chunk is what is cached
            key = shard.chunk_key
            if event["type"] == "HOT":
                # Where readers' GETs leave this host (kernel.watch=any) the chunk is this host's
                # readers' own; where each node counts only requests to its MinIO, the chunk's
                # first holder fills it for every reader of the machine.
                if self.watch_any or index.holders[key][0] == self.node:
                    self.fill(key, "hot")
                return
            hashed = key_hash(f"/{self.bucket}/{key}")
            self.kernel.marks.mark_stale(hashed)  # readers check the chunk's mark; the kernel marked the shard
        if event["type"] == "HOT":
            if key is not None:
                self.fill(key, "hot")
            return
        self.forget(hashed, key)
        self.queue((hashed, key))

    def queue(self, write: Write) -> None:
        """For the other nodes, at the next `send`."""
        with self._lock:
            self._outbox[write] = time.monotonic()  # its last event: a commit comes after the request line
        self._ready.set()

    def forget(self, hashed: int, key: str) -> None:
        """Drop `key` and let it become hot anew."""
        if self.cache.contains(key):
            self.note(entry_name(key), heatmap.STALE)
        self.filler.mark_stale(key)
        self.kernel.reset_key(hashed)
        self.last = time.time()

    def invalidate(self, batch: list[Write], ages_s: list[float] | None = None) -> None:
        """Other hosts' kernels saw these written (key None: a write they could not name, so
        every entry here is checked): mark them stale here too and drop the copies. With
        `ages_s` (told after this node's cache gained them: WriteRouter.heard) each write was
        seen at most that long ago: an entry fetched since is newer and kept; one fetched before
        may be older or newer (the time the word took on the way is not known), so it is checked
        against its holders' ETag (`verify`) rather than dropped."""
        now_ns = time.monotonic_ns()  # the clock of fills' fetched_ns; only durations cross hosts
        check = []
        for i, (hashed, key) in enumerate(batch):
            if key is None:
                self.suspect(True)
                self.last = time.time()
                continue
            if ages_s is not None:
                if (self.cache.fetched_ns(key) or now_ns) < now_ns - int(ages_s[i] * 1e9):
                    check.append(key)
                continue
            self.kernel.marks.mark_stale(hashed)
            self.forget(hashed, key)
        if check:
            self.verify(check)
            self.last = time.time()

    def send(self, wait_s: float = 1.0) -> int:
        """Tell the other nodes every write queued since the last call, in one batch (an ingest of
        many objects would otherwise be a call per object per peer). Returns how many went."""
        if not self._ready.wait(wait_s):
            return 0
        with self._lock:
            outbox, self._outbox = self._outbox, {}
            self._ready.clear()
        self.tell(list(outbox), list(outbox.values()))
        return len(outbox)

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                self.send()
            except Exception:
                log.exception("telling the other nodes of writes failed")

    def on_evict(self, entry: str, index: NodeIndex) -> None:
        """The cache let `entry` go: its chunk may become hot, and be cached, again."""
        self.note(entry, heatmap.EVICTED)
        key = index.by_entry.get(entry)
        for obj in index.object_keys(key) if key else ():
            self.kernel.reset_key(key_hash(f"/{self.bucket}/{obj}"))

    def mark_replaced(self, old, new) -> None:
        """Mark a replaced or removed generation's chunks written, before the write that replaced
        them returns: whoever still holds the old view (the mount's hot files, opened without
        asking anyone) finds them stale at its next open and looks again."""
        if old is not None and (new is None or new.generation != old.generation):
            for c in old.chunks:
                self.kernel.marks.mark_stale(key_hash(f"/{old.bucket}/{c.key}"))

    def clear(self) -> int:
        """Empty the cache and start a new kernel epoch, so every key can become hot again.
        Fills still queued from the old epoch's heat go too, or they would land afterwards."""
        self.filler.cancel_all()
        removed = self.cache.clear()
        self.kernel.new_epoch()
        self.recent.clear()
        return removed

    def note(self, entry: str, state: int) -> None:
        self.recent.pop(entry, None)
        self.recent[entry] = state
        while len(self.recent) > RECENT_MAX:  # oldest first: dicts keep insertion order
            del self.recent[next(iter(self.recent))]


def revalidate(cache: ChunkCache, index: NodeIndex, bucket: str, endpoints: dict[int, str], creds,
               held_by: set[int] | None = None, keep_unverified: bool = True,
               only: list[str] | None = None) -> int:
    """Drop cached entries whose object changed or is gone from every holder while no
    invalidation could reach this node: it was not running, or (`held_by`: only entries of chunks
    those nodes hold) those nodes were cut off from it and are back (or the directory holds
    another cluster's entries under this cluster's keys), or a write went unnamed (MarkKeeper).
    The chunks' holders (`endpoints`: node -> its MinIO) are asked in batches where that is
    cheaper: the entries of one generation (one key prefix) whose objects list in fewer pages than
    they are entries come from one listing of that prefix on their first holder; the others, and
    what a listing lacks, by a HEAD each, holder after holder. An entry no holder can vouch for is
    kept (it may be the only copy readable) and logged, unless keep_unverified=False. Returns how
    many were dropped. `only`: just the entries of these keys (a peer's late word of writes)."""
    etags = cache.etags(None if only is None else [entry_name(k) for k in only])
    if held_by is not None:
        etags = {name: etag for name, etag in etags.items()
                 if set(index.holders.get(index.by_entry.get(name, ""), ())) & held_by}
    if not etags:
        return 0
    if only is not None:  # a few keys: clients of their holders alone
        holders = {n for k in only for n in index.holders.get(k, ())}
        endpoints = {n: e for n, e in endpoints.items() if n in holders}
    clients = {n: s3.client(endpoint, creds, 1.0, 5.0) for n, endpoint in endpoints.items()}
    listed = _listed_etags(clients, bucket, index, [index.by_entry.get(n) for n in etags])

    def current(name: str) -> tuple[str | None, str | None]:
        key = index.by_entry.get(name)
        if key is None:
            return None, None
        if key in index.coded:  # filled from shards, each checked against the current manifest
            return key, ShardedGetter.etag(index.coded[key].chunk)
        if key in listed:
            return key, listed[key]
        holders, missing = index.holders.get(key, []), 0
        for node in holders:
            try:
                return key, clients[node].head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
            except Exception as e:  # holder down, gone from the cluster, or without the object: ask the next
                missing += s3.is_missing(e)
        return key, GONE if holders and missing == len(holders) else None

    try:
        with ThreadPoolExecutor(8) as pool:
            found = dict(zip(etags, pool.map(current, etags)))
    finally:
        for c in clients.values():
            c.close()
    changed = [name for name, (key, now) in found.items() if now is not None and now != etags[name]]
    unverified = [name for name, (key, now) in found.items() if key and now is None]
    for name in changed:
        log.warning("cache entry for %s was filled from ETag %s; its holders now have %s: written while no "
                    "invalidation reached this node, or another cluster's entry; dropped",
                    found[name][0], etags[name], found[name][1])
    if unverified:
        log.warning("%d cache entries %s unverified (no holder answered), e.g. %s", len(unverified),
                    "kept" if keep_unverified else "dropped", found[unverified[0]][0])
        if not keep_unverified:
            changed += unverified
    return cache.drop_changed(changed)


def _listed_etags(clients: dict, bucket: str, index: NodeIndex, keys: list[str | None]) -> dict[str, str]:
    """ETags of `keys` (replicated chunks) read from listings of their generations' prefixes on
    each prefix's first holder, in key order, stopping past the last key wanted and after as many
    pages as the prefix has keys wanted (never more requests than a HEAD each); what the listing
    did not reach or lacks is left out (the HEADs ask)."""
    wanted: dict[tuple[int, str], list[str]] = {}
    for key in keys:
        if key is None or key in index.coded or not index.holders.get(key):
            continue
        wanted.setdefault((index.holders[key][0], key.rpartition("/")[0] + "/"), []).append(key)
    out: dict[str, str] = {}
    for (node, prefix), group in wanted.items():
        if len(group) < 2:
            continue
        last, want = max(group), set(group)
        try:
            pages = clients[node].get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for n, page in enumerate(pages, 1):
                contents = page.get("Contents", [])
                out.update((o["Key"], o["ETag"].strip('"')) for o in contents if o["Key"] in want)
                if n >= len(group) or not contents or contents[-1]["Key"] >= last:
                    break
        except Exception:  # the holder is down: the HEADs ask the next one
            continue
    return out


class WriteRouter:
    """Which peers hear of which writes: a write goes to the nodes whose caches may hold its key,
    as this node's views of its peers' caches say (PeerTier: no name held is missed, a few not
    held are found), and a write nobody could name to every node. An ingest of new keys tells
    nobody; before, every write went to every node (12,700 a second applied by each node at 128
    nodes writing 100 a second each, simulated).

    A view hears of a fill up to a share (~1 s) after it landed, so a fill that began before the
    write may be in no view when the write is routed. Each write is kept `window_s` (as long as
    the kernels keep their stale marks), and news that a peer gained a key written meanwhile has
    that peer told of the write then, once, with how long ago this node's kernel last saw it: the
    peer keeps a copy fetched since (in its own clock: only the duration crosses hosts) and checks
    one fetched before against the holders' ETag (the tell's time on the way is unknown, so it may
    be newer), so a dataset read right after its ingest is not filled twice. Past `max_kept` writes the
    oldest are let go, and for `window_s` a peer gaining anything is told, once, a write nobody
    could name (what it fetched before hearing it is checked, entry by entry)."""

    def __init__(self, peers: PeerTier, window_s: float, max_kept: int = RECENT_MAX):
        self.peers, self.window_s, self.max_kept = peers, window_s, max_kept
        # entry -> when routed, the write, the nodes told of it (most: none, shared)
        self._kept: OrderedDict[str, tuple[float, Write, frozenset[int]]] = OrderedDict()
        self._forgot_at = float("-inf")  # when writes were last let go unexpired
        self._unnamed_told: dict[int, float] = {}  # node -> when it was last told a write nobody could name
        self._lock = threading.Lock()  # a route and a hearing see each other's whole effect
        self.counters = {"writes": 0, "told": 0, "told_late": 0, "to_every_node": 0}

    def route(self, batch: list[Write], nodes: Iterable[int], seen: list[float]) -> dict[int, list[Write]]:
        """The writes each of `nodes` must be told of (a node absent: none); `seen`: when this
        node's kernel last saw each (time.monotonic), what a late tell's age counts from."""
        nodes = list(nodes)
        out: dict[int, list[Write]] = {}
        with self._lock:
            self._expire(max(seen, default=float("-inf")))
            for write, when in zip(batch, seen):
                if write[1] is None:
                    told = nodes
                    self.counters["to_every_node"] += 1
                else:
                    name = entry_name(write[1])
                    told = self.peers.may_hold(name, nodes)
                    self._keep(name, write, told, when)
                for n in told:
                    out.setdefault(n, []).append(write)
            self.counters["writes"] += len(batch)
            self.counters["told"] += sum(map(len, out.values()))
        return out

    def heard(self, news: CacheNews, now: float | None = None) -> list[tuple[Write, float]]:
        """Takes a peer's news into its view; returns the writes that peer must be told of now,
        each with how long ago this node's kernel last saw it (so at least since it was written):
        those of keys it gained since and was not told of."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.peers.heard(news)
            self._expire(now)
            if not news.added:
                return []
            late = []
            if now - self._forgot_at < self.window_s and self._unnamed_told.get(news.node, -1.0) < self._forgot_at:
                late.append((UNNAMED, 0.0))  # once: what it fetched before hearing it is checked
                self._unnamed_told[news.node] = now
            few, many = sorted((news.added, self._kept.keys()), key=len)
            for name in few:
                if name in many:
                    when, write, told = self._kept[name]
                    if news.node not in told:
                        self._kept[name] = (when, write, told | {news.node})  # its place kept
                        late.append((write, now - when))
            self.counters["told_late"] += len(late)
        return late

    def _keep(self, name: str, write: Write, told: list[int], seen: float) -> None:
        self._kept.pop(name, None)  # to the end: kept in the order seen
        self._kept[name] = (seen, write, frozenset(told) if told else NOBODY)  # a write again: told anew
        while len(self._kept) > self.max_kept:
            self._kept.popitem(last=False)
            self._forgot_at = seen

    def _expire(self, now: float) -> None:
        while self._kept and next(iter(self._kept.values()))[0] < now - self.window_s:
            self._kept.popitem(last=False)
