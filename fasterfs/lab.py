"""The lab: N hosts on this one machine, each a network namespace with an address of its
own on a bridge FasterFS creates, one Ray node, one MinIO, and bandwidth of its own.

    fasterfs lab up --nodes 4 [lab=unlimited]      fasterfs lab down

Per host, `tbf` limits the host's loopback (what a local read can pull: the "disk") and
its link's egress (what it can send to the others: the "WiFi"); netem is not in this
kernel, so slow links are bandwidth, not delay. The Ray head runs on the bridge address
in this namespace and holds no data, so drivers and the CLI work from here; the jobs run
unchanged, since the cluster they talk to is the state file. Each host's StorageNode
watches its own link (`lab0`) for requests to any MinIO, so a chunk that a host's readers
make hot is cached on that host.
"""
from __future__ import annotations

import errno
import zlib

from pyroute2 import IPRoute, NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from . import cluster
from .config import Layout, as_cfg
from .errors import FasterFSError

LINK = "lab0"  # the host's interface inside its namespace
MAX_HOSTS = 64  # how far leftover-hunting looks


def names(cluster_name: str, hosts: int) -> dict:
    """Deterministic names, so a failed `up` or a lost state file can still be cleaned up.
    Interface names are at most 15 characters."""
    tag = f"{zlib.crc32(cluster_name.encode()) & 0xFFFFFF:06x}"
    return {"bridge": f"ffsb{tag}", "hosts": [{"netns": f"ffs-{cluster_name}-h{i}", "veth": f"ffsv{tag}{i:x}"}
                                              for i in range(hosts)]}


def _tbf(ipr, index: int, mbit: int, burst_kb: int) -> None:
    ipr.tc("add", "tbf", index, handle=0x10000, rate=f"{mbit}mbit", burst=burst_kb * 1024, latency="50ms")


def create_network(cluster_name: str, hosts: int, lab) -> tuple[dict, cluster.Host, list[cluster.Host]]:
    """Bridge, namespaces, veth pairs, addresses and limits. Returns the record to destroy
    it by, the head (bridge address) and the hosts."""
    record = names(cluster_name, hosts)
    record.update(subnet=lab.subnet, profile=lab.profile, disk_mbit=lab.disk_mbit, link_mbit=lab.link_mbit)
    head = cluster.Host(f"{lab.subnet}.1")
    out = []
    try:
        with IPRoute() as ipr:
            if ipr.link_lookup(ifname=record["bridge"]):
                raise FasterFSError(f"bridge {record['bridge']} already exists: a lab of cluster {cluster_name!r} "
                                    "is up (or was not cleaned up): run `fasterfs lab down`")
            ipr.link("add", ifname=record["bridge"], kind="bridge")
            br = ipr.link_lookup(ifname=record["bridge"])[0]
            ipr.addr("add", index=br, address=head.address, prefixlen=24)
            ipr.link("set", index=br, state="up")
            for i, h in enumerate(record["hosts"]):
                address = f"{lab.subnet}.{10 + i}"
                if h["netns"] in netns.listnetns():
                    raise FasterFSError(f"network namespace {h['netns']} already exists: run `fasterfs lab down`")
                netns.create(h["netns"])
                ipr.link("add", ifname=h["veth"], kind="veth", peer={"ifname": LINK, "net_ns_fd": h["netns"]})
                veth = ipr.link_lookup(ifname=h["veth"])[0]
                ipr.link("set", index=veth, master=br, state="up")
                with NetNS(h["netns"]) as ns:
                    link = ns.link_lookup(ifname=LINK)[0]
                    lo = ns.link_lookup(ifname="lo")[0]
                    ns.addr("add", index=link, address=address, prefixlen=24)
                    ns.link("set", index=link, state="up")
                    ns.link("set", index=lo, state="up")
                    if lab.disk_mbit:
                        _tbf(ns, lo, lab.disk_mbit, lab.burst_kb)
                    if lab.link_mbit:
                        _tbf(ns, link, lab.link_mbit, lab.burst_kb)
                out.append(cluster.Host(address, h["netns"]))
    except BaseException:
        destroy_network(record)
        raise
    return record, head, out


def destroy_network(record: dict) -> int:
    """Remove the namespaces (their interfaces and qdiscs go with them), the host-side veths
    and the bridge. Idempotent; returns how many objects were removed."""
    removed = 0
    existing = set(netns.listnetns())
    for h in record["hosts"]:
        if h["netns"] in existing:
            netns.remove(h["netns"])
            removed += 1
    with IPRoute() as ipr:
        for name in [h["veth"] for h in record["hosts"]] + [record["bridge"]]:
            found = ipr.link_lookup(ifname=name)
            if found:
                try:
                    ipr.link("del", index=found[0])
                    removed += 1
                except NetlinkError as e:
                    if e.code != errno.ENODEV:
                        raise
    return removed


def up(cfg) -> cluster.ClusterState:
    """Create the hosts and start the cluster on them; nothing is left if any step fails."""
    cfg = as_cfg(cfg)
    # Kernel programs watch each host's own link for requests to any MinIO.
    cfg.kernel.interface, cfg.kernel.watch = LINK, "any"
    state_file = Layout.of(cfg).paths.state_file
    if state_file.exists() and cluster.ClusterState.load(state_file.parent).running():
        raise FasterFSError(f"a FasterFS cluster is already running under {state_file.parent}; run `fasterfs lab down` first")
    if leftovers(cfg.cluster.name):  # a lab that crashed: no running cluster owns these any more
        destroy_network(names(cfg.cluster.name, MAX_HOSTS))
    record, head, hosts = create_network(cfg.cluster.name, cfg.nodes, cfg.lab)
    try:
        return cluster.up(cfg, hosts=hosts, head=head, lab=record)
    except BaseException:
        destroy_network(record)  # cluster.up has stopped its processes; the network is ours to undo
        raise


def down(cfg) -> dict:
    """Stop the lab's cluster and remove its network; with no state file (a crash), remove
    whatever of the network is left."""
    cfg = as_cfg(cfg)
    if Layout.of(cfg).paths.state_file.exists():
        return cluster.down(cfg)
    left = leftovers(cfg.cluster.name)
    if not left:
        raise FasterFSError(f"no FasterFS lab is running under {cfg.cluster.root} and none is left to remove")
    destroy_network(names(cfg.cluster.name, MAX_HOSTS))
    return {"actors_stopped": 0, "actor_errors": [], "ray_nodes_stopped": 0, "processes_killed": 0,
            "lab_removed": len(left)}


def leftovers(cluster_name: str, hosts: int = None) -> list[str]:
    """What of a lab still exists (for tests and `lab down` checks)."""
    record = names(cluster_name, hosts or MAX_HOSTS)
    left = [h["netns"] for h in record["hosts"] if h["netns"] in netns.listnetns()]
    with IPRoute() as ipr:
        left += [n for n in [h["veth"] for h in record["hosts"]] + [record["bridge"]] if ipr.link_lookup(ifname=n)]
    return left
