"""The Registry: the cluster's facts, held in Ray so that every host finds them there.

One named, detached actor pinned to the head node holds the cluster state (nodes, their
ids and addresses, configuration), the MinIO credentials and the namespace (one manifest per
dataset or file, `fasterfs.core.namespace`), and
takes job reports for the dashboard. Any process that can reach Ray asks it; no host
reads another host's files.

Why an actor rather than Ray's GCS key-value store: the KV store is an internal API
(`ray.experimental.internal_kv`), has no notion of pushing a new manifest to the
StorageNodes, and keeps nothing once the GCS restarts without Redis. The actor has a
narrow public surface, pushes each change of the namespace to every StorageNode before
ingest returns (each writes it to its own disk: a change is acknowledged once
cluster.durable_copies hosts hold it), and keeps its facts on the head's own disk (the state
file, the 0600 credentials file, the namespace store), so a restarted Registry knows everything
again, and a head that lost its disk takes them back from the hosts (fasterfs.control.head_recovery).
"""
from __future__ import annotations

import logging
import os
import re
from functools import partial
from pathlib import Path

from ..core.config import Paths
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write
from ..core.lease import Lease
from ..core.manifest import Manifest
from ..meta import AttrsListing, Changes, Listing, Moves, NamespaceStore, Resolved, legacy, open_engine
from ..meta.store import TextSink, whole
from . import credentials, tls
from .credentials import ClusterKeys
from .node_directory import NodeDirectory
from .state import ClusterState, host_id, join, ray_namespace

log = logging.getLogger("fasterfs.control.registry")
NAME = "registry"
REPORT_SUFFIXES = (".json", ".png")  # what a run directory holds that the dashboard serves
PUSH_TIMEOUT_S = 60.0  # how long a namespace change waits for the StorageNodes to take it


