"""Ray nodes: the `ray start` processes of a cluster, one per host (and one for a head that holds
no data), with every port fixed, the cluster's token and environment, started in the cluster's
cgroup and waited for. A lab host's node runs in its own mount namespace (fasterfs.hosts.private_host).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from ..control import auth
from ..control.state import RAY_START, ClusterState, Host, NodeState, connect_ray
from ..core import process
from ..core.cgroup import ProjectCgroup
from ..core.config import HEAD_SLOT, NODE_PORT_STRIDE, PROJECT_DIR, Layout, Paths, lobster_dir
from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write, log_tail, private_dir
from ..node.minio_server import check_port_free, endpoint

log = logging.getLogger("fasterfs.hosts.ray_nodes")


def ray_temp_dir(root: str | Path, index: int | None = None) -> str:
    """Ray's directory on this machine's /tmp (a lab host's own) for the head of the cluster
    under `root` (index None) or its node `index`. One per cluster: Ray records the last cluster
    started in <temp dir>/ray_current_cluster and gives a job's driver that address (its job
    supervisor resolves "auto" there), so with one /tmp/ray for all, a job submitted to one
    cluster joins whichever started last. One per node: Ray names a node's sockets and logs by
    counting what its directory holds already, so nodes sharing one can only start one at a
    time. Short: socket paths (<temp dir>/session_<time>_<pid>/sockets/plasma_store) must stay
    under 108 bytes."""
    base = "/tmp/ray-ffs-" + hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]
    return base if index is None else f"{base}-{index}"


def _software_under_tmp() -> list[str]:
    """This checkout and its virtualenv, where a host's own /tmp would hide them."""
    paths = sorted({str(PROJECT_DIR), str(Path(sys.prefix).resolve())})
    under = [p for p in paths if p.startswith(("/tmp/", "/dev/shm/"))]
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


def ray_env(name: str, root: str | Path, cluster_cfg: DictConfig) -> dict[str, str]:
    """The environment every `ray start` gets: this checkout's interpreter first on PATH, so
    a job's `python` (`ray job submit -- python jobs/x.py`) and every worker run in the
    project's environment whatever shell submitted it; the Ray token's file (fasterfs.control.auth);
    the cluster's name and root, so every worker, job driver and process they spawn finds this
    cluster's files and token, never those of another cluster on the machine."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [venv_bin] + [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != venv_bin]
    # a job's code comes from its uploaded copy (`--working-dir .`), not this checkout: the
    # sample data's place must come with the environment
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}  # by file only: no token in environ
    # A `ray start --block` told to stop first waits up to 30 s for its node to drain (for Ray
    # Serve's proxies), which never happens while a StorageNode holds its lease: at once instead.
    # No event-loop statistics and no debug_state.txt every 10 s in each Ray process (Ray's own
    # debugging aids): 1.5% of a core less for an idle 2-node cluster (measured).
    # Ray's head fault tolerance: every Ray process (raylets, workers, drivers such as the mount's
    # agent) waits this long for a GCS that went away before ending itself (Ray's 60 s took every
    # reader down with the head).
    env["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(int(cluster_cfg.head_wait_s))
    # A Ray worker past the node's CPU count (readers' tasks take none) is ended after this
    # long idle, not Ray's 1 s: starting one again takes 0.5 to 1 s of CPU, and reads come in bursts.
    env["RAY_idle_worker_killing_time_threshold_ms"] = str(int(float(cluster_cfg.idle_worker_s) * 1000))
    # One worker process starting at a time per node: with Ray's default (one per CPU) a raylet
    # asked for one worker started two, and a GraySort of 2 nodes ran 6 workers for 4 tasks
    # (4.9 s of their CPU against 4.4 s, the job as fast: measured).
    env["RAY_worker_maximum_startup_concurrency"] = "1"
    return dict(env, RAY_USAGE_STATS_ENABLED="0", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
                RAY_event_stats="false", RAY_debug_dump_period_milliseconds="0",
                PATH=os.pathsep.join(path), VIRTUAL_ENV=sys.prefix,
                FASTERFS_LOBSTER_DIR=lobster_dir(), FASTERFS_CLUSTER=name, FASTERFS_ROOT=str(root),
                **auth.ray_env(auth.token_file(root)))


def provision(host: Host, root: str | Path) -> None:
    """What a host needs on its own disk before its `ray start`: the cluster's Ray token
    (a lab host's disk is behind its cluster root; loopback nodes share the head's)."""
    if host.disk:
        token = auth.read(auth.token_file(root))
        atomic_write(auth.token_file(host.disk), token.encode(), mode=0o600)


def ray_start_args(cfg, host: Host, head: Host, index: int | None, is_head: bool) -> list[str]:
    """`ray start` for a storage node (index given) or a coordinating head without storage."""
    c = cfg.cluster
    # No log monitor: it streams workers' output to drivers, and FasterFS's drivers take none
    # (state.join: log_to_driver=False); it listed the logs directory every 0.1 s, an idle node's
    # largest cost (1.7% of a core with a hundred worker logs). The logs stay in Ray's files.
    args = [sys.executable, "-m", RAY_START, "start", "--block", "--disable-usage-stats", "--include-log-monitor=false",
            f"--node-ip-address={host.address}", f"--object-store-memory={int(c.object_store_mb) * 1024 * 1024}"]
    if index is None:
        args += ["--num-cpus=0", f"--dashboard-agent-listen-port={c.agent_port + HEAD_SLOT}"]
    else:
        args += [f"--num-cpus={c.cpus_per_node}", f"--dashboard-agent-listen-port={c.agent_port + index}"]
    # every port a node listens on is fixed (README, "Addresses and ports"): nothing random
    base = node_ports(cfg, index)
    args += [f"--node-manager-port={base}", f"--object-manager-port={base + 1}", f"--metrics-export-port={base + 2}",
             f"--dashboard-agent-grpc-port={base + 3}", f"--runtime-env-agent-port={base + 4}",
             f"--min-worker-port={c.worker_ports[0]}", f"--max-worker-port={c.worker_ports[1]}"]
    if is_head:
        # objects beyond the object store spill to files here (GraySort larger than memory)
        spill = {"type": "filesystem", "params": {"directory_path": str(c.spill_dir)}}
        system = {"object_spilling_config": json.dumps(spill), "health_check_period_ms": int(c.health_check_period_ms)}
        args += ["--head", f"--port={c.ray_port}", "--include-dashboard=true", f"--system-config={json.dumps(system)}",
                 f"--dashboard-host={host.address}", f"--dashboard-port={c.dashboard_port}"]
        args += [] if c.client_port is None else [f"--ray-client-server-port={c.client_port}"]
    else:
        args += [f"--address={head.address}:{c.ray_port}"]
    args += [f"--temp-dir={ray_temp_dir(c.root, None if is_head else index)}"]
    if host.disk:
        args = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
                "fasterfs.hosts.private_host", str(c.root), host.disk, ":".join(_software_under_tmp()), *args]
    # nsenter switches only the network namespace; `ip netns exec` would also remount /sys
    # and hide the cgroup2 hierarchy the node's SOCK_OPS program attaches to.
    return (["nsenter", f"--net=/run/netns/{host.netns}", "--"] if host.netns else []) + args


def node_ports(cfg, index: int | None) -> int:
    """The first of node `index`'s five fixed Ray ports, seven on the head (None: a head
    without storage)."""
    return int(cfg.cluster.node_ports) + NODE_PORT_STRIDE * (HEAD_SLOT if index is None else index)


def gcs_dir(root: str | Path) -> Path:
    """Where the head's GCS keeps its tables (Ray's embedded RocksDB backend), on the head's disk."""
    return Paths(Path(root)).root / "gcs"


