"""A FasterFS cluster attached to a Ray cluster started elsewhere (`ray up cluster.yaml`) grows
with that Ray cluster: `fasterfs nodes add` gives each Ray node that joined it a StorageNode, on
the head or from the machine that joined (cluster.yaml's worker start commands). Its machines are
Ray's owner's to start and stop; a drain (fasterfs.ops.node_join.drain) leaves their Ray nodes."""
from __future__ import annotations

import fcntl

from ..control import registry
from ..control.state import ClusterState, NodeState, connect_ray
from ..core import config
from ..core.config import Layout, as_cfg
from ..core.errors import FasterFSError
from ..hosts import ray_nodes
from ..node.minio_server import endpoint
from . import node_join


def add_nodes(cfg, count: int = 1) -> list[NodeState]:
    """`fasterfs nodes add`: on a cluster FasterFS started, `count` machines of their own starting (add_nodes);
    on one attached to a Ray cluster started elsewhere, a StorageNode on each Ray node that joined
    since (add_ray_nodes) — also from a machine other than the head (cluster.ray_address given,
    no cluster state on this disk: the machine that just joined, as cluster.yaml's worker start
    commands run it), in a task on the head, where the cluster's state is; from there, every Ray
    node having its StorageNode already is no error (a machine's start commands run again)."""
    layout = Layout.of(as_cfg(cfg))
    if not layout.paths.state_file.exists() and registry.ray_address(cfg):
        return _add_on_head(cfg, count)
    state = ClusterState.load(layout.paths.root)
    if not state.attached:
        return node_join.add_nodes(cfg, [None] * count)
    _each_joined(count)
    return add_ray_nodes(cfg)


def _each_joined(count: int) -> None:
    if count != 1:  # COUNT given: the joined machines are Ray's to count
        raise FasterFSError(f"nodes add {count}: a cluster attached to a Ray cluster started elsewhere gives a "
                            "StorageNode to every Ray node that joined it, however many: no COUNT")


def _add_on_head(cfg, count: int) -> list[NodeState]:
    import ray

    from ..control.head_recovery import on_ray_node

    state = registry.find(cfg)
    if not state.attached:
        raise FasterFSError(f"cluster {state.name!r} runs the Ray nodes FasterFS started: `fasterfs nodes add` on its "
                            f"head ({state.head_address}) starts a machine for it")
    _each_joined(count)
    here = [f"cluster.root={state.root}", f"cluster.name={state.name}"]  # the head's disk, where its state is
    task = ray.remote(num_cpus=0, max_retries=0)(_add_here).options(
        scheduling_strategy=on_ray_node(ray_nodes.head_node_id(state)))
    return ray.get(task.remote(here), timeout=node_join.stored_config(state).cluster.start_timeout_s + 120)


def _add_here(overrides: list[str]) -> list[NodeState]:
    return add_ray_nodes(config.load(overrides), none_new_is_error=False)


def add_ray_nodes(cfg, none_new_is_error: bool = True) -> list[NodeState]:
    """A cluster attached to a Ray cluster started elsewhere grows with it: every Ray node that
    joined it (`ray up` with a machine added, a `ray start --address` there) and has no StorageNode
    gets one, as `up` starts them (the node id its disk records, else a new one; MinIO, kernel
    programs, cache; not the head's unless cluster.storage_on_head); then every name is placed over
    all the nodes and the repair leader moves each new node's share in the background. Ray's
    nodes are not FasterFS's to start or stop: none new is an error saying how one joins."""
    root = Layout.of(as_cfg(cfg)).paths.root
    with open(root / "nodes-add.lock", "a") as lock:  # machines joining at once (`ray up`): one add at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _add_ray_nodes(ClusterState.load(root), none_new_is_error)


def _add_ray_nodes(state: ClusterState, none_new_is_error: bool) -> list[NodeState]:
    from ..control import head_recovery, identity

    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: `fasterfs up` first")
    cfg = node_join.stored_config(state)
    connect_ray(state)
    alive, surveyed = head_recovery.survey_hosts(cfg, state, ray_nodes.head_node_id(state))
    known = {n.address for n in state.nodes}
    joined = [h for h in surveyed if h["address"] not in known]
    if not joined and not none_new_is_error:
        return []
    if not joined:
        raise FasterFSError(f"every node of the Ray cluster at {state.ray_address} has a StorageNode already: a "
                            "machine joins with `ray up` (it added to cluster.yaml's worker_ips) or `ray start "
                            f"--address={state.ray_address}` on it, then `fasterfs nodes add`")
    identity.check_versions(joined)
    # the running nodes keep their ids; a joined disk recording one of them is refused there (a copied disk)
    ids = identity.assign([{"address": n.address, "identities": [{"node": n.index, "address": n.address}]}
                           for n in state.nodes] + joined)
    new = [NodeState(ids[h["address"]], h["address"], endpoint(h["address"], cfg.minio.port, cfg.minio.tls), None,
                     alive[h["address"]], host_id=h["host_id"]) for h in joined]
    node_join.place_new(cfg, state, new)  # Ray's nodes stay: their owner's
    return new
