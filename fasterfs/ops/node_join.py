"""Nodes joining and leaving a running cluster: a machine new to it (`add_node`: `fasterfs nodes
add`, `fasterfs lab add-host`), one back after its machine went down (`rejoin`: `fasterfs lab
power-on`), one taken out after its data has moved to the others (`drain`: `fasterfs nodes
drain`). A `ray start` on the host joins the head, then its StorageNode starts; the other nodes
serve throughout."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..control import registry
from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState, Host, NodeState, connect_ray, is_ray_start
from ..core import process
from ..core.cgroup import ProjectCgroup
from ..core.config import Layout, Paths, as_cfg
from ..core.errors import FasterFSError
from ..hosts import ray_nodes
from ..node.minio_server import endpoint
from .cluster import start_storage_nodes


def rejoin(cfg, state: ClusterState, index: int, host: Host) -> None:
    """Node `index` back on `host` after its machine went down (every process of it gone): a
    new `ray start` there, then its StorageNode, which finds its data on the host's disk or
    starts empty (repair then refills it). The other nodes keep running throughout."""
    import ray

    node = state.node(index)
    if process.running(node.ray_pid) and is_ray_start(node.ray_pid):
        raise FasterFSError(f"node {index} ({node.address}) is running: its Ray node is pid {node.ray_pid}")
    connect_ray(state)
    old = NodeDirectory(state.ray_namespace).get(index)
    if old is not None:  # the old actor is dead with its Ray node; make sure its name is free
        ray.kill(old, no_restart=True)
    proc, log_path = _spawn_ray_node(cfg, state, index, host)
    node.ray_pid = proc.pid
    state.save()
    node.ray_node_id = _joined(cfg, host, index, proc, log_path)
    state.save()  # the Registry reads the state file: every host now finds the new Ray node
    start_storage_nodes(cfg, state, [node])
    state.save()


def add_node(cfg, host: Host | None = None) -> NodeState:
    """A machine joins the running cluster: its Ray node (`ray start` joining the head), its
    StorageNode with MinIO, kernel programs and cache; then every name is placed over all the
    nodes (NamespaceStore.spread), and the repair leader moves, in the background at
    repair.mb_per_s, the pieces the new placement gives the new node, each read through the
    verified path before the namespace names its new home; the old copy serves until then and
    is deleted ingest.keep_old_s after. `host`: a lab host made for it; by default the next
    loopback address. A host already in the cluster, a port in use or a host that does not
    join is refused, naming it, with nothing started left behind and nothing moved."""
    import ray

    layout = Layout.of(as_cfg(cfg))
    state = ClusterState.load(layout.paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: `fasterfs up` first")
    if state.attached:
        raise FasterFSError("a cluster attached to a Ray cluster started elsewhere grows with that cluster "
                            "(`ray up` with the machine added): its nodes are not FasterFS's to start")
    cfg = as_cfg(state.config)
    index = max(n.index for n in state.nodes) + 1
    host = host or Host(Layout(layout.paths, cfg.cluster.first_address, index + 1).address(index))
    taken = {n.address: f"node {n.index}" for n in state.nodes} | {state.head_address: "the head"}
    if host.address in taken:
        raise FasterFSError(f"host {host.address} is already {taken[host.address]} of cluster {state.name!r}")
    ray_nodes.check_host_ports(cfg, host, index)
    connect_ray(state)
    proc, log_path = _spawn_ray_node(cfg, state, index, host)
    node = NodeState(index, host.address, endpoint(host.address, cfg.minio.port, cfg.minio.tls), proc.pid, None,
                     netns=host.netns, disk=host.disk)
    try:
        node.ray_node_id = _joined(cfg, host, index, proc, log_path)
        state.nodes.append(node)
        state.config["nodes"] = len(state.nodes)
        state.save()  # the Registry, and through it every host, finds the new node
        start_storage_nodes(cfg, state, [node])
        state.save()
        _tell_nodes_changed(state)
    except BaseException:
        actor = NodeDirectory(state.ray_namespace).get(index)
        if actor is not None:
            ray.kill(actor, no_restart=True)
        ProjectCgroup.from_dict(state.cgroup).kill_all(child=f"node-{index}")
        if node in state.nodes:
            state.nodes.remove(node)
            state.config["nodes"] = len(state.nodes)
            state.save()
        raise
    registry.spread(state.name, len(state.placing()))
    return node


def _spawn_ray_node(cfg, state: ClusterState, index: int, host: Host):
    """`ray start` of node `index` on `host`, joining the head, in the node's own cgroup."""
    log_path = Paths(Path(state.root)).log_dir / f"ray-node-{index}.log"
    ray_nodes.provision(host, state.root)
    proc = ProjectCgroup.from_dict(state.cgroup).spawn(
        ray_nodes.ray_start_args(cfg, host, Host(state.head_address), index, False), log_path,
        ray_nodes.ray_env(state.name, state.root, cfg.cluster.head_wait_s), child=f"node-{index}")
    return proc, log_path


