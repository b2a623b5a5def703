"""The real eBPF programs: crafted packets through BPF_PROG_TEST_RUN, real S3 traffic on
the live cluster, SOCK_OPS on real sockets, and clean detachment."""
import ctypes as ct
import json
import os
import re
import subprocess
import time
import uuid

import pytest
import ray
from conftest import wait_until

from fasterfs import bpf
from fasterfs.bpf import events as ev
from fasterfs.bpf import tc, testrun
from fasterfs.bpf.programs import SOURCE_DIR, SOURCES
from fasterfs.control import credentials, s3
from fasterfs.core.config import Layout
from fasterfs.ops import cluster

MARK = 0x5FF5


def test_this_machine_runs_real_ebpf():
    assert bpf.unavailable_reason() is None  # the tests here exercise the kernel, never the simulation


@pytest.fixture(scope="module")
def loaded():
    """The programs compiled and verified once for the module (1.2 s a load)."""
    got: list[dict] = []
    progs = bpf.load("real", hot_threshold=2, fill_mark=MARK, on_event=got.append)
    progs.start_events()
    progs.got = got
    yield progs
    progs.close()


def _maps() -> list[bytes]:
    """Every map the programs declare, by name, read from their sources (the ring buffer holds
    nothing to empty: each test waits for its own events)."""
    text = "".join((SOURCE_DIR / name).read_text() for name in SOURCES)
    return [(fields[3] if macro == "TABLE" else fields[0]).strip().encode()
            for macro, args in re.findall(r"^BPF_(\w+)\((.*)\);", text, re.M) if macro != "RINGBUF_OUTPUT"
            for fields in [args.split(",")]]


@pytest.fixture
def programs(loaded):
    """The module's programs as just loaded: every map emptied, then configured (threshold 2,
    a new epoch, port 9000 watched); no event of an earlier test left to see."""
    loaded.got.clear()
    for name in _maps():
        if name != b"seen":  # new_epoch zeroes it in one batch (BCC's clear() writes its 512 Ki words one by one: 1 s)
            loaded.bpf[name].clear()
    loaded.bpf[b"stale_keys"][ct.c_uint64(loaded.suspect_key)] = ct.c_uint64(0)  # as a load leaves it
    loaded.new_epoch()  # writes the whole configuration again
    loaded.watch(None, 9000)
    yield loaded
    loaded.close_attachments()


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: minio\r\nUser-Agent: test\r\n\r\n".encode()


def run(programs, packet: bytes, mark: int = 0) -> int:
    rc, _ = testrun.run(programs.tc_fns["egress"].fd, packet, mark=mark)
    assert rc == -1  # TC_ACT_UNSPEC: never drops or redirects
    return rc


