"""The cluster's lifecycle: `up` starts one Ray node per loopback address and a
StorageNode actor pinned to each; `down` stops all of it; `status` reports it.

Each Ray node is a real raylet with its own object store, started by
`ray start --block` inside the cluster's cgroup. The state file written by `up`
(the cluster root's cluster.json) is what every other command and the client read
to find the cluster; it is written atomically once the cluster is ready, and a
provisional one first so that `down` can clean up a failed `up`.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import credentials
from .cgroup import ProjectCgroup
from .config import Layout, Paths, as_cfg, minio_binary, to_dict
from .errors import FasterFSError
from .fsutil import atomic_write_json, read_json
from .minio_server import check_port_free
from .storage_node import StorageNode, actor_name, filter_prefix

log = logging.getLogger("fasterfs.cluster")


@dataclass
class NodeState:
    index: int
    address: str
    endpoint: str
    ray_pid: int | None  # the `ray start` FasterFS ran for this node; None when attached to a Ray cluster
    ray_node_id: str | None = None
    kernel_mode: str | None = None  # "real" or "simulated", as the node's StorageNode loaded it
    netns: str | None = None        # the lab host's network namespace
    host_id: str | None = None      # machine + network namespace: nodes with equal ids share a host


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
    lab: dict | None = None      # the lab network to remove on teardown (fasterfs.lab)
    web_url: str | None = None   # FasterFS's own dashboard (fasterfs.dashboard), when enabled
    started: float = field(default_factory=time.time)

    @property
    def namespace(self) -> str:
        return f"fasterfs-{self.name}"

    @property
    def head_address(self) -> str:
        return self.ray_address.rsplit(":", 1)[0]

    def save(self) -> None:
        atomic_write_json(Paths(Path(self.root)).state_file, asdict(self))

    @classmethod
    def load(cls, root: Path) -> "ClusterState":
        path = Paths(Path(root)).state_file
        if not path.exists():
            raise FasterFSError(f"no FasterFS cluster is running under {root} (no {path.name}); "
                                "start one with `fasterfs up`")
        data = read_json(path, "cluster state file")
        data["nodes"] = [NodeState(**n) for n in data["nodes"]]
        return cls(**data)

    def ray_processes_alive(self) -> list[int]:
        pids = [n.ray_pid for n in self.nodes] + [self.head_pid]
        return [pid for pid in pids if pid and _is_ray_start(pid)]

    def running(self) -> bool:
        if not self.attached:
            return bool(self.ray_processes_alive())
        import socket

        host, port = self.ray_address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return True
        except OSError:
            return False


def _is_ray_start(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"start" in cmd and any(c.endswith(b"/ray") for c in cmd)


# -- connecting ---------------------------------------------------------------------


def connect_ray(state: ClusterState):
    """Join the cluster as a driver, on the head's loopback address (never the external one)."""
    import ray

    if ray.is_initialized():
        if ray.get_runtime_context().gcs_address == state.ray_address:
            return ray
        ray.shutdown()  # connected to another cluster (a test's, say): switch
    ray.init(address=state.ray_address, _node_ip_address=state.head_address, namespace=state.namespace,
             logging_level=logging.WARNING, log_to_driver=False)
    return ray