class Registry:
    """The actor: a narrow surface over the cluster's state, its keys and CA, and its
    NamespaceStore (which it lets push each change to the StorageNodes)."""

    def __init__(self, root: str):
        self.paths = Paths(Path(root))
        self.cluster = ClusterState.load(self.paths.root)
        self.keys = credentials.load(self.paths.credentials_file)
        self.names = NamespaceStore(open_engine(self.cluster.settings.namespace_store, self.paths.root),
                                    self.cluster.name, self._push)
        legacy.adopt(self.names, self.paths.root)  # a root an earlier FasterFS kept its names in, as files
        self.repair_lease = Lease()  # one repair leader at a time; a restarted Registry starts a new epoch count

    def ready(self) -> str:
        return host_id()

    def state(self) -> dict:
        self.cluster = ClusterState.load(self.paths.root)  # `up` updates it (dashboard address) after start
        return self.cluster.to_dict()

    def credentials(self, role: str = "reader") -> credentials.Credentials:
        """One role's MinIO keys: readers get the read-only user's (fasterfs.control.credentials)."""
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

    # -- the namespace (fasterfs.meta) --------------------------------------------------------

    def manifest(self, name: str | None = None) -> Manifest | None:
        return self.names.manifest(name)

    def manifest_page(self, cursor: str) -> tuple[list[str], str | None]:
        return self.names.page(cursor)

    def manifests_of(self, names: list[str]) -> dict[str, Manifest]:
        return self.names.manifests_of(names)

    def changes(self, since: int, manifests: bool = True) -> Changes | None:
        return self.names.changes(since, manifests)

    def resolve(self, path: str) -> Resolved:
        return self.names.resolve(path)

    def listdir(self, path: str) -> Listing | None:
        return self.names.listdir(path)

    def list_attrs(self, path: str) -> AttrsListing | None:
        return self.names.attrs(path)

    def namespace_version(self) -> int:
        return self.names.version

    def names_count(self) -> int:
        return self.names.count()

    def conflict(self, name: str, kind: str) -> str | None:
        return self.names.conflict(name, kind)

    def publish_manifest(self, manifest: Manifest, prefix: str) -> list[int]:
        return self.names.publish(manifest, prefix)

    def publish_batch(self, items: list[tuple[Manifest, str]], pending: bool = False) -> tuple[int, list[int]]:
        return self.names.publish_batch(items, pending)

    def pending_write(self, pieces: list[tuple[int, str, str]]) -> None:
        self.names.pending_write(pieces)

    def update_chunks(self, items: list[tuple[str, str, Moves]], fence: tuple[int, int] | None = None
                      ) -> dict[str, list[int]]:
        """Pieces a repair moved, of many names at once (NamespaceStore.update_chunks_many).
        `fence`: (node, epoch) of the repair leader's lease it repaired under; refused unless
        that lease is still held (a leader cut off meanwhile has been replaced): what it wrote
        is then retired."""
        if fence is not None and not self.repair_lease.valid(*fence):
            self.names.update_chunks_many(items, refused=True)
            raise FasterFSError(f"repair by node {fence[0]} under lease epoch {fence[1]} refused: the lease is "
                                f"{self.repair_lease.to_dict()}")
        return self.names.update_chunks_many(items)

    def spread(self, node_count: int) -> list[str]:
        return self.names.spread(node_count)

    def lease_repair(self, node: int, ttl_s: float) -> int | None:
        """The repair leader's lease for `node` (granted or renewed: its epoch), or None."""
        return self.repair_lease.acquire(node, ttl_s)

    def expired_pieces(self, keep_old_s: float) -> list[tuple[int, str]]:
        return self.names.expired_pieces(keep_old_s)

    def remove(self, name: str) -> Manifest:
        return self.names.remove(name)

    def expired(self, keep_old_s: float) -> list[dict]:
        return self.names.expired(keep_old_s)

    def generations(self, dataset: str) -> list[str]:
        return self.names.generations(dataset)

    def _push(self, method: str, arg, timeout: float = PUSH_TIMEOUT_S) -> list[int]:
        """A namespace change to every StorageNode, waited for up to `timeout`."""
        import ray

        self.state()
        nodes = NodeDirectory(self.cluster.ray_namespace)  # looked up now: a node may be a new actor since
        refs = {}
        shared = ray.put(arg)  # pickled once, not once per node (0.5 s of the head a batch at 128 nodes)
        for n in self.cluster.nodes:
            actor = nodes.get(n.index)
            if actor is None:
                log.warning("node %d has no StorageNode to take the namespace change", n.index)
            else:
                refs[n.index] = getattr(actor, method).remote(shared)
        done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        took = []
        for i, ref in refs.items():
            if ref in done:
                try:
                    ray.get(ref, timeout=0)  # taken: held on that host's disk (its Replica)
                    took.append(i)
                except Exception as e:
                    log.warning("node %d did not take the namespace change: %s", i, e)
        needed = min(self.cluster.settings.durable_copies - 1, len(self.cluster.nodes))
        if len(took) < needed:
            raise FasterFSError(
                f"the namespace change is stored on the head, but only {len(took)} of the "
                f"{len(self.cluster.nodes)} storage hosts (nodes {sorted(took)}) hold it after {timeout:.0f} s, "
                f"and cluster.durable_copies={self.cluster.settings.durable_copies} asks for {needed}: it is not "
                "acknowledged (it would be lost with the head's disk); see `fasterfs status`, then retry")
        return took

    # -- reports --------------------------------------------------------------------------

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
        name=NAME, namespace=state.ray_namespace, lifetime="detached", num_cpus=0, max_restarts=-1,
        max_task_retries=3, max_concurrency=16,  # a StorageNode restarting asks it while it pushes a manifest
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id, soft=False),
    ).remote(state.root)
    ray.get(actor.ready.remote(), timeout=timeout)  # type: ignore[attr-defined]  # Ray's typing of actor methods
    return actor


