"""The cluster's lifecycle: `up` starts one Ray node per loopback address and a
StorageNode actor pinned to each; `down` stops all of it; `status` reports it.

Each Ray node is a real raylet with its own object store, started by
`ray start --block` inside the cluster's cgroup. The state file written by `up`
(the cluster root's cluster.json) is what every other command and the client read
to find the cluster; it is written atomically once the cluster is ready, and a
provisional one first so that `down` can clean up a failed `up`.
"""
from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from ..control import auth, credentials, head_recovery, identity, registry, tls
from ..control.node_directory import LONG, LONG_THREADS, NodeDirectory, actor_name
from ..control.state import (
    ClusterState,
    Host,
    NodeState,
    connect_ray,
    is_ray_start,
    local_address_towards,
    on_node,
    storage_nodes,
)
from ..core.cgroup import ProjectCgroup
from ..core.config import Layout, as_cfg, minio_binary, to_dict
from ..core.errors import FasterFSError
from ..core.fsutil import owned
from ..hosts import ray_nodes
from ..meta.redis_server import RedisServer
from ..node.minio_server import endpoint
from .teardown import teardown

log = logging.getLogger("fasterfs.ops.cluster")

STATUS_TIMEOUT_S = 30  # for every node's status together (each waits for its object count 5 s at most)


# -- up -------------------------------------------------------------------------------


def up(cfg, hosts: list[Host] | None = None, head: Host | None = None, lab: dict | None = None) -> ClusterState:
    """Start the cluster and a StorageNode with its MinIO on each storage host. Undoes
    everything if any step fails.

    By default the hosts are this machine's loopback addresses from the configuration and
    the first is also the Ray head. The lab passes network-namespace hosts and a head of
    its own (on its bridge) that holds no data; with cluster.attach, the nodes of a Ray
    cluster started elsewhere (`ray up cluster.yaml`) are used. Either way FasterFS then
    attaches the same way: a Registry on the head, node ids read from the hosts' disks,
    a StorageNode on every storage host."""
    cfg = as_cfg(cfg)
    layout = Layout.of(cfg)
    root = owned(layout.paths.root, "the cluster root")  # before anything in it is read or trusted
    if not root.exists():
        root.mkdir(mode=0o700, parents=True)  # only this user's, unless the operator opens it
    if layout.paths.state_file.exists():
        old = ClusterState.load(layout.paths.root)
        if old.running() and _head_lost(old):
            return resume(old)  # the head went away, its storage hosts did not: adopt them
        if old.running():
            raise FasterFSError(f"a FasterFS cluster is already running under {layout.paths.root} "
                                f"(Ray at {old.ray_address}); run `fasterfs down` first")
        log.warning("cleaning up after a cluster that did not shut down: %s", layout.paths.state_file)
        teardown(old)
    minio_binary(cfg)  # fail now, not inside an actor, if MinIO is missing
    conf = to_dict(cfg)
    if cfg.cluster.attach:
        if not cfg.cluster.ray_address:
            raise FasterFSError("option cluster.attach=true needs cluster.ray_address=<head>:<port> of the Ray cluster")
        head = Host(cfg.cluster.ray_address.rsplit(":", 1)[0])
        host, port = cfg.cluster.ray_address.rsplit(":", 1)
        open_ray = auth.cluster_is_open(cfg.cluster.ray_address, local_address_towards(host, int(port)))
        if open_ray and not cfg.cluster.insecure:
            raise FasterFSError(f"the Ray cluster at {cfg.cluster.ray_address} runs without token authentication: "
                                "anyone who reaches it can run code there. Start it with RAY_AUTH_MODE=token (see "
                                "cluster.yaml), or attach anyway with cluster.insecure=true")
        state = ClusterState(name=cfg.cluster.name, root=str(layout.paths.root), ray_address=cfg.cluster.ray_address,
                             dashboard_url=f"http://{head.address}:{cfg.cluster.dashboard_port}", nodes=[],
                             cgroup=ProjectCgroup(None).to_dict(), config=conf, attached=True, insecure=open_ray)
    else:
        hosts = hosts or [Host(a) for a in layout.addresses]
        head = head or hosts[0]
        ray_nodes.check_ports(cfg, head, hosts)
        auth.create(layout.paths.ray_token_file, rotate=cfg.credentials.rotate)
        state = ClusterState(
            name=cfg.cluster.name, root=str(layout.paths.root), ray_address=f"{head.address}:{cfg.cluster.ray_port}",
            dashboard_url=f"http://{head.address}:{cfg.cluster.dashboard_port}", nodes=[],
            cgroup=ProjectCgroup.create(cfg.cluster.name, layout.paths.root).to_dict(), config=conf, lab=lab)
    if cfg.minio.tls:  # the CA stays on this (the head's) disk; its certificate travels in the state
        state.tls_ca = tls.create_ca(layout.paths.tls_ca_dir, cfg.cluster.name, rotate=cfg.credentials.rotate)
        tls.trust(state.tls_ca)
    try:
        state.save()  # provisional: lets `down` clean up if we fail from here on
        if cfg.cluster.namespace_store == "redis":  # before the Registry, which opens it
            state.namespace_pid = RedisServer(layout.paths.root).start(cfg.cluster.start_timeout_s)
            state.save()
        if not cfg.cluster.attach:
            assert hosts is not None  # set above when not attaching
            ray_nodes.start_ray(cfg, layout, state, hosts, head)
        connect_ray(state)  # as a driver on the head, as `ray exec` runs
        head_id = ray_nodes.head_node_id(state)
        alive, surveyed = head_recovery.survey_hosts(cfg, state, head_id)
        head_recovery.recover_head(cfg, state, alive, surveyed)  # before anything on the head's disk is made anew
        credentials.create(layout.paths.credentials_file, rotate=cfg.credentials.rotate)
        registry.start(state, head_id, cfg.cluster.start_timeout_s)
        _identify_nodes(cfg, state, alive, surveyed)
        state.config["nodes"] = len(state.nodes)
        state.save()
        start_storage_nodes(cfg, state)
        state.ready = True
        state.save()
        if cfg.dashboard.enabled:  # it reads the saved state
            state.web_url = _start_dashboard(cfg, state, head_id)
            state.save()
        return state
    except BaseException:
        teardown(state)
        layout.paths.state_file.unlink(missing_ok=True)
        raise


