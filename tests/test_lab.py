"""The lab: hosts in network namespaces with their own addresses and bandwidth; up/down
leave nothing behind (also after a failure half-way); data read across hosts is right;
the reader's host caches what it made hot."""
import subprocess
from pathlib import Path

import pytest
import ray
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs import cluster, config, lab
from fasterfs.errors import FasterFSError
from fasterfs.ingest import ingest

from conftest import assert_nothing_left, cluster_overrides, data_overrides, mounts_under

SUBNET = "198.18.7"


@pytest.fixture
def lab_overrides(tmp_path_factory):
    root = Path(str(tmp_path_factory.mktemp("lab"))[:60])
    return cluster_overrides(root, "127.0.4.2", 3, nodes=2) + [f"lab.subnet={SUBNET}", "lab.link_mbit=100"]


def _in_ns(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, check=True).stdout


@ray.remote(num_cpus=0)
def _read(root, ids):
    client = fasterfs.connect(root, ["cache.prefetch.enabled=false"])
    out = []
    for i in ids:
        data = client.read_chunk(i)
        out.append((xxh3(data), client.sources(i)[0]))
    return ray.get_runtime_context().get_node_id(), out


def test_lab_up_reads_across_hosts_and_down_leaves_nothing(lab_overrides):
    cfg = config.load(lab_overrides)
    state = lab.up(cfg)
    try:
        assert [n.address for n in state.nodes] == [f"{SUBNET}.10", f"{SUBNET}.11"]
        assert state.head_address == f"{SUBNET}.1"
        for n in state.nodes:
            assert n.netns and n.kernel_mode == "real"
            qdiscs = _in_ns(n.netns, "tc", "qdisc", "show")
            assert "tbf" in qdiscs and "dev lo" in qdiscs and "dev lab0" in qdiscs
            listening = _in_ns(n.netns, "ss", "-ltn")
            assert f"{n.address}:{cfg.minio.port}" in listening  # MinIO bound to the host's own address
        assert len({n.host_id for n in state.nodes}) == 2  # two hosts, two network namespaces
        manifest = ingest(config.load(lab_overrides + data_overrides()))
        remote = [c.id for c in manifest.chunks if c.nodes == [1]][:3]
        node_id, got = ray.get(_read.options(**cluster.pinned(state.nodes[0])).remote(state.root, remote + remote))
        assert node_id == state.nodes[0].ray_node_id
        assert [h for h, _ in got] == [manifest.chunk(i).xxh3 for i in remote + remote]  # a chunk read across hosts equals its source
        assert all(src == 1 for _, src in got)
        actors = cluster.storage_nodes(state)
        kernel = ray.get([a.kernel_status.remote() for a in actors])
        assert kernel[0]["counters"]["hot_events"] == len(remote)  # the reader's host saw them hot
        assert kernel[1]["counters"].get("hot_events", 0) == 0
    finally:
        cluster.down(cfg)
    assert_nothing_left(state)
    assert lab.leftovers(cfg.cluster.name) == []


def test_failed_lab_up_leaves_nothing(lab_overrides, tmp_path):
    fake = tmp_path / "minio"
    fake.write_text("#!/bin/sh\nexit 3\n")  # MinIO that dies: the network and Ray nodes are up by then
    fake.chmod(0o755)
    cfg = config.load(lab_overrides + [f"minio.binary={fake}", "cluster.start_timeout_s=60"])
    with pytest.raises(FasterFSError, match="StorageNode failed to start"):
        lab.up(cfg)
    assert lab.leftovers(cfg.cluster.name) == []
    assert not config.Layout.of(cfg).paths.state_file.exists()
    assert not Path("/sys/fs/cgroup/unified", f"fasterfs-{cfg.cluster.name}").exists()
    assert not mounts_under(cfg.cluster.root)  # its bpffs too
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd(p).find(str(cfg.cluster.root)) >= 0]
    assert not left


def _cmd(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_lab_down_without_lab_is_an_error(lab_overrides):
    with pytest.raises(FasterFSError, match="no FasterFS lab is running"):
        lab.down(config.load(lab_overrides))


def test_leftovers_of_a_crashed_lab_are_removed(lab_overrides):
    cfg = config.load(lab_overrides)
    lab.create_network(cfg.cluster.name, 2, cfg.lab)  # as if the process that made them died
    assert lab.leftovers(cfg.cluster.name)
    report = lab.down(cfg)  # no state file: `lab down` still removes what is left
    assert report["lab_removed"] >= 2 and lab.leftovers(cfg.cluster.name) == []
