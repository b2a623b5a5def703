"""Ingest and put: source -> chunks -> placement -> each holding node's MinIO -> manifest.

A LOBSTER pair becomes a dataset (`ingest`), any file becomes a file of the namespace
(`put`); both take the same write path.

Objects of a new ingest go under a fresh generation prefix, so until the new
manifest replaces the old one (atomically, last) readers keep reading the old,
complete dataset; the old generation's objects are deleted afterwards. A failed
ingest deletes what it wrote and leaves the previous dataset untouched.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from ..control import registry, s3
from ..core import erasure
from ..core.config import as_cfg
from ..core.errors import FasterFSError
from ..core.manifest import ChunkInfo, Manifest, object_prefix
from ..core.namespace import check_dataset_name, check_path
from ..core.placement import chunk_homes

if TYPE_CHECKING:
    from ..core import lobster

log = logging.getLogger("fasterfs.write.ingest")
EXTENSIONS = {"csv": "csv", "arrow": "arrow"}


def load_source(cfg) -> lobster.Pair:
    # polars, numpy: imported here, not by the write path's other users (every process that
    # holds a StorageNode's handle imports this module: 0.2 s of CPU each)
    from ..core import lobster

    d = cfg.data
    if d.source == "files":
        rows = d.get("rows")
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
            raise FasterFSError(f"option data.rows={rows}: must be a whole number >= 1 (or null: every row)")
        pair = lobster.read_pair(d.message, d.orderbook, d.level, d.name)
        if rows is not None and rows > pair.rows:
            raise FasterFSError(f"option data.rows={rows}: {d.message} has {pair.rows} rows")
        return pair if rows is None else pair.head(rows)
    if d.source == "synthetic":
        message, orderbook = lobster.generate(d.rows, d.level, d.seed)
        return lobster.parse_pair(message, orderbook, d.level, d.name, "generated message data",
                                  "generated order book data")
    raise FasterFSError(f"option data.source={d.source!r}: must be files or synthetic")


def ingest(cfg, progress: Callable[[int, int], None] | None = None, nodes: int | None = None) -> Manifest:
    """Ingest the configured LOBSTER source into the running cluster as the dataset of its
    name (replacing only a dataset of that name); returns the new manifest. A failed ingest
    removes what it wrote; the previous generation stays current. `nodes` places the data
    on the first N nodes only (Demo B's scaling sweep)."""
    from ..core import lobster

    cfg = as_cfg(cfg)
    _target(cfg, nodes)  # a bad option or no cluster is named before the source is read
    pair = load_source(cfg)
    name = check_dataset_name(pair.name)
    fmt, rpc = cfg.data.format, cfg.data.rows_per_chunk
    starts = list(range(0, pair.rows, rpc))
    time_col = pair.frame["Time"].to_numpy()

    def chunk(i: int) -> tuple[bytes, dict]:
        start, stop = starts[i], min(starts[i] + rpc, pair.rows)
        return lobster.encode_chunk(pair, start, stop, fmt), {
            "rows": stop - start, "first_row": start, "first_time": float(time_col[start]),
            "last_time": float(time_col[stop - 1])}

    def manifest(**common) -> Manifest:
        return Manifest(dataset=name, format=fmt, level=pair.level, rows_per_chunk=rpc, rows=pair.rows, **common)
    return _write(cfg, name, "dataset", len(starts), lambda i: f"chunk-{i:05d}.{EXTENSIONS[fmt]}", chunk, manifest,
                  progress, nodes)


def put(cfg, local: str | Path, dest: str, force: bool = False,
        progress: Callable[[int, int], None] | None = None) -> Manifest:
    """Store any file at `dest` in the namespace, as files.chunk_mb chunks placed and
    replicated like a dataset's. An existing file of that name is replaced only with `force`."""
    cfg = as_cfg(cfg)
    dest = check_path(dest)
    local = Path(local)
    try:
        size = local.stat().st_size
        with open(local, "rb"):
            pass
    except OSError as e:
        raise FasterFSError(f"cannot read {local}: {e.strerror}") from None
    if not local.is_file():
        raise FasterFSError(f"{local} is not a regular file")
    chunk_size = int(cfg.files.chunk_mb * 1024 * 1024)
    if chunk_size <= 0:
        raise FasterFSError(f"option files.chunk_mb={cfg.files.chunk_mb}: must be > 0")
    if not force:
        state = registry.find(cfg)
        if registry.fetch_manifest(state.name, dest) is not None:
            raise FasterFSError(f"{dest} already exists in the namespace: `fasterfs rm {dest}` first, or --force")

    def chunk(i: int) -> tuple[bytes, dict]:
        with open(local, "rb") as f:  # each worker its own handle: chunks are read in parallel
            f.seek(i * chunk_size)
            body = f.read(chunk_size)
        return body, {"rows": 0, "first_row": 0, "first_time": 0.0, "last_time": 0.0}

    def manifest(**common) -> Manifest:
        return Manifest(dataset=dest, format="bytes", level=0, rows_per_chunk=0, rows=0, kind="file", **common)
    count = max(1, -(-size // chunk_size))  # an empty file is one empty chunk
    return _write(cfg, dest, "file", count, lambda i: f"part-{i:05d}", chunk, manifest, progress)


def remove(cfg, name: str) -> Manifest:
    """Take a dataset or file out of the namespace. Readers that hold it keep reading it
    until ingest.keep_old_s has passed; its objects go then (at a later write)."""
    cfg = as_cfg(cfg)
    state = registry.find(cfg)
    manifest = registry.remove(state.name, name.strip("/"))
    collect_garbage(cfg, state)
    return manifest



def _write(cfg, name: str, kind: str, count: int, chunk_name: Callable[[int], str],
           chunk: Callable[[int], tuple[bytes, dict]], manifest: Callable[..., Manifest],
           progress: Callable[[int, int], None] | None, nodes: int | None = None) -> Manifest:
    """The one write path: chunks -> placement -> each holder's MinIO -> the manifest,
    published last under a fresh generation; then old generations' objects go."""
    state, n_nodes = _target(cfg, nodes)
    why = registry.conflict(state.name, name, kind)
    if why:
        raise FasterFSError(f"cannot store {kind} {name!r} in the namespace: {why}")
    ec = cfg.layout == "ec"
    k, m = (int(cfg.ec.data), int(cfg.ec.parity)) if ec else (0, 0)
    placement = chunk_homes(name, count, [n.index for n in state.placing()[:n_nodes]], k + m if ec else cfg.replicas,
                            cfg.placement.load_slack)
    generation = time.strftime("g%Y%m%dT%H%M%S") + secrets.token_hex(4)
    prefix = object_prefix(name, kind)
    bucket = state.settings.bucket
    creds = registry.fetch_credentials(state.name, "admin")
    clients = {n.index: s3.client(n.endpoint, creds) for n in state.nodes}  # placement may pick any

    def store(i: int) -> ChunkInfo:
        body, info = chunk(i)
        return store_chunk(clients, state, i, f"{prefix}{generation}/{chunk_name(i)}", body, placement[i], k, m,
                           info)

    chunks: list[ChunkInfo] = []
    try:  # a failed store or publish (the head's disk full) leaves none of the new generation
        with ThreadPoolExecutor(max_workers=8) as pool:  # at most 8 chunks in memory
            for info in pool.map(store, range(count)):
                chunks.append(info)
                if progress:
                    progress(len(chunks), count)
        new = manifest(replicas=1 if ec else cfg.replicas, node_count=n_nodes, bucket=bucket, generation=generation,
                       chunks=chunks, layout=cfg.layout, ec_data=k, ec_parity=m)
        took = registry.publish_manifest(state.name, new, prefix)  # the head keeps it; every StorageNode gets it
    except BaseException:
        _delete_objects(cleaners(state, creds), bucket, f"{prefix}{generation}/", lambda key: True)
        raise
    missed = sorted({n.index for n in state.nodes} - set(took))
    if missed:  # readers still see it (they ask the Registry); those nodes learn it when they restart
        log.warning("nodes %s did not take generation %s of %s in time", missed, generation, name)
    # Generations no manifest ever named (a crashed write's) go at once
    kept = set(registry.generations(state.name, name))
    getters = cleaners(state, creds)
    _delete_objects(getters, bucket, prefix,
                    lambda key: key[len(prefix):].split("/")[0] not in kept if "/" in key[len(prefix):] else False)
    collect_garbage(cfg, state, getters)
    return new


def store_chunk(clients: dict, state, cid: int, key: str, body: bytes, nodes: list[int], k: int, m: int,
                info: dict) -> ChunkInfo:
    """Chunk `cid`'s bytes on its nodes under `key`: replicas (m == 0 and k == 0) the chunk on each
    holder, ec shard s on the s-th node; what the manifest says of it."""
    digest = xxhash.xxh3_64_intdigest(body)
    objects = ([(node, erasure.shard_key(key, s), shard, erasure.checksum(shard)) for s, (node, shard) in
                enumerate(zip(nodes, erasure.encode(body, k, m)))] if k
               else [(node, key, body, digest) for node in nodes])
    for node, obj, data, sum_ in objects:
        try:
            clients[node].put_object(Bucket=state.settings.bucket, Key=obj, Body=data, Metadata={"xxh3": str(sum_)})
        except Exception as e:
            raise FasterFSError(f"storing {obj} on node {node} ({state.node(node).endpoint}) failed: {e}") from e
    return ChunkInfo(cid, key, nodes, len(body), xxh3=digest, shards=[o[3] for o in objects] if k else [], **info)


def _target(cfg, nodes: int | None):
    """The running cluster and how many of its nodes the data goes on, checked."""
    state = registry.find(cfg)
    placing = len(state.placing())  # a node draining takes no new data
    n_nodes = nodes or placing
    if n_nodes > placing:
        raise FasterFSError(f"cannot place data on {n_nodes} nodes: the running cluster has {placing}"
                            + (" not draining" if placing < len(state.nodes) else ""))
    if cfg.layout not in ("replicas", "ec"):
        raise FasterFSError(f"option layout={cfg.layout!r}: replicas or ec")
    if cfg.layout == "ec":
        erasure.check_layout(cfg.ec.data, cfg.ec.parity, n_nodes)
    elif cfg.replicas > n_nodes:
        raise FasterFSError(f"option replicas={cfg.replicas}: the running cluster has only {n_nodes} nodes")
    return state, n_nodes


def collect_garbage(cfg, state, getters: dict[int, s3.MarkedGetter] | None = None) -> None:
    """Delete the objects of generations replaced or removed more than ingest.keep_old_s ago
    (readers holding their manifests have had that long), and the pieces retired as long ago:
    moved away by repair, or stored by a write that never published them."""
    gone = registry.expired(state.name, cfg.ingest.keep_old_s)
    pieces = registry.expired_pieces(state.name, cfg.ingest.keep_old_s)
    if not gone and not pieces:
        return
    getters = getters or cleaners(state)
    bucket = state.settings.bucket
    for g in gone:
        _delete_objects(getters, bucket, f"{g['prefix']}{g['generation']}/", lambda key: True)
    by_node: dict[int, list[str]] = {}
    for node, key in pieces:
        by_node.setdefault(node, []).append(key)
    for node, keys in by_node.items():
        try:
            missed, why = getters[node].delete(bucket, keys), "MinIO refused them"
        except Exception as e:  # a node down keeps them (orphans of a generation: they go with it)
            missed, why = keys, str(e)
        if missed:
            log.warning("could not delete %d retired pieces on node %d (%s, ...): %s", len(missed), node, missed[0],
                        why)


def cleaners(state, creds=None) -> dict[int, s3.MarkedGetter]:
    """A client of each node's MinIO for clean-up, on sockets with the cache filler's mark: the
    kernel programs skip them, as no manifest names these objects any more (no cache entry to
    mark stale), and a DeleteObjects they saw would mark the whole bucket suspect."""
    creds = creds or registry.fetch_credentials(state.name, "admin")
    return {n.index: s3.MarkedGetter(n.endpoint, creds, state.settings.fill_mark) for n in state.nodes}


def _delete_objects(getters: dict[int, s3.MarkedGetter], bucket: str, prefix: str,
                    doomed: Callable[[str], bool]) -> None:
    """Best effort: remove matching objects from every node (a dead node keeps its orphans)."""
    for getter in getters.values():
        try:
            getter.delete(bucket, [key for key, _ in getter.list(bucket, prefix) if doomed(key)])
        except Exception as e:
            log.info("could not clean %s on %s: %s", prefix, getter.endpoint, e)
