"""The Ray way, as a user runs it: `ray up cluster.yaml` (Ray's cluster launcher, local provider,
over SSH) against machines that run nothing but an SSH server (tests/ssh_hosts.py) brings Ray and
FasterFS up on every machine; a machine added to `worker_ips` and `ray up` again joins with a
StorageNode of its own and its share of the data; `fasterfs down` and `ray down` end it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import ssh_hosts
import yaml
from conftest import CLEAN_ENV, wait_until
from xxhash import xxh3_64_intdigest as xxh3

from fasterfs.control import auth, credentials, s3
from fasterfs.core import config
from fasterfs.core.placement import chunk_homes

NAME = "rayup"  # the machines' cgroups and pins are this machine's: a name no other cluster here has
SUBNET = "198.18.6"
PROJECT = config.PROJECT_DIR
FFS = f"cd {PROJECT} && RAY_AUTH_MODE=token .venv/bin/fasterfs"  # as on a machine cluster.yaml set up
MB = 2**20


def launcher_config(m: ssh_hosts.Machines, workers: int) -> Path:
    """cluster.yaml as shipped, for these machines: their addresses, the test's SSH key, the Ray
    token made here; the software is installed already (scripts/setup.sh not run again) and this
    checkout stands where cluster.yaml copies one (~/fasterfs); FasterFS's commands name the
    cluster."""
    c = yaml.safe_load((PROJECT / "cluster.yaml").read_text())
    c["cluster_name"] = NAME
    c["provider"] = dict(c["provider"], head_ip=m.addresses[0], worker_ips=m.addresses[1:1 + workers])
    c["auth"] = {"ssh_user": "root", "ssh_private_key": str(m.key)}
    c["min_workers"] = c["max_workers"] = workers
    c["file_mounts"] = {"~/.ray/auth_token": str(m.work / "token")}
    c["setup_commands"] = [cmd for cmd in c["setup_commands"] if "scripts/setup.sh" not in cmd]
    for kind in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        c[kind] = [_here(cmd) for cmd in c[kind]]
    path = m.work / f"cluster-{workers}.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _here(cmd: str) -> str:
    cmd = re.sub(r"~/fasterfs(?=[ /]|$)", str(PROJECT), cmd)
    return f"{cmd} cluster.name={NAME}" if re.search(r"fasterfs (up|nodes add) ", cmd) else cmd


def ray(*args: str) -> subprocess.CompletedProcess:
    """Ray's launcher from a clean shell of this machine, with autoscaler v1 as cluster.yaml says."""
    return subprocess.run([str(PROJECT / ".venv/bin/ray"), *args], env=dict(CLEAN_ENV, RAY_UP_enable_autoscaler_v2="0"),
                          capture_output=True, text=True, timeout=600, cwd=PROJECT)


def healthy(m: ssh_hosts.Machines) -> list[str]:
    """The addresses `fasterfs status` on the head shows healthy."""
    out = m.ssh(0, f"{FFS} status cluster.name={NAME}", 120).stdout
    return sorted(cells[2] for line in out.splitlines() if len(cells := [c.strip() for c in line.split("│")]) > 5
                  and cells[5] == "healthy")


@pytest.mark.timeout(900)  # two `ray up`s, each starting machines over SSH: 3-4 minutes here
def test_ray_up_starts_fasterfs_on_every_machine_and_a_second_ray_up_grows_it(tmp_path_factory):
    """`ray up` with one worker: Ray and FasterFS on the head (`up` attached) and on the worker
    (its start commands' `nodes add`), both healthy. A file put there; then the third machine added
    to worker_ips and `ray up` again (Ray restarted on the head, whose `fasterfs up` resumes the
    cluster): Ray's autoscaler starts it, it gets a StorageNode, and its MinIO (listed with boto3)
    comes to hold exactly the chunks placement over three nodes gives it, each with the file's
    bytes; `fasterfs cat` on it reads the file whole. Afterwards `fasterfs down` and `ray down`,
    and the machines switched off, leave nothing."""
    work = Path(str(tmp_path_factory.mktemp("rayup"))[:60])  # under /tmp: each machine's own /tmp hides it
    launchers = set(Path("/tmp").glob("ray[-_][cs]*"))  # the launcher's config caches and SSH sockets here
    m = ssh_hosts.start(NAME, SUBNET, 3, work)
    try:
        auth.create(work / "token")
        up = ray("up", "-y", "--no-config-cache", "--disable-usage-stats", str(launcher_config(m, 1)))
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        wait_until(lambda: healthy(m) == m.addresses[:2], 180, "a healthy StorageNode on the head and the worker")
        blob = os.urandom(6 * MB + 5)
        (m.disks[0] / "blob.bin").write_bytes(blob)  # on the head's own disk, its cluster root there
        put = m.ssh(0, f"{FFS} put {ssh_hosts.ROOT}/blob.bin team/blob.bin files.chunk_mb=1 cluster.name={NAME}")
        assert put.returncode == 0, put.stdout + put.stderr

        grow = ray("up", "-y", "--no-config-cache", "--disable-usage-stats", str(launcher_config(m, 2)))
        assert grow.returncode == 0, grow.stdout[-3000:] + grow.stderr[-3000:]
        wait_until(lambda: healthy(m) == m.addresses, 180, "a healthy StorageNode on the machine added")
        cfg = config.load([])
        homes = chunk_homes("team/blob.bin", 7, [0, 1, 2], 1, cfg.placement.load_slack)
        wanted = sorted(xxh3(blob[i * MB:(i + 1) * MB]) for i, h in enumerate(homes) if 2 in h)
        assert wanted, "placement gave the machine added none of the file's chunks: nothing was shown"
        creds = credentials.load(m.disks[0] / "credentials.json").admin  # the head's disk
        added = s3.client(f"http://{m.addresses[2]}:{cfg.minio.port}", creds)

        def held() -> list[int]:  # what the added machine's MinIO lists and serves, by its own listing
            objects = added.list_objects_v2(Bucket=cfg.minio.bucket).get("Contents", [])
            return sorted(xxh3(added.get_object(Bucket=cfg.minio.bucket, Key=o["Key"])["Body"].read())
                          for o in objects)
        wait_until(lambda: held() == wanted, 180, "the added machine's share of the file moved to it")
        cat = subprocess.run(["ssh", "-i", str(m.key), *ssh_hosts.SSH_OPTIONS, f"root@{m.addresses[2]}",
                              f"{FFS} cat team/blob.bin cluster.ray_address={m.addresses[0]}:6391 cluster.name={NAME}"],
                             capture_output=True, timeout=300)
        assert cat.returncode == 0 and cat.stdout == blob, cat.stderr[-2000:]
    finally:
        down = m.ssh(0, f"{FFS} down cluster.name={NAME}")
        stopped = ray("down", "-y", str(m.work / "cluster-1.yaml"))
        ssh_hosts.stop(m)
        for left in set(Path("/tmp").glob("ray[-_][cs]*")) - launchers:  # what the launcher left on this machine
            shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink()
        for left in Path("/tmp/ray").glob(f"cluster-{NAME}.*"):  # its local provider's record of the machines
            left.unlink()
    assert down.returncode == 0 and "3 StorageNodes" in down.stdout, down.stdout + down.stderr
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    cgroups = [p.name for p in Path("/sys/fs/cgroup").iterdir() if NAME in p.name]
    assert cgroups == [], f"cgroups of the machines' cluster left: {cgroups}"
