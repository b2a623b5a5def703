"""Bare machines for Ray's cluster launcher on one machine: lab hosts (network namespace, private
disk at the cluster root, private /tmp and /dev/shm, fasterfs.hosts.private_host) with nothing
running but an SSH server (Debian's openssh-server, keys made here), each in a PID namespace of
its own, so that `ray stop` run there sees that machine's processes only, and its end ends every
process started on it. Used by tests/test_lab_ray_up.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from fasterfs.core.config import PROJECT_DIR
from fasterfs.hosts import lab_disks
from fasterfs.hosts.lab_network import create_network, destroy_network, leftovers
from fasterfs.hosts.ray_nodes import _software_under_tmp

ROOT = "/var/lib/fasterfs"  # each machine's cluster root (the default), its private disk
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


@dataclass
class Machines:
    name: str
    work: Path
    addresses: list[str]
    disks: list[Path]
    record: dict = field(default_factory=dict)
    mounted: list[str] = field(default_factory=list)
    servers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def key(self) -> Path:
        return self.work / "key"

    def ssh(self, index: int, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`command` run on machine `index` over SSH, as a user logged in there."""
        return subprocess.run(["ssh", "-i", str(self.key), *SSH_OPTIONS, f"root@{self.addresses[index]}", command],
                              capture_output=True, text=True, timeout=timeout)


def start(name: str, subnet: str, count: int, work: Path) -> Machines:
    """`count` machines at <subnet>.10, .11, ... on a bridge at <subnet>.1, each with sshd."""
    lab = OmegaConf.create({"subnet": subnet, "profile": "unlimited", "disk_mbit": None, "link_mbit": None,
                            "burst_kb": 256, "outsiders": 0})
    work.mkdir(parents=True, exist_ok=True)
    record, bridge, hosts = create_network(name, count, lab)
    m = Machines(name, work, [h.address for h in hosts], [], record)
    try:
        m.disks, m.mounted = lab_disks.prepare(work / "disks", [f"disk{i}" for i in range(count)], None)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(m.key)], check=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        for host, disk in zip(hosts, m.disks):
            # Ray's IP detection asks for the route to the Internet: the bridge, which forwards nothing
            subprocess.run(["ip", "-n", host.netns, "route", "add", "default", "via", bridge.address], check=True)
            home = disk / "home" / ".ssh"
            home.mkdir(parents=True)
            shutil.copy(f"{m.key}.pub", home / "authorized_keys")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(disk / "host_key")], check=True)
            (disk / "sshd_config").write_text(
                f"ListenAddress {host.address}\nHostKey {ROOT}/host_key\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPidFile none\n")
            # the machine's own /root too (Ray's launcher writes its key and config there)
            boot = f"mount --bind {ROOT}/home /root && exec /usr/sbin/sshd -D -e -f {ROOT}/sshd_config"
            m.servers.append(subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{host.netns}", "--", "unshare", "--mount", "--propagation", "private",
                 "--pid", "--fork", "--kill-child", "--mount-proc", "--", sys.executable, "-m",
                 "fasterfs.hosts.private_host", ROOT, str(disk), ":".join(_software_under_tmp()), "sh", "-c", boot],
                stdout=open(work / f"sshd-{host.address}.log", "w"), stderr=subprocess.STDOUT, cwd=PROJECT_DIR))
        for i in range(count):
            _wait_for_ssh(m, i)
    except BaseException:
        stop(m)
        raise
    return m


def _wait_for_ssh(m: Machines, index: int) -> None:
    import time

    deadline = time.monotonic() + 30
    while (done := m.ssh(index, "true", 15)).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no SSH server answers on {m.addresses[index]}: {done.stderr[-500:]}")
        time.sleep(0.3)


def stop(m: Machines) -> None:
    """Every machine off: its PID namespace's first process killed, the kernel ends the rest;
    then the network and the disks go."""
    for server in m.servers:
        server.kill()  # unshare --kill-child: its end kills the namespace's init, and the kernel all in it
        server.wait(60)
    destroy_network(m.record)
    lab_disks.release(m.mounted)
    assert leftovers(m.name) == [], leftovers(m.name)
