"""NodeKernel: one node's kernel programs in place (fasterfs.bpf), and undone by `close`.

The TC request tracker on the node's interfaces (exact filter names, which replace what a crashed
earlier incarnation left), the stale marks pinned in this host's own bpffs (readers on the host
check them), and SOCK_OPS on the node's own cgroup (never the root cgroup: every socket on the
host is not ours to tune).
"""
from __future__ import annotations

import os
from collections.abc import Callable

from .. import bpf
from ..bpf.pinned import mount_bpffs, unmount_bpffs
from ..control.state import filter_prefix
from ..core.cgroup import own_cgroup
from ..core.errors import FasterFSError


class NodeKernel:
    def __init__(self, cfg, node: int, address: str, paths, on_event: Callable[[dict], None]):
        k = cfg.kernel
        self.paths = paths
        self._own_bpffs = False
        self.sockops_skipped: str | None = None
        self.programs = programs = bpf.load(k.mode, k.hot_threshold, k.fill_mark, k.delack_max_us,
                                            on_event=on_event, bucket=cfg.minio.bucket,
                                            stale_marks=k.stale_marks, ring_pages=k.ring_pages,
                                            count_keys=k.count_keys, seen_bits=k.seen_bits)
        try:
            programs.watch(address if k.watch == "own" else None, cfg.minio.port)
            # Local reads cross lo; on a host with an interface of its own, its reads of other
            # hosts leave on it (egress) and other hosts' writes arrive on it (ingress).
            prefix = filter_prefix(cfg.cluster.name, node)
            programs.attach_tc(k.interface, f"{prefix}{k.interface}:egress")
            from ..bpf import tc  # pyroute2: not for every process that holds a StorageNode's handle

            host_interface = tc.interface_of(address) if k.host_interface == "auto" else k.host_interface
            if host_interface and host_interface != k.interface:
                for direction in ("egress", "ingress"):
                    programs.attach_tc(host_interface, f"{prefix}{host_interface}:{direction}", direction,
                                       sole_owner=True)  # one StorageNode per host
            if programs.mode == "real":
                try:
                    self._own_bpffs = mount_bpffs(paths.bpffs)
                except OSError as e:
                    raise FasterFSError(f"host {address}: cannot mount a bpffs for the stale marks: {e}") from None
                programs.marks.pin_stale_marks(str(paths.stale_pin(node)))
            cgroup = own_cgroup()
            if k.tune_sockets and cgroup is not None:
                programs.attach_sockops(str(cgroup))
            elif k.tune_sockets:
                self.sockops_skipped = "this process is in the root cgroup (or there is no cgroup2)"
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Detach and unload the programs; unmount the bpffs this node mounted once no sibling's
        pin is left in it."""
        self.programs.close()
        if self._own_bpffs and os.path.isdir(self.paths.bpffs) and not os.listdir(self.paths.bpffs):
            unmount_bpffs(self.paths.bpffs)
            self._own_bpffs = False
