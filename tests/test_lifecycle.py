"""up/down of a cluster of its own: what is started is all stopped; bad starts clean up
after themselves and name the culprit."""
import contextlib
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import cluster_overrides, command_lines, mounts_under
from omegaconf import OmegaConf

from fasterfs.core import config
from fasterfs.core.cgroup import cgroup2_mount
from fasterfs.core.errors import FasterFSError
from fasterfs.hosts import ray_nodes
from fasterfs.ops import attached_growth, cluster


@pytest.fixture
def own(tmp_path_factory):
    root = Path(str(tmp_path_factory.mktemp("lc"))[:60])  # a short root, like a user's
    return cluster_overrides(root, "127.0.2.2", 1, nodes=1)


def test_down_without_cluster(own):
    with pytest.raises(FasterFSError, match="no FasterFS cluster is running under"):
        cluster.down(config.load(own))


@pytest.mark.parametrize("option, label", [("minio.port", "MinIO API"), ("dashboard.port", "FasterFS dashboard")])
def test_port_in_use_named_and_nothing_started(own, option, label):
    cfg = config.load(own)
    port = OmegaConf.select(cfg, option)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.2.2", port))
        s.listen()
        with pytest.raises(FasterFSError, match=rf"port 127.0.2.2:{port} \({label} \({option}\)"):
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
    assert not mounts_under(layout.paths.root)  # its bpffs too
    assert not any(cluster.is_ray_start(int(p.name)) and str(layout.paths.root).encode() in
                   (p / "cmdline").read_bytes() for p in Path("/proc").iterdir() if p.name.isdigit())


@pytest.mark.parametrize("secured", [True, False], ids=["token", "open"])
def test_attach_to_a_ray_cluster_started_elsewhere(tmp_path_factory, monkeypatch, capsys, secured):
    """cluster.yaml's path: Ray is started by someone else (with token authentication, as
    cluster.yaml does; or without, which FasterFS refuses unless cluster.insecure=true, and
    then says so); FasterFS adds StorageNodes and on down stops only what it started. With the
    token (the data path, once): a machine joins the Ray cluster (`ray start --address`) and
    `fasterfs nodes add` gives it a StorageNode; the namespace then names it exactly where
    placement over both nodes does, its MinIO (listed with boto3) holds exactly those pieces, and
    the file reads whole (`nodes add` run as on that machine, whose disk holds no cluster state;
    run again on the head, nothing new, it is refused); `fasterfs nodes drain` moves them back and
    stops its StorageNode, the machine's Ray node running on (its owner's)."""
    import os
    import signal
    import sys

    import fasterfs
    from fasterfs.control import auth
    from fasterfs.core.cgroup import ProjectCgroup
    from fasterfs.ui.cli import main
    from fasterfs.write.ingest import put

    root = Path(str(tmp_path_factory.mktemp("att"))[:60])
    own = cluster_overrides(root, "127.0.3.2", 2, nodes=1) + ["dashboard.enabled=false"]  # not what is tested
    cfg = config.load(own)
    outside = ProjectCgroup.create("attach-test-ray", root)  # stands in for the machines' own Ray
    ray_bin = str(Path(sys.executable).with_name("ray"))
    # open: Ray's own default would be a token where its user keeps one (~/.ray/auth_token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_MODE": "disabled"}
    if secured:  # the machines' token, where Ray's users keep it (not under FasterFS's root)
        token_file = root.parent / f"{root.name}-token"
        auth.create(token_file)
        env.update(auth.ray_env(token_file))
        for k, v in auth.ray_env(token_file).items():  # this driver holds it as a user would
            monkeypatch.setenv(k, v)
    head = outside.spawn([ray_bin, "start", "--block", "--head", "--node-ip-address=127.0.3.2", "--port=6500",
                          "--num-cpus=1", "--object-store-memory=200000000", "--include-dashboard=false",
                          "--ray-client-server-port=7150", "--dashboard-agent-listen-port=52480",
                          "--disable-usage-stats"], root / "head.log", dict(env, RAY_USAGE_STATS_ENABLED="0"))
    attach = own + ["cluster.attach=true", "cluster.ray_address=127.0.3.2:6500", "repair.drain_grace_s=1"]
    worker = None
    try:
        ray_nodes.wait_for_head(config.load(own + ["cluster.ray_port=6500"]), cluster.Host("127.0.3.2"), head,
                               root / "head.log")
        if not secured:
            with pytest.raises(FasterFSError, match="without token authentication.*cluster.insecure=true"):
                cluster.up(config.load(attach))
            attach.append("cluster.insecure=true")
        state = cluster.up(config.load(attach))
        assert state.attached and [n.address for n in state.nodes] == ["127.0.3.2"]
        assert state.insecure is not secured
        assert main(["status", *attach]) == 0
        shown = capsys.readouterr().out
        assert ("Insecure: Ray runs without token authentication" in shown) is not secured, shown
        if secured:  # the data path, once: the token is all the two cases differ in
            src = root / "blob.bin"  # a small file: what is tested is the attached cluster, not ingest's speed
            src.write_bytes(os.urandom(3 * 2**20 + 17))
            put(config.load(own + ["files.chunk_mb=1"]), src, "team/blob.bin")
            client = fasterfs.connect(root, dataset="team/blob.bin")
            assert b"".join(client.read_chunk(i) for i in range(len(client))) == src.read_bytes()
            worker = outside.spawn([ray_bin, "start", "--block", "--address=127.0.3.2:6500",
                                    "--node-ip-address=127.0.3.3", "--num-cpus=1", "--object-store-memory=200000000",
                                    "--dashboard-agent-listen-port=52481", "--disable-usage-stats"],
                                   root / "worker.log", dict(env, RAY_USAGE_STATS_ENABLED="0"))
            grown(attach, src.read_bytes(), worker)
        report = cluster.down(cfg)
        assert report["actors_stopped"] == 1 and report["ray_nodes_stopped"] == 0
        assert head.poll() is None  # the Ray cluster we did not start keeps running
        assert worker is None or worker.poll() is None
        minio_left = [pid for pid, cmd in command_lines() if str(root).encode() in cmd and b"minio" in cmd]
        assert not minio_left
    finally:
        if config.Layout.of(cfg).paths.state_file.exists():  # failed part-way: down what FasterFS started (bpffs too)
            with contextlib.suppress(FasterFSError):
                cluster.down(cfg)
        for started in (worker, head):
            if started is not None:
                started.send_signal(signal.SIGTERM)
                started.wait(60)
        outside.remove()
    assert not mounts_under(str(root)), "a mount (bpffs) of the attached cluster is left"


