"""Ingest: source -> chunks -> placement -> each holding node's MinIO -> manifest.

Objects of a new ingest go under a fresh generation prefix, so until the new
manifest replaces the old one (atomically, last) readers keep reading the old,
complete dataset; the old generation's objects are deleted afterwards. A failed
ingest deletes what it wrote and leaves the previous dataset untouched.
"""
from __future__ import annotations

import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import xxhash

from . import lobster, registry, s3
from .config import as_cfg
from .errors import FasterFSError
from .manifest import ChunkInfo, Manifest
from .placement import place

log = logging.getLogger("fasterfs.ingest")
EXTENSIONS = {"csv": "csv", "arrow": "arrow"}


def load_source(cfg) -> lobster.Pair:
    d = cfg.data
    if d.source == "files":
        return lobster.read_pair(d.message, d.orderbook, d.level, d.name)
    if d.source == "synthetic":
        message, orderbook = lobster.generate(d.rows, d.level, d.seed)
        return lobster.parse_pair(message, orderbook, d.level, d.name, "generated message data",
                                  "generated order book data")
    raise FasterFSError(f"option data.source={d.source!r}: must be files or synthetic")


def ingest(cfg, progress: Callable[[int, int], None] | None = None, nodes: int | None = None) -> Manifest:
    """Ingest the configured data source into the running cluster; returns the new manifest.
    A failed ingest removes what it wrote; the previous generation stays current.
    `nodes` places the data on the first N nodes only (Demo B's scaling sweep)."""
    cfg = as_cfg(cfg)
    state = registry.find(cfg)
    n_nodes = nodes or len(state.nodes)
    if n_nodes > len(state.nodes):
        raise FasterFSError(f"cannot place data on {n_nodes} nodes: the running cluster has {len(state.nodes)}")
    if cfg.replicas > n_nodes:
        raise FasterFSError(f"option replicas={cfg.replicas}: the running cluster has only {n_nodes} nodes")
    pair = load_source(cfg)
    fmt, rpc = cfg.data.format, cfg.data.rows_per_chunk
    starts = list(range(0, pair.rows, rpc))
    dataset = pair.name
    ids = [n.index for n in state.nodes[:n_nodes]]  # placement picks among positions; nodes keep their ids
    placement = [[ids[p] for p in holders] for holders in place(
        [f"{dataset}/chunk-{i:05d}" for i in range(len(starts))], n_nodes, cfg.replicas, cfg.placement.load_slack)]
    generation = time.strftime("g%Y%m%dT%H%M%S") + secrets.token_hex(2)
    bucket = state.config["minio"]["bucket"]
    creds = registry.fetch_credentials(state.name)
    clients = {n.index: s3.client(n.endpoint, creds) for n in state.nodes}  # all: old generations go everywhere
    time_col = pair.frame["Time"].to_numpy()

    def store(i: int) -> ChunkInfo:
        start, stop = starts[i], min(starts[i] + rpc, pair.rows)
        body = lobster.encode_chunk(pair, start, stop, fmt)
        key = f"{dataset}/{generation}/chunk-{i:05d}.{EXTENSIONS[fmt]}"
        digest = xxhash.xxh3_64_intdigest(body)
        for node in placement[i]:
            try:
                clients[node].put_object(Bucket=bucket, Key=key, Body=body, Metadata={"xxh3": str(digest)})
            except Exception as e:
                raise FasterFSError(f"storing {key} on node {node} ({state.node(node).endpoint}) failed: {e}") from e
        return ChunkInfo(i, key, placement[i], len(body), stop - start, start, float(time_col[start]),
                         float(time_col[stop - 1]), digest)

    chunks: list[ChunkInfo] = []
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            for info in pool.map(store, range(len(starts))):
                chunks.append(info)
                if progress:
                    progress(len(chunks), len(starts))
    except BaseException:
        _delete_objects(clients.values(), bucket, f"{dataset}/", lambda key: key.startswith(f"{dataset}/{generation}/"))
        raise
    manifest = Manifest(dataset=dataset, format=fmt, level=pair.level, rows_per_chunk=rpc, rows=pair.rows,
                        replicas=cfg.replicas, node_count=n_nodes, bucket=bucket, generation=generation,
                        chunks=chunks)
    took = registry.publish_manifest(state.name, manifest)  # the head keeps it; every StorageNode gets it
    missed = sorted({n.index for n in state.nodes} - set(took))
    if missed:  # readers still see it (they ask the Registry); those nodes learn it when they restart
        log.warning("nodes %s did not take generation %s of %s in time", missed, generation, dataset)
    # Readers holding an earlier manifest keep reading their generation: it is deleted only once
    # it has been replaced for ingest.keep_old_s. Generations no manifest ever named (a crashed
    # ingest's) go at once.
    kept = set(registry.generations(state.name, dataset, cfg.ingest.keep_old_s))
    _delete_objects(clients.values(), bucket, f"{dataset}/",
                    lambda key: key.split("/")[1] not in kept if key.count("/") >= 2 else False)
    return manifest


def _delete_objects(clients, bucket: str, prefix: str, doomed: Callable[[str], bool]) -> None:
    """Best effort: remove matching objects from every node (a dead node keeps its orphans)."""
    for c in clients:
        try:
            for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", []) if doomed(o["Key"])]
                if keys:
                    c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        except Exception:
            pass
