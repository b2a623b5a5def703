"""What any process needs to find the cluster: its state model, the names of its actors
and kernel attachments, and joining it through Ray.

This module starts and stops nothing (that is fasterfs.ops.cluster). The state is written
once, on the head, by `up`; every other host gets it from the cluster's Registry actor
(fasterfs.control.registry), never from a file of another host.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.config import Paths
from ..core.errors import FasterFSError, HeadUnreachable
from ..core.fsutil import atomic_write_json, owned, read_json
from . import tls

log = logging.getLogger("fasterfs.control.state")


@dataclass
class Host:
    """Where a Ray node runs: an address; on the lab, the network namespace holding it and
    the private disk (a directory of the machine) mounted at its cluster root."""

    address: str
    netns: str | None = None
    disk: str | None = None


@dataclass
class NodeState:
    index: int      # the node's id: recorded on its disk with its data (fasterfs.control.identity), stable
    address: str
    endpoint: str
    ray_pid: int | None  # the `ray start` FasterFS ran for this node; None when attached to a Ray cluster
    ray_node_id: str | None = None
    kernel_mode: str | None = None  # "real" or "simulated", as the node's StorageNode loaded it
    netns: str | None = None        # the lab host's network namespace
    host_id: str | None = None      # machine + network and mount namespaces: equal ids share a host's files
    disk: str | None = None         # the lab host's private disk (directory behind its cluster root)
    draining: bool = False          # leaving: placed on no more, its pieces moved to the others (node_join.drain)


@dataclass(frozen=True)
class Settings:
    """The cluster-wide settings every process of the cluster must agree on, typed, as `up`
    saved them in the state (ClusterState.config): one spelling of each, read from here."""
    bucket: str
    fill_mark: int       # SO_MARK of the nodes' own GETs (fills, repair, scrub): the kernel skips them
    watch: str           # own | any: whose kernel counts a reader's GET (kernel.watch)
    hot_threshold: int
    interface: str       # where the TC programs sit on each host (kernel.interface)
    md5_etags: bool
    spill_dir: str | None
    output_dir: str | None
    namespace_store: str  # the namespace store's engine (fasterfs.meta)
    durable_copies: int   # hosts that hold a namespace change before it is acknowledged (the head's store is one)

    @classmethod
    def of(cls, config: dict) -> Settings:
        k, m = config["kernel"], config["minio"]
        return cls(bucket=m["bucket"], fill_mark=int(k["fill_mark"]), watch=k["watch"],
                   hot_threshold=int(k["hot_threshold"]), interface=k["interface"], md5_etags=bool(m["md5_etags"]),
                   spill_dir=config["cluster"].get("spill_dir"), output_dir=config.get("output_dir"),
                   namespace_store=config["cluster"].get("namespace_store", "sqlite"),
                   durable_copies=int(config["cluster"].get("durable_copies", 2)))


@dataclass
class ClusterState:
    name: str
    root: str
    ray_address: str
    dashboard_url: str
    nodes: list[NodeState]
    cgroup: dict
    config: dict
    ready: bool = False
    attached: bool = False  # StorageNodes on a Ray cluster FasterFS did not start (cluster.yaml)
    head_pid: int | None = None  # `ray start` of a head that holds no data (the lab's)
    lab: dict | None = None      # the lab network to remove on teardown (fasterfs.ops.lab)
    web_url: str | None = None   # FasterFS's own dashboard (fasterfs.dashboard.dashboard), when enabled
    notebook: dict | None = None  # JupyterLab started by `fasterfs notebook`: {pid, url}
    insecure: bool = False  # attached to a Ray cluster without token auth (cluster.insecure=true)
    tls_ca: str | None = None  # the CA certificate (PEM) MinIO's certificates are checked against (minio.tls)
    namespace_pid: int | None = None  # the namespace store's server, if it has one (meta.redis_server)
    recovered: dict | None = None  # what `up` took back from the storage hosts (fasterfs.control.head_recovery)
    resumed: dict | None = None  # the last `up` that started the head again beside live nodes (cluster.resume)
    started: float = field(default_factory=time.time)

    def trust(self) -> ClusterState:
        """Verify this cluster's MinIO servers against its CA in this process (minio.tls); done
        where a process learns the cluster (registry.find_in_ray, a ReadSession, `up`), never as
        a side effect of making or unpickling a state."""
        if self.tls_ca:
            tls.trust(self.tls_ca)
        return self

    @property
    def ray_namespace(self) -> str:
        return ray_namespace(self.name)

    @property
    def settings(self) -> Settings:
        return Settings.of(self.config)

    @property
    def head_address(self) -> str:
        return self.ray_address.rsplit(":", 1)[0]

    def node(self, index: int) -> NodeState:
        for n in self.nodes:
            if n.index == index:
                return n
        raise FasterFSError(f"node {index} is not part of cluster {self.name!r} "
                            f"(its nodes are {[n.index for n in self.nodes]})")

    def placing(self) -> list[NodeState]:
        """The nodes placement puts data on: every node but those draining."""
        return [n for n in self.nodes if not n.draining]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ClusterState:
        data = dict(data, nodes=[NodeState(**n) for n in data["nodes"]])
        return cls(**data)

    def save(self) -> None:
        atomic_write_json(Paths(Path(self.root)).state_file, self.to_dict())

    @classmethod
    def load(cls, root: Path) -> ClusterState:
        """The head's own state file: only `up`/`down` on the head (and drivers there) read it."""
        path = Paths(Path(root)).state_file
        if not path.exists():
            raise FasterFSError(f"no FasterFS cluster is running under {root} (no {path.name}); start one with "
                                "`fasterfs up`, or name a running one with cluster.ray_address=<head>:<port>")
        try:
            return cls.from_dict(read_json(owned(path, "cluster state file"), "cluster state file"))
        except (KeyError, TypeError, AttributeError) as e:  # a key missing or unknown, a value of the wrong shape
            raise FasterFSError(f"cluster state file {path} is not one FasterFS wrote ({type(e).__name__}: {e}); "
                                "if no cluster runs under this root, remove it") from None

    @property
    def head_ray_pid(self) -> int | None:
        """The head's `ray start` (a head of its own, or the storage node on the head's address)."""
        if self.head_pid:
            return self.head_pid
        return next((n.ray_pid for n in self.nodes if n.address == self.head_address), None)

    def ray_processes_alive(self) -> list[int]:
        pids = [n.ray_pid for n in self.nodes] + [self.head_pid]
        return [pid for pid in pids if pid and is_ray_start(pid)]

    def running(self) -> bool:
        if not self.attached:
            return bool(self.ray_processes_alive())
        host, port = self.ray_address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return True
        except OSError:
            return False


