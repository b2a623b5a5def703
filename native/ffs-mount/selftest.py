#!/usr/bin/python3
"""End-to-end self test for ffs-mount (run as root, stdlib only).

Acts as the FasterFS agent: spawns the daemon on a socketpair, pushes a tree
(one dir, a few files), declares one file hot with a backing file, then checks
through the real mount that metadata, hot (passthrough) and cold (agent
served) reads are right, that hot reads never reach the agent, that writes
give EROFS, and that closing the socket unmounts and ends the daemon. Also
covers "hot" and "keep_cache" in open replies and the kernel's stale marks,
with a real pinned BPF hash map made by bpftool (bpffs is mounted at
/sys/fs/bpf for the test if it is not already).
"""
import errno
import json
import mmap
import os
import queue
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "target", "release", "ffs-mount")
HOT, COLD = "d/hot.bin", "d/cold.bin"
WARM, BADHOT = "d/warm.bin", "d/badhot.bin"  # get "hot" in their open replies
CACHE, MARKED = "d/cache.bin", "d/marked.bin"
PARTIAL = "d/partial.bin"  # gets "cached" ranges in its open and read replies
BPFFS = "/sys/fs/bpf"


class Agent:
    """Serves open/read/release from in-memory contents and counts requests."""

    def __init__(self, sock, contents):
        self.sock, self.contents = sock, contents
        self.wlock = threading.Lock()
        self.handles, self.next_h = {}, 100
        self.opens = {p: 0 for p in contents}
        self.reads = {p: 0 for p in contents}
        self.extra = {}  # path -> fields added to its open replies
        self.read_extra = {}  # path -> fields added to its read replies
        self.last_handle, self.released = {}, []
        self.refreshes = 0
        self.replies = queue.Queue()  # replies to our own requests (stats)
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def send(self, obj, data=b""):
        with self.wlock:
            self.sock.sendall(json.dumps(obj).encode() + b"\n" + data)

    def loop(self):
        f = self.sock.makefile("rb")
        for line in f:
            m = json.loads(line)
            op = m.get("op")
            if op is None:
                self.replies.put(m)
            elif op == "open":
                p = m["path"]
                if p not in self.contents:  # e.g. d/denied.bin
                    self.send({"id": m["id"], "errno": errno.EACCES})
                    continue
                self.opens[p] += 1
                self.next_h += 1
                self.handles[self.next_h] = p
                self.last_handle[p] = self.next_h
                self.send(dict(self.extra.get(p, {}), id=m["id"], handle=self.next_h))
            elif op == "read":
                p = self.handles[m["handle"]]
                self.reads[p] += 1
                d = self.contents[p][m["offset"]:m["offset"] + m["size"]]
                self.send(dict(self.read_extra.get(p, {}), id=m["id"], len=len(d)), d)
            elif op == "refresh":  # a lookup miss: the tree sent is the newest this agent has
                self.refreshes += 1
                self.send({"id": m["id"]})
            elif op == "release":
                self.handles.pop(m["handle"], None)
                self.released.append(m["handle"])
                self.send({"id": m["id"]})

    def stats(self):
        self.send({"op": "stats", "id": 424242})
        r = self.replies.get(timeout=5)
        assert r["id"] == 424242, r
        return r["stats"]


def mounted(mnt, fstype=None):
    with open("/proc/mounts") as f:
        return any(l.split()[1] == mnt and fstype in (None, l.split()[2]) for l in f)


def u64hex(v):
    return [f"{b:02x}" for b in struct.pack("<Q", v)]


def map_create(pin):
    subprocess.run(["bpftool", "map", "create", pin, "type", "hash", "key", "8", "value", "8",
                    "entries", "64", "name", "ffs_selftest"], check=True)


def mark(pin, key, value):
    subprocess.run(["bpftool", "map", "update", "pinned", pin,
                    "key", "hex", *u64hex(key), "value", "hex", *u64hex(value)], check=True)


def served(agent, path, rel, want):
    """Open+read+close `path`; "agent" if the open and reads reached the
    agent, "passthrough" if neither did. Fails on wrong bytes."""
    o, r = agent.opens[rel], agent.reads[rel]
    assert read_all(path) == want, f"{rel}: wrong bytes"
    settle(agent)  # every RELEASE handled before the next open
    if agent.opens[rel] == o and agent.reads[rel] == r:
        return "passthrough"
    return "agent" if agent.opens[rel] > o and agent.reads[rel] > r else "mixed"


