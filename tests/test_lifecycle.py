"""up/down of a cluster of its own: what is started is all stopped; bad starts clean up
after themselves and name the culprit."""
import socket
from pathlib import Path

import pytest

from fasterfs import cluster, config
from fasterfs.cgroup import cgroup2_mount
from fasterfs.errors import FasterFSError

from conftest import assert_nothing_left, cluster_overrides


@pytest.fixture
def own(tmp_path_factory):
    root = Path(str(tmp_path_factory.mktemp("lc"))[:60])  # keep Ray's socket paths short
    return cluster_overrides(root, "127.0.2.2", 1, nodes=1)


def test_up_then_down_leaves_nothing(own):
    cfg = config.load(own)
    state = cluster.up(cfg)
    cg = Path(state.cgroup["path"])
    assert cg.parent == cgroup2_mount() and len((cg / "cgroup.procs").read_text().split()) > 3
    report = cluster.down(cfg)
    assert report["actors_stopped"] == 1 and report["ray_nodes_stopped"] == 1 and not report["actor_errors"]
    assert_nothing_left(state)


def test_down_without_cluster(own):
    with pytest.raises(FasterFSError, match="no FasterFS cluster is running under"):
        cluster.down(config.load(own))


def test_port_in_use_named_and_nothing_started(own):
    cfg = config.load(own)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.2.2", cfg.minio.port))
        s.listen()
        with pytest.raises(FasterFSError, match=rf"port 127.0.2.2:{cfg.minio.port} \(MinIO API"):
            cluster.up(cfg)
    assert not config.Layout.of(cfg).paths.state_file.exists()


def test_missing_minio_fails_before_starting_anything(own, tmp_path):
    cfg = config.load(own + [f"minio.binary={tmp_path}/absent/minio"])
    with pytest.raises(FasterFSError, match="MinIO binary not found .*make setup"):
        cluster.up(cfg)
    assert not config.Layout.of(cfg).paths.state_file.exists()


def test_failed_actor_start_tears_everything_down(own, tmp_path):
    # MinIO that exits at once: Ray nodes come up, the StorageNode fails, up must undo it all.
    fake = tmp_path / "minio"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    cfg = config.load(own + [f"minio.binary={fake}", "cluster.start_timeout_s=60"])
    with pytest.raises(FasterFSError, match="StorageNode failed to start"):
        cluster.up(cfg)
    layout = config.Layout.of(cfg)
    assert not layout.paths.state_file.exists()
    assert not Path(cgroup2_mount(), f"fasterfs-{cfg.cluster.name}").exists()
    assert not any(cluster._is_ray_start(int(p.name)) and str(layout.paths.root).encode() in
                   (p / "cmdline").read_bytes() for p in Path("/proc").iterdir() if p.name.isdigit())