def head_env(cfg, env: dict, index: int | None) -> dict:
    """The head's autoscaler monitor and dashboard also serve Prometheus metrics, by default
    on 44217 and 44227 of every interface (clusters would collide): in the head's port block.
    The GCS keeps its tables in RocksDB on the head's disk: a head started again on the same
    disk takes up the same session, and the nodes, actors and jobs that outlived it carry on."""
    base = node_ports(cfg, index)
    storage = private_dir(gcs_dir(cfg.cluster.root), "the GCS's directory")
    return dict(env, AUTOSCALER_METRIC_PORT=str(base + 5), DASHBOARD_METRIC_PORT=str(base + 6),
                RAY_gcs_storage="rocksdb", RAY_gcs_storage_path=str(storage))


def check_ports(cfg, head: Host, hosts: list[Host]) -> None:
    """Ports on addresses of this namespace (a fresh namespace has nothing listening)."""
    if head.netns is None:
        check_port_free(head.address, cfg.cluster.ray_port, "Ray GCS (cluster.ray_port)")
        check_port_free(head.address, cfg.cluster.dashboard_port, "Ray dashboard (cluster.dashboard_port)")
        if cfg.cluster.client_port is not None:
            check_port_free(head.address, cfg.cluster.client_port, "Ray client (cluster.client_port)")
        if cfg.dashboard.enabled:
            check_port_free(head.address, cfg.dashboard.port, "FasterFS dashboard (dashboard.port)")
    for i, host in enumerate(hosts):
        check_host_ports(cfg, host, i, host == head)


def check_host_ports(cfg, host: Host, index: int, is_head: bool = False) -> None:
    """Storage host `host`'s ports as node `index` (Ray's and MinIO's), on an address of this
    namespace (a lab host's fresh namespace has nothing listening)."""
    if host.netns is None:
        check_node_ports(cfg, host, index, is_head)
        check_port_free(host.address, cfg.minio.port, "MinIO API (minio.port)")
        check_port_free(host.address, cfg.minio.console_port, "MinIO console (minio.console_port)")


def check_node_ports(cfg, host: Host, index: int | None, is_head: bool) -> None:
    """The fixed ports of Ray node `index` (None: a head without storage), free on its address."""
    agent = cfg.cluster.agent_port + (HEAD_SLOT if index is None else index)
    check_port_free("127.0.0.1", agent, "Ray dashboard agent (cluster.agent_port)")
    name = "the head" if index is None else f"node {index}"
    for port in range(node_ports(cfg, index), node_ports(cfg, index) + (7 if is_head else 5)):
        check_port_free(host.address, port, f"Ray {name} (cluster.node_ports)")