def applied(agent):
    """Returns once the daemon has applied every message sent before: one reader thread
    applies them in stream order, and answers "stats" in that order too."""
    agent.stats()


def settle(agent):
    """Returns once the daemon has handled the RELEASE of every file closed so far (the kernel
    sends it after close() returns); applied() too. The agent hears of an agent handle's release
    a moment later: the daemon answers the kernel first."""
    deadline = time.time() + 5
    while (s := agent.stats())["releases"] < s["passthrough_opens"] + s["agent_opens"]:
        assert time.time() < deadline, f"RELEASEs never came: {s}"
        time.sleep(0.005)


def until(pred, what, timeout=5.0):
    """Polls pred() for up to `timeout` s. (Waiting on an entry: far inside its 60 s TTL, so only
    an invalidation can change it in that time.)"""
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"never: {what}"
        time.sleep(0.01)


def alive(pid):
    """True unless the process is gone or a zombie (reaping is init's job
    once its parent died)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def read_all(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def expect_errno(e, fn, *a):
    try:
        fn(*a)
    except OSError as x:
        assert x.errno == e, f"{fn.__name__}{a}: got {x!r}, want {errno.errorcode[e]}"
        return
    raise AssertionError(f"{fn.__name__}{a}: succeeded, want {errno.errorcode[e]}")


def check(name, cond, detail=""):
    print(f"  {'ok  ' if cond else 'FAIL'} {name}{(': ' + str(detail)) if detail else ''}")
    if not cond:
        raise AssertionError(name)


def exit_scenario(kind):
    """Daemon must unmount and exit on SIGTERM / parent death / external
    unmount / socket close with a file still open on the mount."""
    tmp = tempfile.mkdtemp(prefix="ffs-selftest-")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc, held = None, None
    try:
        if kind == "parent death":
            # An intermediate parent spawns the daemon, reports its pid and
            # dies when told to (its stdin closes); it never reaps the daemon.
            code = ("import subprocess,sys; p=subprocess.Popen(sys.argv[1:], pass_fds=(%d,));"
                    " print(p.pid, flush=True); sys.stdin.read()" % theirs.fileno())
            mid = subprocess.Popen([sys.executable, "-c", code, BIN, mnt, "--agent-fd",
                                    str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            pid = int(mid.stdout.readline())
        else:
            proc = subprocess.Popen([BIN, mnt, "--agent-fd", str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),))
            pid = proc.pid
        theirs.close()
        agent = Agent(ours, {"f": b"hello"})
        agent.send({"op": "tree", "version": 1,
                    "entries": [{"path": "f", "dir": False, "size": 5, "mtime_ns": 0}]})
        deadline = time.time() + 10
        while not mounted(mnt):
            assert time.time() < deadline, "mount did not appear"
            time.sleep(0.05)
        if kind == "SIGTERM":
            os.kill(pid, 15)
        elif kind == "parent death":
            mid.stdin.close()
            mid.wait()
        elif kind == "external unmount":
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=True)
        elif kind == "socket close, file open":
            held = open(os.path.join(mnt, "f"), "rb")
            ours.shutdown(socket.SHUT_RDWR)
        t0 = time.time()
        while (mounted(mnt) or alive(pid)) and time.time() - t0 < 5:
            if proc:
                proc.poll()  # reap
            time.sleep(0.02)
        check(f"{kind}: unmounted and exited", not mounted(mnt) and not alive(pid),
              f"{time.time() - t0:.2f}s")
    finally:
        if held:
            held.close()
        if mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        ours.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if os.geteuid() != 0:
        sys.exit("selftest.py must run as root")
    if not os.access(BIN, os.X_OK):
        sys.exit(f"build first: cargo build --release -j1 ({BIN} missing)")
    tmp = tempfile.mkdtemp(prefix="ffs-selftest-")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    backing = os.path.join(tmp, "backing.bin")
    hot_bytes = os.urandom((1 << 20) + 12345)
    cold_bytes = os.urandom(300_001)
    with open(backing, "wb") as f:
        f.write(hot_bytes)
    data = {p: os.urandom(200_000 + k) for k, p in enumerate((WARM, BADHOT, CACHE, MARKED, PARTIAL))}
    backings = {}
    for p in (WARM, BADHOT, MARKED, PARTIAL):
        backings[p] = os.path.join(tmp, os.path.basename(p))
        with open(backings[p], "wb") as f:
            f.write(data[p])
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc, our_bpffs = None, False
    pin = os.path.join(BPFFS, f"ffs_selftest_{os.getpid()}_{os.urandom(4).hex()}")
    try:
        if not mounted(BPFFS, "bpf"):
            subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], check=True)
            our_bpffs = True
        map_create(pin)
        proc = subprocess.Popen(
            [BIN, mnt, "--agent-fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),))
        theirs.close()
        agent = Agent(ours, dict(data, **{HOT: hot_bytes, COLD: cold_bytes}))
        now = time.time_ns()
        agent.send({"op": "tree", "version": 1, "entries": [
            {"path": "d", "dir": True, "size": 0, "mtime_ns": now},
            {"path": HOT, "dir": False, "size": len(hot_bytes), "mtime_ns": now},
            {"path": COLD, "dir": False, "size": len(cold_bytes), "mtime_ns": now},
            {"path": "d/denied.bin", "dir": False, "size": 1, "mtime_ns": now},
        ] + [{"path": p, "dir": False, "size": len(b), "mtime_ns": now} for p, b in data.items()]})
        hot_msg = {"op": "hot", "path": HOT, "backing": backing,
                   "inode": os.stat(backing).st_ino, "version": 1}
        agent.send(hot_msg)
        deadline = time.time() + 10
        while not mounted(mnt):
            assert proc.poll() is None, f"daemon exited early: {proc.returncode}"
            assert time.time() < deadline, "mount did not appear"
            time.sleep(0.05)
        print("mounted", mnt)

        # The mount appears before the session spawns its worker threads.
        deadline = time.time() + 5
        while True:
            tasks = os.listdir(f"/proc/{proc.pid}/task")
            comms = [open(f"/proc/{proc.pid}/task/{t}/comm").read().strip() for t in tasks]
            n = sum(c.startswith("fuser-") and c != "fuser-bg" for c in comms)
            if n >= 2 or time.time() > deadline:
                break
            time.sleep(0.02)
        check("multi-threaded FUSE loop", n >= 2, f"{n} fuser worker threads")

        print("metadata:")
        check("root listing", os.listdir(mnt) == ["d"], os.listdir(mnt))
        ls = sorted(os.listdir(os.path.join(mnt, "d")))
        want = sorted(["cold.bin", "denied.bin", "hot.bin"] + [os.path.basename(p) for p in data])
        check("dir listing", ls == want, ls)
        st = os.stat(os.path.join(mnt, HOT))
        check("hot size", st.st_size == len(hot_bytes), st.st_size)
        check("hot mode 0440 (the default: root's alone)", st.st_mode & 0o7777 == 0o440, oct(st.st_mode))
        check("cold size", os.stat(os.path.join(mnt, COLD)).st_size == len(cold_bytes))
        check("dir mode 0550", os.stat(os.path.join(mnt, "d")).st_mode & 0o7777 == 0o550)
        expect_errno(errno.ENOENT, os.stat, os.path.join(mnt, "d/nope"))

        print("data:")
        hp, cp = os.path.join(mnt, HOT), os.path.join(mnt, COLD)
        check("hot bytes == backing", read_all(hp) == hot_bytes)
        with open(hp, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            check("hot mmap bytes == backing", m[:] == hot_bytes)
        with open(hp, "rb") as f1, open(hp, "rb") as f2:  # 2nd open reuses the backing id
            check("two concurrent hot opens", f1.read() == hot_bytes and f2.read() == hot_bytes)
        check("cold bytes == agent's", read_all(cp) == cold_bytes)
        check("cold reads reached the agent", agent.reads[COLD] > 0, agent.reads[COLD])
        check("hot opens/reads never reached the agent",
              agent.opens[HOT] == 0 and agent.reads[HOT] == 0,
              (agent.opens[HOT], agent.reads[HOT]))
        expect_errno(errno.EACCES, os.open, os.path.join(mnt, "d/denied.bin"), os.O_RDONLY)
        check("agent errno passed through (EACCES)", True)
        s = agent.stats()
        check("daemon stats passthrough_opens >= 1", s["passthrough_opens"] >= 1, s)
        settle(agent)  # every handle of HOT released: the next open probes the backing anew
        old = time.time() - 100
        os.utime(backing, (old, old))
        read_all(hp)
        check("a passthrough open touches its backing (the cache's LRU)",
              os.stat(backing).st_mtime > old + 50, os.stat(backing).st_mtime - old)

        print("mode switching:")
        agent.send({**hot_msg, "version": 999})  # a declaration of another version: not hot now
        applied(agent)
        with open(hp, "rb") as held:  # non-passthrough open via the agent
            check("a file declared hot for another version served by agent",
                  held.read() == hot_bytes and agent.opens[HOT] == 1, agent.opens[HOT])
            agent.send(hot_msg)
            applied(agent)
            # A non-passthrough open exists: this one must also go to the agent.
            check("open while agent-open held -> agent, no EIO",
                  read_all(hp) == hot_bytes and agent.opens[HOT] == 2, agent.opens[HOT])
        settle(agent)
        before = agent.opens[HOT]
        check("after release: passthrough again",
              read_all(hp) == hot_bytes and agent.opens[HOT] == before)

        print("keep_cache in open replies:")
        p = os.path.join(mnt, CACHE)
        agent.extra[CACHE] = {"keep_cache": True}
        check("first read from the agent", served(agent, p, CACHE, data[CACHE]) == "agent")
        o, r = agent.opens[CACHE], agent.reads[CACHE]
        read_all(p)
        check("keep_cache open: opened by the agent, read from the page cache",
              agent.opens[CACHE] == o + 1 and agent.reads[CACHE] == r, (o, r))
        agent.extra[CACHE] = {}
        check("open without keep_cache drops the pages",
              served(agent, p, CACHE, data[CACHE]) == "agent")

        print("cached ranges in open and read replies:")
        p = os.path.join(mnt, PARTIAL)
        agent.extra[PARTIAL] = {"cached": {"backing": backings[PARTIAL], "inode": os.stat(backings[PARTIAL]).st_ino,
                                           "ranges": [[0, 100_000]]}}
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: each read is one request
            r = agent.reads[PARTIAL]
            check("a read inside a cached range is the daemon's",
                  os.pread(fd, 4096, 8192) == data[PARTIAL][8192:12288] and agent.reads[PARTIAL] == r)
            agent.extra[PARTIAL] = {}
            agent.read_extra[PARTIAL] = {"cached": {"backing": backings[PARTIAL],
                                                    "inode": os.stat(backings[PARTIAL]).st_ino,
                                                    "ranges": [[0, len(data[PARTIAL])]]}}
            check("a read outside goes to the agent",
                  os.pread(fd, 4096, 150_000) == data[PARTIAL][150_000:154_096] and agent.reads[PARTIAL] == r + 1)
            agent.read_extra[PARTIAL] = {}
            check("... whose reply widened the ranges",
                  os.pread(fd, 4096, 180_000) == data[PARTIAL][180_000:184_096] and agent.reads[PARTIAL] == r + 1)
        finally:
            os.close(fd)
        agent.extra[PARTIAL] = {"cached": {"backing": backings[PARTIAL], "inode": 1, "ranges": [[0, 100_000]]}}
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            r = agent.reads[PARTIAL]
            check("a backing of another inode is not read",
                  os.pread(fd, 4096, 8192) == data[PARTIAL][8192:12288] and agent.reads[PARTIAL] == r + 1)
        finally:
            os.close(fd)
        agent.extra[PARTIAL] = {}
        s = agent.stats()
        check("stats reads_cached >= 2", s["reads_cached"] >= 2, s)

        print("hot in open replies:")
        p = os.path.join(mnt, WARM)
        before = agent.stats()
        # keep_cache too: it must be dropped, the kernel fails it with passthrough
        agent.extra[WARM] = {"keep_cache": True, "hot": {
            "backing": backings[WARM], "inode": os.stat(backings[WARM]).st_ino, "version": 1}}
        with open(p, "rb") as f:
            h = agent.last_handle[WARM]
            deadline = time.time() + 2
            while h not in agent.released and time.time() < deadline:
                time.sleep(0.01)
            check("open with hot reply: agent handle released while file open",
                  h in agent.released and agent.opens[WARM] == 1, agent.released)
            check("... and read by passthrough", f.read() == data[WARM] and agent.reads[WARM] == 0,
                  agent.reads[WARM])
        settle(agent)
        check("next open: passthrough (hot recorded)",
              served(agent, p, WARM, data[WARM]) == "passthrough")
        s = agent.stats()
        check("stats hot_from_open_reply +1",
              s["hot_from_open_reply"] == before["hot_from_open_reply"] + 1, s)
        p = os.path.join(mnt, BADHOT)
        good = {"backing": backings[BADHOT], "inode": os.stat(backings[BADHOT]).st_ino,
                "version": 1}
        agent.extra[BADHOT] = {"hot": dict(good, inode=good["inode"] + 1)}
        with open(p, "rb") as f:
            h = agent.last_handle[BADHOT]
            check("hot reply, wrong inode: agent open, served by the agent",
                  f.read() == data[BADHOT] and agent.reads[BADHOT] > 0 and h not in agent.released)
        until(lambda: h in agent.released, "the agent told of the release")  # after the kernel's reply
        check("... released on close", h in agent.released)
        agent.extra[BADHOT] = {"hot": dict(good, pin=pin, keys=[77], fetched_ns=now)}
        mark(pin, 77, now + 1)
        check("hot reply, stale marks: served by the agent",
              served(agent, p, BADHOT, data[BADHOT]) == "agent")
        agent.extra[BADHOT] = {"hot": good}  # replaces the stale entry
        o, r = agent.opens[BADHOT], agent.reads[BADHOT]
        check("stale entry -> agent open, its reply's fresh hot -> passthrough",
              served(agent, p, BADHOT, data[BADHOT]) == "mixed"
              and (agent.opens[BADHOT], agent.reads[BADHOT]) == (o + 1, r))
        check("... then passthrough without the agent",
              served(agent, p, BADHOT, data[BADHOT]) == "passthrough")
        s = agent.stats()
        check("stats: stale_refused +2, hot_from_open_reply +2",
              s["stale_refused"] == before["stale_refused"] + 2
              and s["hot_from_open_reply"] == before["hot_from_open_reply"] + 2, s)

        print("stale marks (pinned BPF map):")
        p, m = os.path.join(mnt, MARKED), MARKED
        key, bucket, fetched = 0x1234_5678_9abc, 0x99, time.time_ns()
        agent.send({"op": "hot", "path": m, "backing": backings[m],
                    "inode": os.stat(backings[m]).st_ino, "version": 1,
                    "pin": pin, "keys": [key], "bucket": bucket, "fetched_ns": fetched})
        applied(agent)
        before = agent.stats()
        check("unmarked key -> passthrough", served(agent, p, m, data[m]) == "passthrough")
        mark(pin, key, fetched - 1000)
        check("key marked < fetched_ns -> passthrough",
              served(agent, p, m, data[m]) == "passthrough")
        mark(pin, key, fetched + 1000)
        check("key marked > fetched_ns -> agent", served(agent, p, m, data[m]) == "agent")
        mark(pin, key, fetched - 1000)
        mark(pin, bucket, fetched + 1000)
        check("bucket marked > fetched_ns -> agent", served(agent, p, m, data[m]) == "agent")
        mark(pin, bucket, fetched)
        check("bucket marked == fetched_ns -> passthrough",
              served(agent, p, m, data[m]) == "passthrough")
        other = 0x4242  # a file of several chunks: every chunk's key is checked
        agent.send({"op": "hot", "path": m, "backing": backings[m],
                    "inode": os.stat(backings[m]).st_ino, "version": 1,
                    "pin": pin, "keys": [key, other], "bucket": bucket, "fetched_ns": fetched})
        settle(agent)
        check("keys unmarked -> passthrough", served(agent, p, m, data[m]) == "passthrough")
        mark(pin, other, fetched + 1000)
        check("second of keys marked > fetched_ns -> agent", served(agent, p, m, data[m]) == "agent")
        mark(pin, other, fetched)
        with open(p, "rb") as held:
            mark(pin, key, fetched + 1)
            expect_errno(errno.ESTALE, os.open, p, os.O_RDONLY)
            check("stale while a passthrough open is held -> ESTALE, held file still reads",
                  held.read() == data[m])
        settle(agent)
        check("... after its release -> agent", served(agent, p, m, data[m]) == "agent")
        os.unlink(pin)
        map_create(pin)  # a new, empty map at the same path
        time.sleep(1.1)  # the pin is re-stat'ed at most once a second
        check("re-pinned map (unmarked) -> passthrough",
              served(agent, p, m, data[m]) == "passthrough")
        mark(pin, bucket, fetched + 1)
        check("re-pinned map marked -> agent", served(agent, p, m, data[m]) == "agent")
        os.unlink(pin)
        time.sleep(1.1)
        check("pin removed (the node restarting: nothing vouches) -> agent",
              served(agent, p, m, data[m]) == "agent")
        s = agent.stats()
        check("stats stale_refused >= 4 more", s["stale_refused"] >= before["stale_refused"] + 4,
              s["stale_refused"] - before["stale_refused"])

        print("tree update:")
        ino = os.stat(hp).st_ino
        agent.send({"op": "tree", "version": 2, "entries": [
            {"path": HOT, "dir": False, "size": len(hot_bytes), "mtime_ns": now},
        ]})  # "d" is implicit now
        until(lambda: not os.path.exists(cp), "the removed path's entry invalidated")
        expect_errno(errno.ENOENT, os.stat, cp)
        check("removed path -> ENOENT", True)
        check("a lookup miss asked the agent for a newer tree", agent.refreshes >= 1)
        check("inode stable across versions", os.stat(hp).st_ino == ino)
        before = agent.opens[HOT]
        read_all(hp)
        check("hot msg for old version ignored (agent open)", agent.opens[HOT] == before + 1)
        agent.send(dict(hot_msg, version=2))
        settle(agent)
        read_all(hp)
        check("hot msg for new version -> passthrough", agent.opens[HOT] == before + 1)
        with open(hp, "rb") as held:  # held by passthrough while its file is replaced
            agent.send({"op": "tree", "version": 3, "entries": [
                {"path": HOT, "dir": False, "size": len(cold_bytes), "mtime_ns": now, "gen": "g2"}]})
            until(lambda: os.stat(hp).st_ino != ino, "the replaced file's entry invalidated")
            check("a new gen is a new inode", os.stat(hp).st_ino != ino, (os.stat(hp).st_ino, ino))
            agent.contents[HOT] = cold_bytes
            check("a new open reads the new file (agent)", read_all(hp) == cold_bytes)
            check("the held handle keeps its bytes", held.read() == hot_bytes)
            check("... and its attributes", os.fstat(held.fileno()).st_size == len(hot_bytes))
        agent.contents[HOT] = hot_bytes  # back to the first file, hot, for what follows
        agent.send({"op": "tree", "version": 4, "entries": [
            {"path": HOT, "dir": False, "size": len(hot_bytes), "mtime_ns": now}]})
        agent.send(dict(hot_msg, version=4))
        settle(agent)
        until(lambda: os.stat(hp).st_ino == ino, "the old gen's entry back")
        check("the old gen's inode again", os.stat(hp).st_ino == ino)

        print("delta:")
        big = [f"big/f{i:05}" for i in range(3000)]
        agent.send({"op": "delta", "version": 5, "since": 4, "gone": [], "entries": [
            {"path": p, "dir": False, "size": 1, "mtime_ns": now} for p in big]})
        applied(agent)
        got = os.listdir(os.path.join(mnt, "big"))
        check("new files in a new directory, listed in many readdir batches",
              got == [os.path.basename(p) for p in big], len(got))
        check("... the rest as it was", os.stat(hp).st_ino == ino)
        agent.send({"op": "delta", "version": 6, "since": 5, "gone": big[:1500], "entries": [
            {"path": HOT, "dir": False, "size": len(hot_bytes), "mtime_ns": now + 1}]})
        until(lambda: os.stat(hp).st_mtime_ns == now + 1, "the changed file's attributes invalidated")
        check("a changed file: new attributes at once, same inode", os.stat(hp).st_ino == ino)
        until(lambda: not os.path.exists(os.path.join(mnt, big[0])), "a removed file's entry invalidated")
        check("removed files gone", len(os.listdir(os.path.join(mnt, "big"))) == 1500)
        agent.send({"op": "delta", "version": 7, "since": 5, "gone": [HOT], "entries": [{"path": "bogus"}]})
        applied(agent)
        check("a delta that does not follow the tree is ignored",
              os.path.exists(hp) and not os.path.exists(os.path.join(mnt, "bogus")))
        asked = agent.refreshes
        for _ in range(3):
            expect_errno(errno.ENOENT, os.stat, os.path.join(mnt, "d/missing"))
        check("a missing name is asked for once", agent.refreshes == asked + 1, agent.refreshes - asked)
        agent.send({"op": "delta", "version": 7, "since": 6, "gone": big[1500:] + ["big"], "entries": []})
        until(lambda: not os.path.exists(os.path.join(mnt, "big")), "a removed directory's entry invalidated")
        asked = agent.refreshes
        expect_errno(errno.ENOENT, os.stat, os.path.join(mnt, "d/missing"))
        check("... again once the tree changed", agent.refreshes == asked + 1, agent.refreshes - asked)
        agent.send(dict(hot_msg, version=7))
        settle(agent)

        print("read-only:")
        expect_errno(errno.EROFS, os.open, hp, os.O_WRONLY)
        expect_errno(errno.EROFS, os.open, hp, os.O_RDWR)
        expect_errno(errno.EROFS, os.open, os.path.join(mnt, "d/new"), os.O_WRONLY | os.O_CREAT)
        expect_errno(errno.EROFS, os.mkdir, os.path.join(mnt, "x"))
        expect_errno(errno.EROFS, os.unlink, cp)
        expect_errno(errno.EROFS, os.rename, cp, os.path.join(mnt, "d/c2"))
        expect_errno(errno.EROFS, os.chmod, hp, 0o644)
        check("writes/create/mkdir/unlink/rename/chmod give EROFS", True)

        print("timing (200 x open+read-all+close, 1 MiB file):")
        read_all(hp), read_all(backing)
        reads_before = agent.reads[HOT]
        t_mnt, t_dir = [], []
        for _ in range(200):
            t0 = time.perf_counter(); read_all(hp); t1 = time.perf_counter()
            read_all(backing); t2 = time.perf_counter()
            t_mnt.append(t1 - t0)
            t_dir.append(t2 - t1)
        pm, pd = statistics.median(t_mnt), statistics.median(t_dir)
        print(f"  hot via mount p50 {pm * 1e6:.1f} us, backing direct p50 {pd * 1e6:.1f} us, "
              f"ratio {pm / pd:.2f}")
        check("timed hot reads never reached the agent", agent.reads[HOT] == reads_before,
              (reads_before, agent.reads[HOT]))
        s = agent.stats()
        print("  daemon stats:", json.dumps(s))
        keys = ("passthrough_opens agent_opens reads_forwarded bytes_forwarded lookups getattrs"
                " readdirs stale_refused hot_from_open_reply lookup_refreshes negative_hits").split()
        check("stats has all counters", all(isinstance(s.get(k), int) for k in keys))

        print("shutdown:")
        ours.shutdown(socket.SHUT_RDWR)
        ours.close()
        t0 = time.time()
        while mounted(mnt) and time.time() - t0 < 5:
            time.sleep(0.02)
        check("mount gone after socket close", not mounted(mnt), f"{time.time() - t0:.2f}s")
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        check("daemon exited", rc == 0, rc)
        print("other exit paths:")
        for kind in ("SIGTERM", "parent death", "external unmount", "socket close, file open"):
            exit_scenario(kind)
        print("PASS")
    finally:
        if mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            ours.close()
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(pin):
            os.unlink(pin)
        if our_bpffs:
            subprocess.run(["umount", BPFFS])


if __name__ == "__main__":
    main()