def answer(status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nServer: MinIO\r\nContent-Length: 0\r\n\r\n".encode()


def exchange(programs, path: str, method: str = "GET", status: str | None = "200 OK", src: str = "127.0.0.9",
             dst: str = "127.0.0.2", port: int = 40000, mark: int = 0) -> None:
    """A request to MinIO (dst:9000) and, unless status is None, MinIO's answer on the same
    connection."""
    run(programs, testrun.tcp_packet(src, dst, port, 9000, get(path, method)), mark=mark)
    if status is not None:
        run(programs, testrun.tcp_packet(dst, src, 9000, port, answer(status)))


def mark_of(programs, path: str) -> int:
    try:
        return programs.bpf[b"stale_keys"][ct.c_uint64(ev.key_hash(path))].value
    except KeyError:
        return 0


def test_programs_share_one_set_of_maps(programs):
    # Both programs reference the very same config map object (map ids from the kernel)...
    cfg_map = _map_id(programs.bpf[b"config"].map_fd)
    assert cfg_map in _prog_maps(programs.tc_fns["egress"].fd) and cfg_map in _prog_maps(programs.sockops_fn.fd)
    # ...and what user space writes there is what the TC program acts on: threshold 2 -> HOT on the 2nd GET.
    exchange(programs, "/b/shared/k")
    exchange(programs, "/b/shared/k")
    assert wait_until(lambda: any(e["path"] == "/b/shared/k" for e in programs.got))


def _fd_info(fd: int) -> dict:
    out = {}
    for line in open(f"/proc/self/fdinfo/{fd}"):
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


def _prog_maps(fd: int) -> list[int]:
    prog_id = int(_fd_info(fd)["prog_id"])
    shown = json.loads(subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    return shown["map_ids"]


def _map_id(fd: int) -> int:
    return int(_fd_info(fd)["map_id"])


@pytest.mark.parametrize("src, dst", [("127.0.0.9", "127.0.0.2"), ("fd00::9", "fd00::2")])
def test_get_counted_under_python_fnv1a(programs, src, dst):
    path = f"/fasterfs/AAPL/g1/chunk-{uuid.uuid4().hex[:6]}.csv"
    exchange(programs, path, src=src, dst=dst)
    assert programs.key_count(ev.key_hash(path)) == 1
    exchange(programs, path + "?versionId=null", src=src, dst=dst)  # query not hashed
    assert programs.key_count(ev.key_hash(path)) == 2
    batch = ev.key_hashes([path + "?versionId=null", "/other", path])  # all at once, as a node's index hashes
    assert programs.key_count(batch[0]) == programs.key_count(batch[2]) == 2 and programs.key_count(batch[1]) == 0
    assert wait_until(lambda: [e for e in programs.got if e["path"] == path])
    hot = [e for e in programs.got if e["path"] == path]
    assert len(hot) == 1 and hot[0]["type"] == "HOT" and hot[0]["count"] == 2 and hot[0]["key"] == ev.key_hash(path)


@pytest.mark.parametrize("status", ["403 Forbidden", "404 Not Found", "400 Bad Request", None])
def test_gets_minio_did_not_serve_count_for_nothing(programs, status):
    """An unauthenticated GET (403), a missing key, a malformed request, or one never answered:
    none of them makes a key hot, however many come."""
    path = "/fasterfs/AAPL/g1/chunk-000001.csv"
    for port in range(40000, 40005):
        exchange(programs, path, status=status, port=port)
    assert programs.key_count(ev.key_hash(path)) == 0
    assert programs.snapshot()["counters"]["hot_events"] == 0
    assert programs.snapshot()["counters"]["refused"] == (0 if status is None else 5)


@pytest.mark.parametrize("method, path", [("PUT", "/fasterfs/k"), ("DELETE", "/fasterfs/k"),
                                          ("POST", "/fasterfs/k?uploadId=1"), ("POST", "/fasterfs?delete"),
                                          ("POST", "/fasterfs")])
@pytest.mark.parametrize("status", ["403 Forbidden", "400 Bad Request", None])
def test_writes_minio_refused_mark_nothing(programs, method, path, status):
    """The packet that emptied every cache: a POST nobody authenticated. MinIO refuses it, so no
    key and not the bucket is marked, and no STALE event goes to user space."""
    exchange(programs, path, method, status)
    assert mark_of(programs, path) == 0 and mark_of(programs, "/fasterfs") == 0
    time.sleep(0.2)
    assert programs.got == [] and programs.snapshot()["counters"]["stale_marks"] == 0
def test_other_ports_ignored(programs):
    before = programs.snapshot()["counters"]["packets"]
    run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9001, get("/b/other/port")))
    assert programs.key_count(ev.key_hash("/b/other/port")) == 0
    assert programs.snapshot()["counters"]["packets"] == before


@pytest.mark.parametrize("payload", [
    b"GET /b/trunc/k",                      # request line cut mid-path
    b"GET ",                                # too short to be a request
    b"HTTP/1.1 200 OK\r\n\r\n",             # not a request
    b"\x00\xff" * 700,                      # garbage
    b"GET /b HTTP/1.1\r\n\r\n",             # bucket-level, not an object
    b"GET /minio/health/live HTTP/1.1\r\n\r\n",
])
def test_malformed_payloads_do_not_count(programs, payload):
    seen = programs.snapshot()["counters"].get("packets", 0)
    run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9000, payload))
    snap = programs.snapshot()
    assert snap["counters"]["packets"] == seen + 1  # the program saw it (its own counter)...
    assert snap["counters"]["requests"] == 0 and snap["keys_tracked"] == 0  # ...and counted no request


@pytest.mark.parametrize("packet", [b"", b"\x00" * 10, b"\x00" * 12 + b"\x08\x00" + b"\x45" * 10,
                                    b"\x00" * 12 + b"\x86\xdd" + b"\x60" * 30])
