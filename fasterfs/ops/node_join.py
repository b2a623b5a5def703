"""Nodes joining and leaving a running cluster: machines new to it (`add_nodes`: `fasterfs nodes
add`, `fasterfs lab add-host`), one back after its machine went down (`rejoin`: `fasterfs lab
power-on`), one taken out after its data has moved to the others (`drain`: `fasterfs nodes
drain`), each StorageNode started again in turn with new code or settings (`restart`: `fasterfs
nodes restart`). A `ray start` on the host joins the head, then its StorageNode starts; the other
nodes serve throughout. (A cluster attached to a Ray cluster started elsewhere grows with it:
fasterfs.ops.attached_growth.)"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..control import registry
from ..control.node_directory import NodeDirectory, actor_name
from ..control.state import ClusterState, Host, NodeState, connect_ray, is_ray_start
from ..core import config, process
from ..core.cgroup import ProjectCgroup
from ..core.config import Layout, Paths, as_cfg
from ..core.errors import FasterFSError
from ..core.fsutil import log_tail
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


def add_nodes(cfg, hosts: list[Host | None]) -> list[NodeState]:
    """Machines join the running cluster in one step: each its Ray node (`ray start` joining the
    head), its StorageNode with MinIO, kernel programs and cache; then every name is placed over
    all the nodes once (NamespaceStore.spread: a piece moves at most once, however many join),
    and the repair leader moves, in the background at repair.mb_per_s, the pieces the new
    placement gives the new nodes, each read through the verified path before the namespace
    names its new home; the old copy serves until then and is deleted ingest.keep_old_s after.
    `hosts`: lab hosts made for them, or None for the next loopback address. A host already in
    the cluster or given twice, a port in use or a host that does not join is refused, naming
    it, with nothing started left behind and nothing moved."""
    layout = Layout.of(as_cfg(cfg))
    state = ClusterState.load(layout.paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: `fasterfs up` first")
    if state.attached:
        raise FasterFSError("a cluster attached to a Ray cluster started elsewhere grows with that cluster: "
                            "its machines join Ray (`ray up`), then `fasterfs nodes add` gives them StorageNodes")
    if not hosts:
        raise FasterFSError("no machine to add: give 1 or more")
    cfg = stored_config(state)
    first = max(n.index for n in state.nodes) + 1
    taken = {n.address: f"node {n.index}" for n in state.nodes} | {state.head_address: "the head"}
    chosen: list[tuple[int, Host]] = []
    for index, host in enumerate(hosts, first):
        host = host or Host(Layout(layout.paths, cfg.cluster.first_address, index + 1).address(index))
        if host.address in taken:
            raise FasterFSError(f"host {host.address} is already {taken[host.address]} of cluster {state.name!r}")
        if host.address in {h.address for _, h in chosen}:
            raise FasterFSError(f"host {host.address} is given twice")
        ray_nodes.check_host_ports(cfg, host, index)
        chosen.append((index, host))
    connect_ray(state)

    def stop_ray_node(n: NodeState) -> None:
        ProjectCgroup.from_dict(state.cgroup).kill_all(child=f"node-{n.index}")
    new: list[NodeState] = []
    try:
        started = []
        for index, host in chosen:  # every `ray start` at once: they join side by side
            proc, log_path = _spawn_ray_node(cfg, state, index, host)
            new.append(NodeState(index, host.address, endpoint(host.address, cfg.minio.port, cfg.minio.tls), proc.pid,
                                 None, netns=host.netns, disk=host.disk))
            started.append((index, host, proc, log_path))
        for node, (index, host, proc, log_path) in zip(new, started):
            node.ray_node_id = _joined(cfg, host, index, proc, log_path)
    except BaseException:
        for node in new:
            stop_ray_node(node)
        raise
    place_new(cfg, state, new, undo=stop_ray_node)
    return new


def place_new(cfg, state: ClusterState, new: list[NodeState],
              undo: Callable[[NodeState], None] = lambda node: None) -> None:
    """Nodes whose Ray nodes have joined enter the cluster: in its state (the Registry, and
    through it every host, finds them), their StorageNodes started, every node told; then every
    name is placed over all the nodes, the repair leader moving the new nodes' shares. If a
    StorageNode does not start, none of `new` is left: their actors killed, `undo(node)` for each
    (its Ray node stopped, where FasterFS started it), the state as before."""
    import ray

    state.nodes = sorted(state.nodes + new, key=lambda n: n.index)
    state.config["nodes"] = len(state.nodes)
    state.save()
    try:
        start_storage_nodes(cfg, state, new)
        state.save()
        tell_nodes_changed(state)
    except BaseException:
        for node in new:
            actor = NodeDirectory(state.ray_namespace).get(node.index)
            if actor is not None:
                ray.kill(actor, no_restart=True)
            undo(node)
            state.nodes.remove(node)
        state.config["nodes"] = len(state.nodes)
        state.save()
        raise
    registry.spread(state.name, len(state.placing()))


def _spawn_ray_node(cfg, state: ClusterState, index: int, host: Host):
    """`ray start` of node `index` on `host`, joining the head, in the node's own cgroup."""
    log_path = Paths(Path(state.root)).log_dir / f"ray-node-{index}.log"
    ray_nodes.provision(host, state.root)
    proc = ProjectCgroup.from_dict(state.cgroup).spawn(
        ray_nodes.ray_start_args(cfg, host, Host(state.head_address), index, False), log_path,
        ray_nodes.ray_env(state.name, state.root, cfg.cluster), child=f"node-{index}")
    return proc, log_path


