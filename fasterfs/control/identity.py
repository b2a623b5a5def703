"""Stable node identity: a node's id is recorded on its host's disk, beside its data.

Each StorageNode writes `<root>/node-<id>/identity.json` when it starts. When a cluster
starts (or FasterFS attaches to a Ray cluster), a probe task on every Ray node reports
the identities that host's disk records, and ids are assigned so that the data decides:

1. a node whose address is the one recorded in an identity on its disk keeps that id;
2. a host whose disk records exactly one identity nobody claimed in step 1 takes it (a
   machine that came back with another address, or lab disks handed out in another order);
3. every other node gets the smallest id no disk records (a new, empty host).

On a one-machine cluster every node sees every identity (one shared root), so only
step 1 applies there; on share-nothing hosts each disk holds one. Two hosts claiming the
same id is an error that names both.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..core.config import Paths
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write_json
from ..core.version import VERSION

FILE = "identity.json"


def record(paths: Paths, index: int, cluster: str, address: str) -> None:
    atomic_write_json(paths.node_dir(index) / FILE, {"cluster": cluster, "node": index, "address": address})


def recorded(root: str, cluster: str) -> list[dict]:
    """The identities of this cluster on this host's disk."""
    out = []
    for f in sorted(Path(root).glob(f"node-*/{FILE}")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if data.get("cluster") == cluster and isinstance(data.get("node"), int):
            out.append(data)
    return out


def probe(root: str, cluster: str) -> dict:
    """What a Ray node's host says about itself (run in a task pinned to it)."""
    import ray

    from .state import host_id

    return {"node_id": ray.get_runtime_context().get_node_id(), "host_id": host_id(), "version": VERSION,
            "identities": recorded(root, cluster)}


def assign(hosts: list[dict]) -> dict[str, int]:
    """hosts: [{"address", "identities", ...}] -> {address: node id}."""
    ids: dict[str, int] = {}
    claimed: dict[int, str] = {}

    def claim(address: str, index: int) -> None:
        if index in claimed and claimed[index] != address:
            raise FasterFSError(f"node id {index} is recorded on two hosts, {claimed[index]} and {address} "
                                f"(a copied disk?): remove node-{index}/{FILE} from one of them")
        ids[address] = index
        claimed[index] = address

    for h in hosts:
        for ident in h["identities"]:
            if ident.get("address") == h["address"]:
                claim(h["address"], ident["node"])
    for h in hosts:
        if h["address"] not in ids and len(h["identities"]) == 1 and h["identities"][0]["node"] not in claimed:
            claim(h["address"], h["identities"][0]["node"])
    recorded_ids = {i["node"] for h in hosts for i in h["identities"]}
    fresh = (i for i in range(10_000) if i not in recorded_ids and i not in claimed)
    for h in hosts:
        if h["address"] not in ids:
            claim(h["address"], next(fresh))
    return ids


def check_versions(hosts: list[dict]) -> None:
    for h in hosts:
        if h["version"] != VERSION:
            raise FasterFSError(f"host {h['address']} runs FasterFS {h['version']}, this driver {VERSION}: "
                                "install the same version on every host")