def test_truncated_headers_do_not_crash(programs, packet):
    import errno

    try:
        rc, _ = testrun.run(programs.tc_fns["egress"].fd, packet.ljust(14, b"\x00"))
    except OSError as e:  # only this refusal is expected: the kernel will not build an skb from it
        assert e.errno == errno.EINVAL
    else:
        assert rc == -1  # the program ran on it and passed it on untouched (TC_ACT_UNSPEC)
    assert programs.snapshot()["counters"]["requests"] == 0


@pytest.mark.parametrize("first", [
    [get("/minio/health/live")],                                  # an anonymous request MinIO answers 200
    [b"GE", b"T /minio/health/live HTTP/1.1\r\nHost: x\r\n\r\n"],  # ...its request line cut in two segments
])
def test_a_write_pipelined_behind_another_request_never_takes_its_answer(programs, first):
    """One connection, no answer read between: the 200 that comes first is the health check's. The
    PUT behind it is never paired with it, nor with the 403 that follows."""
    for payload in [*first, get("/fasterfs/pipelined/k", "PUT")]:
        run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9000, payload))
    for status in ("200 OK", "403 Forbidden"):
        run(programs, testrun.tcp_packet("127.0.0.2", "127.0.0.9", 9000, 40000, answer(status)))
    assert mark_of(programs, "/fasterfs/pipelined/k") == 0 and programs.snapshot()["counters"]["pipelined"] >= 1
    time.sleep(0.2)
    assert programs.got == []


def test_an_upload_whose_body_looks_like_a_request_is_marked_as_itself(programs):
    """A body segment that begins like a request line is the body: the PUT is marked at its 200,
    and the GET it seems to hold is not counted."""
    run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9000, get("/fasterfs/upload/k", "PUT")))
    run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9000, get("/fasterfs/body/k")))
    run(programs, testrun.tcp_packet("127.0.0.2", "127.0.0.9", 9000, 40000, answer()))
    assert mark_of(programs, "/fasterfs/upload/k") > 0
    assert programs.key_count(ev.key_hash("/fasterfs/body/k")) == 0 and mark_of(programs, "/fasterfs/body/k") == 0
    assert wait_until(lambda: [(e["type"], e["path"]) for e in programs.got] == [("STALE", "/fasterfs/upload/k")])


def test_put_and_delete_mark_stale(programs):
    exchange(programs, "/b/stale/k", "PUT")
    exchange(programs, "/b/stale/k", "DELETE", "204 No Content", src="fd00::9", dst="fd00::2")
    assert wait_until(lambda: len(programs.got) == 2)
    assert [(e["type"], e["method"], e["path"]) for e in programs.got] == [
        ("STALE", "PUT", "/b/stale/k"), ("STALE", "DELETE", "/b/stale/k")]
    assert programs.key_count(ev.key_hash("/b/stale/k")) == 0  # writes do not make a key hot


def test_posts_mark_stale_the_key_or_the_bucket(programs):
    """CompleteMultipartUpload names its key; DeleteObjects names only the bucket: the cluster's
    bucket is the suspect key, counted, so user space checks every entry."""
    exchange(programs, "/fasterfs/mp/k?uploadId=7", "POST")
    exchange(programs, "/fasterfs?delete", "POST", port=40001)
    assert wait_until(lambda: len(programs.got) == 2)
    assert [(e["type"], e["method"], e["path"]) for e in programs.got] == [("STALE", "POST", "/fasterfs/mp/k"),
                                                                          ("STALE", "POST", "/fasterfs")]
    assert mark_of(programs, "/fasterfs/mp/k") > 0 and programs.marks.suspect_mark() > 0
    assert programs.snapshot()["counters"]["suspect_marks"] == 1


def test_a_write_marks_when_minio_answers(programs):
    """Nothing is marked at the request line (MinIO has not authenticated it) nor at "100
    Continue" (the body is still to come): the mark is the 2xx, so a fill that began while the
    upload ran is older than it."""
    run(programs, testrun.tcp_packet("127.0.0.9", "127.0.0.2", 40000, 9000, get("/b/commit/k", "PUT")))
    run(programs, testrun.tcp_packet("127.0.0.2", "127.0.0.9", 9000, 40000, answer("100 Continue")))
    assert mark_of(programs, "/b/commit/k") == 0
    fill_began = time.monotonic_ns()  # a fill starting during the upload
    run(programs, testrun.tcp_packet("127.0.0.2", "127.0.0.9", 9000, 40000, answer()))
    assert mark_of(programs, "/b/commit/k") > fill_began
    assert wait_until(lambda: [e["type"] for e in programs.got] == ["STALE"])
    assert programs.got[0]["path"] == "/b/commit/k" and programs.snapshot()["counters"]["writes_committed"] == 1