def pinned(node: NodeState) -> dict:
    """Ray options that run a task or actor on `node` and nowhere else (locality-aware scheduling)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.ray_node_id, soft=False)}


def storage_nodes(state: ClusterState) -> list:
    ray = connect_ray(state)
    return [ray.get_actor(actor_name(n.index), namespace=state.namespace) for n in state.nodes]


# -- up -------------------------------------------------------------------------------


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


@dataclass
class Host:
    """Where a Ray node runs: an address, and the network namespace holding it (None: this one)."""

    address: str
    netns: str | None = None


def _ray_start_args(cfg, host: Host, head: Host, index: int | None, is_head: bool) -> list[str]:
    """`ray start` for a storage node (index given) or a coordinating head without storage."""
    c = cfg.cluster
    args = [_ray_bin(), "start", "--block", "--disable-usage-stats", f"--node-ip-address={host.address}",
            f"--object-store-memory={int(c.object_store_mb) * 1024 * 1024}"]
    if index is None:
        args += ["--num-cpus=0", f"--dashboard-agent-listen-port={c.agent_port + 99}"]
    else:
        args += [f"--num-cpus={c.cpus_per_node}", f"--resources={json.dumps({f'fasterfs_node_{index}': 1000})}",
                 f"--dashboard-agent-listen-port={c.agent_port + index}"]
    if is_head:
        # objects beyond the object store spill to files here (GraySort larger than memory)
        spill = {"type": "filesystem", "params": {"directory_path": str(c.spill_dir)}}
        args += ["--head", f"--port={c.ray_port}", "--include-dashboard=true",
                 f"--system-config={json.dumps({'object_spilling_config': json.dumps(spill)})}",
                 f"--dashboard-host={host.address}", f"--dashboard-port={c.dashboard_port}",
                 f"--ray-client-server-port={c.client_port}"]
    else:
        args += [f"--address={head.address}:{c.ray_port}"]
    # nsenter switches only the network namespace; `ip netns exec` would also remount /sys
    # and hide the cgroup2 hierarchy the node's SOCK_OPS program attaches to.
    return (["nsenter", f"--net=/run/netns/{host.netns}", "--"] if host.netns else []) + args


def _check_ports(cfg, head: Host, hosts: list[Host]) -> None:
    """Ports on addresses of this namespace (a fresh namespace has nothing listening)."""
    if head.netns is None:
        check_port_free(head.address, cfg.cluster.ray_port, "Ray GCS (cluster.ray_port)")
        check_port_free(head.address, cfg.cluster.dashboard_port, "Ray dashboard (cluster.dashboard_port)")
        check_port_free(head.address, cfg.cluster.client_port, "Ray client (cluster.client_port)")
        if cfg.dashboard.enabled:
            check_port_free(head.address, cfg.dashboard.port, "FasterFS dashboard (dashboard.port)")
    for i, host in enumerate(hosts):
        if host.netns is None:
            check_port_free("127.0.0.1", cfg.cluster.agent_port + i, "Ray dashboard agent (cluster.agent_port)")
            check_port_free(host.address, cfg.minio.port, "MinIO API (minio.port)")
            check_port_free(host.address, cfg.minio.console_port, "MinIO console (minio.console_port)")


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def up(cfg, hosts: list[Host] | None = None, head: Host | None = None, lab: dict | None = None) -> ClusterState:
    """Start the cluster and a StorageNode with its MinIO on each storage host. Undoes
    everything if any step fails.

    By default the hosts are this machine's loopback addresses from the configuration and
    the first is also the Ray head. The lab passes network-namespace hosts and a head of
    its own (on its bridge) that holds no data; with cluster.attach, the nodes of a Ray
    cluster started elsewhere are used instead."""
    cfg = as_cfg(cfg)
    layout = Layout.of(cfg)
    if layout.paths.state_file.exists():
        old = ClusterState.load(layout.paths.root)
        if old.running():
            raise FasterFSError(f"a FasterFS cluster is already running under {layout.paths.root} "
                                f"(Ray at {old.ray_address}); run `fasterfs down` first")
        log.warning("cleaning up after a cluster that did not shut down: %s", layout.paths.state_file)
        teardown(old)
    minio_binary(cfg)  # fail now, not inside an actor, if MinIO is missing
    credentials.create(layout.paths.credentials_file)
    if cfg.cluster.attach:
        state = _attach_ray(cfg, layout)
    else:
        hosts = hosts or [Host(a) for a in layout.addresses]
        head = head or hosts[0]
        _check_ports(cfg, head, hosts)
        conf = to_dict(cfg)
        conf["nodes"] = len(hosts)
        state = ClusterState(
            name=cfg.cluster.name, root=str(layout.paths.root), ray_address=f"{head.address}:{cfg.cluster.ray_port}",
            dashboard_url=f"http://{head.address}:{cfg.cluster.dashboard_port}", nodes=[],
            cgroup=ProjectCgroup.create(cfg.cluster.name, layout.paths.root).to_dict(), config=conf, lab=lab)
    try:
        _mount_bpffs(layout.paths.bpffs)
        if not cfg.cluster.attach:
            _start_ray(cfg, layout, state, hosts, head)
        _start_storage_nodes(cfg, state)
        state.ready = True
        state.save()
        if cfg.dashboard.enabled:  # it reads the saved state
            state.web_url = _start_dashboard(cfg, state)
            state.save()
        return state
    except BaseException:
        teardown(state)
        layout.paths.state_file.unlink(missing_ok=True)
        raise


def _mounted(path: Path) -> bool:
    try:
        return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())
    except OSError:
        return False


def _mount_bpffs(path: Path) -> None:
    """A bpffs of the cluster's own for pinned maps; without one, readers rely on events alone."""
    from . import bpf

    if _mounted(path) or bpf.unavailable_reason() is not None:
        return
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "bpf", "bpf", str(path)], capture_output=True).returncode != 0:
        log.warning("could not mount bpffs at %s; cache readers will rely on STALE events alone", path)