RAY_START = "fasterfs.hosts.ray_start"  # the module a cluster's `ray start` runs as (python -m)


def is_ray_start(pid: int | None) -> bool:
    """Whether `pid` is a `ray start`: FasterFS's (RAY_START) or Ray's own command."""
    if not pid:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"start" in cmd and any(c.endswith(b"/ray") or c == RAY_START.encode() for c in cmd)


# -- names ------------------------------------------------------------------------------


def ray_namespace(cluster_name: str) -> str:
    """The Ray namespace holding a cluster's named actors."""
    return f"fasterfs-{cluster_name}"


def filter_prefix(cluster_name: str, index: int | None = None) -> str:
    """Names of a cluster's TC filters (or one node's) start with this. Both end in ':', so
    node 1's prefix never matches node 10's filters, nor cluster "a"'s cluster "ab"'s."""
    return f"ffs:{cluster_name}:" + ("" if index is None else f"{index}:")


def host_id() -> str:
    """This machine and its network and mount namespaces: processes with the same id share
    a host, and so can read each other's cache directories as local files."""
    return f"{socket.gethostname()}/{os.readlink('/proc/self/ns/net')}/{os.readlink('/proc/self/ns/mnt')}"


# -- joining through Ray -------------------------------------------------------------------


def local_address_towards(host: str, port: int) -> str:
    """The address this process would join a Ray cluster from: the head's own address when
    it is an address of this host (loopback nodes, the lab's head), else the address the
    route to the head leaves from (a lab host, a real machine). Never 127.0.0.1, which Ray
    would swap for the machine's external address."""
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return host
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # UDP: no packet is sent
        return s.getsockname()[0]