def test_ingress_counts_writes_but_not_gets(programs):
    """On a host's own interface, ingress carries other hosts' requests (their answers leave on
    egress): their writes mark the key stale here, their GETs are the reading host's to count."""
    ingress = programs.tc_fns["ingress"].fd
    for port in range(40000, 40003):
        testrun.run(ingress, testrun.tcp_packet("10.9.0.7", "10.9.0.2", port, 9000, get("/b/in/k")))
        run(programs, testrun.tcp_packet("10.9.0.2", "10.9.0.7", 9000, port, answer()))
    assert programs.key_count(ev.key_hash("/b/in/k")) == 0
    testrun.run(ingress, testrun.tcp_packet("10.9.0.7", "10.9.0.2", 40009, 9000, get("/b/in/k", "PUT")))
    run(programs, testrun.tcp_packet("10.9.0.2", "10.9.0.7", 9000, 40009, answer()))
    assert wait_until(lambda: [(e["type"], e["path"]) for e in programs.got] == [("STALE", "/b/in/k")])
    assert mark_of(programs, "/b/in/k") > 0


def test_a_flood_past_the_marks_and_the_ring_leaves_nothing_trusted(tmp_path):
    """More accepted writes than the mark map holds and than the ring holds events, nobody
    draining the ring, with an overwrite of a cached key in the middle: its own mark may be
    missing, but the suspect mark is newer than the entry, so the readers' rule
    (cache_entry) does not serve it."""
    from fasterfs.read import cache_entry

    progs = bpf.load("real", stale_marks=64, ring_pages=1)  # no start_events: the ring fills
    try:
        progs.watch(None, 9000)
        cached = cache_entry.Header(4, 0, "etag", time.monotonic_ns(), cache_entry.BOOT)  # filled before
        for i in range(200):
            path = "/fasterfs/hot/k" if i == 100 else f"/fasterfs/flood/{i}"
            exchange(progs, path, "PUT", port=30000 + i)
        c = progs.snapshot()["counters"]
        assert c["writes_committed"] == 200
        assert c["ringbuf_drops"] > 0 and c["marks_full"] > 0  # both bounds were passed
        assert mark_of(progs, "/fasterfs/hot/k") == 0  # the overwrite found the map full...
        assert progs.marks.suspect_mark() > cached.fetched_ns  # ...and marked the bucket suspect instead
        written, suspect = mark_of(progs, "/fasterfs/hot/k"), progs.marks.suspect_mark()
        assert cache_entry._stale(cached, (written, suspect)) == cache_entry.SUSPECT
        seq = progs.marks.suspect_seq()
        assert progs.marks.clear_suspect(seq) and progs.marks.suspect_mark() == 0  # user space checked every entry
        exchange(progs, "/fasterfs/flood/again", "PUT", port=31000)  # map still full
        # a check that began before it is not enough
        assert progs.marks.suspect_mark() > 0 and not progs.marks.clear_suspect(seq)
    finally:
        progs.close()


@pytest.mark.parametrize("count_keys,seen_bits", [(128, 0), (1024, 0), (128, 1 << 16)])
def test_a_scan_past_the_counting_map_is_counted_and_said(count_keys, seen_bits):
    """300 chunks read in order, twice (the second pass would make each hot, threshold 2): with a
    counting map of 1,024 keys every chunk becomes hot (the kernel's HOT counter); with one of 128
    and no second-chance filter, the first pass's counts are gone before the second reaches them
    (but for a few the kernel's approximate LRU kept), almost none becomes hot, and the snapshot
    says how many counts the map let go (at least 600 made, at most 128 held); with the filter,
    each chunk whose count went is known again and becomes hot."""
    progs = bpf.load("real", hot_threshold=2, count_keys=count_keys, seen_bits=seen_bits)
    try:
        progs.watch(None, 9000)
        for _ in range(2):
            for i in range(300):
                exchange(progs, f"/fasterfs/scan/{i}", port=20000 + i)
        snap = progs.snapshot()
        counts, hot = snap["key_counts"], snap["counters"]["hot_events"]
        assert counts["capacity"] == count_keys and counts["held"] <= count_keys
        if count_keys == 1024:
            assert hot == 300 and counts["evicted"] == 0 and counts["second_chances"] == 0, (hot, counts)
        elif not seen_bits:
            # the kernel's LRU is approximate (per-CPU free lists hand entries out in batches): a few
            # first-pass counts may outlive later ones (16 and 30 of 300 seen), never most of them.
            # Each GET made a count but for the second pass's that found theirs (each then hot);
            # the map holds at most count_keys of them
            assert hot <= count_keys // 4 and counts["evicted"] >= 600 - hot - count_keys, (hot, counts)
        else:  # every chunk hot; a first read may be too, if another key set its bit (~keys / bits)
            false = 2 * 300 * 300 / seen_bits
            # each by a second chance, but for the few first-pass counts the approximate LRU kept (the
            # case above's bound; 22 of 300 seen)
            assert 300 <= hot <= 300 + 2 * false + 1, (hot, counts)
            assert counts["second_chances"] >= 300 - count_keys // 4, counts
            # the second pass made a count anew for each second chance at least
            assert counts["evicted"] >= 300 + counts["second_chances"] - count_keys, counts
    finally:
        progs.close()


