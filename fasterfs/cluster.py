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
import sys
import time
from pathlib import Path
from typing import Any

from . import auth, credentials, identity, notebook, process, registry, tls
from .bpf.pinned import unmount_bpffs
from .cgroup import ProjectCgroup
from .config import PROJECT_DIR, Layout, Paths, as_cfg, lobster_dir, minio_binary, to_dict
from .errors import FasterFSError
from .fsutil import atomic_write
from .minio_server import check_port_free, endpoint
from .node_directory import NodeDirectory, actor_name
from .state import (
    ClusterState,
    Host,
    NodeState,
    connect_ray,
    filter_prefix,
    is_ray_start,
    local_address_towards,
    pinned,
    storage_nodes,
)
from .storage_node import StorageNode

log = logging.getLogger("fasterfs.cluster")


# -- up -------------------------------------------------------------------------------


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


# A lab host shares nothing but the network (and the installed software) with the others: its
# own mount namespace, in which its disk is its cluster root and /tmp (Ray's session directory)
# and /dev/shm (the object store's files) are its own. The disk, and the software when it lies
# under /tmp (a checkout there), are opened before the new /tmp hides them and bound back from
# their file descriptors. The final exec keeps the PID, so the PID FasterFS records is the
# `ray start` process itself.
_PRIVATE_HOST = r"""
import os, subprocess, sys
root, disk, keep, cmd = sys.argv[1], sys.argv[2], [p for p in sys.argv[3].split(":") if p], sys.argv[4:]
fds = {p: os.open(p, os.O_PATH) for p in [disk, *keep]}
def mount(*args):
    subprocess.run(["mount", "--no-canonicalize", *args], check=True, pass_fds=tuple(fds.values()))
mount("--make-rprivate", "/")
mount("-t", "tmpfs", "-o", "mode=1777", "ffs-tmp", "/tmp")
mount("-t", "tmpfs", "-o", "mode=1777", "ffs-shm", "/dev/shm")
for path in [*keep, root]:
    os.makedirs(path, exist_ok=True)
    mount("--bind", f"/proc/self/fd/{fds[disk if path == root else path]}", path)
os.chdir("/")
os.execvp(cmd[0], cmd)
"""


def _software_under_tmp() -> list[str]:
    """This checkout and its virtualenv, where a host's own /tmp would hide them."""
    paths = sorted({str(PROJECT_DIR), str(Path(sys.prefix).resolve())})
    under = [p for p in paths if p.startswith(("/tmp/", "/dev/shm/"))]
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


