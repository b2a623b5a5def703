"""Shared fixtures: a real 2-node FasterFS cluster (Ray nodes, StorageNode actors, MinIO
servers) on loopback addresses and ports of its own, so it never meets a cluster a user
runs with the defaults; and checks that it leaves nothing behind."""
from __future__ import annotations

import base64
import contextlib
import csv
import functools
import gzip
import hashlib
import hmac
import itertools
import json
import os
import posixpath
import shutil
import subprocess
import tempfile
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

# The suite's clusters are its own, whatever the caller's shell points at (`eval "$(fasterfs env)"`
# sets these): taken out before Ray or FasterFS is imported. FASTERFS_TEST_DATA and
# FASTERFS_LOBSTER_DIR stay: they choose the suite's data.
for _name in [n for n in os.environ if n.startswith("RAY_") or n in ("FASTERFS_ROOT", "FASTERFS_CLUSTER")]:
    del os.environ[_name]

import pytest  # noqa: E402

from fasterfs.core import config, lobster  # noqa: E402
from fasterfs.core.config import Layout  # noqa: E402
from fasterfs.ops import cluster  # noqa: E402
from fasterfs.write.ingest import ingest  # noqa: E402

LOBSTER = Path(config.lobster_dir())
HAVE_SAMPLE = (LOBSTER / "AAPL_2012-06-21_34200000_37800000_message_30.csv.gz").exists()


def cluster_overrides(root: Path, first_address: str, port_offset: int, nodes: int = 2) -> list[str]:
    return [f"cluster.root={root}", f"cluster.first_address={first_address}", f"nodes={nodes}",
            "cluster.name=fasterfs-test" + str(port_offset), "cluster.object_store_mb=256", "cluster.cpus_per_node=2",
            f"cluster.ray_port={6400 + port_offset}", f"cluster.dashboard_port={8300 + port_offset}",
            f"cluster.agent_port={22000 + 10 * port_offset}",
            f"cluster.node_ports={23000 + 1000 * port_offset}",
            f"minio.port={9100 + port_offset}", f"minio.console_port={9150 + port_offset}",
            f"dashboard.port={8400 + port_offset}", "kernel.mode=real",  # never the simulation, unless a test says so
            "mount.warm_entries=0",  # mounts list what they are asked for alone (test_mount warms one itself)
            "repair.check_s=2"]  # the leader looks at a change within 2 s, as on the lab: tests wait for that look


def wait_until(pred, timeout: float = 15.0, what: str = "condition") -> bool:
    """Poll until pred() is true (bounded); an AssertionError names what never happened. Between
    polls it waits as long as the last poll took (at least 50 ms): a poll that runs a command or
    lists MinIO then takes at most half the time, not a core the awaited work needs."""
    deadline = time.monotonic() + timeout
    while (began := time.monotonic()) < deadline:
        if pred():
            return True
        time.sleep(min(max(0.05, time.monotonic() - began), max(0.0, deadline - time.monotonic())))
    raise AssertionError(f"timed out waiting for {what}")


def placed(tasks) -> bool:
    """Every task listed has the node Ray placed it on (a task's record may arrive before that)."""
    return bool(tasks) and all(t.node_id for t in tasks)


def tasks_ray_recorded(state, filters: list, present=placed, excluding: frozenset = frozenset()) -> list:
    """The tasks Ray's state API (the dashboard of cluster `state`) lists under `filters`, but
    none of `excluding` (task ids: an earlier run's, from `task_ids`), once `present(tasks)`: a
    task's events reach the GCS a second or so after it ends, so a job just finished may not be
    there yet."""
    from ray.util.state import list_tasks

    tasks: list = []

    def listed() -> bool:
        nonlocal tasks
        tasks = [t for t in list_tasks(address=state.dashboard_url, filters=filters, limit=10000, timeout=60)
                 if t.task_id not in excluding]
        return present(tasks)

    try:
        wait_until(listed, 30, f"Ray to record tasks {filters}")
    except AssertionError as e:  # what Ray did have, to tell a lost record from one without its node
        raise AssertionError(f"{e}; listed: {[(t.state, t.node_id, t.job_id) for t in tasks]}") from None
    return tasks


