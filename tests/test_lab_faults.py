"""The quiet failures of real clusters, made on share-nothing lab hosts (fasterfs.hosts.lab_faults):
cuts, hung and slow servers, full disks, rotten bytes. Each fault is seen from the hosts with
plain sockets, tc, statvfs and the files' bytes; FasterFS's reads under it are compared with
the source file's bytes. The lab is conftest's lab3; every test undoes what it made."""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import ray
from conftest import data_overrides, load_job, minio_keys, source_csv, source_xxh3, wait_until
from lab_hosts import chunk_xxh3, put_blob
from xxhash import xxh3_64_intdigest as xxh3

import fasterfs
from fasterfs.core import config
from fasterfs.hosts import lab_faults
from fasterfs.ops import cluster
from fasterfs.write.ingest import put

PROJECT = config.PROJECT_DIR
CONNECTS = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close(); print("open")
except OSError as e:
    print(type(e).__name__)
"""
ANSWERS = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
s.settimeout(float(sys.argv[3]))
s.sendall(b"GET /minio/health/live HTTP/1.0\\r\\n\\r\\n")
try:
    print("answers" if s.recv(64) else "closed")
except TimeoutError:
    print("silent")
"""


def _from(netns, script: str, *args) -> str:
    """What `script` prints, run on a lab host (None: the head)."""
    cmd = ["python3", "-c", script, *map(str, args)]
    return subprocess.run(["ip", "netns", "exec", netns, *cmd] if netns else cmd, capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def _cut_rules(netns) -> list:
    out = subprocess.run(["ip", *(["-n", netns] if netns else []), "-j", "rule", "show"], capture_output=True,
                         text=True, check=True).stdout
    return [r for r in json.loads(out) if r.get("priority") == lab_faults.CUT_PREF]


def _lab(overrides, *args) -> str:
    """`fasterfs lab ARGS` as a user types it."""
    out = subprocess.run([str(PROJECT / ".venv/bin/fasterfs"), "lab", *map(str, args), *overrides],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@ray.remote(num_cpus=0)
def _timed_reads(name: str, rounds: int) -> dict:
    """Every chunk of `name` read `rounds` times on this host (MinIO only: no cache), each read's
    seconds, and the bytes of the last round."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=False)
    seconds, data = [], b""
    for _ in range(rounds):
        parts = []
        for i in range(len(client)):
            t = time.perf_counter()
            parts.append(client.read_chunk(i))
            seconds.append(time.perf_counter() - t)
        data = b"".join(parts)
    return {"seconds": seconds, "xxh3": xxh3(data), "degraded": client.degraded_reads}


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def test_cuts_are_made_and_healed(lab3):
    """`lab partition` both ways, from the head, and one way; `lab heal`: seen by plain sockets."""
    state, overrides = lab3
    port = config.load(overrides).minio.port
    h0, h1, h2 = state.nodes
    reach = lambda a, b: _from(a.netns, CONNECTS, b.address, port, 1)  # noqa: E731
    head_reach = lambda b: _from(None, CONNECTS, b.address, port, 1)  # noqa: E731
    try:
        assert reach(h0, h1) == reach(h1, h0) == reach(h0, h2) == "open"
        _lab(overrides, "partition", 0, "1,head")
        assert reach(h0, h1) == reach(h1, h0) == "TimeoutError" and reach(h0, h2) == reach(h2, h0) == "open"
        assert head_reach(h0) == "TimeoutError" and head_reach(h1) == "open"
        _lab(overrides, "heal")
        assert not _cut_rules(h0.netns) and not _cut_rules(h1.netns) and not _cut_rules(None)
        assert reach(h0, h1) == reach(h1, h0) == "open" and head_reach(h0) == "open"
        _lab(overrides, "partition", 0, "1", "--one-way")  # host 0 cannot reach host 1; host 1 still reaches 0
        assert reach(h0, h1) == "TimeoutError" and reach(h1, h0) == "open"
    finally:
        _lab(overrides, "heal")
    assert reach(h0, h1) == "open"


def test_freeze_thaw_slow_fill_flip(lab3):
    """A frozen MinIO accepts connections and never answers until thawed; `lab slow` sets the
    link's rate until healed; `lab fill` leaves the host's disk no room (ENOSPC) until healed;
    `lab flip` changes exactly one byte of one file."""
    state, overrides = lab3
    port = config.load(overrides).minio.port
    h0, h1, h2 = state.nodes
    try:
        assert _from(h0.netns, ANSWERS, h1.address, port, 2) == "answers"
        _lab(overrides, "freeze", 1, "minio")
        pid = lab_faults.in_force(state)["frozen"][0]["pid"]
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"  # stopped
        assert _from(h0.netns, ANSWERS, h1.address, port, 2) == "silent"
        _lab(overrides, "thaw", 1)
        assert _from(h0.netns, ANSWERS, h1.address, port, 2) == "answers"

        _lab(overrides, "slow", 2, "--mbit", 8)
        assert "rate 8Mbit" in subprocess.run(["ip", "netns", "exec", h2.netns, "tc", "qdisc", "show", "dev", "lab0"],
                                              capture_output=True, text=True).stdout
        free = lambda d: os.statvfs(d).f_bavail * os.statvfs(d).f_frsize  # noqa: E731
        assert free(h1.disk) > 256 * 2**20
        _lab(overrides, "fill", 1)
        assert free(h1.disk) < 2**20
        with pytest.raises(OSError, match="No space left"), open(Path(h1.disk) / "more", "wb") as f:
            f.write(os.urandom(4 * 2**20))
            f.flush()
            os.fsync(f.fileno())
    finally:
        Path(h1.disk, "more").unlink(missing_ok=True)
        _lab(overrides, "thaw", 1)
        _lab(overrides, "heal")
        _minio_takes_writes(state, 1)
    assert "rate 200Mbit" in subprocess.run(["ip", "netns", "exec", h2.netns, "tc", "qdisc", "show", "dev", "lab0"],
                                            capture_output=True, text=True).stdout
    assert os.statvfs(h1.disk).f_bavail * os.statvfs(h1.disk).f_frsize > 256 * 2**20

    put_blob(state, overrides, "team/flip.bin", 2, "replicas=3")  # a copy on every host
    files = {p: p.read_bytes() for p in (Path(h1.disk) / "node-1" / "minio").rglob("*") if p.is_file()}
    said = _lab(overrides, "flip", 1, "minio", "--seed", 7)
    changed = [p for p, b in files.items() if p.read_bytes() != b]
    assert len(changed) == 1 and str(changed[0]) in "".join(said.split()), said  # (rich wraps long paths)
    assert sum(x != y for x, y in zip(files[changed[0]], changed[0].read_bytes())) == 1


@pytest.mark.parametrize("layout", [["replicas=2"], ["layout=ec", "ec.data=2", "ec.parity=1"]],
                         ids=["replicas", "ec"])
def test_a_hung_minio_is_read_around(lab3, layout):
    """Host 1's MinIO frozen (connections accepted, nothing answered): host 0's readers get every
    chunk right from the other copies (replicas, or parity), none waits for its read timeout
    (hedged requests); p99 read latency during the hang against the healthy one, in the output."""
    state, overrides = lab3
    name = f"team/hung-{layout[0].split('=')[0]}.bin"
    blob, manifest = put_blob(state, overrides, name, 8, *layout)
    assert any(1 in c.nodes for c in manifest.chunks)
    on0 = cluster.on_node(state.node(0))
    healthy = ray.get(_timed_reads.options(**on0).remote(name, 3))
    assert healthy["xxh3"] == xxh3(blob)
    try:
        _lab(overrides, "freeze", 1, "minio")
        hung = ray.get(_timed_reads.options(**on0).remote(name, 3))
    finally:
        _lab(overrides, "thaw", 1)
    assert hung["xxh3"] == xxh3(blob)
    timeout = config.load(overrides).client.read_timeout_s
    assert max(hung["seconds"]) < timeout / 2, max(hung["seconds"])  # hedged, never waited out
    ratio = p99(hung["seconds"]) / p99(healthy["seconds"])
    print(f"{layout}: p99 {p99(healthy['seconds']) * 1e3:.1f} ms healthy, {p99(hung['seconds']) * 1e3:.1f} ms "
          f"with host 1's MinIO hung ({ratio:.1f}x); slowest {max(hung['seconds']) * 1e3:.0f} ms")


def test_rotten_bytes_are_never_returned_and_the_scrub_repairs_them(lab3):
    """A byte flipped in every MinIO file of host 1 (bit rot): reads on host 0 are the source's
    bytes (a checksum catches each rotten copy; the other replica serves), and host 1's scrub
    finds the rotten objects and rewrites them."""
    state, overrides = lab3
    blob, manifest = put_blob(state, overrides, "team/rot.bin", 6, "replicas=2")
    on1 = [c for c in manifest.chunks if 1 in c.nodes]
    assert on1
    _lab(overrides, "flip", 1, "minio", "--count", 0, "--seed", 3)  # every file of host 1's MinIO
    got = ray.get(_timed_reads.options(**cluster.on_node(state.node(0))).remote("team/rot.bin", 1))
    assert got["xxh3"] == xxh3(blob)
    got = ray.get(_timed_reads.options(**cluster.on_node(state.node(1))).remote("team/rot.bin", 1))
    assert got["xxh3"] == xxh3(blob)  # host 1's own readers too: its copy is rotten, host 0's is not
    actor = cluster.storage_nodes(state)[1]
    found = ray.get(actor.scrub_minio.remote())
    rot_keys = {c.key for c in on1}
    assert rot_keys <= set(found["bad"]) and found["repaired"] >= len(rot_keys), found
    assert not rot_keys & set(ray.get(actor.scrub_minio.remote())["bad"])  # repaired: clean now


def _minio_takes_writes(state, index: int) -> None:
    """Wait (bounded) until host `index`'s MinIO stores an object again: it learns that its disk has
    room again a few seconds after the filler is gone (its own view of the disk is cached)."""
    from fasterfs.control import registry, s3

    client = s3.client(state.node(index).endpoint, registry.fetch_credentials(state.name, "admin"))

    def stores() -> bool:
        try:
            client.put_object(Bucket=state.settings.bucket, Key="lab-probe", Body=b"x")
            client.delete_object(Bucket=state.settings.bucket, Key="lab-probe")
            return True
        except Exception:
            return False
    wait_until(stores, 60, f"host {index}'s MinIO to take writes after the heal")


def test_a_full_disk_fails_a_put_naming_the_host_and_keeps_the_old_generation(lab3):
    """Host 1's disk full: replacing a file whose chunks go to it fails naming node 1; every
    node's MinIO holds exactly the old generation's objects of that file (as MinIO lists them),
    and the old generation reads back as the source bytes."""
    from fasterfs.control import registry, s3
    from fasterfs.core.errors import FasterFSError

    state, overrides = lab3
    blob, first = put_blob(state, overrides, "team/full.bin", 6)
    assert any(1 in c.nodes for c in first.chunks)
    creds = registry.fetch_credentials(state.name, "admin")
    prefix = "/".join(first.chunks[0].key.split("/")[:2]) + "/"  # files/<the name's hash>/: every generation

    def stored() -> set:
        keys = set()
        for n in state.nodes:
            listing = s3.client(n.endpoint, creds).list_objects_v2(Bucket=first.bucket, Prefix=prefix)
            keys |= {(n.index, o["Key"]) for o in listing.get("Contents", [])}
        return keys

    before = stored()
    assert before == {p for c in first.chunks for p in first.pieces(c)}
    src = Path(state.root) / "full-new.src"
    src.write_bytes(os.urandom(6 * 2**20))
    try:
        _lab(overrides, "fill", 1)
        with pytest.raises(FasterFSError, match=r"node 1 \("):
            put(config.load(overrides + ["files.chunk_mb=1"]), src, "team/full.bin", force=True)
    finally:
        _lab(overrides, "heal")
        _minio_takes_writes(state, 1)
    assert stored() == before
    assert registry.fetch_manifest(state.name, "team/full.bin").generation == first.generation
    got = ray.get(_timed_reads.options(**cluster.on_node(state.node(0))).remote("team/full.bin", 1))
    assert got["xxh3"] == xxh3(blob)


@ray.remote(num_cpus=0)
def _read_each(name: str) -> list:
    """Each chunk of `name` read on this host: (xxh3, None) or (None, the error), and its seconds."""
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=False)
    out = []
    for i in range(len(client)):
        t = time.perf_counter()
        try:
            out.append((xxh3(client.read_chunk(i)), None, time.perf_counter() - t))
        except Exception as e:
            out.append((None, f"{type(e).__name__}: {e}", time.perf_counter() - t))
    return out


def test_a_cut_host_reads_what_it_reaches_and_fails_fast_naming_what_it_cannot(lab3):
    """Host 0 cut from host 1 (both ways): its readers read every chunk with a copy on hosts 0 or
    2 right, and each chunk only host 1 holds fails within a bounded time naming node 1; nothing
    wrong is ever returned. Healed, everything reads again."""
    state, overrides = lab3
    cfg = config.load(overrides)
    blob, manifest = put_blob(state, overrides, "team/cut.bin", 8)
    chunk = 2**20
    expected = [xxh3(blob[i * chunk:(i + 1) * chunk]) for i in range(len(manifest))]
    only1 = {c.id for c in manifest.chunks if c.nodes == [1]}
    assert only1 and len(only1) < len(manifest)
    on0 = cluster.on_node(state.node(0))
    try:
        _lab(overrides, "partition", 0, "1")
        got = ray.get(_read_each.options(**on0).remote("team/cut.bin"))
    finally:
        _lab(overrides, "heal")
    bound = 3 * cfg.client.connect_timeout_s + cfg.client.read_timeout_s
    for i, (h, error, seconds) in enumerate(got):
        if i in only1:
            assert h is None and "node 1" in error and seconds < bound, (i, error, seconds)
        else:
            assert h == expected[i] and error is None, (i, error)
    print(f"cut: chunks only host 1 holds failed in {max(s for _, e, s in got if e) * 1e3:.0f} ms at most")
    again = ray.get(_read_each.options(**on0).remote("team/cut.bin"))
    assert [h for h, _, _ in again] == expected


def test_the_fault_harness_reads_right_through_the_quiet_failures(lab3):
    """jobs/faults.py on the lab, short: kills, overwrites and re-ingests, and the quiet failures
    (a frozen MinIO, a cut, a slow link, flipped bytes then scrubbed, a full disk), every read
    checked against the history of writes (the source's bytes and each overwrite's): none wrong,
    stale or failed, every kind injected with reads during it, caches never past capacity, and
    every reader that died one the harness killed; afterwards every node's MinIO lists every
    piece the dataset's chunks have there, and each piece's bytes are the source's. (On one
    machine the harness runs the loud kinds only: a subset of these.)"""
    from fasterfs.control import registry, s3

    state, overrides = lab3
    began = time.monotonic()
    cap_s = 240  # the harness's own bound; a busy machine restarts a killed StorageNode in up to a minute
    result = load_job("faults").main(overrides + data_overrides() + [
        "faults.rounds=1", f"faults.duration_s={cap_s}", "faults.every_s=1", "faults.readers_per_node=1",
        "faults.seed=5"])
    took = time.monotonic() - began  # this test's clock, set-up included: not the harness's own figure
    kinds = result["by_kind"]
    # every kind once, then the readers stopped: before the cap, not cut off by it
    assert result["rounds"] == 1 and result["duration_s"] < cap_s and took < cap_s + 60, (took, result["duration_s"])
    assert (result["wrong"], result["stale"], result["failed"], result["readers_lost"]) == (0, 0, 0, 0), \
        result["errors"]
    # a read may find no good copy at once (a MinIO killed while the other copy is rotten, or its
    # StorageNode restarts): reported with its holders, never a wrong byte
    print(f"no good copy: {result['no_good_copy']} reads, holders {result['no_good_copy_holders']}; "
          f"late (a raw overwrite's word still on its way to another host): {result['late']}")
    for kind in ("freeze_minio", "partition", "slow_link", "flip", "full_disk"):
        assert kinds[kind]["injected"] >= 1 and kinds[kind]["reads"] > 0, kinds
        assert kinds[kind]["not_back_to_full"] == 0, kinds
    assert result["kills"] >= 2 and result["writes"] >= 1 and result["reingests"] >= 1, result["log"]
    assert result["polls"] > 10 and result["polls_over_capacity"] == 0
    assert 0 < max(result["peak_fill_of_capacity"].values()) <= 1  # filled, never past its capacity
    # every reader that died is one the harness killed (kill_reader, as its log says), and no other
    assert result["readers_killed"] == sum(" kill_reader on node " in f" {line} " for line in result["log"]) >= 1
    assert result["passed"]
    # every read, checked here: its bytes are its chunk's rows of the source files (gzip's read;
    # the chunking is the same in every generation the re-ingests made) or one of the overwrites
    # the harness made of that object, each a numbered first line over the source's bytes reversed
    m = registry.fetch_manifest(state.name)
    sums = {c.id: source_xxh3(c) for c in m.chunks}
    written: dict[str, set[int]] = {}
    for key, number, chunk in result["overwrites"]:
        c = m.chunks[chunk]
        written.setdefault(key, set()).add(xxh3(b"overwritten %d\n" % number + source_csv(c.first_row, c.rows)[::-1]))
    reads = result["read_log"]
    assert len(reads) == result["reads"] > 0 and written  # every read the harness counted, and an overwrite
    overwritten = [r for r in reads if r[1] != sums[r[4]]]
    wrong = [r for r in overwritten if r[1] not in written.get(r[0], set())]
    assert not wrong, wrong[:5]
    print(f"reads checked against the source: {len(reads)}, of them an overwrite's bytes: {len(overwritten)}")
    # what MinIO holds, by its own listing and bytes, against the source file's chunks
    creds = registry.fetch_credentials(state.name, "admin")
    clients = {n.index: s3.client(n.endpoint, creds) for n in state.nodes}
    assert m.layout == "replicas" and len(m.chunks[0].nodes) == 2
    for c in m.chunks:
        expected = source_xxh3(c)  # gzip's read of the source files
        for node, key in m.pieces(c):
            body = clients[node].get_object(Bucket=m.bucket, Key=key)["Body"].read()
            assert xxh3(body) == expected, f"chunk {c.id} on node {node} ({key})"


@ray.remote(num_cpus=0)
def _read_chunk(name: str, i: int, use_cache: bool) -> int:
    client = fasterfs.connect(None, ["cache.prefetch.enabled=false"], dataset=name, use_cache=use_cache)
    return xxh3(client.read_chunk(i))


def test_a_write_across_a_cut_is_not_served_stale_after_the_heal(lab3):
    """A chunk held by host 1 and cached on host 0; host 0 cut from host 1; the chunk overwritten
    on host 1 from the head, whose invalidation cannot cross the cut. Once healed, host 0's
    StorageNode sees host 1 answer again and checks the ETags of its entries of host 1's chunks:
    a read on host 0 returns the new bytes within a few repair.check_s."""
    from fasterfs.control import registry, s3

    state, overrides = lab3
    check_s = config.load(overrides).repair.check_s
    blob, m = put_blob(state, overrides, "team/inval.bin", 4)
    x = next(c for c in m.chunks if c.nodes == [1])
    on0 = cluster.on_node(state.node(0))
    actors = cluster.storage_nodes(state)
    for _ in range(2):  # twice from MinIO: host 0's kernel makes it hot, host 0 caches it
        assert ray.get(_read_chunk.options(**on0).remote(m.name, x.id, False)) == chunk_xxh3(blob, x.id)
    wait_until(lambda: ray.get(actors[0].cache_contains.remote(x.key)), 30, "the chunk cached on host 0")
    new = os.urandom(x.bytes)
    try:
        _lab(overrides, "partition", 0, "1")
        s3.client(state.node(1).endpoint, registry.fetch_credentials(state.name, "admin")).put_object(
            Bucket=m.bucket, Key=x.key, Body=new)
        during = ray.get(_read_chunk.options(**on0).remote(m.name, x.id, True))
        assert during in (chunk_xxh3(blob, x.id), xxh3(new))  # across a cut: the cached bytes (said so), never others
    finally:
        _lab(overrides, "heal")
    healed = time.monotonic()
    wait_until(lambda: ray.get(_read_chunk.options(**on0).remote(m.name, x.id, True)) == xxh3(new),
               3 * check_s + 10, "host 0 to serve the new bytes after the heal")
    print(f"write across a cut: host 0 read {'the old' if during != xxh3(new) else 'the new'} bytes during it, "
          f"the new ones {time.monotonic() - healed:.1f} s after the heal")


KEEP_OLD_S = 6  # longer than the two writes between the replacement and the step take on the lab


def test_a_clock_step_expires_nothing_early(lab3):
    """The machine's wall clock stepped ahead past ingest.keep_old_s (every lab host's at once: they
    share one kernel, so a step on one host alone cannot be made here): a generation replaced a
    moment ago stays readable for a reader holding it (keep_old_s counts on the monotonic clock),
    though a write runs the clean-up of expired generations meanwhile.

    The step is small and short (the one write, then back): every Ray process on the machine
    times its periodic work with realtime deadlines (boost's deadline_timer), so one re-armed while
    the clock is ahead waits the step over again once it is back (an hour's step once held the
    test driver's task events back that long)."""
    state, overrides = lab3
    blob, first = put_blob(state, overrides, "team/clock.bin", 3)
    held = fasterfs.connect(state.root, ["cache.prefetch.enabled=false"], dataset=first.name, use_cache=False)
    src = Path(state.root) / "clock2.src"
    src.write_bytes(os.urandom(2**20))
    keep = overrides + ["files.chunk_mb=1", f"ingest.keep_old_s={KEEP_OLD_S}"]
    put(config.load(keep), src, first.name, force=True)  # first is replaced now
    replaced = time.monotonic()
    step = 2.0 * KEEP_OLD_S  # past keep_old_s on the wall clock; a second or two on the monotonic one
    time.clock_settime(time.CLOCK_REALTIME, time.time() + step)
    try:
        put(config.load(keep), src, "team/clock-other.bin")  # cleans up what expired
    finally:
        time.clock_settime(time.CLOCK_REALTIME, time.time() - step)
    got = [xxh3(held.read_chunk(i)) for i in range(len(first.chunks))]
    assert got == [chunk_xxh3(blob, i) for i in range(len(first.chunks))]
    # the positive control: past keep_old_s on the monotonic clock, a write's clean-up does remove
    # the replaced generation's objects (MinIO's listing), so the one above ran and spared them
    old_keys = {k for c in first.chunks for k in first.object_keys(c)}
    prefix = first.chunks[0].key.rsplit("/", 1)[0]
    assert old_keys <= set().union(*minio_keys(state, prefix).values())
    time.sleep(max(0.0, replaced + KEEP_OLD_S + 1 - time.monotonic()))  # the control's own wait, no proof
    put(config.load(keep), src, "team/clock-third.bin")
    assert not old_keys & set().union(*minio_keys(state, prefix).values())