def ray_env(name: str, root: str | Path) -> dict[str, str]:
    """The environment every `ray start` gets: this checkout's interpreter first on PATH, so
    a job's `python` (`ray job submit -- python jobs/x.py`) and every worker run in the
    project's environment whatever shell submitted it; the Ray token's file (fasterfs.auth);
    the cluster's name and root, so every worker, job driver and process they spawn finds this
    cluster's files and token, never those of another cluster on the machine."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = [venv_bin] + [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != venv_bin]
    # a job's code comes from its uploaded copy (`--working-dir .`), not this checkout: the
    # sample data's place must come with the environment
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}  # by file only: no token in environ
    return dict(env, RAY_USAGE_STATS_ENABLED="0", PATH=os.pathsep.join(path), VIRTUAL_ENV=sys.prefix,
                FASTERFS_LOBSTER_DIR=lobster_dir(), FASTERFS_CLUSTER=name, FASTERFS_ROOT=str(root),
                **auth.ray_env(auth.token_file(root)))


def _provision(host: Host, root: str | Path) -> None:
    """What a host needs on its own disk before its `ray start`: the cluster's Ray token
    (a lab host's disk is behind its cluster root; loopback nodes share the head's)."""
    if host.disk:
        token = auth.read(auth.token_file(root))
        atomic_write(auth.token_file(host.disk), token.encode(), mode=0o600)


def _ray_start_args(cfg, host: Host, head: Host, index: int | None, is_head: bool) -> list[str]:
    """`ray start` for a storage node (index given) or a coordinating head without storage."""
    c = cfg.cluster
    args = [_ray_bin(), "start", "--block", "--disable-usage-stats", f"--node-ip-address={host.address}",
            f"--object-store-memory={int(c.object_store_mb) * 1024 * 1024}"]
    if index is None:
        args += ["--num-cpus=0", f"--dashboard-agent-listen-port={c.agent_port + 99}"]
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
        args += ["--head", f"--port={c.ray_port}", "--include-dashboard=true",
                 f"--system-config={json.dumps({'object_spilling_config': json.dumps(spill)})}",
                 f"--dashboard-host={host.address}", f"--dashboard-port={c.dashboard_port}",
                 f"--ray-client-server-port={c.client_port}"]
    else:
        args += [f"--address={head.address}:{c.ray_port}"]
    if host.disk:
        args = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c", _PRIVATE_HOST,
                str(c.root), host.disk, ":".join(_software_under_tmp()), *args]
    # nsenter switches only the network namespace; `ip netns exec` would also remount /sys
    # and hide the cgroup2 hierarchy the node's SOCK_OPS program attaches to.
    return (["nsenter", f"--net=/run/netns/{host.netns}", "--"] if host.netns else []) + args


def node_ports(cfg, index: int | None) -> int:
    """The first of node `index`'s five fixed Ray ports, seven on the head (None: a head
    without storage)."""
    return int(cfg.cluster.node_ports) + 10 * (99 if index is None else index)


def _head_env(cfg, env: dict, index: int | None) -> dict:
    """The head's autoscaler monitor and dashboard also serve Prometheus metrics, by default
    on 44217 and 44227 of every interface (clusters would collide): in the head's port block."""
    base = node_ports(cfg, index)
    return dict(env, AUTOSCALER_METRIC_PORT=str(base + 5), DASHBOARD_METRIC_PORT=str(base + 6))


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
            for port in range(node_ports(cfg, i), node_ports(cfg, i) + (7 if host == head else 5)):
                check_port_free(host.address, port, f"Ray node {i} (cluster.node_ports)")
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
    cluster started elsewhere (`ray up cluster.yaml`) are used. Either way FasterFS then
    attaches the same way: a Registry on the head, node ids read from the hosts' disks,
    a StorageNode on every storage host."""
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
    keys = credentials.create(layout.paths.credentials_file, rotate=cfg.credentials.rotate)
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
        _check_ports(cfg, head, hosts)
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
        if not cfg.cluster.attach:
            assert hosts is not None  # set above when not attaching
            _start_ray(cfg, layout, state, hosts, head)
        connect_ray(state)  # as a driver on the head, as `ray exec` runs
        head_id = _head_node_id(state)
        registry.start(state, head_id, cfg.cluster.start_timeout_s)
        _identify_nodes(cfg, state, head_id)
        state.config["nodes"] = len(state.nodes)
        state.save()
        _start_storage_nodes(cfg, state, keys)
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


def _head_node_id(state: ClusterState) -> str:
    import ray

    head = next((n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == state.head_address),
                None)
    if head is None:
        raise FasterFSError(f"no Ray node has the head's address {state.head_address}; give cluster.ray_address "
                            "as <head IP>:<port>")
    return head


def _start_ray(cfg, layout: Layout, state: ClusterState, hosts: list[Host], head: Host) -> None:
    """One `ray start` per host (and one for a head without storage); records their PIDs."""
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    env = ray_env(state.name, state.root)
    logs = layout.paths.log_dir
    if head not in hosts:  # a coordinating head that holds no data (the lab's)
        proc = cgroup.spawn(_ray_start_args(cfg, head, head, None, True), logs / "ray-head.log",
                            _head_env(cfg, env, None), child="head")
        state.head_pid = proc.pid
        state.save()
        _wait_for_head(cfg, head, proc, logs / "ray-head.log")
        connect_ray(state)
    joined = {head.address} if head not in hosts else set()
    for i, host in enumerate(hosts):
        _provision(host, state.root)
        # each node in a cgroup of its own, which its StorageNode's SOCK_OPS program watches
        proc = cgroup.spawn(_ray_start_args(cfg, host, head, i, host == head), logs / f"ray-node-{i}.log",
                            _head_env(cfg, env, i) if host == head else env, child=f"node-{i}")
        # provisional (position, not id): lets `down` stop it if we fail from here on
        state.nodes.append(NodeState(i, host.address, endpoint(host.address, cfg.minio.port, cfg.minio.tls), proc.pid,
                                     netns=host.netns, disk=host.disk))
        state.save()
        if host == head:
            _wait_for_head(cfg, head, proc, logs / f"ray-node-{i}.log")
            connect_ray(state)
        # One at a time: raylets started back to back race for the same socket names.
        joined.add(host.address)
        _wait_for_nodes(cfg, state, joined)


def _identify_nodes(cfg, state: ClusterState, head_id: str) -> None:
    """The storage nodes with their stable ids, as the hosts' disks record them (fasterfs.identity)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    started = {n.address: n for n in state.nodes}
    if state.attached:  # every node of the Ray cluster (the head too, unless told otherwise)
        addresses = sorted(a for a, nid in alive.items() if cfg.cluster.storage_on_head or nid != head_id)
    else:
        addresses = [n.address for n in state.nodes]
    if not addresses:
        raise FasterFSError(f"the Ray cluster at {state.ray_address} has no node to put a StorageNode on")
    probe = ray.remote(num_cpus=0)(identity.probe)
    refs = {a: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(alive[a], soft=False))
            .remote(state.root, state.name) for a in addresses}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg.cluster.start_timeout_s)
    silent = [a for a, ref in refs.items() if ref not in done]
    if silent:
        raise FasterFSError(f"hosts {silent} did not answer FasterFS's probe within {cfg.cluster.start_timeout_s} s")
    answers: dict[str, dict] = {a: ray.get(refs[a]) for a in addresses}
    hosts = [dict(answers[a], address=a) for a in addresses]
    identity.check_versions(hosts)
    ids = identity.assign(hosts)
    nodes = []
    for h in hosts:
        a, old = h["address"], started.get(h["address"])
        nodes.append(NodeState(ids[a], a, endpoint(a, cfg.minio.port, cfg.minio.tls), old.ray_pid if old else None,
                               alive[a], netns=old.netns if old else None, host_id=h["host_id"],
                               disk=old.disk if old else None))
    state.nodes = sorted(nodes, key=lambda n: n.index)