def _unmount_bpffs(path: Path) -> bool:
    if not _mounted(path):
        return False
    subprocess.run(["umount", str(path)], capture_output=True)
    try:
        path.rmdir()
    except OSError:
        pass
    return not _mounted(path)


def _start_ray(cfg, layout: Layout, state: ClusterState, hosts: list[Host], head: Host) -> None:
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    logs = layout.paths.log_dir
    if head not in hosts:  # a coordinating head that holds no data (the lab's)
        proc = cgroup.spawn(_ray_start_args(cfg, head, head, None, True), logs / "ray-head.log", env, child="head")
        state.head_pid = proc.pid
        state.save()
        _wait_for_head(cfg, head, proc, logs / "ray-head.log")
        connect_ray(state)
    joined = {head.address} if head not in hosts else set()
    for i, host in enumerate(hosts):
        # each node in a cgroup of its own, which its StorageNode's SOCK_OPS program watches
        proc = cgroup.spawn(_ray_start_args(cfg, host, head, i, host == head), logs / f"ray-node-{i}.log", env,
                            child=f"node-{i}")
        state.nodes.append(NodeState(i, host.address, f"http://{host.address}:{cfg.minio.port}", proc.pid,
                                     netns=host.netns))
        state.save()  # provisional: lets `down` clean up if we fail from here on
        if host == head:
            _wait_for_head(cfg, head, proc, logs / f"ray-node-{i}.log")
            connect_ray(state)
        # One at a time: raylets started back to back race for the same socket names.
        joined.add(host.address)
        node_ids = _wait_for_nodes(cfg, state, joined)
    for node in state.nodes:
        node.ray_node_id = node_ids[node.address]


def _attach_ray(cfg, layout: Layout) -> ClusterState:
    """StorageNodes on every node of a running Ray cluster (started by `ray up cluster.yaml`)."""
    import ray

    if not cfg.cluster.ray_address:
        raise FasterFSError("option cluster.attach=true needs cluster.ray_address=<head>:<port> of the Ray cluster")
    head = cfg.cluster.ray_address.rsplit(":", 1)[0]
    ray.shutdown()
    ray.init(address=cfg.cluster.ray_address, _node_ip_address=head, namespace=f"fasterfs-{cfg.cluster.name}",
             logging_level=logging.WARNING, log_to_driver=False)  # run on the head node, as `ray exec` does
    alive = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
    nodes = [NodeState(i, addr, f"http://{addr}:{cfg.minio.port}", None, node_id)
             for i, (addr, node_id) in enumerate(alive)]
    conf = to_dict(cfg)
    conf["nodes"] = len(nodes)
    return ClusterState(name=cfg.cluster.name, root=str(layout.paths.root), ray_address=cfg.cluster.ray_address,
                        dashboard_url=f"http://{head}:{cfg.cluster.dashboard_port}", nodes=nodes,
                        cgroup=ProjectCgroup(None).to_dict(), config=conf, attached=True)


