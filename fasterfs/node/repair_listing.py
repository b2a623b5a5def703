"""What each node holds, as a repair's survey sees it (fasterfs.node.repair): every node's bucket
listed (paced, bucket_walk), or just some pieces asked by HEAD, or a node believed to hold what
the namespace places on it (TRUSTED); and which nodes' MinIO answers now."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from concurrent.futures import ThreadPoolExecutor

import urllib3

from ..control import s3
from ..control.state import ClusterState
from ..write import bucket_walk


class _Trusted(frozenset[str]):
    """A node's holdings taken from the namespace, not listed: every piece placed there is there."""

    def __contains__(self, key) -> bool:
        return True

    def __or__(self, other):  # what a later listing adds to a believed node's: nothing
        return self


TRUSTED = _Trusted()
Listing = dict[int, Set[str] | None]  # node -> the keys it holds (TRUSTED: believed); None: no answer


def _per_node(state: ClusterState, creds, timeout: float,
              ask: Callable[[int, s3.MarkedGetter], Set[str] | None]) -> Listing:
    """`ask(node, its MinIO)` of every node at once; None for a node whose MinIO does not answer."""
    def one(node) -> Set[str] | None:
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


def listings(state: ClusterState, creds, timeout: float = 2.0, share: float = 1.0,
             trusted: Set[int] = frozenset()) -> Listing:
    """Every node's object keys, each bucket walked with at most `share` of the time
    (bucket_walk); None for a node whose MinIO does not answer. A `trusted` node that answers
    is not listed: it holds what the namespace places on it (TRUSTED)."""
    def keys(node: int, lister: s3.MarkedGetter) -> Set[str] | None:
        if node in trusted:
            return TRUSTED if lister.answers(state.settings.bucket, timeout) else None
        return {key for key, _ in bucket_walk.walk(lister, state.settings.bucket, share)}
    return _per_node(state, creds, timeout, keys)


def holdings(state: ClusterState, creds, pieces: Iterable[tuple[int, str]],
             timeout: float = 2.0) -> Listing:
    """Of `pieces` (node, key), those each node holds, asked one HEAD each (a listing's shape,
    of just these keys); None for a node whose MinIO does not answer. A node asked for
    nothing is probed."""
    wanted: dict[int, list[str]] = {n.index: [] for n in state.nodes}
    for node, key in pieces:
        if node in wanted:  # a node no longer in the cluster is down to plan_repairs, as in a survey
            wanted[node].append(key)
    bucket = state.settings.bucket

    def held(node: int, asker: s3.MarkedGetter) -> Set[str] | None:
        if not wanted[node]:
            return set() if asker.answers(bucket, timeout) else None
        with ThreadPoolExecutor(8) as pool:
            return {k for k, there in zip(wanted[node], pool.map(lambda k: asker.holds(bucket, k), wanted[node]))
                    if there}
    return _per_node(state, creds, timeout, held)


def answering(state: ClusterState, getter: Callable[[int], s3.MarkedGetter], timeout: float = 1.0) -> set[int]:
    """The nodes whose MinIO answers now (one cheap request each), through `getter(node)`'s
    kept-alive connection (a new connection at every probe is one more MinIO connection for
    SOCK_OPS to count)."""
    bucket = state.settings.bucket
    with ThreadPoolExecutor(8) as pool:
        return {n.index for n, ok in zip(state.nodes, pool.map(lambda n: getter(n.index).answers(bucket, timeout),
                                                                state.nodes)) if ok}
