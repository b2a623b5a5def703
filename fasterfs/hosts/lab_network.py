"""The lab's network: a bridge, one network namespace per host with a veth to the bridge,
addresses, and `tbf` limits; created and destroyed by deterministic names, so a crashed
lab can still be removed. (fasterfs.ops.lab starts a cluster on it.)"""
from __future__ import annotations

import errno
import subprocess
import zlib

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from ..control.state import Host
from ..core.errors import FasterFSError

LINK = "lab0"  # the host's interface inside its namespace
MAX_HOSTS = 64  # how far leftover-hunting looks


def names(cluster_name: str, hosts: int, outsiders: int = 0) -> dict:
    """Deterministic names, so a failed `up` or a lost state file can still be cleaned up.
    Interface names are at most 15 characters. Outsiders are machines on the same network
    that are not part of the cluster (what it must keep out)."""
    tag = f"{zlib.crc32(cluster_name.encode()) & 0xFFFFFF:06x}"
    return {"bridge": f"ffsb{tag}",
            "hosts": [{"netns": f"ffs-{cluster_name}-h{i}", "veth": f"ffsv{tag}{i:x}"} for i in range(hosts)],
            "outsiders": [{"netns": f"ffs-{cluster_name}-x{i}", "veth": f"ffsx{tag}{i:x}"} for i in range(outsiders)]}


def _ip(*args: str) -> None:
    """`ip ...`: inside a namespace with `-n`. A subprocess, never a fork of this process:
    pyroute2's NetNS and netns.create fork the caller, which can deadlock a multi-threaded one
    (a Ray driver) on a lock another thread held — seen here as a hung `lab up`."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise FasterFSError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def tbf_args(verb: str, device: str, mbit: float, burst_kb: int) -> list[str]:
    """`tc qdisc <verb>` of a host's bandwidth limit on `device` (its link, or lo: its "disk")."""
    return ["tc", "qdisc", verb, "dev", device, "root", "handle", "1:", "tbf", "rate", f"{mbit}mbit",
            "burst", f"{burst_kb}kb", "latency", "50ms"]


def _tbf(ns: str, device: str, mbit: int, burst_kb: int) -> None:
    _ip("netns", "exec", ns, *tbf_args("add", device, mbit, burst_kb))


def create_network(cluster_name: str, hosts: int, lab) -> tuple[dict, Host, list[Host]]:
    """Bridge, namespaces, veth pairs, addresses and limits. Returns the record to destroy
    it by, the head (bridge address) and the hosts."""
    record = names(cluster_name, hosts, int(lab.get("outsiders") or 0))
    record.update(subnet=lab.subnet, profile=lab.profile, disk_mbit=lab.disk_mbit, link_mbit=lab.link_mbit,
                  burst_kb=lab.burst_kb)
    head = Host(f"{lab.subnet}.1")
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
            for i, h in enumerate(record["hosts"] + record["outsiders"]):
                outsider = i >= hosts
                address = f"{lab.subnet}.{200 + i - hosts if outsider else 10 + i}"
                _plumb(ipr, br, h, address, None if outsider else record)
                if outsider:
                    h["address"] = address
                else:
                    out.append(Host(address, h["netns"]))
    except BaseException:
        destroy_network(record)
        raise
    return record, head, out


def _plumb(ipr, bridge: int, h: dict, address: str, limits: dict | None) -> None:
    """Machine `h` (netns, veth) on the bridge at `address`; a host's `limits` (the record's
    link_mbit, disk_mbit, burst_kb) on its link and loopback (an outsider has none)."""
    if h["netns"] in netns.listnetns():
        raise FasterFSError(f"network namespace {h['netns']} already exists: run `fasterfs lab down`")
    _ip("netns", "add", h["netns"])
    _ip("link", "add", h["veth"], "type", "veth", "peer", "name", LINK, "netns", h["netns"])
    veth = ipr.link_lookup(ifname=h["veth"])[0]
    ipr.link("set", index=veth, master=bridge, state="up")
    _ip("-n", h["netns"], "addr", "add", f"{address}/24", "dev", LINK)
    _ip("-n", h["netns"], "link", "set", LINK, "up")
    _ip("-n", h["netns"], "link", "set", "lo", "up")
    if limits is not None and limits.get("disk_mbit"):
        _tbf(h["netns"], "lo", limits["disk_mbit"], limits["burst_kb"])
    if limits is not None and limits.get("link_mbit"):
        _tbf(h["netns"], LINK, limits["link_mbit"], limits["burst_kb"])


def add_host(cluster_name: str, record: dict) -> Host:
    """One more host on a lab's network (a machine joining): the next one of names(), with the
    record's limits; the record takes it, so destroy_network removes it with the rest."""
    i = len(record["hosts"])
    if i >= MAX_HOSTS:
        raise FasterFSError(f"the lab has {i} hosts: {MAX_HOSTS} at most")
    h = names(cluster_name, i + 1)["hosts"][i]
    address = f"{record['subnet']}.{10 + i}"
    with IPRoute() as ipr:
        bridge = ipr.link_lookup(ifname=record["bridge"])
        if not bridge:
            raise FasterFSError(f"the lab's bridge {record['bridge']} is gone: is the lab up?")
        record["hosts"].append(h)  # before anything is made: destroy_network undoes a part made
        _plumb(ipr, bridge[0], h, address, record)
    return Host(address, h["netns"])


def destroy_network(record: dict) -> int:
    """Remove the namespaces (their interfaces and qdiscs go with them), the host-side veths
    and the bridge. Idempotent; returns how many objects were removed."""
    removed = 0
    existing = set(netns.listnetns())
    machines = record["hosts"] + record.get("outsiders", [])
    for h in machines:
        if h["netns"] in existing:
            _ip("netns", "del", h["netns"])
            removed += 1
    with IPRoute() as ipr:
        for name in [h["veth"] for h in machines] + ([record["bridge"]] if "bridge" in record else []):
            found = ipr.link_lookup(ifname=name)
            if found:
                try:
                    ipr.link("del", index=found[0])
                    removed += 1
                except NetlinkError as e:
                    if e.code != errno.ENODEV:
                        raise
    return removed


def leftovers(cluster_name: str, hosts: int | None = None) -> list[str]:
    """What of a lab still exists (for tests and `lab down` checks)."""
    record = names(cluster_name, hosts or MAX_HOSTS, MAX_HOSTS)
    machines = record["hosts"] + record["outsiders"]
    left = [h["netns"] for h in machines if h["netns"] in netns.listnetns()]
    with IPRoute() as ipr:
        left += [n for n in [h["veth"] for h in machines] + [record["bridge"]] if ipr.link_lookup(ifname=n)]
    return left