def task_ids(state, filters: list) -> frozenset:
    """The ids of the tasks Ray lists under `filters` now: what a run about to start is not."""
    from ray.util.state import list_tasks

    return frozenset(t.task_id for t in list_tasks(address=state.dashboard_url, filters=filters, limit=10000,
                                                   timeout=60))


def dashboard_headers(state) -> dict[str, str]:
    """What FasterFS's dashboard asks of every request: the cluster's token (its file, 0600)."""
    from fasterfs.control import auth

    return auth.bearer(state.root)


def minio_listing(state, prefix: str) -> dict[int, list[dict]]:
    """Node index -> the objects under `prefix` in that node's MinIO, as MinIO lists them (boto3
    with the cluster's admin key): where the data is, not where FasterFS's plan says."""
    from fasterfs.control import registry, s3

    creds = registry.fetch_credentials(state.name, "admin")
    out = {}
    for n in state.nodes:
        pages = s3.client(n.endpoint, creds).get_paginator("list_objects_v2").paginate(
            Bucket=state.settings.bucket, Prefix=prefix)
        out[n.index] = [o for page in pages for o in page.get("Contents", [])]
    return out


def minio_keys(state, prefix: str) -> dict[int, set[str]]:
    """Node index -> the keys under `prefix` in that node's MinIO, as MinIO lists them."""
    return {n: {o["Key"] for o in objects} for n, objects in minio_listing(state, prefix).items()}


