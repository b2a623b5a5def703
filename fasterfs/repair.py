"""Repair: every chunk back to full redundancy, from what survives.

A survey lists every node's bucket once and holds it against the namespace: a piece (a
replica, or an erasure-coded shard) is missing when its node does not answer or does not
have it. Repair rebuilds each degraded chunk through the reader's own verified read path
(any good replica; any ec.data good shards), re-encodes it and writes the missing pieces:
on their own node when it answers (a host back empty, an object the scrub found bad), else
on a live node holding nothing of the chunk. A piece living away from its home (where
ingest's placement put it) moves back once the home answers again, so a host that returns
empty is refilled. The Registry applies new locations only to chunks still as the repair
saw them; moved-away pieces are deleted ingest.keep_old_s later (readers may hold the
manifest naming them).

A chunk with fewer good pieces than it needs is lost: named, and left as it is (its
surviving pieces may yet be joined by a host that comes back).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import urllib3

from . import erasure, ingest, registry, s3
from .errors import FasterFSError
from .manifest import ChunkInfo, Manifest
from .placement import chunk_homes, node_name, score
from .state import ClusterState

log = logging.getLogger("fasterfs.repair")


UPDATE_BATCH = 1000  # names whose moved pieces one namespace transaction records (as put -r's batches)


def needed(m: Manifest) -> int:
    """Good pieces that rebuild a chunk."""
    return m.ec_data if m.layout == "ec" else 1


def homes(m: Manifest, state: ClusterState, load_slack: float) -> list[list[int]]:
    width = m.ec_data + m.ec_parity if m.layout == "ec" else m.replicas
    nodes = [n.index for n in state.nodes[:m.node_count]]
    if width > len(nodes):  # written on a larger cluster than runs now: no home for every piece
        return [list(c.nodes) for c in m.chunks]
    return chunk_homes(m.name, len(m), nodes, width, load_slack)


def _per_node(state: ClusterState, creds, timeout: float,
              ask: Callable[[int, s3.MarkedGetter], set[str] | None]) -> dict[int, set[str] | None]:
    """`ask(node, its MinIO)` of every node at once; None for a node whose MinIO does not answer."""
    def one(node) -> set[str] | None:
        getter = s3.MarkedGetter(node.endpoint, creds, state.settings.fill_mark,  # the kernel skips it
                                 urllib3.Timeout(connect=timeout, read=30.0))
        try:
            return ask(node.index, getter)
        except Exception:
            return None
        finally:
            getter.close()
    with ThreadPoolExecutor(8) as pool:
        return dict(zip((n.index for n in state.nodes), pool.map(one, state.nodes)))


def listings(state: ClusterState, creds, timeout: float = 2.0) -> dict[int, set[str] | None]:
    """Every node's object keys; None for a node whose MinIO does not answer."""
    return _per_node(state, creds, timeout, lambda node, lister: {key for key, _ in lister.list(state.settings.bucket)})


def holdings(state: ClusterState, creds, pieces: Iterable[tuple[int, str]],
             timeout: float = 2.0) -> dict[int, set[str] | None]:
    """Of `pieces` (node, key), those each node holds, asked one HEAD each (a listing's shape,
    of just these keys); None for a node whose MinIO does not answer. A node asked for
    nothing is probed."""
    wanted: dict[int, list[str]] = {n.index: [] for n in state.nodes}
    for node, key in pieces:
        if node in wanted:  # a node no longer in the cluster is down to _plan, as in a survey
            wanted[node].append(key)
    bucket = state.settings.bucket

    def held(node: int, asker: s3.MarkedGetter) -> set[str] | None:
        if not wanted[node]:
            return set() if asker.answers(bucket, timeout) else None
        with ThreadPoolExecutor(8) as pool:
            return {k for k, there in zip(wanted[node], pool.map(lambda k: asker.holds(bucket, k), wanted[node]))
                    if there}
    return _per_node(state, creds, timeout, held)