def _joined(cfg, host: Host, index: int, proc, log_path: Path) -> str:
    """The Ray node id of `host` once it has joined; an error naming it if it does not."""
    import ray

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    while not (node_id := next((n["NodeID"] for n in ray.nodes()
                                if n["Alive"] and n["NodeManagerAddress"] == host.address), None)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise FasterFSError(f"Ray node {index} ({host.address}) did not join within "
                                f"{cfg.cluster.start_timeout_s} s:\n{ray_nodes.log_tail(log_path)}")
        time.sleep(0.3)
    return node_id


DRAIN_ROUNDS = 5  # repairs a drain runs before it says what is still on the node


def drain(cfg, index: int, progress: Callable[[int, int], None] | None = None) -> dict:
    """Node `index` leaves the running cluster with the cluster at full redundancy throughout:
    marked draining (placed on no more; new writes go to the others), its pieces moved by
    repair to the nodes placement now gives them (each read through the verified path and
    written before the namespace names its new home; the copy on the node serves until then),
    and once the namespace names nothing on it, its StorageNode (MinIO, kernel programs, mounts)
    and Ray node (not the head's: the cluster's GCS) stopped and the node out of the cluster's
    state. Refused, naming why, with nothing moved: a node not in the cluster, a cluster attached
    to Ray started elsewhere, a name whose layout needs more nodes than would be left. Run
    again, it resumes."""
    import ray

    from ..node import repair, repair_rebuild

    state = ClusterState.load(Layout.of(as_cfg(cfg)).paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: nothing to drain")
    if state.attached:
        raise FasterFSError("a cluster attached to a Ray cluster started elsewhere: its machines leave with "
                            "that cluster (`ray down`), their data repaired after")
    node = state.node(index)  # names the cluster's nodes when it is not one
    connect_ray(state)
    left = [n.index for n in state.placing() if n.index != index]
    _, manifests = registry.fetch_manifests(state.name)
    narrow = sorted(m.name for m in manifests.values() if _width(m) > len(left))
    if narrow:
        m = manifests[narrow[0]]
        kind = f"ec={m.ec_data}+{m.ec_parity}" if m.layout == "ec" else f"replicas={m.replicas}"
        raise FasterFSError(f"draining node {index} would leave {len(left)} nodes, fewer than {narrow[0]!r} needs "
                            f"({kind}; {len(narrow)} names in all): nothing moved")
    cfg = as_cfg(state.config)
    creds = registry.fetch_credentials(state.name, "admin")
    directory = NodeDirectory(state.ray_namespace)
    node.draining = True
    state.save()  # the Registry's state: every host's next look places nothing on it
    _tell_nodes_changed(state)
    began, moved, wrote = time.monotonic(), 0, 0
    for _ in range(DRAIN_ROUNDS):  # a write or a leader's repair meanwhile may name it again
        out = repair.run(cfg, state, creds, progress=progress, spread=repair_rebuild.through(directory))
        moved, wrote = moved + out.moved, wrote + out.bytes_written
        held = _named_on(state, index)
        if not held:
            break
    else:
        raise FasterFSError(f"node {index} still holds {held} pieces the namespace names after {DRAIN_ROUNDS} "
                            f"repairs ({out.failed[:3]}); it stays draining: `fasterfs nodes drain {index}` again")
    actor = directory.get(index)
    if actor is not None:
        ray.get(actor.stop.remote(), timeout=60)
        ray.kill(actor, no_restart=True)
    if node.address != state.head_address:  # the head's Ray node (its GCS) stays: the cluster's control plane
        if node.ray_pid and is_ray_start(node.ray_pid):
            process.terminate_all([node.ray_pid], 40)
        ProjectCgroup.from_dict(state.cgroup).kill_all(child=f"node-{index}")
    state.nodes.remove(node)
    state.config["nodes"] = len(state.nodes)
    state.save()
    _tell_nodes_changed(state)
    return {"node": index, "address": node.address, "moved": moved, "bytes": wrote,
            "seconds": time.monotonic() - began}


def _width(m) -> int:
    return m.ec_data + m.ec_parity if m.layout == "ec" else m.replicas


def _named_on(state: ClusterState, index: int) -> int:
    """Pieces the namespace names on node `index`."""
    _, manifests = registry.fetch_manifests(state.name)
    return sum(node == index for m in manifests.values() for c in m.chunks for node, _ in m.pieces(c))


def _tell_nodes_changed(state: ClusterState) -> None:
    """Every StorageNode looks the cluster's state up again (fire and forget: one that is down
    looks it up when it starts)."""
    directory = NodeDirectory(state.ray_namespace)
    for n in state.nodes:
        actor = directory.get(n.index)
        if actor is not None:
            actor.nodes_changed.remote()