def wait_node_ports(cfg, host: Host, index: int | None, is_head: bool, timeout: float) -> None:
    """A Ray node started where one just died: the dead node's agents let go of its fixed ports
    seconds after its raylet (its dashboard agent's gRPC port, on every interface, still held
    10 s later was seen), and the new node's agent, failing to bind, takes the node down."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check_node_ports(cfg, host, index, is_head)
        except FasterFSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def head_node_id(state: ClusterState) -> str:
    import ray

    head = next((n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == state.head_address),
                None)
    if head is None:
        raise FasterFSError(f"no Ray node has the head's address {state.head_address}; give cluster.ray_address "
                            "as <head IP>:<port>")
    return head


def start_ray(cfg, layout: Layout, state: ClusterState, hosts: list[Host], head: Host) -> None:
    """One `ray start` per host (and one for a head without storage), all side by side (a
    node's `ray start` waits for the head's GCS); records their PIDs."""
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    env = ray_env(state.name, state.root, cfg.cluster)
    logs = layout.paths.log_dir
    for i, host in [(None, head)] * (head not in hosts) + list(enumerate(hosts)):
        if not host.disk:  # on this machine's /tmp, at a predictable name: another user's is never used
            private_dir(ray_temp_dir(state.root, None if host == head else i), "Ray's directory")
    # a new cluster, a new session: tables an earlier cluster's GCS left on this disk are not taken up
    shutil.rmtree(gcs_dir(state.root), ignore_errors=True)
    if head not in hosts:  # a coordinating head that holds no data (the lab's)
        head_log = logs / "ray-head.log"
        head_proc = cgroup.spawn(ray_start_args(cfg, head, head, None, True), head_log,
                                 head_env(cfg, env, None), child="head")
        state.head_pid = head_proc.pid
        state.save()

    def spawn(i: int):  # each node in a cgroup of its own, which its StorageNode's SOCK_OPS program watches
        host = hosts[i]
        return cgroup.spawn(ray_start_args(cfg, host, head, i, host == head), logs / f"ray-node-{i}.log",
                            head_env(cfg, env, i) if host == head else env, child=f"node-{i}")
    for i, host in enumerate(hosts):
        provision(host, state.root)
        proc = spawn(i)
        if host == head:
            head_proc, head_log = proc, logs / f"ray-node-{i}.log"
        # provisional (position, not id): lets `down` stop it if we fail from here on
        state.nodes.append(NodeState(i, host.address, endpoint(host.address, cfg.minio.port, cfg.minio.tls), proc.pid,
                                     netns=host.netns, disk=host.disk))
        state.save()
    wait_for_head(cfg, head, head_proc, head_log)
    connect_ray(state)
    _wait_for_nodes(cfg, state, {head.address} | {host.address for host in hosts}, lambda node: spawn(node.index).pid)


def wait_for_head(cfg, head: Host, proc, log_path: Path) -> None:
    import socket

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FasterFSError(f"Ray head on {head.address} exited at start:\n{log_tail(log_path)}")
        try:
            socket.create_connection((head.address, cfg.cluster.ray_port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise FasterFSError(f"Ray head on {head.address}:{cfg.cluster.ray_port} did not start within "
                        f"{cfg.cluster.start_timeout_s} s; see {log_path}")


def _wait_for_nodes(cfg, state: ClusterState, wanted: set[str], again: Callable[[NodeState], int]) -> dict[str, str]:
    """Wait until every node has joined; check none reports an address other than its own. A
    node whose `ray start` exits at start is started once more (`again`: its new PID): Ray gives
    a node's agents a fixed 30 s to come up, which a machine busy starting several nodes (the
    lab's, beside the suite's other clusters) can miss."""
    import ray

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    logs = Paths(Path(state.root)).log_dir
    retried: set[int] = set()
    while True:
        alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        stray = set(alive) - wanted
        if stray:
            raise FasterFSError(f"Ray nodes report addresses {sorted(stray)} outside the cluster's {sorted(wanted)}")
        if set(alive) == wanted:
            return alive
        for node in state.nodes:
            # alive, not "is `ray start`": a lab host's process sets up its namespaces before it
            # becomes `ray start`, which on a busy machine can take longer than the first look
            if not process.running(node.ray_pid):
                if node.index in retried or node.address == state.head_address:
                    raise FasterFSError(f"Ray node {node.index} ({node.address}) exited at start:\n"
                                        f"{log_tail(logs / f'ray-node-{node.index}.log')}")
                log.warning("Ray node %d (%s) exited at start; starting it once more", node.index, node.address)
                retried.add(node.index)
                node.ray_pid = again(node)
                state.save()
        if time.monotonic() > deadline:
            raise FasterFSError(f"only {sorted(alive)} of {sorted(wanted)} joined within "
                                f"{cfg.cluster.start_timeout_s} s")
        time.sleep(0.3)