def _joined(cfg, host: Host, index: int, proc, log_path: Path) -> str:
    """The Ray node id of `host` once it has joined; an error naming it if it does not."""
    import ray

    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    while not (node_id := next((n["NodeID"] for n in ray.nodes()
                                if n["Alive"] and n["NodeManagerAddress"] == host.address), None)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise FasterFSError(f"Ray node {index} ({host.address}) did not join within "
                                f"{cfg.cluster.start_timeout_s} s:\n{log_tail(log_path)}")
        time.sleep(0.3)
    return node_id


DRAIN_ROUNDS = 5  # repairs a drain runs before it says what is still on the node


def drain(cfg, index: int, progress: Callable[[int, int], None] | None = None) -> dict:
    """Node `index` leaves the running cluster with the cluster at full redundancy throughout:
    marked draining (placed on no more; new writes go to the others), its pieces moved by
    repair to the nodes placement now gives them (each read through the verified path and
    written before the namespace names its new home; the copy on the node serves until then),
    and once the namespace names nothing on it, its StorageNode (MinIO, kernel programs, mounts)
    and Ray node (not the head's: the cluster's GCS; nor one of a Ray cluster started elsewhere,
    whose owner removes the machine: `ray down`, cluster.yaml's worker_ips) stopped and the node out
    of the cluster's state. Refused, naming why, with nothing moved: a node not in the cluster, a
    name whose layout needs more nodes than would be left. Run
    again, it resumes. Its moves go at `repair.drain_mb_per_s` on every node (given in `cfg`'s
    overrides, else the cluster's; 0: each node's repair.mb_per_s): readers share the disks with them."""
    import ray

    from ..node import repair, repair_rebuild

    state = ClusterState.load(Layout.of(as_cfg(cfg)).paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: nothing to drain")
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
    given = settings_given(cfg)
    cfg = stored_config(state)
    # a planned move yields to readers: the drain's own pace, given to it or the cluster's
    pace = float(str(given.get("repair.drain_mb_per_s", cfg.repair.drain_mb_per_s))) or None
    creds = registry.fetch_credentials(state.name, "admin")
    directory = NodeDirectory(state.ray_namespace)
    node.draining = True
    state.save()  # the Registry's state: every host's next look places nothing on it
    tell_nodes_changed(state)
    began, moved, wrote = time.monotonic(), 0, 0
    for _ in range(DRAIN_ROUNDS):  # a write or a leader's repair meanwhile may name it again
        out = repair.run(cfg, state, creds, progress=progress,
                         spread=repair_rebuild.through(directory, mb_per_s=pace))
        moved, wrote = moved + out.moved, wrote + out.bytes_written
        held = _named_on(state, index)
        if not held:
            break
    else:
        raise FasterFSError(f"node {index} still holds {held} pieces the namespace names after {DRAIN_ROUNDS} "
                            f"repairs ({out.failed[:3]}); it stays draining: `fasterfs nodes drain {index}` again")
    time.sleep(cfg.repair.drain_grace_s)  # readers holding a manifest from before the last move read there
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
    tell_nodes_changed(state)
    return {"node": index, "address": node.address, "moved": moved, "bytes": wrote,
            "seconds": time.monotonic() - began, "ray_node_left": state.attached, "mb_per_s": pace}


# what `up` fixed for the cluster's life: where it lives, how it is addressed, how names are placed
FIXED = ("cluster.", "minio.port", "minio.console_port", "minio.bucket", "minio.tls", "nodes", "layout", "replicas",
         "ec.", "credentials.")


def settings_given(cfg) -> dict[str, object]:
    """The options a command line set (`key=value` overrides): where `cfg` differs from the
    configuration composed without them. The cluster's name and root only pick the cluster; what
    else names the running cluster as it is changes nothing (`restart` drops it)."""
    from omegaconf import OmegaConf

    given, bare = (_flatten(OmegaConf.to_container(c, resolve=True)) for c in (cfg, config.load([])))
    return {k: v for k, v in given.items() if bare.get(k) != v and k not in ("cluster.root", "cluster.name")}


def stored_config(state: ClusterState):
    """The cluster's configuration as stored at `up` (and changed by restarts), over the defaults
    of the code installed now: an option this code added has its default (a node started by new
    code reads it), every stored value wins."""
    from omegaconf import OmegaConf

    defaults = config.load([])
    OmegaConf.set_struct(defaults, False)
    return OmegaConf.merge(defaults, as_cfg(state.config))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def restart(cfg, indices: list[int] | None = None, settings: dict | None = None,
            progress: Callable[[dict], None] | None = None) -> tuple[list[dict], dict]:
    """Each StorageNode of `indices` (default: all) stopped and started again, one after the
    other, with `settings` (option -> value) over the cluster's configuration and whatever code
    is installed now: the old one hands over (its MinIO and mounts' daemons serve on; the new
    one takes them over: readers of the node's chunks never see them stop), the new one starts
    with the namespace caught up, then the next. Refused, nothing restarted, for an option `up`
    fixed (FIXED) or a node not in the cluster. (each node's {node, seconds, minio_served_on},
    the settings that changed)."""
    import ray
    from omegaconf import DictConfig, OmegaConf

    state = ClusterState.load(Layout.of(as_cfg(cfg)).paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: nothing to restart")
    stored = _flatten(state.config)
    settings = {k: v for k, v in (settings or {}).items() if stored.get(k) != v}  # what would change
    fixed = sorted(k for k in settings if k.startswith(FIXED))
    if fixed:
        raise FasterFSError(f"option {fixed[0]} is fixed while the cluster runs (set at `fasterfs up`): a restart "
                            f"cannot change it; nothing restarted")
    order = [state.node(i).index for i in indices] if indices else [n.index for n in state.nodes]  # names bad ones
    merged = OmegaConf.merge(stored_config(state), OmegaConf.from_dotlist([f"{k}={v}" for k, v in settings.items()]))
    assert isinstance(merged, DictConfig)
    new = config.checked(merged)  # a bad value is refused here, before any node stops
    connect_ray(state)
    state.config = cast(dict, OmegaConf.to_container(new, resolve=True))
    state.save()  # the Registry's state: what every host and the next incarnation read
    directory, done = NodeDirectory(state.ray_namespace), []
    for index in order:
        node, began = state.node(index), time.monotonic()
        actor = directory.get(index)
        minio_pid = None
        if actor is not None:
            try:
                minio_pid = ray.get(actor.status.remote(1e9), timeout=30)["minio_pid"]
                ray.get(actor.stop.remote(True), timeout=60)  # hand over: MinIO and mounts serve on
            except (ray.exceptions.RayError, KeyError):
                pass  # a node already down starts anew
            ray.kill(actor, no_restart=True)
            _name_free(directory, index, state.ray_namespace)
        start_storage_nodes(new, state, [node])
        state.save()
        after = ray.get(directory.require(index).status.remote(1e9), timeout=30)["minio_pid"]
        done.append({"node": index, "seconds": round(time.monotonic() - began, 2),
                     "minio_served_on": minio_pid is not None and after == minio_pid})
        if progress:
            progress(done[-1])
    tell_nodes_changed(state)
    return done, settings


def _name_free(directory: NodeDirectory, index: int, namespace: str, timeout: float = 30.0) -> None:
    """Wait until Ray has let go of the killed actor's name (a new actor may take it)."""
    import ray

    directory.forget(index)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(actor_name(index), namespace=namespace)
        except ValueError:
            return
        time.sleep(0.1)
    raise FasterFSError(f"Ray kept the name of node {index}'s stopped StorageNode for {timeout:.0f} s")


def _width(m) -> int:
    return m.ec_data + m.ec_parity if m.layout == "ec" else m.replicas


def _named_on(state: ClusterState, index: int) -> int:
    """Pieces the namespace names on node `index`."""
    _, manifests = registry.fetch_manifests(state.name)
    return sum(node == index for m in manifests.values() for c in m.chunks for node, _ in m.pieces(c))


def tell_nodes_changed(state: ClusterState) -> None:
    """Every StorageNode looks the cluster's state up again (fire and forget: one that is down
    looks it up when it starts)."""
    directory = NodeDirectory(state.ray_namespace)
    for n in state.nodes:
        actor = directory.get(n.index)
        if actor is not None:
            actor.nodes_changed.remote()
