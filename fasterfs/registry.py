"""The Registry: the cluster's facts, held in Ray so that every host finds them there.

One named, detached actor pinned to the head node holds the cluster state (nodes, their
ids and addresses, configuration), the MinIO credentials and the namespace (one manifest per
dataset or file, `fasterfs.namespace`), and
takes job reports for the dashboard. Any process that can reach Ray asks it; no host
reads another host's files.

Why an actor rather than Ray's GCS key-value store: the KV store is an internal API
(`ray.experimental.internal_kv`), has no notion of pushing a new manifest to the
StorageNodes, and keeps nothing once the GCS restarts without Redis. The actor has a
narrow public surface, pushes each new manifest generation to every StorageNode before
ingest returns, and keeps its facts on the head's own disk (the state file, the 0600
credentials file, one manifest file per name), so a restarted Registry knows everything again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from . import credentials, tls
from .config import Paths
from .credentials import ClusterKeys
from .errors import FasterFSError
from .fsutil import atomic_write, atomic_write_json, read_json
from .manifest import Manifest
from .node_directory import NodeDirectory
from .state import ClusterState, host_id, join, namespace

log = logging.getLogger("fasterfs.registry")
NAME = "registry"
REPORT_SUFFIXES = (".json", ".png")


class Registry:
    def __init__(self, root: str):
        self.paths = Paths(Path(root))
        self.cluster = ClusterState.load(self.paths.root)
        self.keys = credentials.load(self.paths.credentials_file)
        self._names_dir = self.paths.root / "namespace"
        self._names_dir.mkdir(exist_ok=True)
        self._entries = {m.name: m for m in map(Manifest.load, sorted(self._names_dir.glob("*.json")))}
        if not self._entries and self.paths.manifest_file.exists():  # a root from before the namespace
            legacy = Manifest.load(self.paths.manifest_file)
            self._entries[legacy.name] = legacy
        # bumped on every change (mounts and filesystems poll it); from the clock, so a restarted
        # Registry never repeats a number a reader saw before
        self.version = time.time_ns()
        # every generation a manifest named: {dataset, generation, prefix, replaced: time or None}
        self._history_file = self.paths.root / "generations.json"
        self._history = read_json(self._history_file, "generation history") if self._history_file.exists() else []
        # pieces repair moved away from a node ({node, key, retired}): readers holding the manifest
        # from before the move may still read them, so they go only after ingest.keep_old_s
        self._retired_file = self.paths.root / "retired-pieces.json"
        self._retired = read_json(self._retired_file, "retired pieces") if self._retired_file.exists() else []
        self._lock = threading.Lock()

    def ready(self) -> str:
        return host_id()

    def state(self) -> dict:
        self.cluster = ClusterState.load(self.paths.root)  # `up` updates it (dashboard address) after start
        return self.cluster.to_dict()

    def credentials(self, role: str = "reader") -> credentials.Credentials:
        """One role's MinIO keys: readers get the read-only user's (fasterfs.credentials)."""
        return self.keys.role(role)

    def all_keys(self) -> ClusterKeys:  # (`credentials` here would name the method above)
        """Both users' keys: for a StorageNode started on a host that rejoins."""
        return self.keys

    def issue_certificate(self, address: str, public_key_pem: str) -> tuple[str, str]:
        """(certificate, CA certificate) for the MinIO of a node of this cluster (minio.tls):
        the CA's key never leaves the head; the node's key never leaves its host."""
        self.cluster = ClusterState.load(self.paths.root)
        if not self.cluster.tls_ca:
            raise FasterFSError(f"cluster {self.cluster.name!r} was started without minio.tls=true")
        if address not in {n.address for n in self.cluster.nodes}:
            raise FasterFSError(f"{address} is not a node of cluster {self.cluster.name!r}: no certificate for it")
        return tls.issue(self.paths.tls_ca_dir, address, public_key_pem), self.cluster.tls_ca

    def manifest(self, name: str | None = None) -> Manifest | None:
        """The manifest of `name`; None: the dataset ingested last (what `connect()` reads)."""
        if name is not None:
            return self._entries.get(name)
        datasets = [m for m in self._entries.values() if m.kind == "dataset"]
        return max(datasets, key=lambda m: m.created) if datasets else None

    def manifests(self) -> tuple[int, dict[str, Manifest]]:
        """The whole namespace and its version."""
        return self.version, dict(self._entries)

    def namespace_version(self) -> int:
        return self.version

    def _file(self, name: str) -> Path:
        return self._names_dir / (quote(name, safe="") + ".json")

    def _retire(self, name: str, now: float) -> None:
        for g in self._history:
            if g["dataset"] == name and g["replaced"] is None:
                g["replaced"] = now

    def publish_manifest(self, manifest: Manifest, prefix: str, timeout: float = 60.0) -> list[int]:
        """Make `manifest` the current generation of its name (its objects under `prefix`):
        kept on the head's disk, then pushed to every StorageNode. Returns the nodes that took it."""
        with self._lock:
            self._retire(manifest.name, time.time())
            self._history.append({"dataset": manifest.name, "generation": manifest.generation, "prefix": prefix,
                                  "replaced": None})
            atomic_write_json(self._history_file, self._history)
            manifest.save(self._file(manifest.name))
            self._entries[manifest.name] = manifest
            self.version += 1
            return self._push("set_manifest", manifest, timeout)

    def update_chunks(self, name: str, generation: str, moves: dict[int, tuple[list[int], list[int]]],
                      retired: Sequence[tuple[int, str]] = (), timeout: float = 60.0) -> list[int]:
        """Repair moved pieces of `name`'s chunks: {chunk id: (nodes before, nodes now)}. Applied
        to the chunks still as the repair saw them, only in the generation it repaired (a
        re-ingest meanwhile wins); pushed like a new generation. Returns the chunk ids applied."""
        with self._lock:
            current = self._entries.get(name)
            if current is None or current.generation != generation:
                return []
            chunks, applied = list(current.chunks), []
            for cid, (before, after) in moves.items():
                if chunks[cid].nodes == list(before):
                    chunks[cid] = dataclasses.replace(chunks[cid], nodes=list(after))
                    applied.append(cid)
            if not applied:
                return []
            manifest = dataclasses.replace(current, chunks=chunks)
            manifest.save(self._file(name))
            self._entries[name] = manifest
            now = time.time()
            self._retired += [{"node": node, "key": key, "retired": now} for node, key in retired]
            atomic_write_json(self._retired_file, self._retired)
            self.version += 1
            self._push("set_manifest", manifest, timeout)
            return applied

    def expired_pieces(self, keep_old_s: float) -> list[tuple[int, str]]:
        """Pieces retired by repair more than keep_old_s ago, forgotten here: they can go."""
        with self._lock:
            now = time.time()
            gone = [p for p in self._retired if now - p["retired"] >= keep_old_s]
            if gone:
                self._retired = [p for p in self._retired if p not in gone]
                atomic_write_json(self._retired_file, self._retired)
            return [(p["node"], p["key"]) for p in gone]

    def remove(self, name: str, timeout: float = 60.0) -> Manifest:
        """Take `name` out of the namespace. Its objects stay for readers that hold its
        manifest until ingest.keep_old_s has passed (`expired` then names them)."""
        with self._lock:
            manifest = self._entries.pop(name, None)
            if manifest is None:
                raise FasterFSError(f"{name!r}: no such dataset or file in cluster {self.cluster.name!r}")
            self._retire(name, time.time())
            atomic_write_json(self._history_file, self._history)
            self._file(name).unlink(missing_ok=True)
            if self.paths.manifest_file.exists() and Manifest.load(self.paths.manifest_file).name == name:
                self.paths.manifest_file.unlink()
            self.version += 1
            self._push("drop_manifest", name, timeout)
            return manifest

    def _push(self, method: str, arg, timeout: float) -> list[int]:
        import ray

        self.state()
        nodes = NodeDirectory(self.cluster.namespace)  # looked up now: a node may be a new actor since
        refs = {}
        for n in self.cluster.nodes:
            actor = nodes.get(n.index)
            if actor is None:
                log.warning("node %d has no StorageNode to take the namespace change", n.index)
            else:
                refs[n.index] = getattr(actor, method).remote(arg)
        done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        return [i for i, ref in refs.items() if ref in done]

    def expired(self, keep_old_s: float) -> list[dict]:
        """Generations replaced (or removed) more than keep_old_s ago, forgotten here: their
        objects can go. Each as {dataset, generation, prefix}."""
        with self._lock:
            now = time.time()
            gone = [g for g in self._history if g["replaced"] is not None and now - g["replaced"] >= keep_old_s]
            if gone:
                self._history = [g for g in self._history if g not in gone]
                atomic_write_json(self._history_file, self._history)
            return gone

    def generations(self, dataset: str) -> list[str]:
        """The generations of `dataset` whose objects are kept: the current one and those
        not yet expired (readers may still hold their manifests)."""
        with self._lock:
            return [g["generation"] for g in self._history if g["dataset"] == dataset]

    def put_report(self, run: str, name: str, data: bytes) -> str:
        """Store a job report file (written on any host) where the dashboard serves it."""
        if "/" in run or "/" in name or run.startswith(".") or not name.endswith(REPORT_SUFFIXES):
            raise FasterFSError(f"report file {run}/{name}: only .json and .png files of a run directory")
        out = Path(self.cluster.settings.output_dir or self.paths.root / "outputs") / run / name
        atomic_write(out, data)
        return str(out)


