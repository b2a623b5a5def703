"""A chunk not cached on this host, read from where it is held: a holder's MinIO (a replica, or an
erasure-coded chunk's shards, checked) or, while its holders are down or slow, another host's cache
(the peer tier). Each read counted in the reader's stats and reported as the kernel would see it."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import xxhash

from ..core import erasure
from ..core.errors import FasterFSError
from .read_session import NoGoodCopy, ReadFailed, RottenCopy, unavailable
from .reader_stats import BYTES_MINIO, MISSES

if TYPE_CHECKING:
    from .client import Client


def from_peer(client: Client, chunk) -> bytes | None:
    """Chunk i from the cache of a node that has it (any host; the StorageNodes keep the
    index), checked against the manifest; None without Ray or when no cache has it."""
    import ray

    if not ray.is_initialized():
        return None
    s = client.session
    near = [client.local_node] if client.local_node is not None else []
    for node in near + [n.index for n in client.state.nodes if n.index not in near and not s.down(n.index)]:
        try:
            cached_on = client.session.ask(node, "cached_on", chunk.key, timeout=5.0)
            break
        except Exception:  # that node is gone too: ask the next
            continue
    else:
        return None
    for node in cached_on:
        began = time.perf_counter()
        try:
            data = client.session.ask(node, "cache_read", chunk.key, timeout=10.0)
        except Exception:
            continue
        if data is not None and len(data) == chunk.bytes and xxhash.xxh3_64_intdigest(data) == chunk.xxh3:
            client.session.note_peer((time.perf_counter() - began) * 1e3)
            client.session.peer_reads += 1
            client.session.count_hit(node, len(data))
            return data
    return None


def replicas(client: Client, i: int, chunk) -> bytes:
    def get(node: int) -> bytes:
        body, meta = client.session.timed_get(node, client.manifest.bucket, chunk.key)
        # The object carries the checksum it was stored with; MinIO is the source of truth, so an
        # object rewritten by another tool (without one) is served as it now is.
        stored = meta.get("xxh3")
        if client.session.verify and stored is not None and xxhash.xxh3_64_intdigest(body) != int(stored):
            raise RottenCopy(f"{chunk.key} does not match its stored checksum")
        return body

    try:  # holders that refused lately, last
        node, body = client.session.first_answer(sorted(client.sources(i), key=client.session.down), get)
    except ReadFailed as failed:
        errors = failed.errors
        if errors and all("NoSuchKey" in str(e) for e in errors.values()):
            raise FasterFSError(f"chunk {i} ({chunk.key}) of generation {client.manifest.generation} is gone "
                                f"from every holder: dataset {client.manifest.dataset} was re-ingested more than "
                                "ingest.keep_old_s ago; connect() again to read the current generation") from None
        said = [f"node {n} ({client.session.where(n)}): {type(e).__name__}: {e}"[:300] for n, e in errors.items()]
        message = f"chunk {i} ({chunk.key}) could not be read from any holder: " + "; ".join(said)
        if all(unavailable(e) for e in errors.values()):
            raise NoGoodCopy(message, sorted(errors)) from None
        raise FasterFSError(message) from None
    client.session.served_by[node] += 1
    st = client.stats(node)
    st.add(MISSES)
    st.add(BYTES_MINIO, len(body))
    client.session.report_read(node, f"/{client.manifest.bucket}/{chunk.key}")
    return body


def shards(client: Client, i: int, chunk) -> bytes:
    """An erasure-coded chunk: its data shards fetched in parallel and joined; a shard that
    is missing, unreadable or fails its checksum is replaced by the next parity shard
    (a degraded read, decoded from any ec.data good shards)."""
    bucket = client.manifest.bucket

    def fetch(s: int) -> bytes:
        node, key = chunk.nodes[s], erasure.shard_key(chunk.key, s)
        try:
            body = client.session.timed_get(node, bucket, key)[0]
        except Exception as e:
            client.session.note_failure(node, e)
            raise
        client.session.served_by[node] += 1
        client.stats(node).add(BYTES_MINIO, len(body))
        client.session.report_read(node, f"/{bucket}/{key}")
        return body

    data, degraded, why = erasure.gather(chunk, client.manifest.ec_data, client.manifest.ec_parity, fetch,
                                         client.session.shard_pool(), lambda s: client.session.down(chunk.nodes[s]),
                                         f"chunk {i} ({chunk.key})",
                                         client.session.hedge_s(chunk.nodes[0]) if client.session.hedge else None)
    client.session.degraded_reads += degraded
    client.session.degraded_why.extend(why)
    client.stats(chunk.nodes[0]).add(MISSES)
    return data
