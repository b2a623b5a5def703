"""TC (clsact) attachment of BPF filters through netlink (pyroute2).

Filters outlive the process that attached them, so each carries a name
(`ffs:<cluster>:<node>:<interface>:<direction>`) by which a restarted owner or `fasterfs down` finds and
removes it. The clsact qdisc is removed by its sole owner (or `down`) with the last filter.
"""
from __future__ import annotations

import errno
import ipaddress
import zlib

from pyroute2 import IPRoute, NetNS
from pyroute2.netlink.exceptions import NetlinkError

from ..core.errors import FasterFSError

EGRESS, INGRESS = 0xFFFFFFF3, 0xFFFFFFF2
DIRECTIONS = {"egress": EGRESS, "ingress": INGRESS}


def _ipr(netns: str | None):
    return NetNS(netns) if netns else IPRoute()


def _index(ipr, interface: str) -> int:
    found = ipr.link_lookup(ifname=interface)
    if not found:
        raise FasterFSError(f"network interface {interface!r} not found (option kernel.interface)")
    return found[0]


def _filter_name(msg) -> str | None:
    options = msg.get_attr("TCA_OPTIONS")
    if not options:
        return None
    return dict((k, v) for k, v in options.get("attrs", []) if isinstance(k, str)).get("TCA_BPF_NAME")


def attach(prog_fd: int, interface: str, name: str, direction: str = "egress", netns: str | None = None) -> int:
    """Attach a direct-action BPF filter; returns the priority it got."""
    parent = DIRECTIONS[direction]
    with _ipr(netns) as ipr:
        idx = _index(ipr, interface)
        try:
            ipr.tc("add", "clsact", idx)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
        prio = 0x4000 + zlib.crc32(name.encode()) % 0x3000  # stable per name; another filter may hold it
        for attempt in range(32):
            try:
                ipr.tc("add-filter", "bpf", idx, ":1", fd=prog_fd, name=name, parent=parent, classid=1,
                       direct_action=True, prio=prio + attempt)
                return prio + attempt
            except NetlinkError as e:
                if e.code != errno.EEXIST:
                    raise
    raise FasterFSError(f"no free TC priority for filter {name} on {interface}")


def remove(interface: str, prefix: str, netns: str | None = None, exact: bool = False,
           drop_qdisc: bool = False) -> int:
    """Delete every BPF filter whose name starts with `prefix` (is `prefix`, if exact); with
    drop_qdisc, also clsact if it is then empty. Only a sole owner of the interface may drop
    it: on a shared one (lo of a one-machine cluster) a sibling may be attaching right now.
    Returns how many filters were removed."""
    removed = 0
    with _ipr(netns) as ipr:
        found = ipr.link_lookup(ifname=interface)
        if not found:
            return 0
        idx = found[0]
        remaining = 0
        for parent in (EGRESS, INGRESS):
            try:
                filters = ipr.get_filters(idx, parent=parent)
            except NetlinkError:
                continue  # no clsact on this interface
            for f in filters:
                if not f.get_attr("TCA_OPTIONS"):
                    continue  # the per-priority header entry
                name = _filter_name(f)
                if name is not None and (name == prefix if exact else name.startswith(prefix)):
                    try:
                        ipr.tc("del-filter", "bpf", idx, f["handle"], parent=parent, prio=f["info"] >> 16)
                        removed += 1
                    except NetlinkError as e:
                        if e.code != errno.ENOENT:
                            raise
                else:
                    remaining += 1
        if drop_qdisc and remaining == 0:
            try:
                ipr.tc("del", "clsact", idx)
            except NetlinkError:
                pass  # none, or another owner removed it first
    return removed


def list_filters(interface: str, netns: str | None = None) -> list[str]:
    """Names of the BPF filters on an interface (both directions)."""
    names = []
    with _ipr(netns) as ipr:
        found = ipr.link_lookup(ifname=interface)
        if not found:
            return []
        for parent in (EGRESS, INGRESS):
            try:
                names += [n for n in (_filter_name(f) for f in ipr.get_filters(found[0], parent=parent)) if n]
            except NetlinkError:
                pass
    return names


def interface_of(address: str) -> str:
    """The interface that holds `address` in this network namespace (`kernel.host_interface=auto`:
    a machine's own, whatever the distribution named it: eth0, ens3, enp0s31f6, lab0)."""
    with IPRoute() as ipr:
        for msg in ipr.get_addr(address=address):
            return ipr.get_links(msg["index"])[0].get_attr("IFLA_IFNAME")
    if ipaddress.ip_address(address).is_loopback:  # 127.0.0.0/8 is lo's whole, not one address on it
        return "lo"
    raise FasterFSError(f"no interface of this host holds address {address} (kernel.host_interface=auto)")