def test_the_second_chance_filter_ages_and_its_false_hots_stay_within_its_share():
    """A flood of distinct keys read once each (adversarial: none is ever re-read) ages the
    filter instead of filling it: after 20,000 keys through a filter of 2 x 65,536 bits (aged
    every 2,048), 2,000 keys never seen, read once, make at most what the filter's arithmetic
    allows hot (a bit set by another key: at most 2 x 2,048 of 65,536 bits set, 6.25%; asserted
    with twice that margin); a key read twice in a row is still hot, and once its count is
    forgotten (reset_key, after an eviction) one read makes it hot again."""
    progs = bpf.load("real", hot_threshold=2, count_keys=128, seen_bits=1 << 16)
    try:
        progs.watch(None, 9000)
        for i in range(20_000):
            exchange(progs, f"/fasterfs/flood/{i}", port=20000 + i % 30000)
            progs.age_seen()
        aged = progs.snapshot()["key_counts"]["second_chance_ages"]
        assert aged >= 20_000 // 2_048 - 1, aged
        before = progs.snapshot()["counters"]["hot_events"]
        for i in range(2_000):
            exchange(progs, f"/fasterfs/fresh/{i}", port=20000 + i)
        false_hot = progs.snapshot()["counters"]["hot_events"] - before
        assert false_hot <= 2 * 2_000 * (2 * 2_048 / 65_536), false_hot
        for _ in range(2):
            exchange(progs, "/fasterfs/twice", port=29999)
        assert progs.snapshot()["counters"]["hot_events"] == before + false_hot + 1
        # its count forgotten after an eviction (reset_key), its bit kept: one read makes it hot again
        progs.reset_key(ev.key_hash("/fasterfs/twice"))
        exchange(progs, "/fasterfs/twice", port=29999)
        assert progs.snapshot()["counters"]["hot_events"] == before + false_hot + 2
    finally:
        progs.close()


def test_a_peers_stale_mark_lands_in_the_pinned_map(programs):
    before = time.monotonic_ns()
    programs.marks.mark_stale(ev.key_hash("/b/peer/k"))
    assert programs.bpf[b"stale_keys"][ct.c_uint64(ev.key_hash("/b/peer/k"))].value >= before


def test_filter_names_match_exactly(programs):
    """Node 1's filters are removed by node 1's prefix; node 10's stay."""
    from fasterfs.control.state import filter_prefix

    names = [f"{filter_prefix('xt', i)}lo:egress" for i in (1, 10)]
    try:
        for name in names:
            programs.attach_tc("lo", name)
        assert tc.remove("lo", filter_prefix("xt", 1)) == 1
        assert [n for n in tc.list_filters("lo") if n.startswith("ffs:xt:")] == [names[1]]
    finally:
        programs.close_attachments()
    assert not [n for n in tc.list_filters("lo") if n.startswith("ffs:xt:")]


def test_cache_filler_requests_not_counted(programs):
    exchange(programs, "/b/fill/k", mark=MARK)
    exchange(programs, "/b/fill/k", mark=MARK)
    assert programs.key_count(ev.key_hash("/b/fill/k")) == 0
    assert programs.snapshot()["counters"]["filler_skipped"] == 2
    exchange(programs, "/b/fill/k", mark=MARK + 1)  # another mark is an ordinary reader
    assert programs.key_count(ev.key_hash("/b/fill/k")) == 1