def _start_storage_nodes(cfg, state: ClusterState) -> None:
    import ray

    actor_cls = ray.remote(StorageNode)
    actors = [actor_cls.options(
        name=actor_name(node.index), namespace=state.namespace, lifetime="detached",
        max_restarts=-1, max_task_retries=3, num_cpus=0, **pinned(node),
    ).remote(node.index, node.address, state.config) for node in state.nodes]
    state.save()
    try:
        ready = ray.get([a.ready.remote() for a in actors], timeout=cfg.cluster.start_timeout_s)
    except ray.exceptions.RayActorError as e:
        raise FasterFSError(f"a StorageNode failed to start: {e}") from None
    for info, node in zip(ready, state.nodes):
        if info["node_id"] != node.ray_node_id:
            raise FasterFSError(f"StorageNode {node.index} landed on the wrong Ray node")
        node.kernel_mode = info["kernel_mode"]
        node.host_id = info["host_id"]


def _start_dashboard(cfg, state: ClusterState) -> str:
    """FasterFS's web dashboard, as an actor on the head node listening on the head's address."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .dashboard import ACTOR_NAME, DashboardServer

    head = next((n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == state.head_address), None)
    if head is None:
        raise FasterFSError(f"no Ray node has the head's address {state.head_address} for the FasterFS dashboard; "
                            "give cluster.ray_address as <head IP>:<port>, or set dashboard.enabled=false")
    actor = ray.remote(DashboardServer).options(  # restarted (and listening again) if its worker dies
        name=ACTOR_NAME, namespace=state.namespace, lifetime="detached", num_cpus=0, max_restarts=3,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
    ).remote(state.root, state.head_address, cfg.dashboard.port, cfg.dashboard.refresh_s)
    try:
        return ray.get(actor.ready.remote(), timeout=cfg.cluster.start_timeout_s)
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None


def _wait_for_head(cfg, head: Host, proc, log_path: Path) -> None:
    import socket

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FasterFSError(f"Ray head on {head.address} exited at start:\n{_log_tail(log_path)}")
        try:
            socket.create_connection((head.address, cfg.cluster.ray_port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise FasterFSError(f"Ray head on {head.address}:{cfg.cluster.ray_port} did not start within "
                        f"{cfg.cluster.start_timeout_s} s; see {log_path}")


def _wait_for_nodes(cfg, state: ClusterState, wanted: set[str]) -> dict[str, str]:
    """Wait until every node has joined; check none reports an address other than its own."""
    import ray

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    logs = Paths(Path(state.root)).log_dir
    while True:
        alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        stray = set(alive) - wanted
        if stray:
            raise FasterFSError(f"Ray nodes report addresses {sorted(stray)} outside the cluster's {sorted(wanted)}")
        if set(alive) == wanted:
            return alive
        for node in state.nodes:
            if not _is_ray_start(node.ray_pid):
                raise FasterFSError(f"Ray node {node.index} ({node.address}) exited at start:\n"
                                    f"{_log_tail(logs / f'ray-node-{node.index}.log')}")
        if time.monotonic() > deadline:
            raise FasterFSError(f"only {sorted(alive)} of {sorted(wanted)} joined within {cfg.cluster.start_timeout_s} s")
        time.sleep(0.3)


# -- down -----------------------------------------------------------------------------


def teardown(state: ClusterState) -> dict:
    """Stop everything the cluster started, whatever state it is in. Returns what was done."""
    report = {"actors_stopped": 0, "actor_errors": [], "ray_nodes_stopped": 0, "processes_killed": 0,
              "tc_filters_removed": 0}
    if state.running():
        try:
            import ray

            connect_ray(state)
            _stop_dashboard(state, report)
            for node in state.nodes:
                try:
                    actor = ray.get_actor(actor_name(node.index), namespace=state.namespace)
                    ray.get(actor.stop.remote(), timeout=30)
                    ray.kill(actor, no_restart=True)
                    report["actors_stopped"] += 1
                except Exception as e:  # a dead actor must not stop the rest of the teardown
                    report["actor_errors"].append(f"node {node.index}: {type(e).__name__}: {e}"[:300])
        except Exception as e:
            report["actor_errors"].append(f"ray: {type(e).__name__}: {e}"[:300])
        finally:
            import ray

            ray.shutdown()
    # `ray start --block` drains and stops its node's processes on SIGTERM; workers before the head.
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    ours = set(cgroup.pids()) if cgroup.path else None
    for pid in [n.ray_pid for n in reversed(state.nodes)] + [state.head_pid]:
        if pid and _is_ray_start(pid) and (ours is None or pid in ours):
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 40)
            report["ray_nodes_stopped"] += 1
    deadline = time.monotonic() + 15  # the nodes' own processes finish exiting a moment later
    while cgroup.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    report["processes_killed"] = cgroup.kill_all() if cgroup.path else 0
    cgroup.remove()  # also drops the SOCK_OPS attachments on the node cgroups
    spill = state.config.get("cluster", {}).get("spill_dir")
    if spill and not state.attached:
        shutil.rmtree(spill, ignore_errors=True)  # spilled objects die with the cluster
    report["tc_filters_removed"] = _remove_tc_filters(state)
    report["bpffs_unmounted"] = _unmount_bpffs(Paths(Path(state.root)).bpffs)
    if state.lab:  # namespaces, links and their qdiscs; only once no process holds a namespace
        from . import lab

        report["lab_removed"] = lab.destroy_network(state.lab)
    return report


def _stop_dashboard(state: ClusterState, report: dict) -> None:
    import ray

    from .dashboard import ACTOR_NAME

    try:
        actor = ray.get_actor(ACTOR_NAME, namespace=state.namespace)
    except ValueError:
        return  # not started (disabled, or up failed before it)
    try:
        ray.get(actor.stop.remote(), timeout=15)
    except Exception as e:
        report["actor_errors"].append(f"dashboard: {type(e).__name__}: {e}"[:300])
    ray.kill(actor, no_restart=True)


def _remove_tc_filters(state: ClusterState) -> int:
    """TC filters a StorageNode could not remove itself (it crashed, or was killed)."""
    from . import bpf

    if bpf.unavailable_reason() is not None:
        return 0
    from .bpf import tc

    return tc.remove(state.config["kernel"]["interface"], filter_prefix(state.name))


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _is_ray_start(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_ray_start(pid):
        os.kill(pid, signal.SIGKILL)


def down(cfg) -> dict:
    layout = Layout.of(as_cfg(cfg))
    state = ClusterState.load(layout.paths.root)
    report = teardown(state)
    layout.paths.state_file.unlink(missing_ok=True)
    return report


# -- status ---------------------------------------------------------------------------


def status(cfg) -> tuple[ClusterState, list[dict]]:
    """The cluster state and one row per node, as each StorageNode reports it."""
    import ray

    state = ClusterState.load(Layout.of(as_cfg(cfg)).paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running (its Ray processes are gone); "
                            "run `fasterfs down` to clean up, then `fasterfs up`")
    rows = []
    for node, actor in zip(state.nodes, storage_nodes(state)):
        try:
            rows.append(ray.get(actor.status.remote(), timeout=30))
        except Exception as e:
            rows.append({"index": node.index, "address": node.address, "node_id": node.ray_node_id,
                         "endpoint": node.endpoint, "healthy": False, "error": f"{type(e).__name__}: {e}"[:200]})
    return state, rows
