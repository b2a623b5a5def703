"""The lab: N hosts on this one machine that share nothing but the network and the
installed software, as real machines in a cluster do. Each host is a network namespace
with an address of its own on a bridge FasterFS creates, a mount namespace of its own in
which a private disk (a directory under <cluster.root>/lab-disks/, or an ext4 image of lab.disk_mb
MB loop-mounted there: fasterfs.hosts.lab_disks) is its cluster root and
/tmp and /dev/shm are its own, one Ray node, one MinIO, and bandwidth of its own.

    fasterfs lab up --nodes 4 [lab=unlimited] [lab.disks=[disk2,disk0,disk1]]
    fasterfs lab exec 1 -- fasterfs status cluster.ray_address=198.18.0.1:6391
    fasterfs lab power-off 2           # every process of host 2 killed at once
    fasterfs lab power-on 2 --empty    # back, with a blank disk: repair refills it
    fasterfs lab power-off head        # the head's every process killed at once (the hosts run on)
    fasterfs lab power-on head         # back on its disk: the hosts, their readers and mounts carried on
    fasterfs lab power-on head --empty # back blank: the names and keys taken back from the hosts
    fasterfs lab partition 0 1         # and the other quiet failures: fasterfs.hosts.lab_faults
    fasterfs lab add-host [COUNT]      # machines join the running lab (node_join.add_nodes)
    fasterfs lab down

Per host, `tbf` limits the host's loopback (what a local read can pull: the "disk") and
its link's egress (what it can send to the others: the "WiFi"); netem is not in this
kernel, so slow links are bandwidth, not delay. The Ray head runs on the bridge address
in this namespace with a root of its own and holds no data, so drivers and the CLI work
from here; every host finds the cluster through Ray (the Registry), never through files.
Each host's StorageNode watches `lo` and its own link (`lab0`, both directions) for
requests to any MinIO, so a chunk that a host's readers make hot is cached on that host,
and a write arriving from another host invalidates it there.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..control.state import Host
from ..core.config import Layout, as_cfg
from ..core.errors import ConfigError, FasterFSError
from ..hosts import lab_disks
from ..hosts.lab_network import MAX_HOSTS, add_host, create_network, destroy_network, leftovers, names
from . import cluster, node_join
from .teardown import teardown


def up(cfg) -> cluster.ClusterState:
    """Create the hosts and start the cluster on them; nothing is left if any step fails."""
    cfg = as_cfg(cfg)
    if "lab" not in cfg:
        raise ConfigError("the lab's settings (conf/lab/) are missing: compose with config.load(overrides, lab=True)")
    # Kernel programs watch each host's lo and its own link (found as on a real machine: the
    # interface holding the host's address, lab0) for requests to any MinIO.
    cfg.kernel.host_interface, cfg.kernel.watch = "auto", "any"
    disk_names = _disks(cfg)
    state_file = Layout.of(cfg).paths.state_file
    if state_file.exists() and cluster.ClusterState.load(state_file.parent).running():
        raise FasterFSError(f"a FasterFS cluster is already running under {state_file.parent}; "
                            "run `fasterfs lab down` first")
    if leftovers(cfg.cluster.name):  # a lab that crashed: no running cluster owns these any more
        destroy_network(names(cfg.cluster.name, MAX_HOSTS, MAX_HOSTS))
    disks, mounted = lab_disks.prepare(Path(cfg.cluster.root) / lab_disks.BASE, disk_names, cfg.lab.get("disk_mb"))
    try:
        record, head, hosts = create_network(cfg.cluster.name, cfg.nodes, cfg.lab)
    except BaseException:
        lab_disks.release(mounted)
        raise
    record["disk_mounts"] = mounted
    for host, disk in zip(hosts, disks):
        host.disk = str(disk)
    try:
        return cluster.up(cfg, hosts=hosts, head=head, lab=record)
    except BaseException:
        destroy_network(record)  # cluster.up has stopped its processes; the network and disks are ours to undo
        lab_disks.release(mounted)
        raise


def down(cfg) -> dict:
    """Stop the lab's cluster and remove its network; with no state file (a crash), remove
    whatever of the network is left."""
    cfg = as_cfg(cfg)
    if Layout.of(cfg).paths.state_file.exists():
        return cluster.down(cfg)
    left = leftovers(cfg.cluster.name)
    disks = Path(cfg.cluster.root) / lab_disks.BASE
    mounted = [str(d) for d in disks.iterdir() if lab_disks.is_mounted(d)] if disks.is_dir() else []
    if not left and not mounted:
        raise FasterFSError(f"no FasterFS lab is running under {cfg.cluster.root} and none is left to remove")
    destroy_network(names(cfg.cluster.name, MAX_HOSTS, MAX_HOSTS))
    lab_disks.release(mounted)
    return {"actors_stopped": 0, "actor_errors": [], "ray_nodes_stopped": 0, "processes_killed": 0,
            "lab_removed": len(left)}


def add(cfg, count: int = 1) -> list[cluster.NodeState]:
    """Machines join the running lab in one step: `count` hosts of their own (namespace, link and
    limits as the others', a blank private disk each), then node_join.add_nodes on them. Nothing
    of them is left if one does not join."""
    state = cluster.ClusterState.load(Layout.of(as_cfg(cfg)).paths.root)
    if not state.lab:
        raise FasterFSError(f"cluster {state.name!r} under {state.root} is not a lab: `fasterfs nodes add` adds a "
                            "machine to it")
    base = Path(state.root) / lab_disks.BASE
    free = (f"disk{i}" for i in range(MAX_HOSTS + len(state.nodes) + count) if not (base / f"disk{i}").exists())
    disks, mounted = lab_disks.prepare(base, [next(free) for _ in range(count)],
                                       state.config.get("lab", {}).get("disk_mb"))
    made = len(state.lab["hosts"])
    try:
        hosts = []
        for disk in disks:
            hosts.append(add_host(state.name, state.lab))
            hosts[-1].disk = str(disk)
        state.lab.setdefault("disk_mounts", []).extend(mounted)
        state.save()  # `lab down` removes the hosts and their disks from here on
        return node_join.add_nodes(cfg, list(hosts))
    except BaseException:
        state.lab["disk_mounts"] = [m for m in state.lab.get("disk_mounts", []) if m not in mounted]
        destroy_network({"hosts": state.lab["hosts"][made:]})
        del state.lab["hosts"][made:]
        state.save()
        lab_disks.release(mounted)
        for disk in disks:
            shutil.rmtree(disk, ignore_errors=True)
        raise


def _disks(cfg) -> list[str]:
    """The names of the hosts' private disks, in host order."""
    names = list(cfg.lab.disks) if cfg.lab.get("disks") else [f"disk{i}" for i in range(cfg.nodes)]
    if len(names) != cfg.nodes or len(set(names)) != len(names):
        raise FasterFSError(f"option lab.disks={names}: give {cfg.nodes} distinct names, one per host")
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", str(name)):
            raise FasterFSError(f"option lab.disks: disk name {name!r} must be 1-32 letters, digits, '-' or '_'")
    return [str(n) for n in names]


def exec_args(state: cluster.ClusterState, index: int, command: list[str]) -> list[str]:
    """`command` run on lab host `index` as on that machine: its network and mount namespaces
    (its own cluster root, /tmp and /dev/shm), entered through its Ray node's process."""
    node = state.node(index)
    if not node.netns or not node.ray_pid or not cluster.is_ray_start(node.ray_pid):
        raise FasterFSError(f"node {index} is not a running lab host of cluster {state.name!r}")
    return ["nsenter", f"--net=/run/netns/{node.netns}", f"--mount=/proc/{node.ray_pid}/ns/mnt",
            f"--wd={os.getcwd()}", "--", *command]


def _lab_node(state: cluster.ClusterState, index: int):
    if not state.lab or not any(n.index == index for n in state.nodes):
        raise FasterFSError(f"no lab host with node id {index} in cluster {state.name!r} "
                            f"(hosts: {[n.index for n in state.nodes]})")
    return state.node(index)


POWER_OFF_S = 10.0  # how long SIGKILLed processes may take to be gone (a process exits once its syscall ends)


def _host_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout
    return [int(p) for p in out.split()]


def power_off(state: cluster.ClusterState, index: int) -> int:
    """Lab host `index` loses power: every process of it SIGKILLed at once (Ray node,
    StorageNode, MinIO, mounts), no shutdown of any kind, and gone when this returns. Its disk
    stays as it was. Returns how many processes there were."""
    netns = _lab_node(state, index).netns
    return _kill_now(state, f"node-{index}", lambda: _host_pids(netns), f"lab host {index}")


def power_off_head(state: cluster.ClusterState) -> int:
    """The lab's head loses power: every process of its Ray node (the GCS, its raylet, the
    Registry and dashboard actors) SIGKILLed at once. The storage hosts run on, waiting for it
    (cluster.head_wait_s); their disks and the head's stay as they were."""
    if not state.lab or not state.head_pid:
        raise FasterFSError(f"cluster {state.name!r} has no lab head of its own to power off")
    return _kill_now(state, "head", list, "the lab's head")


def _kill_now(state: cluster.ClusterState, child: str, also: Callable[[], list[int]], what: str) -> int:
    """SIGKILL at once to every process of a host's cgroup `child` (cgroup.kill: a fork under
    way is caught too, where a list of pids would miss its child) and to any `also` lists (a
    host's network namespace); returns when none is left, how many there were."""
    from ..core.cgroup import ProjectCgroup

    cgroup = ProjectCgroup.from_dict(state.cgroup)
    there = set(cgroup.pids(child)) | set(also())
    cgroup.kill_all(child=child, timeout=POWER_OFF_S)
    deadline = time.monotonic() + POWER_OFF_S
    while left := sorted(set(cgroup.pids(child)) | set(also())):
        if time.monotonic() > deadline:
            raise FasterFSError(f"{what} still runs {len(left)} processes {POWER_OFF_S:.0f} s after SIGKILL "
                                f"(pids {left[:5]}): in uninterruptible sleep?")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(there)


def power_on_head(cfg, empty: bool = False) -> cluster.ClusterState:
    """The lab's head back on its disk: it adopts the hosts that outlived it (cluster.resume).
    `empty`: back with a blank disk, as a replaced machine — no Ray session is left to take up,
    so the hosts' Ray nodes start again on their own disks, and `up` takes the names and keys
    back from them (fasterfs.control.head_recovery): nothing stored is lost, nothing is stored again."""
    cfg = as_cfg(cfg)
    root = Layout.of(cfg).paths.root
    state = cluster.ClusterState.load(root)
    if cluster.is_ray_start(state.head_pid):
        raise FasterFSError(f"the lab's head is running (its Ray node is pid {state.head_pid}): power it off first")
    if not empty:
        return cluster.resume(state)
    teardown(state)  # the hosts' processes, the network, the disks' mounts: the hosts' disks stay
    for child in root.iterdir():  # the head's disk: everything under the root but the hosts' disks
        if child.name != lab_disks.BASE:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    cfg.nodes = len(state.nodes)
    return up(cfg)


def power_on(cfg, index: int, empty: bool = False) -> cluster.ClusterState:
    """Lab host `index` comes back after power_off: its Ray node and StorageNode start again
    on its disk, or (empty) on a blank disk, as a replaced machine would (repair refills it)."""
    cfg = as_cfg(cfg)
    state = cluster.ClusterState.load(Layout.of(cfg).paths.root)
    node = _lab_node(state, index)
    left = _host_pids(node.netns)
    if left:
        raise FasterFSError(f"lab host {index} ({node.address}) still runs {len(left)} processes (pids "
                            f"{left[:5]}): power it off first (`fasterfs lab power-off {index}`)")
    if empty:  # emptied, not removed: an image disk's directory is its mount point
        for child in Path(node.disk).iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    node_join.rejoin(cfg, state, index, Host(node.address, node.netns, node.disk))
    return state
