"""Machines join and leave the running lab (conftest's lab3; this module runs last on it): `fasterfs
lab add-host 2` makes two more hosts and their nodes in one step, every name is placed over them
all, and the repair leader moves the new hosts their shares while readers read on; `fasterfs nodes drain` moves a host's
data to the others, copies first, then stops it."""
import subprocess
import threading
import time
from pathlib import Path

import pytest
import ray
from conftest import minio_keys, minio_requests, wait_until
from lab_hosts import PROJECT, chunk_xxh3, put_blob, read_ids
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.control import registry, s3
from fasterfs.control.state import Host
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.core.placement import chunk_homes
from fasterfs.node import repair_survey
from fasterfs.ops import cluster, node_join

READS = 400  # the readers' bound: reads in all (each a whole file), and READ_S seconds
READ_S = 120
PACE_S = 0.25  # between reads: readers throughout the change, not a load that starves the machine's two cores


class Readers:
    """A thread reading the files whole, again and again, each time through a client made anew
    (the namespace as it is now), every chunk held to the bytes the test stored."""

    def __init__(self, root: str, blobs: dict[str, bytes]):
        self.root, self.blobs = root, blobs
        self.reads, self.wrong, self.failed = 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        deadline = time.monotonic() + READ_S
        while not self.stop.is_set() and self.reads < READS and time.monotonic() < deadline:
            for name, blob in self.blobs.items():
                try:
                    client = fasterfs.connect(self.root, ["cache.prefetch.enabled=false"], dataset=name)
                    got = [client.read_chunk(i) for i in range(len(client))]
                    if b"".join(got) != blob:
                        self.wrong.append(name)
                except Exception as e:
                    self.failed.append(f"{name}: {e}"[:300])
                self.reads += 1
                self.stop.wait(PACE_S)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(60)