def grown(attach: list[str], blob: bytes, worker) -> None:
    """The attached cluster (node 0 holding team/blob.bin) grown by the Ray node at 127.0.3.3, then
    drained of it (test_attach_to_a_ray_cluster_started_elsewhere)."""
    import sys

    import ray
    from conftest import minio_keys, wait_until
    from xxhash import xxh3_64_intdigest as xxh3

    import fasterfs
    from fasterfs.control import registry, s3
    from fasterfs.core.placement import chunk_homes
    from fasterfs.node import repair_survey
    from fasterfs.ui.cli import main

    cfg = config.load(attach)
    wait_until(lambda: any(n["Alive"] and n["NodeManagerAddress"] == "127.0.3.3" for n in ray.nodes()), 60,
               "the machine's Ray node to join")
    # run on the machine that joined, as cluster.yaml's worker start commands do: no cluster state on its disk
    elsewhere = [o for o in attach if not o.startswith("cluster.root=")] + [f"cluster.root={cfg.cluster.root}-w"]
    out = subprocess.run([str(Path(sys.executable).with_name("fasterfs")), "nodes", "add", *elsewhere],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "node 1 joined at 127.0.3.3" in " ".join(out.stdout.split()), out.stdout + out.stderr
    assert not Path(f"{cfg.cluster.root}-w", "cluster.json").exists()
    again = subprocess.run(out.args, capture_output=True, text=True, timeout=300)  # its start commands run again
    assert again.returncode == 0 and "has its StorageNode already" in again.stdout, again.stdout + again.stderr
    state = cluster.ClusterState.load(cfg.cluster.root)
    assert [(n.index, n.address) for n in state.nodes] == [(0, "127.0.3.2"), (1, "127.0.3.3")]
    assert main(["nodes", "add", *attach]) == 1  # nothing new: refused, naming how a machine joins
    with pytest.raises(FasterFSError, match="however many: no COUNT"):  # the joined machines are Ray's to count
        attached_growth.add_nodes(config.load(attach), 2)
    homes = chunk_homes("team/blob.bin", -(-len(blob) // 2**20), [0, 1], 1, cfg.placement.load_slack)
    wanted = {i for i, h in enumerate(homes) if 1 in h}
    assert wanted, "placement gave the new node none of the file's chunks: nothing was shown"
    creds = registry.fetch_credentials(state.name, "admin")

    def moved() -> bool:
        named = {c.id for c in registry.fetch_manifest(state.name, "team/blob.bin").chunks if 1 in c.nodes}
        return named == wanted and repair_survey.survey(state, creds, cfg.placement.load_slack).misplaced == 0
    wait_until(moved, 120, "the new node's share moved to it")
    m = registry.fetch_manifest(state.name, "team/blob.bin")
    held = minio_keys(state, "")
    assert held[1] == {c.key for c in m.chunks if 1 in c.nodes}  # its MinIO's own listing: exactly its share
    mine = s3.client(state.node(1).endpoint, creds)
    for c in (c for c in m.chunks if 1 in c.nodes):  # each piece there as stored: the source's bytes
        body = mine.get_object(Bucket=m.bucket, Key=c.key)["Body"].read()
        assert xxh3(body) == xxh3(blob[c.id * 2**20:(c.id + 1) * 2**20]), c.id
    client = fasterfs.connect(cfg.cluster.root, dataset="team/blob.bin")
    assert b"".join(client.read_chunk(i) for i in range(len(client))) == blob
    assert main(["nodes", "drain", "1", *attach]) == 0
    state = cluster.ClusterState.load(cfg.cluster.root)
    assert [n.index for n in state.nodes] == [0]
    assert not [c.id for c in registry.fetch_manifest(state.name, "team/blob.bin").chunks if 1 in c.nodes]
    assert any(n["Alive"] and n["NodeManagerAddress"] == "127.0.3.3" for n in ray.nodes()) and worker.poll() is None
    client = fasterfs.connect(cfg.cluster.root, dataset="team/blob.bin")
    assert b"".join(client.read_chunk(i) for i in range(len(client))) == blob