def check(state: ClusterState, creds, manifests: list[Manifest], load_slack: float) -> Health:
    """The redundancy of just `manifests` (a change of the namespace): what a change costs is
    what it wrote, not what the cluster holds."""
    pieces = [p for m in manifests for c in m.chunks for p in m.pieces(c)]
    return _plan(manifests, state, holdings(state, creds, pieces), load_slack)[0]


def answering(state: ClusterState, getter: Callable[[int], s3.MarkedGetter], timeout: float = 1.0) -> set[int]:
    """The nodes whose MinIO answers now (one cheap request each), through `getter(node)`'s
    kept-alive connection (a new connection at every probe is one more MinIO connection for
    SOCK_OPS to count)."""
    bucket = state.settings.bucket
    with ThreadPoolExecutor(8) as pool:
        return {n.index for n, ok in zip(state.nodes, pool.map(lambda n: getter(n.index).answers(bucket, timeout),
                                                                state.nodes)) if ok}


@dataclass
class Health:
    """The namespace's redundancy as one survey found it."""
    chunks: int = 0
    degraded: dict[str, list[int]] = field(default_factory=dict)  # name -> chunks with a piece missing
    lost: dict[str, list[int]] = field(default_factory=dict)      # name -> chunks too few pieces rebuild
    misplaced: int = 0      # pieces away from a home that answers (a returned host, to refill)
    nodes_down: list[int] = field(default_factory=list)
    time: float = field(default_factory=time.time)

    @property
    def degraded_count(self) -> int:
        return sum(map(len, self.degraded.values()))

    @property
    def lost_count(self) -> int:
        return sum(map(len, self.lost.values()))

    def lost_names(self) -> str:
        return "; ".join(f"{name}: chunks {', '.join(map(str, ids))}" for name, ids in self.lost.items())

    def summary(self) -> str:
        down = f"; nodes down: {', '.join(map(str, self.nodes_down))}" if self.nodes_down else ""
        lost = f"; LOST {self.lost_count} ({self.lost_names()})" if self.lost else ""
        return (f"{self.chunks} chunks: {self.chunks - self.degraded_count} at full redundancy, "
                f"{self.degraded_count} degraded{lost}{down}")

    def to_dict(self) -> dict:
        return {"chunks": self.chunks, "degraded": self.degraded_count, "lost": self.lost_count,
                "lost_chunks": self.lost, "misplaced": self.misplaced, "nodes_down": self.nodes_down,
                "time": self.time, "summary": self.summary()}


@dataclass
class _Plan:
    manifest: Manifest
    chunk: ChunkInfo
    missing: list[int]      # slots to rewrite
    moves: list[int]        # slots to move home
    home: list[int]


def _plan(manifests: Iterable[Manifest], state: ClusterState, listing: dict, load_slack: float,
          waiting: Set[int] = frozenset(), bad: Set[tuple[int, str]] = frozenset(),
          only: dict[str, set[int]] | None = None) -> tuple[Health, list[_Plan]]:
    """What is missing or away from home. Pieces on a `waiting` node whose listing failed
    (down, not for long; or a listing that failed on a node up again) are left alone: rebuilt
    elsewhere, they would only move back. `bad` pieces (node, key) count as missing (the
    scrub found them wrong)."""
    alive = {n for n, keys in listing.items() if keys is not None}
    health = Health(nodes_down=sorted(set(listing) - alive))
    plans = []
    stored_on: set[int] = set()
    for m in manifests:
        home = homes(m, state, load_slack)
        for c in m.chunks:
            if only is not None and c.id not in only.get(m.name, ()):
                continue
            health.chunks += 1
            slots = m.pieces(c)
            present = [s for s, (node, key) in enumerate(slots)
                       if node in alive and key in listing[node] and (node, key) not in bad]
            missing = [s for s in range(len(slots))
                       if s not in present and (slots[s][0] in alive or slots[s][0] not in waiting)]
            moves = [s for s in present if home[c.id][s] != c.nodes[s] and home[c.id][s] in alive
                     and home[c.id][s] not in c.nodes]
            health.misplaced += len(moves)
            if len(present) < len(slots):
                health.degraded.setdefault(m.name, []).append(c.id)
            if len(present) < needed(m):
                health.lost.setdefault(m.name, []).append(c.id)
            elif missing or moves:
                plans.append(_Plan(m, c, missing, moves, home[c.id]))
            stored_on.update(c.nodes)
    # a node the data was stored on that is not part of the cluster now: down, as a machine that is
    health.nodes_down = sorted(set(health.nodes_down) | (stored_on - {n.index for n in state.nodes}))
    return health, plans