def test_hosts_added_live_take_their_share_while_readers_read(lab3):
    """`fasterfs lab add-host 2`: hosts 3 and 4 join in one step, each with its Ray node and
    StorageNode; the namespace then places on each exactly the chunks placement over five nodes
    gives it, each one's MinIO (listed with boto3) holds exactly the pieces the namespace names
    there, each with its bytes as stored, and wrote no other (MinIO's own count of PUTs: no piece
    moved twice), and a task on each reads every file whole. Readers reading throughout get every
    byte right, none failing. A host under an address in use, or given twice, is refused, naming
    it, with nothing changed."""
    state, overrides = lab3
    before = len(state.nodes)
    blobs = {}
    for k in range(4):
        blob, _ = put_blob(state, overrides, f"grow/f{k}.bin", 3)
        blobs[f"grow/f{k}.bin"] = blob
    readers = Readers(state.root, blobs)
    try:
        wait_until(lambda: readers.reads >= len(blobs), 60, "the readers' first round")
        ffs = str(PROJECT / ".venv/bin/fasterfs")
        reads_before = readers.reads
        out = subprocess.run([ffs, "lab", "add-host", "2", *overrides], capture_output=True, text=True, timeout=300)
        said = " ".join(out.stdout.split())
        now = cluster.ClusterState.load(Path(state.root))
        added = now.nodes[-2:]
        for new in added:
            assert f"node {new.index} joined at {new.address}" in said, out.stdout + out.stderr
            assert new.netns and cluster.is_ray_start(new.ray_pid)
        assert out.returncode == 0 and len(now.nodes) == before + 2, out.stdout + out.stderr
        ids, slack = [n.index for n in now.nodes], config.load(overrides).placement.load_slack
        homes = {name: chunk_homes(name, -(-len(blob) // 2**20), ids, 1, slack)
                 for name, blob in blobs.items()}
        creds = registry.fetch_credentials(now.name, "admin")

        def moved() -> bool:  # the namespace names each new host where placement does, and nothing is left to move
            placed = all({c.id for c in registry.fetch_manifest(now.name, name).chunks if new.index in c.nodes}
                         == {i for i, h in enumerate(homes[name]) if new.index in h} for name in blobs for new in added)
            return placed and repair_survey.survey(now, creds, slack).misplaced == 0
        wait_until(moved, 180, "the pieces placement gives the new hosts moved there")
        for new in added:
            wanted = {i for h in homes.values() for i, hs in enumerate(h) if new.index in hs}
            assert wanted, f"placement gave node {new.index} none of the test's chunks: nothing was shown"
        reads_moved = readers.reads
    finally:
        readers.end()
    assert readers.failed == [] and readers.wrong == [], (readers.failed[:5], readers.wrong[:5])
    assert reads_moved > reads_before  # they read on while the host joined and its share moved
    # each new host's MinIO by its own listing and count of PUTs: exactly what the namespace names
    # there, each as stored, each written once
    manifests = registry.fetch_manifests(now.name)[1]
    listed = minio_keys(now, "")
    for new in added:
        named = {key for m in manifests.values() for c in m.chunks for node, key in m.pieces(c) if node == new.index}
        assert listed[new.index] == named
        assert minio_requests(new.endpoint, creds, "PutObject") == len(named), f"node {new.index}: a piece moved twice"
        mine = s3.client(new.endpoint, creds)
        for name, blob in blobs.items():
            for c in registry.fetch_manifest(now.name, name).chunks:
                if new.index in c.nodes:
                    body = mine.get_object(Bucket=now.settings.bucket, Key=c.key)["Body"].read()
                    assert xxh3(body) == chunk_xxh3(blob, c.id)
        # a task on the new host reads every file whole
        for name, blob in blobs.items():
            count = -(-len(blob) // 2**20)
            node_id, got = ray.get(read_ids.options(**cluster.on_node(new)).remote(None, list(range(count)), name))
            assert node_id == new.ray_node_id and [h for h, _ in got] == [chunk_xxh3(blob, i) for i in range(count)]
    with pytest.raises(FasterFSError, match=f"host {now.nodes[0].address} is already node {now.nodes[0].index}"):
        node_join.add_nodes(config.load(overrides), [Host(now.nodes[0].address)])
    twice = Host("127.0.9.250")
    with pytest.raises(FasterFSError, match="host 127.0.9.250 is given twice"):
        node_join.add_nodes(config.load(overrides), [twice, twice])
    assert len(cluster.ClusterState.load(Path(state.root)).nodes) == before + 2


def test_a_host_drained_under_readers_holds_nothing_the_namespace_needs_then_stops(lab3):
    """`fasterfs nodes drain 1`: refused first, naming the file, while a file is stored on every
    node (nothing moved); then, with readers reading throughout and MinIO's own listings (boto3)
    looked at all along, every chunk of a replicas=2 file has two copies the namespace names and
    their MinIO lists at every look, no read
    fails or returns a wrong byte, the namespace names nothing on node 1 afterwards, every other
    name's chunks are whole where it says, and node 1's MinIO and Ray node are gone (no process
    left in its host's network namespace)."""
    from fasterfs.write.ingest import remove

    state, overrides = lab3
    everywhere = len(cluster.ClusterState.load(Path(state.root)).placing())
    put_blob(state, overrides, "drain/wide.bin", 1, f"replicas={everywhere}", f"nodes={everywhere}")
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    out = subprocess.run([ffs, "nodes", "drain", "1", *overrides], capture_output=True, text=True, timeout=300)
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1 and "draining node 1 would leave" in said and "'drain/wide.bin'" in said, said
    assert not any(n.draining for n in cluster.ClusterState.load(Path(state.root)).nodes)
    remove(config.load(overrides), "drain/wide.bin")
    two, _ = put_blob(state, overrides, "drain/two.bin", 4, "replicas=2")
    blobs = {"drain/two.bin": two}
    for k in range(2):
        blobs[f"drain/f{k}.bin"] = put_blob(state, overrides, f"drain/f{k}.bin", 3)[0]
    # at each look: the fewest copies of one of the file's chunks that the namespace names and the
    # named node's MinIO lists (a moved-away copy is retired, not deleted: it counts while named)
    copies: list[int] = []
    looking = threading.Event()

    def look() -> None:
        while not looking.is_set():
            try:
                named = registry.fetch_manifest(state.name, "drain/two.bin").chunks
                held = minio_keys(cluster.ClusterState.load(Path(state.root)), "files/")
                copies.append(min(sum(c.key in held.get(n, ()) for n in c.nodes) for c in named))
            except Exception:  # node 1's MinIO stopping between the state read and its listing: no look
                pass
            time.sleep(0.2)
    looker = threading.Thread(target=look, daemon=True)
    readers = Readers(state.root, blobs)
    looker.start()
    try:
        wait_until(lambda: readers.reads >= len(blobs), 60, "the readers' first round")
        netns = state.node(1).netns
        out = subprocess.run([ffs, "nodes", "drain", "1", *overrides], capture_output=True, text=True, timeout=600)
        said = " ".join(out.stdout.split())
        assert out.returncode == 0 and "node 1 (" in said and "drained and stopped" in said, out.stdout + out.stderr
        reads_drained = readers.reads
        wait_until(lambda: readers.reads >= reads_drained + len(blobs), 60, "a round of reads after the drain")
    finally:
        readers.end()
        looking.set()
        looker.join(30)
    assert readers.failed == [] and readers.wrong == [], (readers.failed[:5], readers.wrong[:5])
    assert len(copies) >= 5 and min(copies) >= 2, copies
    now = cluster.ClusterState.load(Path(state.root))
    assert 1 not in [n.index for n in now.nodes]
    manifests = registry.fetch_manifests(now.name)[1]
    assert not [(m.name, c.id) for m in manifests.values() for c in m.chunks if 1 in c.nodes]
    for name, blob in blobs.items():  # where the namespace names them now, MinIO holds them, as stored
        for c in manifests[name].chunks:
            for node, key in manifests[name].pieces(c):
                body = s3.client(now.node(node).endpoint, registry.fetch_credentials(now.name, "admin")).get_object(
                    Bucket=now.settings.bucket, Key=key)["Body"].read()
                assert xxh3(body) == chunk_xxh3(blob, c.id)
    left = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout.split()
    assert left == [], f"processes still on the drained host: {left}"


def _storage_node_pids(state) -> dict[str, int]:
    """Ray's own record (its actor table): each live StorageNode's name and worker pid."""
    from ray.util.state import list_actors

    return {a.name: a.pid for a in list_actors(address=state.dashboard_url, timeout=60, raise_on_missing_output=False,
                                               filters=[("class_name", "=", "StorageNode"), ("state", "=", "ALIVE")])}


def _minio_pids(state) -> dict[int, tuple[int, float]]:
    """Each host's MinIO as the kernel shows it: the pid in the host's network namespace running
    `minio server`, and its start time (clock ticks since boot)."""
    out = {}
    for n in state.nodes:
        for pid in subprocess.run(["ip", "netns", "pids", n.netns], capture_output=True, text=True,
                                  check=True).stdout.split():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"server"]:
                    started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
                    out[n.index] = (int(pid), float(started))
            except (OSError, IndexError):
                pass
    return out


def test_every_storage_node_restarted_in_turn_under_readers_loses_no_read(lab3):
    """`fasterfs nodes restart cache.capacity_mb=900`: with readers reading files whose chunks
    have one copy each throughout, every StorageNode is started again in turn — Ray's actor
    table shows each with a new worker process, the kernel shows each host's MinIO the same
    process as before (it served on) — and no read fails or returns a wrong byte; the new setting
    is what each node now runs with. An option `up` fixed is refused naming it, nothing restarted."""
    state, overrides = lab3
    overrides = [o for o in overrides if not o.startswith("nodes=")]  # the lab's count at `up`: grown since
    now = cluster.ClusterState.load(Path(state.root))
    blobs = {f"restart/f{k}.bin": put_blob(state, overrides, f"restart/f{k}.bin", 3)[0] for k in range(3)}
    ffs = str(PROJECT / ".venv/bin/fasterfs")
    actors, minios = _storage_node_pids(now), _minio_pids(now)
    assert len(actors) == len(minios) == len(now.nodes), (actors, minios)
    out = subprocess.run([ffs, "nodes", "restart", *overrides, "minio.port=9999"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "option minio.port is fixed" in " ".join(out.stderr.split()), out.stdout + out.stderr
    assert _storage_node_pids(now) == actors
    readers = Readers(state.root, blobs)
    try:
        wait_until(lambda: readers.reads >= len(blobs), 60, "the readers' first round")
        out = subprocess.run([ffs, "nodes", "restart", *overrides, "cache.capacity_mb=900"], capture_output=True,
                             text=True, timeout=600)
        said = " ".join(out.stdout.split())
        assert out.returncode == 0 and said.count("restarted in") == len(now.nodes), out.stdout + out.stderr
        restarted = readers.reads
        wait_until(lambda: readers.reads >= restarted + len(blobs), 60, "a round of reads after the restarts")
    finally:
        readers.end()
    assert readers.failed == [] and readers.wrong == [], (readers.failed[:5], readers.wrong[:5])
    assert readers.reads > restarted > len(blobs)
    again = _storage_node_pids(now)
    assert again.keys() == actors.keys() and not set(again.values()) & set(actors.values()), (actors, again)
    assert _minio_pids(now) == minios
    capacities = ray.get([a.cache_status.remote() for a in cluster.storage_nodes(now)])
    assert [c["capacity"] for c in capacities] == [900_000_000] * len(now.nodes)