def _head_lost(state: ClusterState) -> bool:
    """Whether the head of a cluster whose nodes still run went away: its `ray start` gone (a
    cluster `up` started), or no Registry answering (Ray started by someone else, its head
    started again by them: cluster.yaml)."""
    if not state.attached:
        return not is_ray_start(state.head_ray_pid)
    import ray

    connect_ray(state)
    try:
        ray.get(registry.handle(state.name).ready.remote(), timeout=10)
        return False
    except (FasterFSError, ray.exceptions.RayError):
        return True


def resume(state: ClusterState) -> ClusterState:
    """The head started again beside storage hosts that outlived it: its `ray start` anew on the
    same disk (the GCS takes up its session from RocksDB; the nodes, their StorageNodes, MinIO
    servers and mounts reconnect and carry on; with cluster.attach Ray's owner starts it), then
    what lived on the head alone made anew: the Registry, the dashboard, and the StorageNode of
    a node whose Ray process went with the head. With the settings the cluster was started with."""
    import ray

    cfg = as_cfg(state.config)
    layout = Layout.of(cfg)
    head = Host(state.head_address)
    state.ready = False
    if not state.attached:
        index = next((n.index for n in state.nodes if n.address == head.address), None)
        # Ray's `ray start --head` takes a raylet still naming this GCS for a cluster already running
        Path(ray_nodes.ray_temp_dir(state.root), "ray_current_cluster").unlink(missing_ok=True)
        env = ray_nodes.ray_env(state.name, state.root, cfg.cluster)
        child = "head" if index is None else f"node-{index}"
        if not is_ray_start(state.head_pid if index is None else state.node(index).ray_pid):
            # the head's Ray node is gone; its agents outlive its raylet by a minute, holding its
            # fixed ports: what is left in its cgroup is of that dead node alone
            ProjectCgroup.from_dict(state.cgroup).kill_all(child=child)
        if head.netns is None:
            ray_nodes.wait_node_ports(cfg, head, index, True, cfg.cluster.start_timeout_s)
        log_path = layout.paths.log_dir / ("ray-head.log" if index is None else f"ray-node-{index}.log")
        proc = ProjectCgroup.from_dict(state.cgroup).spawn(
            ray_nodes.ray_start_args(cfg, head, head, index, True), log_path, ray_nodes.head_env(cfg, env, index),
            child=child)
        if index is None:
            state.head_pid = proc.pid
        else:
            state.node(index).ray_pid = proc.pid
        state.save()
        ray_nodes.wait_for_head(cfg, head, proc, log_path)
    connect_ray(state)
    head_id = ray_nodes.head_node_id(state)
    alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    from ..dashboard.dashboard import ACTOR_NAME as DASHBOARD

    for name in (registry.NAME, DASHBOARD):  # pinned to the head's old Ray node: gone with it
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=state.ray_namespace), no_restart=True)
    registry.start(state, head_id, cfg.cluster.start_timeout_s)
    directory = NodeDirectory(state.ray_namespace)
    lost = []
    for node in state.nodes:
        if node.ray_node_id != alive.get(node.address) or directory.get(node.index) is None:
            old = directory.get(node.index)
            if old is not None:
                ray.kill(old, no_restart=True)
            node.ray_node_id = alive.get(node.address)
            lost.append(node)
    state.save()  # the Registry reads the nodes' Ray ids from here
    ready = [n for n in lost if n.ray_node_id is not None]
    if ready:
        start_storage_nodes(cfg, state, ready)
    state.ready = True
    state.resumed = {"at": time.time(), "restarted": [n.index for n in ready],
                     "kept": [n.index for n in state.nodes if n not in lost],
                     "not_back": [n.index for n in lost if n.ray_node_id is None]}
    state.save()
    if cfg.dashboard.enabled:
        state.web_url = _start_dashboard(cfg, state, head_id)
        state.save()
    return state