Names = Callable[[], dict[str, Manifest]]  # every name's manifest, current as of the call


def _registrys(state: ClusterState) -> Names:
    return lambda: registry.fetch_manifests(state.name)[1]


def _look(state: ClusterState, creds, plan: Callable[[dict, dict], tuple[Health, list[_Plan]]], names: Names):
    """The nodes' listings and the manifests (`names()`: a StorageNode's own copy, caught up,
    else fetched whole from the Registry), planned by `plan(listing, manifests)`, so that a
    piece another writer moves meanwhile (a concurrent repair, a refill) is not taken for
    missing. Listed before the manifests are fetched, so a piece retired since still counts;
    when that finds anything to do, listed again after, so a piece written since counts too,
    and a node is up or down by its later answer (a host back from a power cut mid-survey);
    a piece still missing from both is asked of its node."""
    first = listings(state, creds)
    manifests = names()
    health, plans = plan(first, manifests)
    if not plans and not health.nodes_down:
        return first, manifests, health, plans
    again = listings(state, creds)
    merged = {n: None if keys is None else keys | (first.get(n) or set()) for n, keys in again.items()}
    # a listing may come from MinIO's metacache, a little behind: what it misses is asked by HEAD
    _, plans = plan(merged, manifests)
    unlisted = [piece for p in plans for s, piece in enumerate(p.manifest.pieces(p.chunk))
                if s in p.missing and merged.get(piece[0]) is not None]
    for n, keys in holdings(state, creds, unlisted).items() if unlisted else ():
        listed = merged.get(n)
        if keys and listed is not None:
            merged[n] = listed | keys
    return (merged, manifests, *plan(merged, manifests))


def survey(state: ClusterState, creds, load_slack: float, names: Names | None = None) -> Health:
    return _look(state, creds, lambda listing, ms: _plan(ms.values(), state, listing, load_slack),
                 names or _registrys(state))[2]


class Throttle:
    """At most `rate` bytes per second, over the whole run (0: unbounded)."""

    def __init__(self, rate: float):
        self.rate, self.next, self.lock = rate, time.monotonic(), threading.Lock()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - now - n / self.rate
        if wait > 0:
            time.sleep(wait)


@dataclass
class Outcome:
    health: Health                      # as found, before repairing
    repaired: int = 0                   # chunks back to full redundancy
    pieces_written: int = 0
    moved: int = 0                      # pieces moved back home
    bytes_written: int = 0
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)   # chunks a repair could not finish, and why

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.seconds if self.seconds else 0.0


