"""A repair's survey (fasterfs.node.repair): every node's listing held against the namespace. A
piece (a replica, or an erasure-coded shard) is missing when its node does not answer or does not
have it, misplaced when it lives away from a home that answers again; a chunk with fewer good
pieces than it needs is lost. `plan_repairs` says, chunk by chunk, what a repair has to write or move."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass

from ..control import registry
from ..control.state import ClusterState
from ..core.manifest import ChunkInfo, Manifest
from ..core.placement import chunk_homes
from .repair_health import Health
from .repair_listing import TRUSTED, holdings, listings


def needed(m: Manifest) -> int:
    """Good pieces that rebuild a chunk."""
    return m.ec_data if m.layout == "ec" else 1


def homes(m: Manifest, state: ClusterState, load_slack: float) -> list[list[int]]:
    width = m.ec_data + m.ec_parity if m.layout == "ec" else m.replicas
    nodes = [n.index for n in state.placing()[:m.node_count]]  # a draining node is no piece's home
    if width > len(nodes):  # written on a larger cluster than runs now: no home for every piece
        return [list(c.nodes) for c in m.chunks]
    return chunk_homes(m.name, len(m), nodes, width, load_slack)


@dataclass
class ChunkPlan:
    manifest: Manifest
    chunk: ChunkInfo
    missing: list[int]      # slots to rewrite
    moves: list[int]        # slots to move home
    home: list[int]
    leaving: list[int] = dataclasses.field(default_factory=list)  # slots to move off a draining node


def plan_repairs(manifests: Iterable[Manifest], state: ClusterState, listing: Mapping[int, Set[str] | None],
                 load_slack: float, waiting: Set[int] = frozenset(), bad: Set[tuple[int, str]] = frozenset(),
                 only: dict[str, set[int]] | None = None) -> tuple[Health, list[ChunkPlan]]:
    """What is missing or away from home. Pieces on a `waiting` node whose listing failed
    (down, not for long; or a listing that failed on a node up again) are left alone: rebuilt
    elsewhere, they would only move back. `bad` pieces (node, key) count as missing (the
    scrub found them wrong). A name whose every piece is on a believed node (TRUSTED) and at
    home is whole without looking further: after a node's loss, the plan's work is what the
    changed nodes held, not every chunk."""
    held = {n: keys for n, keys in listing.items() if keys is not None}
    alive = set(held)
    draining = {n.index for n in state.nodes if n.draining}
    health = Health(nodes_down=sorted(set(listing) - alive),
                    believed=sorted(n for n, keys in held.items() if keys is TRUSTED))
    believed = set(health.believed) if only is None and not bad else set()
    plans = []
    stored_on: set[int] = set()
    for m in manifests:
        if believed and not m.moved and believed.issuperset(itertools.chain.from_iterable(c.nodes for c in m.chunks)):
            health.chunks += len(m.chunks)
            continue
        # placing a chunk ranks every node: only for a name whose pieces repair moved (else every
        # piece is where ingest put it, its home: placing a lost node's files again was most of a
        # plan's time, 20 s at 128 nodes and a million chunks, simulated)
        home: list[list[int]] | None = None
        for c in m.chunks:
            if only is not None and c.id not in only.get(m.name, ()):
                continue
            health.chunks += 1
            slots = m.pieces(c)
            present = [s for s, (node, key) in enumerate(slots)
                       if node in alive and key in held[node] and (node, key) not in bad]
            missing = [s for s in range(len(slots))
                       if s not in present and (slots[s][0] in alive or slots[s][0] not in waiting)]
            leaving = [s for s in present if slots[s][0] in draining]
            if (m.moved or leaving) and home is None:
                home = homes(m, state, load_slack)
            at = home[c.id] if home is not None else list(c.nodes)
            moves = [s for s in present if at[s] != c.nodes[s] and at[s] in alive and at[s] not in c.nodes
                     and s not in leaving] if m.moved else []
            health.misplaced += len(moves) + len(leaving)
            health.misplaced_bytes += (len(moves) + len(leaving)) * piece_bytes(m, c)
            if len(present) < len(slots):
                health.degraded.setdefault(m.name, []).append(c.id)
            if len(present) < needed(m):
                health.lost.setdefault(m.name, []).append(c.id)
            elif missing or moves or leaving:
                plans.append(ChunkPlan(m, c, missing, moves, at, leaving))
                health.repairable += 1
            stored_on.update(c.nodes)
    # a node the data was stored on that is not part of the cluster now: down, as a machine that is
    health.nodes_down = sorted(set(health.nodes_down) | (stored_on - {n.index for n in state.nodes}))
    return health, plans


def piece_bytes(m: Manifest, c) -> int:
    """What one piece of chunk `c` holds: the chunk (a replica), or its share (an ec shard)."""
    return -(-c.bytes // m.ec_data) if m.layout == "ec" else c.bytes


def check(state: ClusterState, creds, manifests: list[Manifest], load_slack: float) -> Health:
    """The redundancy of just `manifests` (a change of the namespace): what a change costs is
    what it wrote, not what the cluster holds."""
    pieces = [p for m in manifests for c in m.chunks for p in m.pieces(c)]
    return plan_repairs(manifests, state, holdings(state, creds, pieces), load_slack)[0]


Names = Callable[[], dict[str, Manifest]]  # every name's manifest, current as of the call


def registry_names(state: ClusterState) -> Names:
    return lambda: registry.fetch_manifests(state.name)[1]


def look(state: ClusterState, creds, plan: Callable[[dict, dict], tuple[Health, list[ChunkPlan]]], names: Names,
          share: float = 1.0, trusted: Set[int] = frozenset()):
    """The nodes' listings and the manifests (`names()`: a StorageNode's own copy, caught up,
    else fetched whole from the Registry), planned by `plan(listing, manifests)`, so that a
    piece another writer moves meanwhile (a concurrent repair, a refill) is not taken for
    missing. Listed before the manifests are fetched, so a piece retired since still counts;
    when that finds anything to do, listed again after, so a piece written since counts too,
    and a node is up or down by its later answer (a host back from a power cut mid-survey);
    a piece still missing from both is asked of its node. `trusted` nodes are not listed (listings)."""
    first = listings(state, creds, share=share, trusted=trusted)
    manifests = names()
    health, plans = plan(first, manifests)
    if not plans and not health.nodes_down:
        return first, manifests, health, plans
    again = listings(state, creds, share=share, trusted=trusted)
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


def survey(state: ClusterState, creds, load_slack: float, names: Names | None = None, share: float = 1.0,
           trusted: Set[int] = frozenset()) -> Health:
    """The namespace's redundancy as the nodes' listings show it; `share`: of the time the
    listings may take (bucket_walk; the StorageNodes' own surveys are paced, a user's are not);
    `trusted` nodes are believed, not listed (listings)."""
    return look(state, creds, lambda listing, ms: plan_repairs(ms.values(), state, listing, load_slack),
                 names or registry_names(state), share, trusted)[2]
