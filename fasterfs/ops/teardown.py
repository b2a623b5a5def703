"""Teardown: everything a cluster started, stopped, whatever state it is in (a failed `up`, a
crashed node, a lab with cuts and frozen processes): its actors, its Ray nodes by the PIDs it
started, its cgroup, the TC filters and bpffs it left, the namespace's Redis, the lab's network
and disks. `fasterfs down` and a failed `up` both end here."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from ..bpf.pinned import unmount_bpffs
from ..control import registry, tls
from ..control.node_directory import NodeDirectory
from ..control.state import ClusterState, connect_ray, filter_prefix, is_ray_start
from ..core import process
from ..core.cgroup import ProjectCgroup
from ..core.config import Paths
from ..core.errors import FasterFSError
from ..dashboard import notebook
from ..hosts import ray_nodes
from ..meta.redis_server import RedisServer
from ..read import fuse_uring


def teardown(state: ClusterState) -> dict:
    """Stop everything the cluster started, whatever state it is in. Returns what was done."""
    report: dict[str, Any] = {"actors_stopped": 0, "actor_errors": [], "ray_nodes_stopped": 0,
                              "processes_killed": 0, "tc_filters_removed": 0}
    if state.lab:  # a frozen process ignores SIGTERM, a cut host cannot be told to stop: undo them first
        from ..hosts import lab_faults

        report["lab_faults_undone"] = lab_faults.undo_all(state)
    report["notebook_stopped"] = notebook.stop(state)
    if state.running():
        try:
            import ray

            connect_ray(state)
            _stop_dashboard(state, report)
            _stop_registry(state)
            nodes = NodeDirectory(state.ray_namespace)
            stopping = {}  # every node stops at once (MinIO's exit, the kernel programs' detach)
            for node in state.nodes:
                try:
                    actor = nodes.require(node.index)
                    stopping[node.index] = (actor, actor.stop.remote())
                except Exception as e:  # a dead actor must not stop the rest of the teardown
                    report["actor_errors"].append(f"node {node.index}: {type(e).__name__}: {e}"[:300])
            deadline = time.monotonic() + 30
            for index, (actor, stopped) in stopping.items():
                try:
                    ray.get(stopped, timeout=max(1.0, deadline - time.monotonic()))
                    ray.kill(actor, no_restart=True)
                    report["actors_stopped"] += 1
                except Exception as e:
                    report["actor_errors"].append(f"node {index}: {type(e).__name__}: {e}"[:300])
        except Exception as e:
            report["actor_errors"].append(f"ray: {type(e).__name__}: {e}"[:300])
        finally:
            import ray

            ray.shutdown()
    # `ray start --block` drains and stops its node's processes on SIGTERM; the workers (side by
    # side) before the head.
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    ours = set(cgroup.pids()) if cgroup.path else None
    for pids in ([n.ray_pid for n in state.nodes], [state.head_pid]):
        started = [pid for pid in pids if pid and is_ray_start(pid) and (ours is None or pid in ours)]
        process.terminate_all(started, 40)
        report["ray_nodes_stopped"] += len(started)
    deadline = time.monotonic() + 15  # the nodes' own processes finish exiting a moment later
    while cgroup.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:  # a cgroup that will not go must not keep the filters, the bpffs and the lab behind
        report["processes_killed"] = cgroup.kill_all() if cgroup.path else 0
        cgroup.remove()  # also drops the SOCK_OPS attachments on the node cgroups
    except (OSError, FasterFSError) as e:
        report["actor_errors"].append(f"cgroup {cgroup.path}: {e}"[:300])
    if not state.attached:  # the GCS's tables of a session that is over
        shutil.rmtree(ray_nodes.gcs_dir(state.root), ignore_errors=True)
    spill = state.settings.spill_dir
    if spill and not state.attached:  # spilled objects die with the cluster, on the head and lab disks
        shutil.rmtree(spill, ignore_errors=True)
        for n in state.nodes:
            if n.disk and Path(spill).is_relative_to(state.root):
                shutil.rmtree(Path(n.disk) / Path(spill).relative_to(state.root), ignore_errors=True)
    report["tc_filters_removed"] = _remove_tc_filters(state)
    if RedisServer(Path(state.root)).is_ours(state.namespace_pid):  # after the Registry: nobody writes
        assert state.namespace_pid is not None
        process.terminate(state.namespace_pid)
        report["namespace_store_stopped"] = True
    report["bpffs_unmounted"] = unmount_bpffs(Paths(Path(state.root)).bpffs)  # one-machine clusters share it
    fuse_uring.release()  # mounts killed with the cgroup: the kernel's io_uring switch as it was once none is left
    if state.tls_ca:
        tls.forget(state.tls_ca)  # this host's copy of the CA certificate clients verified with
    if state.lab:  # namespaces, links and their qdiscs; only once no process holds a namespace
        from ..hosts.lab_network import destroy_network

        report["lab_removed"] = destroy_network(state.lab)
        from ..hosts import lab_disks

        report["lab_disks_unmounted"] = lab_disks.release(state.lab.get("disk_mounts", []))
    return report


def _stop_dashboard(state: ClusterState, report: dict) -> None:
    import ray

    from ..dashboard.dashboard import ACTOR_NAME

    try:
        actor = ray.get_actor(ACTOR_NAME, namespace=state.ray_namespace)
    except ValueError:
        return  # not started (disabled, or up failed before it)
    try:
        ray.get(actor.stop.remote(), timeout=15)
    except Exception as e:
        report["actor_errors"].append(f"dashboard: {type(e).__name__}: {e}"[:300])
    ray.kill(actor, no_restart=True)


def _stop_registry(state: ClusterState) -> None:
    import ray

    try:
        ray.kill(ray.get_actor(registry.NAME, namespace=state.ray_namespace), no_restart=True)
    except ValueError:
        pass  # up failed before it started


def _remove_tc_filters(state: ClusterState) -> int:
    """TC filters a StorageNode could not remove itself (it crashed, or was killed)."""
    from .. import bpf

    if bpf.unavailable_reason() is not None:
        return 0
    from ..bpf import tc

    return tc.remove(state.settings.interface, filter_prefix(state.name), drop_qdisc=True)