def in_ray_worker() -> bool:
    """True inside a Ray task or actor (whose cluster is the one to use). A worker has Ray loaded:
    a command that has not needs no half-second import of it to learn that it is not one."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and \
        ray._private.worker.global_worker.mode == ray._private.worker.WORKER_MODE


# What a job's driver tells Ray about itself (fasterfs.ops.job sets it): shown with the job in
# the Ray dashboard and `ray list jobs`.
DRIVER_METADATA: dict[str, str] = {}


def join(ray_address: str, cluster_name: str, root: str | None = None, head_wait_s: float | None = None):
    """Join the cluster at `ray_address` as a driver (a no-op inside a Ray worker of it), with
    the Ray token under `root` on this host if there is one (fasterfs.control.auth); a driver outlives a
    head that went away by `head_wait_s` (cluster.head_wait_s), as the cluster's Ray processes do."""
    import ray

    from . import auth

    if in_ray_worker():
        return ray
    if ray.is_initialized():
        if ray.get_runtime_context().gcs_address == ray_address:
            return ray
        ray.shutdown()  # connected to another cluster (a test's, say): switch
    auth.prepare_driver(root)
    if head_wait_s is not None:  # read by the driver's core worker as it starts
        os.environ["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(int(head_wait_s))
    host, port = ray_address.rsplit(":", 1)
    try:  # ray.init retries a GCS that is not there for many minutes
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise HeadUnreachable(f"cannot join the Ray cluster at {ray_address} from host {socket.gethostname()}: "
                              f"nothing answers there ({e.strerror or type(e).__name__}); is it up?") from None
    from ray.job_config import JobConfig

    try:
        ray.init(address=ray_address, _node_ip_address=local_address_towards(host, int(port)),
                 namespace=ray_namespace(cluster_name), logging_level=logging.WARNING, log_to_driver=False,
                 job_config=JobConfig(metadata=dict(DRIVER_METADATA)))
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        # Ray says only "failed to connect" when it refuses a driver without the right token
        raise FasterFSError(f"cannot join the Ray cluster at {ray_address} from host {socket.gethostname()}: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__} (is it up? does this host hold "
                            f"the cluster's Ray token: <cluster root>/ray_token, RAY_AUTH_TOKEN_PATH or "
                            f"~/.ray/auth_token?)") from None
    return ray


def joined() -> bool:
    """Whether this process is a driver connected to Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and not in_ray_worker()


def leave() -> None:
    """Disconnect this driver from Ray, if it joined: a process that exits connected spends
    about half a second more in Ray's exit handlers than this call takes (measured)."""
    if joined():
        import ray

        ray.shutdown()


def connect_ray(state: ClusterState):
    return join(state.ray_address, state.name, state.root, state.config.get("cluster", {}).get("head_wait_s"))


def on_node(node: NodeState, task: str | None = None, soft: bool = False) -> dict:
    """Ray options that run a task or actor on `node` and nowhere else (locality-aware
    scheduling; soft: preferably there). `task` names it in the Ray dashboard as
    "<task> @ node N]", e.g. on_node(node, "graysort.map[part 3")."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node.ray_node_id is None:
        raise FasterFSError(f"node {node.index} ({node.address}) has no Ray node yet: nothing can be placed on it")
    options: dict[str, object] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.ray_node_id, soft=soft)}
    if task:
        options["name"] = f"{task} @ node {node.index}]" if "[" in task else f"{task}[node {node.index}]"
    return options


def storage_nodes(state: ClusterState) -> list:
    """The StorageNode actors, in the order of state.nodes."""
    from .node_directory import NodeDirectory

    connect_ray(state)
    nodes = NodeDirectory(state.ray_namespace)
    return [nodes.require(n.index) for n in state.nodes]