def test_reset_and_epoch_make_a_key_hot_again(programs):
    for _ in range(3):
        exchange(programs, "/b/again/k")
    programs.reset_key(ev.key_hash("/b/again/k"))
    exchange(programs, "/b/again/k")
    exchange(programs, "/b/again/k")
    programs.new_epoch()
    exchange(programs, "/b/again/k")
    exchange(programs, "/b/again/k")
    assert wait_until(lambda: len(programs.got) == 3)
    assert all(e["type"] == "HOT" and e["count"] == 2 for e in programs.got)


# -- real traffic on the live cluster ---------------------------------------------------


def _node_client(state, index):
    creds = credentials.load(Layout.of(_cfg(state)).paths.credentials_file).admin
    return s3.client(state.nodes[index].endpoint, creds)


def _cfg(state):
    from fasterfs.core.config import as_cfg
    return as_cfg(state.config)


def test_real_gets_counted_exactly_and_hot_once(live_cluster):
    assert all(n.kernel_mode == "real" for n in live_cluster.nodes)
    bucket = live_cluster.config["minio"]["bucket"]
    actor = cluster.storage_nodes(live_cluster)[1]
    client = _node_client(live_cluster, 1)
    key, other = f"kernel-test/{uuid.uuid4().hex}", f"kernel-test/{uuid.uuid4().hex}"
    client.put_object(Bucket=bucket, Key=key, Body=b"x" * 100_000)
    client.put_object(Bucket=bucket, Key=other, Body=b"y" * 1000)
    n = 7
    for i in range(n):
        client.get_object(Bucket=bucket, Key=key)["Body"].read()
        if i % 2:
            client.get_object(Bucket=bucket, Key=other)["Body"].read()
    path = f"/{bucket}/{key}"
    assert ray.get(actor.kernel_key_count.remote(path)) == n
    assert ray.get(actor.kernel_key_count.remote(f"/{bucket}/{other}")) == n // 2

    def events():
        return [e for e in ray.get(actor.kernel_status.remote(top=50))["recent_events"] if e["path"] == path]
    def drained() -> bool:  # every event the program emitted (its own counters) has reached user space
        s = ray.get(actor.kernel_status.remote())
        c, got = s["counters"], s["events_received"]
        return sum(got.values()) + c["ringbuf_drops"] == c["hot_events"] + c["stale_marks"]
    assert wait_until(lambda: len(events()) == 2)
    assert wait_until(drained, what="the ring buffer drained: no event of the key still on its way")
    kinds = sorted((e["type"], e["count"]) for e in events())
    # the PUT MinIO accepted, then exactly one HOT at the threshold
    assert kinds == [("HOT", 2), ("STALE", 0)]
    status = ray.get(actor.kernel_status.remote(top=50))
    port = status["ports"][live_cluster.config["minio"]["port"]]
    assert port["latency_count"] > 0 and port["latency_avg_us"] > 0
    # the other node's program watches only its own MinIO
    assert ray.get(cluster.storage_nodes(live_cluster)[0].kernel_key_count.remote(path)) == 0


@ray.remote(num_cpus=0)
def _connect_and_read_nodelay(targets):
    import socket
    out = []
    for host, port in targets:
        s = socket.create_connection((host, port), timeout=5)
        time.sleep(0.05)  # the established callback has run by the time connect returns; margin anyway
        out.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        s.close()
    return out


def test_sockops_sets_nodelay_on_minio_connections_only(live_cluster):
    """k connections to a MinIO get TCP_NODELAY and are counted; one to another port is not.
    The cluster's own work may open MinIO connections in the same window (the repair leader's
    survey after a namespace change: 3 counted), so the count must be exact in one of three
    windows and never short."""
    import socket
    actors = cluster.storage_nodes(live_cluster)
    node0, node1 = live_cluster.nodes[0], live_cluster.nodes[1]
    minio_port = live_cluster.config["minio"]["port"]
    other = socket.socket()
    other.bind((node0.address, 0))
    other.listen(8)
    k, deltas = 3, []
    targets = [(node1.address, minio_port)] * k + [(node0.address, other.getsockname()[1])]
    for _ in range(3):
        before = ray.get(actors[0].kernel_status.remote())["sockops"]
        got = ray.get(_connect_and_read_nodelay.options(**cluster.on_node(node0)).remote(targets))
        assert got[:k] == [1] * k and got[k] == 0
        after = ray.get(actors[0].kernel_status.remote())["sockops"]
        delta = {"matched": after["connections_matched"] - before["connections_matched"]}
        for opt in ("TCP_NODELAY", "TCP_BPF_DELACK_MAX"):
            delta[opt] = after["options"][opt]["ok"] - before["options"][opt]["ok"]
            assert after["options"][opt]["fail"] == before["options"][opt]["fail"]
        deltas.append(delta)
        if set(delta.values()) == {k}:
            break
    other.close()
    assert all(v >= k for d in deltas for v in d.values()) and set(deltas[-1].values()) == {k}, deltas
    assert "TCP_QUICKACK cannot be set from BPF" in after["note"]


