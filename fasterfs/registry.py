"""The Registry: the cluster's facts, held in Ray so that every host finds them there.

One named, detached actor pinned to the head node holds the cluster state (nodes, their
ids and addresses, configuration), the MinIO credentials and the dataset's manifest, and
takes job reports for the dashboard. Any process that can reach Ray asks it; no host
reads another host's files.

Why an actor rather than Ray's GCS key-value store: the KV store is an internal API
(`ray.experimental.internal_kv`), has no notion of pushing a new manifest to the
StorageNodes, and keeps nothing once the GCS restarts without Redis. The actor has a
narrow public surface, pushes each new manifest generation to every StorageNode before
ingest returns, and keeps its facts on the head's own disk (the state file, the 0600
credentials file, the manifest), so a restarted Registry knows everything again.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

from . import credentials
from .config import Paths
from .errors import FasterFSError
from .fsutil import atomic_write, atomic_write_json, read_json
from .manifest import Manifest
from .state import ClusterState, actor_name, host_id, join, namespace

log = logging.getLogger("fasterfs.registry")
NAME = "registry"
REPORT_SUFFIXES = (".json", ".png")


class Registry:
    def __init__(self, root: str):
        self.paths = Paths(Path(root))
        self.cluster = ClusterState.load(self.paths.root)
        self.creds = credentials.load(self.paths.credentials_file)
        self._manifest = Manifest.load(self.paths.manifest_file) if self.paths.manifest_file.exists() else None
        # every generation a manifest named: {dataset, generation, replaced: time or None}
        self._history_file = self.paths.root / "generations.json"
        self._history = read_json(self._history_file, "generation history") if self._history_file.exists() else []
        self._lock = threading.Lock()

    def ready(self) -> str:
        return host_id()

    def state(self) -> dict:
        self.cluster = ClusterState.load(self.paths.root)  # `up` updates it (dashboard address) after start
        return self.cluster.to_dict()

    def credentials(self) -> credentials.Credentials:
        return self.creds

    def manifest(self) -> Manifest | None:
        return self._manifest

    def publish_manifest(self, manifest: Manifest, timeout: float = 60.0) -> list[int]:
        """Make `manifest` the dataset's current generation: kept on the head's disk, then
        pushed to every StorageNode. Returns the nodes that took it."""
        import ray

        with self._lock:
            self.state()
            now = time.time()
            for g in self._history:
                if g["dataset"] == manifest.dataset and g["replaced"] is None:
                    g["replaced"] = now
            self._history.append({"dataset": manifest.dataset, "generation": manifest.generation, "replaced": None})
            atomic_write_json(self._history_file, self._history)
            manifest.save(self.paths.manifest_file)
            self._manifest = manifest
            refs = {}
            for n in self.cluster.nodes:
                try:
                    refs[n.index] = ray.get_actor(actor_name(n.index), namespace=self.cluster.namespace) \
                        .set_manifest.remote(manifest)
                except ValueError:
                    log.warning("node %d has no StorageNode to take the new manifest", n.index)
            done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
            return [i for i, ref in refs.items() if ref in done]

    def generations(self, dataset: str, keep_old_s: float) -> list[str]:
        """The dataset's generations to keep: the current one and those replaced less than
        keep_old_s ago (readers may still hold their manifests). Forgets the others."""
        with self._lock:
            now = time.time()
            keep = [g for g in self._history if g["dataset"] != dataset or g["replaced"] is None
                    or now - g["replaced"] < keep_old_s]
            if len(keep) != len(self._history):
                self._history = keep
                atomic_write_json(self._history_file, keep)
            return [g["generation"] for g in keep if g["dataset"] == dataset]

    def put_report(self, run: str, name: str, data: bytes) -> str:
        """Store a job report file (written on any host) where the dashboard serves it."""
        if "/" in run or "/" in name or run.startswith(".") or not name.endswith(REPORT_SUFFIXES):
            raise FasterFSError(f"report file {run}/{name}: only .json and .png files of a run directory")
        out = Path(self.cluster.config.get("output_dir") or self.paths.root / "outputs") / run / name
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
    ray.get(actor.ready.remote(), timeout=timeout)
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
    elif _ray_address(cfg):
        name = cfg.cluster.name
        join(_ray_address(cfg), name)
    else:
        head = ClusterState.load(Path(root or cfg.cluster.root))
        name = head.name
        join(head.ray_address, name)
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


def fetch_credentials(cluster_name: str) -> credentials.Credentials:
    return _ask(cluster_name, "credentials")


def fetch_manifest(cluster_name: str) -> Manifest | None:
    return _ask(cluster_name, "manifest")


def publish_manifest(cluster_name: str, manifest: Manifest) -> list[int]:
    return _ask(cluster_name, "publish_manifest", manifest)


def generations(cluster_name: str, dataset: str, keep_old_s: float) -> list[str]:
    return _ask(cluster_name, "generations", dataset, keep_old_s)


def put_report(cluster_name: str, run: str, name: str, data: bytes) -> str:
    return _ask(cluster_name, "put_report", run, name, data)