def minio_requests(endpoint: str, creds, api: str) -> int:
    """How many `api` requests (e.g. "ListObjectsV2") the MinIO at `endpoint` has served, as it
    counts them itself: its metrics (v3, not cached as v2's are), asked with the bearer token
    `mc admin prometheus generate` makes (HS512 over the admin's secret key)."""
    def part(d: dict) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(d, separators=(",", ":")).encode()).rstrip(b"=")
    signed = part({"alg": "HS512", "typ": "JWT"}) + b"." + part(
        {"exp": int(time.time()) + 60, "sub": creds.access_key, "iss": "prometheus"})
    sig = base64.urlsafe_b64encode(hmac.new(creds.secret_key.encode(), signed, hashlib.sha512).digest()).rstrip(b"=")
    req = urllib.request.Request(f"{endpoint}/minio/metrics/v3/api/requests",
                                 headers={"Authorization": f"Bearer {(signed + b'.' + sig).decode()}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("minio_api_requests_total{") and f'name="{api}"' in line)


def minio_holdings(state, manifest) -> dict[int, list[dict]]:
    """Node index -> the objects of `manifest`'s generation in that node's MinIO: everything
    under its chunks' directory (a dataset's `<name>/<generation>/`, a put file's under a hash
    of its path)."""
    return minio_listing(state, posixpath.dirname(manifest.chunks[0].key) + "/")


def mounts_under(root) -> list[str]:
    """Mount points (bpffs, cgroup2) the cluster under `root` still has."""
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(f"{root}/")]


def command_lines():
    """(pid, command line bytes) of every process still there."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                yield proc.name, (proc / "cmdline").read_bytes()
            except OSError:
                continue


def assert_nothing_left(state: cluster.ClusterState) -> None:
    """After down: no Ray or MinIO process, no cgroup, no state file of this cluster."""
    for node in state.nodes:
        assert not cluster.is_ray_start(node.ray_pid), f"ray start of node {node.index} still running"
    cg = state.cgroup.get("path")
    assert not (cg and Path(cg).exists()), f"cgroup {cg} left behind"
    for pid, cmd in command_lines():
        assert state.root.encode() not in cmd, f"process {pid} still uses {state.root}: {cmd[:200]!r}"
    assert not Layout.of(config.as_cfg(state.config)).paths.state_file.exists()
    assert not mounts_under(state.root), "a mount (bpffs, cgroup2) of the cluster is left"
    from fasterfs.bpf import tc
    assert not [n for n in tc.list_filters("lo") if n.startswith(f"ffs:{state.name}:")], "TC filters left on lo"
    # the dashboard actor's server is gone with its port (looked up, not connected to: the
    # lab's head address is gone too, and a connection would leave the machine)
    port = state.config["dashboard"]["port"]
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    assert not listening.strip(), f"dashboard port {port} still listening: {listening}"
    tree = subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout
    assert f"fasterfs-{state.name}/" not in tree, "SOCK_OPS attachment left"


STAND_IN = pytest.StashKey[list]()  # what pytest_configure made, for pytest_unconfigure to remove
CONFIG_CACHE = pytest.StashKey[str]()  # where this pytest process's composed configurations are kept
RAY_DIRS = pytest.StashKey[set]()  # Ray's directories there before the run
HOST_AT_START = pytest.StashKey[tuple]()  # host_speed() and the cores' /proc/stat counters as the run began


def default_root() -> Path:
    return Path(config.load([]).cluster.root)


def default_token() -> Path:
    from fasterfs.control import auth

    return auth.token_file(default_root())


def pytest_configure(config):
    """The suite runs as after `make run`: another cluster's Ray token under the default root
    (that cluster's own, when one is there; else a stand-in made here, once per run by pytest's
    controller when -n runs workers, and removed after). Every process the test clusters start
    must find their own cluster, never take that token."""
    from fasterfs.control import auth

    # The configurations the run's processes compose (fasterfs.core.config_cache) are kept in a
    # directory of each pytest process's own, removed after it, not in the caller's home.
    config.stash[CONFIG_CACHE] = os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fasterfs-tests-")
    if hasattr(config, "workerinput"):  # an xdist worker: the controller made it
        return
    if config.getoption("markexpr") == "unit":  # no cluster starts: nothing written outside tmp_path
        return
    config.stash[RAY_DIRS] = ray_dirs()
    token = default_token()
    made = [] if token.exists() else [p for p in (token.parent, token) if not p.exists()]
    if made:
        token.parent.mkdir(parents=True, exist_ok=True)
        auth.create(token)
    config.stash[STAND_IN] = made


def ray_dirs() -> set[Path]:
    """Ray's directories of every FasterFS cluster on this machine (fasterfs.hosts.ray_nodes.ray_temp_dir)."""
    from fasterfs.hosts.ray_nodes import ray_temp_dir

    return set(Path(ray_temp_dir("/")).parent.glob("ray-ffs-*"))


def pytest_unconfigure(config):
    """What pytest_configure made goes; so do Ray's directories of the clusters the tests started
    (their logs: `fasterfs down` keeps them for a user), once every worker is done: the
    controller's, never those of a cluster at the default root (a user's, as after `make run`)."""
    from fasterfs.hosts.ray_nodes import ray_temp_dir

    shutil.rmtree(config.stash[CONFIG_CACHE], ignore_errors=True)
    for path in reversed(config.stash.get(STAND_IN, [])):
        with contextlib.suppress(OSError):  # never more than what was made here
            path.unlink() if path.is_file() else path.rmdir()
    if hasattr(config, "workerinput") or RAY_DIRS not in config.stash:
        return
    users = Path(ray_temp_dir(default_root()))
    running = b"\0".join(cmd for _, cmd in command_lines())  # a cluster another user started meanwhile: its own
    for d in ray_dirs() - config.stash[RAY_DIRS]:
        if d != users and not d.name.startswith(users.name + "-") and str(d).encode() + b"/" not in running:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def another_clusters_token_at_the_default_root() -> str:
    from fasterfs.control import auth

    return auth.read(default_token())


@pytest.fixture(scope="session")
def cluster_root():
    root = Path(tempfile.mkdtemp(prefix="ffs-test-"))  # its own root, never the default one
    yield root
    # a mount the session's cluster left (a teardown that failed part-way) is unmounted before the
    # root goes, where rmtree would skip it and leave it behind, and fails the session
    left = mounts_under(root)
    for point in reversed(left):
        subprocess.run(["umount", point], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"the session's cluster left mounts under its root: {left}"


@pytest.fixture(scope="session")
def overrides(cluster_root) -> list[str]:
    return cluster_overrides(cluster_root, "127.0.1.2", 0)


@pytest.fixture(scope="session")
def cfg(overrides):
    return config.load(overrides)


_LIVE: dict = {}  # how to stop the session's cluster while it runs


@pytest.fixture(scope="session")
def live_cluster(cfg):
    state = cluster.up(cfg)

    def stop() -> None:
        if _LIVE.pop("stop", None) is not None:
            cluster.down(cfg)
            assert_nothing_left(state)
    _LIVE["stop"] = stop
    try:
        yield state
    finally:
        stop()


def pytest_runtest_setup(item):
    """The lab tier comes last and builds hosts of its own: the session's cluster is stopped (and
    checked gone) first, so the lab's hosts have the machine to themselves."""
    if item.get_closest_marker("lab") is not None and "stop" in _LIVE:
        _LIVE["stop"]()


@pytest.fixture(scope="session")
def lab3(tmp_path_factory):
    """One 3-host lab for test_lab_faults, _share_nothing, _head and _with_a_host_added (a lab takes 20 s to come up),
    its hosts with disks of their own (512 MB ext4 images) and repair looking every 2 s. Each
    test undoes what it made; afterwards no cut rule, disk mount or record of faults is left."""
    from lab_hosts import shared_lab

    def nothing_of_the_faults_left(state) -> None:
        assert not [n for n in state.nodes if os.path.ismount(n.disk)]
        assert not Path(state.root, "lab-faults.json").exists()
    yield from shared_lab(tmp_path_factory, "lab", "lab.disk_mb=512", "repair.check_s=2",
                          after=nothing_of_the_faults_left)


@pytest.fixture
def mounted(live_cluster, cluster_root):
    """The namespace mounted on this host by its StorageNode (one host: one mount); unmounted after."""
    import ray

    point = cluster_root / "mnt"
    point.mkdir(exist_ok=True)
    actor = cluster.storage_nodes(live_cluster)[0]
    ray.get(actor.mount.remote(str(point)))
    yield point, actor
    ray.get(actor.umount.remote(str(point)))
    assert str(point) not in mounts_under(cluster_root), "the mount is left"


def load_job(name: str):
    """A job script of jobs/ as a module, to call its main(argv) as `python jobs/<name>.py` would."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"job_{name}", config.PROJECT_DIR / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


# what a shell that never activated the virtualenv has
CLEAN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def submit_job(state, job: str, args: list[str], timeout: float = 900) -> dict:
    """`ray job submit --no-wait ... -- python jobs/<job>.py ARGS` from a clean shell, as the README
    says (run_job); returns its report (<job>.json in the output directory the job's log names)."""
    import json
    import re

    logs, job_id = run_job(state, ["python", f"jobs/{job}.py", *args], timeout, job)
    out = re.findall(r"^output: (\S+)$", logs, re.M)
    assert out, logs[-4000:]
    # with the id Ray gave the job: what its state API lists this run's tasks under
    return dict(json.loads((Path(out[-1]) / f"{job}.json").read_text()), ray_job_id=job_id)


def run_job(state, entrypoint: list[str], timeout: float = 900, name: str = "job") -> tuple[str, str]:
    """`ray job submit --no-wait ... -- ENTRYPOINT` from a clean shell (no VIRTUAL_ENV, default
    PATH; the cluster's Ray token); waits for Ray to report it SUCCEEDED and returns its log and
    the Ray job id it ran as.
    Polled rather than followed: Ray's log tail adds seconds at each end of a job (the following
    form is test_command_line's)."""
    import uuid

    from ray.job_submission import JobStatus, JobSubmissionClient

    from fasterfs.control import auth

    sid = f"test-{name}-{uuid.uuid4().hex[:8]}"
    run = subprocess.run([str(config.PROJECT_DIR / ".venv/bin/ray"), "job", "submit", "--no-wait",
                          "--address", state.dashboard_url, "--submission-id", sid,
                          "--working-dir", str(config.PROJECT_DIR), "--", *entrypoint],
                         # the cluster's token, as the README says (`fasterfs status` names the file)
                         env=dict(CLEAN_ENV, **auth.ray_env(auth.token_file(state.root))), cwd="/",
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    # this cluster's token by name: the process may hold another's (a cluster it started since)
    jobs = JobSubmissionClient(state.dashboard_url,
                               headers={"Authorization": f"Bearer {auth.read(auth.token_file(state.root))}"})
    deadline = time.monotonic() + timeout
    while not (status := jobs.get_job_status(sid)).is_terminal():
        assert time.monotonic() < deadline, f"job {sid} still {status} after {timeout} s"
        time.sleep(0.2)
    logs = jobs.get_job_logs(sid)
    assert status == JobStatus.SUCCEEDED, logs[-4000:]
    return logs, jobs.get_job_info(sid).job_id


# a driver that joins and runs one task: what anyone reaching the GCS would try
PROBE = """
import logging, sys, ray
ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], logging_level=logging.ERROR, log_to_driver=False)
print("ran", ray.get(ray.remote(lambda: 6 * 7).remote()))
"""


def try_driver(address: str, node_ip: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """A Python driver from a shell holding only `env` (not even Ray's default token file). Ray
    tries the GCS once a second, 20 times by default; 3 (its RAY_gcs_server_port_wait_time_s) tell
    a refusal as well, and a driver that gets in does so on the first."""
    return subprocess.run([str(config.PROJECT_DIR / ".venv/bin/python"), "-c", PROBE, address, node_ip],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(CLEAN_ENV, HOME="/nonexistent", RAY_gcs_server_port_wait_time_s="3", **env))


def need_sample() -> None:
    """A data test without the sample fails, unless generated data was asked for by name."""
    if not HAVE_SAMPLE and not SYNTHETIC:
        pytest.fail(MISSING_SAMPLE, pytrace=False)


def data_overrides(fmt: str = "csv", replicas: int = 1) -> list[str]:
    need_sample()
    base = [] if HAVE_SAMPLE else ["data=synthetic", "data.level=30"]
    return base + [f"data.format={fmt}", f"replicas={replicas}"]


def source_lines(overrides: list[str]) -> tuple[list[bytes], list[bytes]]:
    """The source's message and order-book rows as the standard library reads them (gzip): the
    oracle the data tests hold FasterFS to, never its own parser. Without the sample, and only when
    FASTERFS_TEST_DATA=synthetic asks for it, the generated data stands in (the run says so)."""
    return _source_lines(tuple(overrides))


@functools.cache  # read once per session (seconds for the sample): tests only read them
def _source_lines(overrides: tuple[str, ...]) -> tuple[list[bytes], list[bytes]]:
    cfg = config.load(list(overrides) + data_overrides())
    if not HAVE_SAMPLE:
        from fasterfs.write.ingest import load_source

        pair = load_source(cfg)
        return pair.message_lines, pair.orderbook_lines

    def lines(path: str) -> list[bytes]:
        with gzip.open(path, "rb") as f:
            return [line.rstrip(b"\r\n") for line in f if line.strip()]
    return lines(cfg.data.message), lines(cfg.data.orderbook)


def source_csv(first_row: int = 0, rows: int | None = None) -> bytes:
    """Source rows [first_row, first_row + rows) as a CSV dataset's bytes must be: each message line,
    a comma, its order-book line, a newline (LOBSTER's own files, read by gzip)."""
    message, orderbook = source_lines([])
    stop = len(message) if rows is None else first_row + rows
    return b"".join(m + b"," + o + b"\n" for m, o in zip(message[first_row:stop], orderbook[first_row:stop]))


def source_xxh3(chunk) -> int:
    """The xxh3 a CSV dataset's chunk must have: that of its rows of the source files (gzip)."""
    from xxhash import xxh3_64_intdigest

    return xxh3_64_intdigest(source_csv(chunk.first_row, chunk.rows))


def source_rows(overrides: list[str]) -> list[tuple]:
    """Each source row as the csv module parses it: Time a float, every other column an int."""
    return _source_rows(tuple(overrides))


@functools.cache
def _source_rows(overrides: tuple[str, ...]) -> list[tuple]:
    return _rows(*_source_lines(overrides))


def first_source_rows(n: int) -> list[tuple]:
    """The source's first `n` rows as source_rows has them, the sample's read no further (gzip)."""
    if not HAVE_SAMPLE:
        return source_rows([])[:n]
    cfg = config.load(data_overrides())

    def head(path: str) -> list[bytes]:
        with gzip.open(path, "rb") as f:
            return [line.rstrip(b"\r\n") for line in itertools.islice((x for x in f if x.strip()), n)]
    return _rows(head(cfg.data.message), head(cfg.data.orderbook))


def _rows(message: list[bytes], orderbook: list[bytes]) -> list[tuple]:
    """Time a float, every other column an int, as the csv module splits each joined line."""
    lines = ((m + b"," + o).decode() for m, o in zip(message, orderbook))
    return [(float(f[0]), *map(int, f[1:])) for f in csv.reader(lines)]


def loop_pnl(mid: list[int], fast: int, slow: int) -> float:
    """The strategy by its definition, one event at a time, in exact arithmetic: `mid` in whole
    units (1/20000 USD), the averages compared by cross-multiplying their sums."""
    pnl = 0
    for t in range(slow - 1, len(mid) - 1):
        f, s = sum(mid[t - fast + 1:t + 1]) * slow, sum(mid[t - slow + 1:t + 1]) * fast
        pnl += ((f > s) - (f < s)) * (mid[t + 1] - mid[t])
    return float(Fraction(pnl, 20000))


def source_pnls(windows: list, params: list) -> list[tuple[int, list[float]]]:
    """For each [start, end) window of the source, its row count and the crossover strategy's P&L
    for each (fast, slow), by the plain loop over the csv module's rows: the backtests' oracle."""
    rows = source_rows([])
    ask, bid = (lobster.columns(1).index(c) for c in ("AskPrice1", "BidPrice1"))  # the same at every depth
    out = []
    for start, end in windows:
        window = [r for r in rows if start <= r[0] < end]
        mid = [r[ask] + r[bid] for r in window]  # USD x 20000
        out.append((len(window), [loop_pnl(mid, f, s) for f, s in params]))
    return out


_READ_ONLY: dict = {}  # (format, replicas) -> the dataset a read-only test ingested


@pytest.fixture
def ingest_as(live_cluster, overrides):
    """Ingest the LOBSTER sample (or generated data without it) in a format and replication
    (rows: its first rows only). reuse=True, for tests that only read it: the dataset an earlier
    such test ingested, if it is still the current generation as the Registry says (any other
    ingest since replaced it)."""
    from fasterfs.control import registry

    def run(fmt: str = "csv", replicas: int = 1, reuse: bool = False, rows: int | None = None):
        kept = _READ_ONLY.get((fmt, replicas)) if reuse else None
        if kept is not None:
            cluster.connect_ray(live_cluster)  # an earlier test may have left Ray
            current = registry.fetch_manifest(live_cluster.name, kept.name)
            if current is not None and current.generation == kept.generation:
                return kept
        _READ_ONLY.clear()
        first = [f"data.rows={rows}"] if rows else []  # the source's first rows only
        manifest = ingest(config.load(overrides + data_overrides(fmt, replicas) + first))
        if reuse:
            _READ_ONLY[(fmt, replicas)] = manifest
        return manifest
    return run


NO_PREFETCH = ["cache.prefetch.enabled=false"]


def emptied(manifest, live_cluster):
    import ray

    actors = cluster.storage_nodes(live_cluster)
    ray.get([a.cache_clear.remote() for a in actors])
    return manifest, actors


@pytest.fixture
def fresh(ingest_as, live_cluster):
    """A freshly ingested CSV dataset (the test writes its objects) of the sample's first 12
    chunks (the tests read chunks 0 to 9: the whole sample was 7 times the bytes to store), empty
    caches, a new kernel epoch; (its manifest, the StorageNode actors)."""
    return emptied(ingest_as("csv", rows=12_000), live_cluster)


def cached_entry(client, actors, i) -> Path:
    """Chunk i filled into its first source's cache; the entry's path."""
    import ray

    node = client.sources(i)[0]
    ray.get(actors[node].cache_warm.remote([client.manifest.chunk(i).key]))
    return Path(client.cache_path(node, i))


@pytest.fixture
def client_for(live_cluster, cluster_root):
    import fasterfs

    def make(use_cache: bool = True):
        return fasterfs.connect(cluster_root, use_cache=use_cache)
    return make


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Without the sample every data test fails; FASTERFS_TEST_DATA=synthetic runs them on generated
# LOBSTER-format data instead, said in the header and the summary.
SYNTHETIC = os.environ.get("FASTERFS_TEST_DATA") == "synthetic"
MISSING_SAMPLE = (f"THE LOBSTER SAMPLE IS MISSING ({LOBSTER}): put the AAPL sample there (or set "
                  "FASTERFS_LOBSTER_DIR); FASTERFS_TEST_DATA=synthetic tests on generated data instead"
                  + (" (as this run did)" if SYNTHETIC else ""))


def host_speed(steps: int = 2_000_000, tries: int = 3) -> float:
    """Seconds this process takes for 10M steps of a plain Python loop now, the best of a few
    tries: hosts of one kind differ from hour to hour (docs/testing.md), and a suite's time means
    little without this."""
    best = float("inf")
    for _ in range(tries):
        began = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        best = min(best, time.perf_counter() - began)
    return best * 10_000_000 / steps


def cpu_counters() -> tuple[int, int]:
    """(busy, all) jiffies of every core since boot, from /proc/stat's first line."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)  # idle and iowait are not busy


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # pytest's own process, before any worker runs
        session.config.stash[HOST_AT_START] = (host_speed(), cpu_counters())


def pytest_report_header(config):
    speed = [f"host: 10M Python loop steps in {config.stash[HOST_AT_START][0]:.2f} s now"] \
        if HOST_AT_START in config.stash else []
    return speed + ([] if HAVE_SAMPLE else [MISSING_SAMPLE])


def pytest_terminal_summary(terminalreporter, config):
    if HOST_AT_START in config.stash:  # how fast the host was, and how busy the run kept its cores
        speed, (busy, total) = config.stash[HOST_AT_START]
        busy_now, total_now = cpu_counters()
        terminalreporter.write_line(
            f"host: 10M Python loop steps in {speed:.2f} s before the run, {host_speed():.2f} s after; "
            f"its {os.cpu_count()} cores {100 * (busy_now - busy) / max(total_now - total, 1):.0f}% busy during it")
    if not HAVE_SAMPLE:
        terminalreporter.section("missing data", sep="!", red=True, bold=True)
        terminalreporter.write_line(MISSING_SAMPLE, red=True, bold=True)


def in_lab_tier(nodeid: str) -> bool:
    """The lab tier is its modules, tests/test_lab*.py: the one place it is said, as pytest's
    workers' scheduler sees only test ids."""
    return _module(nodeid).startswith("test_lab")


# Cluster-tier modules that start only clusters and servers of their own, never the session's:
# they may run on the lab tier's worker, whichever keeps the workers even.
OWN_CLUSTERS = ("test_lifecycle.py", "test_minio_supervisor.py", "test_command_line_offline.py", "test_head_loss.py",
                "test_mark_keeper.py")
DURATIONS = Path(__file__).with_name("durations.json")  # seconds per module, measured (scripts/test_durations.py)


def worker_groups(modules: list[str]) -> dict[str, str]:
    """`make test` (-n 2): each module's worker, the two even by measured time. The lab tier is
    on one (its hosts share labs), the modules that use the session cluster on the other (one
    such cluster); a module of OWN_CLUSTERS goes to the lighter, the longest first. A module
    not measured yet counts as 10 s."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    groups = {m: "lab" if in_lab_tier(m) else "cluster" for m in set(modules) if m not in OWN_CLUSTERS}
    load = {g: sum(seconds.get(m, 10.0) for m in groups if groups[m] == g) for g in ("lab", "cluster")}
    for module in sorted(set(modules) & set(OWN_CLUSTERS), key=lambda m: (-seconds.get(m, 10.0), m)):
        groups[module] = min(load, key=lambda g: (load[g], g))
        load[groups[module]] += seconds.get(module, 10.0)
    return groups


def _module(nodeid: str) -> str:
    return Path(nodeid.split("::")[0]).name


def pytest_ignore_collect(collection_path, config):
    """`pytest -m unit`: a module with no unit test in it is not even imported (the cluster and
    lab modules' imports, Ray's, DuckDB's and the browser's, were a third of the tier's time)."""
    if (config.getoption("markexpr") == "unit" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        return True if "mark.unit" not in collection_path.read_text() else None
    return None


def pytest_collection_modifyitems(config, items):
    """Tiers: `unit` (no root, no Ray, no MinIO) first, so a broken component fails in seconds
    before any cluster starts; then `cluster` (the session's live cluster, or clusters of their
    own); `lab` (share-nothing hosts, tests/test_lab*.py) last. `pytest -m unit` (or cluster,
    lab) runs one tier."""
    for item in items:
        if in_lab_tier(item.nodeid):
            item.add_marker(pytest.mark.lab)
        elif item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.cluster)
        # the session's cluster, not one of the module's own (a module fixture of the same name)
        session = "live_cluster" in item.fixturenames and not hasattr(item.module, "live_cluster")
        if (in_lab_tier(item.nodeid) or _module(item.nodeid) in OWN_CLUSTERS) and session:
            raise pytest.UsageError(f"{item.nodeid} uses the session's cluster: on the lab's worker it would start"
                                    " one beside the lab; move it to a cluster-tier module (conftest.OWN_CLUSTERS)")
    tier = {"unit": 0, "cluster": 1, "lab": 2}
    # within a tier, the modules that need no shared cluster first: the session's cluster and the
    # shared lab start at their first user and stay up until the session ends, idle but for Ray's
    # floor (12% of a core for 2 nodes) through every module after their last user
    shared = {_module(item.nodeid) for item in items if {"live_cluster", "lab3"} & set(item.fixturenames)}
    items.sort(key=lambda item: (min(tier[m.name] for m in item.iter_markers() if m.name in tier),
                                 _module(item.nodeid) in shared))


def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2` (make test): the two worker groups side by side, each module's tests in
    order on one worker (conftest.worker_groups). Each worker keeps its own clusters (the
    session's, the labs'), on addresses and ports of their own. (A third worker, the modules of
    OWN_CLUSTERS its own, was tried: on 2 cores the suite took as long, 717 s against 713 s, the
    cores 89% busy against 88%: two keep them busy already.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(_module(nodeid), "cluster")

        def schedule(self):
            collected = next(iter(self.registered_collections.values()), [])  # every worker's, the same
            self.groups = worker_groups([_module(n) for n in collected])
            return super().schedule()
    return ByGroup(config, log)