def test_filters_and_attachments_are_the_clusters_own(live_cluster):
    names = [n for n in tc.list_filters("lo") if n.startswith(f"ffs:{live_cluster.name}:")]
    assert sorted(names) == [f"ffs:{live_cluster.name}:{n.index}:lo:egress" for n in live_cluster.nodes]
    tree = subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout
    for node in live_cluster.nodes:
        assert f"fasterfs-{live_cluster.name}/node-{node.index}" in tree


def test_removing_a_filter_leaves_a_shared_clsact(programs):
    """A node removing its filter must not take the clsact its siblings attach under;
    only its sole owner (or `down`) drops it."""
    link = "ffs-t-clsact"
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", "ffs-t-peer"], check=True)
    try:
        programs.attach_tc(link, "ffs:t:0:x:egress")
        assert tc.remove(link, "ffs:t:0:x:egress", exact=True) == 1
        assert "clsact" in subprocess.run(["tc", "qdisc", "show", "dev", link], capture_output=True, text=True).stdout
        programs.attach_tc(link, "ffs:t:0:x:egress", sole_owner=True)
        programs.close_attachments()
        assert "clsact" not in subprocess.run(["tc", "qdisc", "show", "dev", link], capture_output=True,
                                              text=True).stdout
    finally:
        subprocess.run(["ip", "link", "del", link], check=True)


def test_simulated_mode_says_it_sees_no_writes():
    assert "sees no PUT or DELETE" in bpf.load("simulated").snapshot()["stale_source"]


def test_both_backends_report_one_snapshot_shape(programs):
    """Whoever reads a node's kernel snapshot (CLI, dashboard) finds the same keys whichever
    backend served it."""
    from fasterfs.bpf.backend import KernelSnapshot

    wanted = set(KernelSnapshot.__annotations__)
    assert set(programs.snapshot()) == wanted
    assert set(bpf.load("simulated").snapshot()) == wanted


def test_unmounting_a_bpffs_takes_every_one_stacked_there(tmp_path):
    """Two StorageNodes starting at once may each mount a bpffs at the cluster's path: `down`
    (unmount_bpffs) leaves none, as /proc/mounts says."""
    from fasterfs.bpf.pinned import unmount_bpffs

    path = tmp_path / "bpf"
    path.mkdir()
    for _ in range(2):
        subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(path)], check=True)

    def at_path() -> int:
        with open("/proc/mounts") as f:
            return sum(line.split()[1] == str(path) for line in f)
    assert at_path() == 2
    try:
        assert unmount_bpffs(path) and at_path() == 0
    finally:
        while at_path():
            subprocess.run(["umount", str(path)], check=True)


def test_a_pin_that_failed_to_open_is_opened_at_the_next_look(programs, tmp_path):
    """A reader that could not open the marks' pin once (here: out of file descriptors for a
    moment) trusts nothing meanwhile and opens the same pin at its next look, then reads the
    mark the kernel's map holds (read with BCC)."""
    import resource

    from fasterfs.bpf.pinned import UNREADABLE, FollowedMarks, unmount_bpffs

    bpffs, key = tmp_path / "bpf", ev.key_hash("/b/reopened/k")
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(bpffs)], check=True)
    try:
        programs.marks.pin_stale_marks(str(bpffs / "marks"))
        programs.marks.mark_stale(key)
        written = programs.bpf[b"stale_keys"][ct.c_uint64(key)].value
        followed = FollowedMarks(str(bpffs / "marks"))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # the next descriptor is refused
        try:
            assert followed.marks(key)[0] == UNREADABLE
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        followed._checked = float("-inf")  # its next look, without waiting out RECHECK_S
        assert followed.marks(key)[0] == written > 0
    finally:
        programs.marks.unpin()
        unmount_bpffs(bpffs)