def handle(cluster_name: str):
    """The Registry of a cluster this process is connected to through Ray."""
    import ray

    if not ray.is_initialized():  # else Ray's auto-init would join whatever cluster it finds, or wait for one
        raise FasterFSError(f"this process is not connected to the Ray cluster of FasterFS cluster {cluster_name!r}: "
                            "connect first (fasterfs.connect, cluster.connect_ray)")
    try:
        return ray.get_actor(NAME, namespace=ray_namespace(cluster_name))
    except ValueError:
        raise FasterFSError(f"the Ray cluster has no FasterFS registry for cluster {cluster_name!r} (Ray namespace "
                            f"{ray_namespace(cluster_name)}): start FasterFS on it with `fasterfs up` "
                            "(cluster.attach=true for a Ray cluster started elsewhere), or set cluster.name") from None


def find(cfg, root=None) -> ClusterState:
    """The running cluster, from any host: inside a Ray task or actor, the cluster it runs in
    (its Ray namespace names it); elsewhere the one at cluster.ray_address (or RAY_ADDRESS), or else the one
    whose head state file is under `root` (this is the head). Joins it and asks its Registry."""
    from .state import in_ray_worker

    if in_ray_worker():
        import ray

        ns = ray.get_runtime_context().namespace or ""
        name = ns[len(ray_namespace("")):] if ns.startswith(ray_namespace("")) else cfg.cluster.name
    elif address := ray_address(cfg):
        name = cfg.cluster.name
        join(address, name, cfg.cluster.root, cfg.cluster.head_wait_s)
    else:
        head = ClusterState.load(Path(root or cfg.cluster.root))
        name = head.name
        join(head.ray_address, name, head.root, cfg.cluster.head_wait_s)
    return find_in_ray(name)


def ray_address(cfg) -> str | None:
    """cluster.ray_address, else RAY_ADDRESS as Ray sets it for a `ray job submit` driver
    (<host>:<port>; not "auto" nor a dashboard URL)."""
    env = os.environ.get("RAY_ADDRESS", "")
    return cfg.cluster.ray_address or (env if re.fullmatch(r"[\w.-]+:\d+", env) else None)


def ask(cluster_name: str, what: str, *args, timeout: float = 120):
    """The Registry's method `what` called with `args`, waited for up to `timeout`. An error the
    method raised comes as itself; the Registry gone or silent (its head lost, say) is one line
    naming it, not Ray's traceback."""
    import ray

    try:
        return ray.get(getattr(handle(cluster_name), what).remote(*args), timeout=timeout)
    except ray.exceptions.RayTaskError:
        raise
    except ray.exceptions.RayError as e:
        said = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise FasterFSError(f"the Registry of cluster {cluster_name!r} (on the head) did not answer {what}: "
                            f"{said}") from None


def find_in_ray(cluster_name: str) -> ClusterState:
    return ClusterState.from_dict(ask(cluster_name, "state")).trust()


def fetch_credentials(cluster_name: str, role: str = "reader") -> credentials.Credentials:
    """MinIO keys for `role`: "reader" (list and GET only) unless the caller writes ("admin")."""
    return ask(cluster_name, "credentials", role)


def fetch_keys(cluster_name: str) -> credentials.ClusterKeys:
    return ask(cluster_name, "all_keys")


def fetch_keys_kept(cluster_name: str, copy: Path, who: str) -> credentials.ClusterKeys:
    """The MinIO keys from the Registry, kept at `copy` on this host's disk (0600); or that copy
    when the Registry does not answer (Ray started a storage node again while the head was away)."""
    import ray

    try:
        keys = fetch_keys(cluster_name)
    except (FasterFSError, ray.exceptions.RayError) as e:
        if not copy.exists():
            raise FasterFSError(f"{who}: the Registry does not answer ({e}) and this host holds no copy of the "
                                f"keys at {copy}") from None
        log.warning("%s: the Registry does not answer; MinIO's keys from %s", who, copy)
        return credentials.load(copy)
    credentials.save(copy, keys)
    return keys