def _identify_nodes(cfg, state: ClusterState, alive: dict[str, str], hosts: list[dict]) -> None:
    """The storage nodes with their stable ids, as the hosts' disks record them (fasterfs.control.identity)."""
    started = {n.address: n for n in state.nodes}
    identity.check_versions(hosts)
    ids = identity.assign(hosts)
    nodes = []
    for h in hosts:
        a, old = h["address"], started.get(h["address"])
        nodes.append(NodeState(ids[a], a, endpoint(a, cfg.minio.port, cfg.minio.tls), old.ray_pid if old else None,
                               alive[a], netns=old.netns if old else None, host_id=h["host_id"],
                               disk=old.disk if old else None))
    state.nodes = sorted(nodes, key=lambda n: n.index)


def start_storage_nodes(cfg, state: ClusterState, nodes: list[NodeState] | None = None) -> None:
    """One StorageNode per node (default: every node). Its arguments hold no secret: Ray keeps an
    actor's arguments in the GCS's tables, on the head's disk; each node asks the Registry for the
    MinIO keys."""
    import ray

    from ..node.storage_node import StorageNode  # here: a command that starts none loads none of it

    nodes = state.nodes if nodes is None else nodes
    actor_cls = ray.remote(concurrency_groups={LONG: LONG_THREADS})(StorageNode)  # type: ignore[call-overload]
    actors = {node.index: actor_cls.options(
        name=actor_name(node.index), namespace=state.ray_namespace, lifetime="detached",
        max_restarts=-1, max_task_retries=3, num_cpus=0, **on_node(node),
    ).remote(node.index, node.address, state.config) for node in nodes}
    refs = {i: a.ready.remote() for i, a in actors.items()}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg.cluster.start_timeout_s)
    for node in nodes:
        ref = refs[node.index]
        if ref not in done:
            raise FasterFSError(f"the StorageNode of node {node.index} on host {node.address} did not start within "
                                f"{cfg.cluster.start_timeout_s} s")
        try:
            info = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise FasterFSError(f"a StorageNode failed to start on host {node.address} (node {node.index}): "
                                f"{e}"[:2000]) from None
        if info["node_id"] != node.ray_node_id:
            raise FasterFSError(f"StorageNode {node.index} landed on the wrong Ray node")
        node.kernel_mode = info["kernel_mode"]
        node.host_id = info["host_id"]


def _start_dashboard(cfg, state: ClusterState, head_id: str) -> str:
    """FasterFS's web dashboard, as an actor on the head node listening on the head's address."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ..dashboard.dashboard import ACTOR_NAME, DashboardServer

    actor = ray.remote(DashboardServer).options(  # restarted (and listening again) if its worker dies
        name=ACTOR_NAME, namespace=state.ray_namespace, lifetime="detached", num_cpus=0, max_restarts=3,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False),
    ).remote(state.root, state.head_address, cfg.dashboard.port, cfg.dashboard.refresh_s, cfg.dashboard.require_token,
              heat_cells=cfg.dashboard.heat_cells)
    try:
        ref: ray.ObjectRef[str] = actor.ready.remote()  # type: ignore[attr-defined]  # Ray's typing of actor methods
        return ray.get(ref, timeout=cfg.cluster.start_timeout_s)
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None


# -- down -----------------------------------------------------------------------------


def down(cfg) -> dict:
    layout = Layout.of(as_cfg(cfg))
    state = ClusterState.load(layout.paths.root)
    report = teardown(state)
    layout.paths.state_file.unlink(missing_ok=True)
    return report


# -- status ---------------------------------------------------------------------------


def status(cfg) -> tuple[ClusterState, list[dict]]:
    """The cluster state and one row per node, as each StorageNode reports it; from any host
    given cluster.ray_address."""
    cfg = as_cfg(cfg)
    if not cfg.cluster.ray_address:  # on the head: its state file says whether Ray still runs
        state = ClusterState.load(Layout.of(cfg).paths.root)
        if not state.running():
            raise FasterFSError(f"the cluster under {state.root} is not running (its Ray processes are gone); "
                                "run `fasterfs down` to clean up, then `fasterfs up`")
    state = registry.find(cfg)
    import ray

    refs = [actor.status.remote() for actor in storage_nodes(state)]  # asked at once, answered within one wait
    ray.wait(refs, num_returns=len(refs), timeout=STATUS_TIMEOUT_S)
    rows = []
    for node, ref in zip(state.nodes, refs):
        try:
            rows.append(ray.get(ref, timeout=0))
        except Exception as e:
            rows.append({"index": node.index, "address": node.address, "node_id": node.ray_node_id,
                         "endpoint": node.endpoint, "healthy": False, "error": f"{type(e).__name__}: {e}"[:200]})
    return state, rows