def start(state: ClusterState, head_node_id: str, timeout: float):
    """Create the cluster's Registry on the head node (restarted there if its worker dies)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(Registry).options(
        name=NAME, namespace=state.namespace, lifetime="detached", num_cpus=0, max_restarts=-1,
        max_task_retries=3, max_concurrency=16,  # a StorageNode restarting asks it while it pushes a manifest
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False),
    ).remote(state.root)
    ray.get(actor.ready.remote(), timeout=timeout)  # type: ignore[attr-defined]  # Ray's typing of actor methods
    return actor


def handle(cluster_name: str):
    """The Registry of a cluster this process is connected to through Ray."""
    import ray

    try:
        return ray.get_actor(NAME, namespace=namespace(cluster_name))
    except ValueError:
        raise FasterFSError(f"the Ray cluster has no FasterFS registry for cluster {cluster_name!r} (Ray namespace "
                            f"{namespace(cluster_name)}): start FasterFS on it with `fasterfs up` "
                            "(cluster.attach=true for a Ray cluster started elsewhere), or set cluster.name") from None


def find(cfg, root=None) -> ClusterState:
    """The running cluster, from any host: inside a Ray task or actor, the cluster it runs in
    (its Ray namespace names it); elsewhere the one at cluster.ray_address (or RAY_ADDRESS), or else the one
    whose head state file is under `root` (this is the head). Joins it and asks its Registry."""
    import ray

    from .state import in_ray_worker

    if in_ray_worker():
        ns = ray.get_runtime_context().namespace or ""
        name = ns[len(namespace("")):] if ns.startswith(namespace("")) else cfg.cluster.name
    elif address := _ray_address(cfg):
        name = cfg.cluster.name
        join(address, name, cfg.cluster.root)
    else:
        head = ClusterState.load(Path(root or cfg.cluster.root))
        name = head.name
        join(head.ray_address, name, head.root)
    return find_in_ray(name)


def _ray_address(cfg) -> str | None:
    """cluster.ray_address, else RAY_ADDRESS as Ray sets it for a `ray job submit` driver
    (<host>:<port>; not "auto" nor a dashboard URL)."""
    env = os.environ.get("RAY_ADDRESS", "")
    return cfg.cluster.ray_address or (env if re.fullmatch(r"[\w.-]+:\d+", env) else None)


def _ask(cluster_name: str, what: str, *args):
    import ray

    return ray.get(getattr(handle(cluster_name), what).remote(*args), timeout=120)


def find_in_ray(cluster_name: str) -> ClusterState:
    return ClusterState.from_dict(_ask(cluster_name, "state"))


def fetch_credentials(cluster_name: str, role: str = "reader") -> credentials.Credentials:
    """MinIO keys for `role`: "reader" (list and GET only) unless the caller writes ("admin")."""
    return _ask(cluster_name, "credentials", role)


def fetch_keys(cluster_name: str) -> credentials.ClusterKeys:
    return _ask(cluster_name, "all_keys")


def issue_certificate(cluster_name: str, address: str, public_key_pem: str) -> tuple[str, str]:
    return _ask(cluster_name, "issue_certificate", address, public_key_pem)


def fetch_manifest(cluster_name: str, name: str | None = None) -> Manifest | None:
    return _ask(cluster_name, "manifest", name)


def fetch_manifests(cluster_name: str) -> tuple[int, dict[str, Manifest]]:
    return _ask(cluster_name, "manifests")


def namespace_version(cluster_name: str) -> int:
    return _ask(cluster_name, "namespace_version")


def publish_manifest(cluster_name: str, manifest: Manifest, prefix: str) -> list[int]:
    return _ask(cluster_name, "publish_manifest", manifest, prefix)


def update_chunks(cluster_name: str, name: str, generation: str, moves: dict, retired: list) -> list[int]:
    return _ask(cluster_name, "update_chunks", name, generation, moves, retired)


def expired_pieces(cluster_name: str, keep_old_s: float) -> list[tuple[int, str]]:
    return _ask(cluster_name, "expired_pieces", keep_old_s)


def remove(cluster_name: str, name: str) -> Manifest:
    return _ask(cluster_name, "remove", name)


def expired(cluster_name: str, keep_old_s: float) -> list[dict]:
    return _ask(cluster_name, "expired", keep_old_s)


def generations(cluster_name: str, dataset: str) -> list[str]:
    return _ask(cluster_name, "generations", dataset)


def put_report(cluster_name: str, run: str, name: str, data: bytes) -> str:
    return _ask(cluster_name, "put_report", run, name, data)