def issue_certificate(cluster_name: str, address: str, public_key_pem: str) -> tuple[str, str]:
    return ask(cluster_name, "issue_certificate", address, public_key_pem)


def fetch_manifest(cluster_name: str, name: str | None = None) -> Manifest | None:
    return ask(cluster_name, "manifest", name)


def fetch_manifests(cluster_name: str, texts: TextSink | None = None) -> tuple[int, dict[str, Manifest]]:
    """The whole namespace, decoded by the caller from pages of texts (a StorageNode starting at a
    million names: the head serves rows, it does not parse or pickle a million manifests);
    `texts` as `meta.store.whole`'s."""
    return whole(partial(namespace_version, cluster_name), partial(ask, cluster_name, "manifest_page"),
                 partial(fetch_changes, cluster_name), texts)


def fetch_manifests_of(cluster_name: str, names: list[str]) -> dict[str, Manifest]:
    return ask(cluster_name, "manifests_of", names)


def fetch_changes(cluster_name: str, since: int, manifests: bool = True) -> Changes | None:
    return ask(cluster_name, "changes", since, manifests)


def resolve(cluster_name: str, path: str) -> Resolved:
    return ask(cluster_name, "resolve", path)


def listdir(cluster_name: str, path: str) -> Listing | None:
    return ask(cluster_name, "listdir", path)


def list_attrs(cluster_name: str, path: str) -> AttrsListing | None:
    """A directory of the store with its names' attributes (None: no such directory in the
    store; a dataset's directories are in its manifest)."""
    return ask(cluster_name, "list_attrs", path)


def namespace_version(cluster_name: str) -> int:
    return ask(cluster_name, "namespace_version")


def names_count(cluster_name: str) -> int:
    return ask(cluster_name, "names_count")


def conflict(cluster_name: str, name: str, kind: str) -> str | None:
    return ask(cluster_name, "conflict", name, kind)


def publish_batch(cluster_name: str, items: list[tuple[Manifest, str]], pending: bool = False) -> tuple[int, list[int]]:
    return ask(cluster_name, "publish_batch", items, pending)


def pending_write(cluster_name: str, pieces: list[tuple[int, str, str]]) -> None:
    ask(cluster_name, "pending_write", pieces)


def publish_manifest(cluster_name: str, manifest: Manifest, prefix: str) -> list[int]:
    return ask(cluster_name, "publish_manifest", manifest, prefix)


def update_chunks(cluster_name: str, items: list[tuple[str, str, Moves]],
                  fence: tuple[int, int] | None = None) -> dict[str, list[int]]:
    return ask(cluster_name, "update_chunks", items, fence)


def spread(cluster_name: str, node_count: int) -> list[str]:
    """Every name placed on `node_count` nodes from now on (NamespaceStore.spread)."""
    return ask(cluster_name, "spread", node_count, timeout=600)


def lease_repair(cluster_name: str, node: int, ttl_s: float) -> int | None:
    import ray

    return ray.get(handle(cluster_name).lease_repair.remote(node, ttl_s), timeout=max(1.0, ttl_s / 2))


def expired_pieces(cluster_name: str, keep_old_s: float) -> list[tuple[int, str]]:
    return ask(cluster_name, "expired_pieces", keep_old_s)


def remove(cluster_name: str, name: str) -> Manifest:
    return ask(cluster_name, "remove", name)


def expired(cluster_name: str, keep_old_s: float) -> list[dict]:
    return ask(cluster_name, "expired", keep_old_s)


def generations(cluster_name: str, dataset: str) -> list[str]:
    return ask(cluster_name, "generations", dataset)


def put_report(cluster_name: str, run: str, name: str, data: bytes) -> str:
    return ask(cluster_name, "put_report", run, name, data)