def _start_storage_nodes(cfg, state: ClusterState, keys: credentials.ClusterKeys,
                         nodes: list[NodeState] | None = None) -> None:
    """One StorageNode per node (default: every node), handed the MinIO keys (never
    written on the hosts)."""
    import ray

    nodes = state.nodes if nodes is None else nodes
    actor_cls = ray.remote(StorageNode)
    actors = {node.index: actor_cls.options(
        name=actor_name(node.index), namespace=state.namespace, lifetime="detached",
        max_restarts=-1, max_task_retries=3, num_cpus=0, **pinned(node),
    ).remote(node.index, node.address, state.config, keys) for node in nodes}
    refs = {i: a.ready.remote() for i, a in actors.items()}  # type: ignore[attr-defined]  # Ray's typing of actor methods
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


def rejoin(cfg, state: ClusterState, index: int, host: Host) -> None:
    """Node `index` back on `host` after its machine went down (every process of it gone): a
    new `ray start` there, then its StorageNode, which finds its data on the host's disk or
    starts empty (repair then refills it). The other nodes keep running throughout."""
    import ray

    node = state.node(index)
    if process.running(node.ray_pid) and is_ray_start(node.ray_pid):
        raise FasterFSError(f"node {index} ({node.address}) is running: its Ray node is pid {node.ray_pid}")
    connect_ray(state)
    old = NodeDirectory(state.namespace).get(index)
    if old is not None:  # the old actor is dead with its Ray node; make sure its name is free
        ray.kill(old, no_restart=True)
    cgroup = ProjectCgroup.from_dict(state.cgroup)
    log_path = Paths(Path(state.root)).log_dir / f"ray-node-{index}.log"
    head = Host(state.head_address)
    _provision(host, state.root)
    proc = cgroup.spawn(_ray_start_args(cfg, host, head, index, False), log_path,
                        ray_env(state.name, state.root), child=f"node-{index}")
    node.ray_pid = proc.pid
    state.save()
    deadline = time.monotonic() + cfg.cluster.start_timeout_s
    while not (node_id := next((n["NodeID"] for n in ray.nodes()
                                if n["Alive"] and n["NodeManagerAddress"] == host.address), None)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise FasterFSError(f"Ray node {index} ({host.address}) did not rejoin within "
                                f"{cfg.cluster.start_timeout_s} s:\n{_log_tail(log_path)}")
        time.sleep(0.3)
    node.ray_node_id = node_id
    state.save()  # the Registry reads the state file: every host now finds the new Ray node
    _start_storage_nodes(cfg, state, registry.fetch_keys(state.name), [node])
    state.save()


def _start_dashboard(cfg, state: ClusterState, head_id: str) -> str:
    """FasterFS's web dashboard, as an actor on the head node listening on the head's address."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .dashboard import ACTOR_NAME, DashboardServer

    actor = ray.remote(DashboardServer).options(  # restarted (and listening again) if its worker dies
        name=ACTOR_NAME, namespace=state.namespace, lifetime="detached", num_cpus=0, max_restarts=3,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False),
    ).remote(state.root, state.head_address, cfg.dashboard.port, cfg.dashboard.refresh_s, cfg.dashboard.require_token)
    try:
        ref: ray.ObjectRef[str] = actor.ready.remote()  # type: ignore[attr-defined]  # Ray's typing of actor methods
        return ray.get(ref, timeout=cfg.cluster.start_timeout_s)
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
            # alive, not "is `ray start`": a lab host's process sets up its namespaces before it
            # becomes `ray start`, which on a busy machine can take longer than the first look
            if not process.running(node.ray_pid):
                raise FasterFSError(f"Ray node {node.index} ({node.address}) exited at start:\n"
                                    f"{_log_tail(logs / f'ray-node-{node.index}.log')}")
        if time.monotonic() > deadline:
            raise FasterFSError(f"only {sorted(alive)} of {sorted(wanted)} joined within "
                                f"{cfg.cluster.start_timeout_s} s")
        time.sleep(0.3)


# -- down -----------------------------------------------------------------------------


def teardown(state: ClusterState) -> dict:
    """Stop everything the cluster started, whatever state it is in. Returns what was done."""
    report: dict[str, Any] = {"actors_stopped": 0, "actor_errors": [], "ray_nodes_stopped": 0,
                              "processes_killed": 0, "tc_filters_removed": 0}
    report["notebook_stopped"] = notebook.stop(state)
    if state.running():
        try:
            import ray

            connect_ray(state)
            _stop_dashboard(state, report)
            _stop_registry(state)
            nodes = NodeDirectory(state.namespace)
            for node in state.nodes:
                try:
                    actor = nodes.require(node.index)
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
        if pid and is_ray_start(pid) and (ours is None or pid in ours):
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 40)
            report["ray_nodes_stopped"] += 1
    deadline = time.monotonic() + 15  # the nodes' own processes finish exiting a moment later
    while cgroup.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:  # a cgroup that will not go must not keep the filters, the bpffs and the lab behind
        report["processes_killed"] = cgroup.kill_all() if cgroup.path else 0
        cgroup.remove()  # also drops the SOCK_OPS attachments on the node cgroups
    except (OSError, FasterFSError) as e:
        report["actor_errors"].append(f"cgroup {cgroup.path}: {e}"[:300])
    spill = state.settings.spill_dir
    if spill and not state.attached:  # spilled objects die with the cluster, on the head and lab disks
        shutil.rmtree(spill, ignore_errors=True)
        for n in state.nodes:
            if n.disk and Path(spill).is_relative_to(state.root):
                shutil.rmtree(Path(n.disk) / Path(spill).relative_to(state.root), ignore_errors=True)
    report["tc_filters_removed"] = _remove_tc_filters(state)
    report["bpffs_unmounted"] = unmount_bpffs(Paths(Path(state.root)).bpffs)  # one-machine clusters share it
    if state.tls_ca:
        tls.forget(state.tls_ca)  # this host's copy of the CA certificate clients verified with
    if state.lab:  # namespaces, links and their qdiscs; only once no process holds a namespace
        from .lab_network import destroy_network

        report["lab_removed"] = destroy_network(state.lab)
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


def _stop_registry(state: ClusterState) -> None:
    import ray

    try:
        ray.kill(ray.get_actor(registry.NAME, namespace=state.namespace), no_restart=True)
    except ValueError:
        pass  # up failed before it started


def _remove_tc_filters(state: ClusterState) -> int:
    """TC filters a StorageNode could not remove itself (it crashed, or was killed)."""
    from . import bpf

    if bpf.unavailable_reason() is not None:
        return 0
    from .bpf import tc

    return tc.remove(state.settings.interface, filter_prefix(state.name), drop_qdisc=True)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while is_ray_start(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_ray_start(pid):
        os.kill(pid, signal.SIGKILL)


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
    import ray

    cfg = as_cfg(cfg)
    if not cfg.cluster.ray_address:  # on the head: its state file says whether Ray still runs
        state = ClusterState.load(Layout.of(cfg).paths.root)
        if not state.running():
            raise FasterFSError(f"the cluster under {state.root} is not running (its Ray processes are gone); "
                                "run `fasterfs down` to clean up, then `fasterfs up`")
    state = registry.find(cfg)
    rows = []
    for node, actor in zip(state.nodes, storage_nodes(state)):
        try:
            rows.append(ray.get(actor.status.remote(), timeout=30))
        except Exception as e:
            rows.append({"index": node.index, "address": node.address, "node_id": node.ray_node_id,
                         "endpoint": node.endpoint, "healthy": False, "error": f"{type(e).__name__}: {e}"[:200]})
    return state, rows