def run(cfg, state: ClusterState, creds, progress: Callable[[int, int], None] | None = None,
        waiting: Set[int] = frozenset(), bad: Set[tuple[int, str]] = frozenset(),
        only: dict[str, set[int]] | None = None, fence: tuple[int, int] | None = None,
        names: Names | None = None) -> Outcome:
    """Repair the namespace (or the chunks in `only`: {name: ids}); see the module's doc.
    `fence`: (node, epoch) of the repair lease this repair runs under (the automatic leader's)."""
    from .client import Client
    from .read_session import ReadSession

    started = time.monotonic()
    ingest.collect_garbage(cfg, state, {n.index: s3.client(n.endpoint, creds) for n in state.nodes})
    listing, manifests, health, plans = _look(state, creds, lambda listing, ms: _plan(
        ms.values(), state, listing, cfg.placement.load_slack, waiting, bad, only), names or _registrys(state))
    alive = {n for n, keys in listing.items() if keys is not None}
    out = Outcome(health)
    if not plans:
        out.seconds = time.monotonic() - started
        return out
    clients = {n.index: s3.client(n.endpoint, creds, cfg.client.connect_timeout_s, cfg.client.read_timeout_s)
               for n in state.nodes}
    session = ReadSession(state, creds, cfg, use_cache=False, prefetch=False, mark=state.settings.fill_mark)
    session.avoid(set(listing) - alive)
    readers = {}
    load = collections.Counter(n for m in manifests.values() for c in m.chunks for n in c.nodes)
    throttle = Throttle(cfg.repair.mb_per_s * 1e6)
    lock = threading.Lock()
    moves: dict[str, dict[int, tuple[list[int], list[int]]]] = collections.defaultdict(dict)

    def target(plan: _Plan, slot: int, nodes: list[int]) -> int | None:
        """Where slot's piece goes: its own node if it answers, then its home, then the live
        node with the fewest pieces that holds nothing of this chunk."""
        others = set(nodes[:slot] + nodes[slot + 1:])
        if plan.chunk.nodes[slot] in alive and plan.chunk.nodes[slot] not in others:
            return plan.chunk.nodes[slot]
        free = [n for n in sorted(alive) if n not in others]
        if plan.home[slot] in free:
            return plan.home[slot]
        with lock:
            best = min(free, key=lambda n: (load[n], -score(node_name(n), plan.chunk.key)), default=None)
            if best is not None:
                load[best] += 1
        return best

    def repair_chunk(plan: _Plan) -> None:
        m, c = plan.manifest, plan.chunk
        nodes = list(c.nodes)
        slots = plan.missing + [s for s in plan.moves if s not in plan.missing]
        for slot in slots:  # where each piece goes, before anything is read
            node = plan.home[slot] if slot in plan.moves else target(plan, slot, nodes)
            if node is None:
                raise FasterFSError(f"no live node without a piece of this chunk for piece {slot}: its {len(nodes)} "
                                    f"pieces need {len(nodes)} distinct nodes, {len(alive)} answer")
            nodes[slot] = node
        with lock:
            if m.name not in readers:
                readers[m.name] = Client(session, m)
        data = readers[m.name].read_chunk(c.id)  # verified: checksums per piece and of the chunk
        throttle.take(len(data))
        bodies = erasure.encode(data, m.ec_data, m.ec_parity) if m.layout == "ec" else [data] * len(c.nodes)
        sums = c.shards if m.layout == "ec" else [c.xxh3] * len(c.nodes)
        wrote = 0
        for slot in slots:
            if erasure.checksum(bodies[slot]) != sums[slot] and m.layout == "ec":
                raise FasterFSError(f"shard {slot} re-encoded does not match its recorded checksum")
            key = m.pieces(c)[slot][1]
            throttle.take(len(bodies[slot]))
            clients[nodes[slot]].put_object(Bucket=m.bucket, Key=key, Body=bodies[slot],
                                            Metadata={"xxh3": str(sums[slot])})
            wrote += len(bodies[slot])
        with lock:
            out.pieces_written += len(slots)
            out.moved += len(plan.moves)
            out.bytes_written += wrote
            if nodes != c.nodes:
                moves[m.name][c.id] = (c.nodes, nodes)
            out.repaired += 1

    done = 0
    with ThreadPoolExecutor(max(1, int(cfg.repair.threads))) as pool:
        futures = {pool.submit(repair_chunk, p): p for p in plans}
        for future, plan in futures.items():
            try:
                future.result()
            except Exception as e:
                out.failed.append(f"{plan.manifest.name} chunk {plan.chunk.id} ({plan.chunk.key}): {e}"[:400])
            done += 1
            if progress:
                progress(done, len(plans))
    moved = [(m.name, m.generation, dict(moves[m.name])) for m in manifests.values() if moves.get(m.name)]
    for at in range(0, len(moved), UPDATE_BATCH):  # a lost node's files: one transaction per batch
        applied = registry.update_chunks(state.name, moved[at:at + UPDATE_BATCH], fence)
        for name, _, chunks in moved[at:at + UPDATE_BATCH]:
            for cid in set(chunks) - set(applied[name]):
                out.failed.append(f"{name} chunk {cid}: changed while repaired (re-ingested?); not applied")
    out.seconds = time.monotonic() - started
    return out

