"""The mount's agent (fasterfs.read.mount_agent.Agent) on a socket pair, its namespace scripted over a real
Tree: no Ray, no MinIO, no daemon. What the daemon is told must hold for the tree it has: the
root at the start, then each change as a delta that follows the one before with the changed
names alone, listings never ahead of the deltas, and a file declared hot only for the version
the daemon has."""
import json
import os
import socket
import threading
from types import SimpleNamespace

import pytest

from fasterfs.core.manifest import ChunkInfo, Manifest
from fasterfs.core.namespace import Tree
from fasterfs.meta import Attrs, AttrsListing
from fasterfs.read.mount_agent import Agent

pytestmark = pytest.mark.unit


def manifest(name: str, generation: str, size: int = 10) -> Manifest:
    chunks = [ChunkInfo(0, f"{name}/{generation}/0", [0], size, 0, 0, 0.0, 0.0, 0)]
    return Manifest(name, "bytes", 0, 0, 0, 1, 1, "b", generation, chunks, kind="file")


class ScriptedNamespace:
    """reader.Namespace's surface as the agent uses it, over a real Tree: `publish` queues a
    change; refresh() applies what is queued and tells the watcher each change's names, under one
    lock; the store's answers (lookups, listings) come from the tree as it will be once the queue
    is applied, as a store ahead of this view would give them."""

    def __init__(self, manifests: dict, version: int, client=None):
        self.tree, self.client_of = Tree(manifests, version), client
        self.queued: list[tuple[dict, int]] = []
        self.on_change = None
        self.lock = threading.RLock()

    @property
    def version(self) -> int:
        return self.tree.version

    def publish(self, names: dict, version: int) -> None:
        with self.lock:
            self.queued.append((names, version))

    def refresh(self, force: bool = False) -> None:
        with self.lock:
            while self.queued:
                names, version = self.queued.pop(0)
                self.tree.apply(names, version)
                if self.on_change:
                    self.on_change(version, names)

    def watch(self, on_change) -> None:
        with self.lock:
            on_change(self.tree.version, None)
            self.on_change = on_change

    def store(self) -> Tree:
        """The tree with every queued change applied (the store's newest)."""
        t = Tree(dict(self.tree.manifests), self.tree.version)
        for names, version in self.queued:
            t.apply(names, version)
        return t

    def lookup(self, path):
        return self.tree.lookup(path)

    def version_of(self, entry):
        with self.lock:
            try:
                current = self.tree.lookup(entry.path)
            except FileNotFoundError:
                return None
            return self.tree.version if current is entry or current == entry else None

    def is_dir(self, path: str) -> bool:
        try:
            return self.store().lookup(path).is_dir
        except FileNotFoundError:
            return False

    def listed(self, path: str):
        """As reader.Namespace.listed: the store's listing, this view caught up to it first."""
        t = self.store()
        if t.version > self.version:
            self.refresh(force=True)
        kids = t.listdir(path)
        return AttrsListing(t.version, [(e.path, e.mtime) for e in kids if e.is_dir],
                            [Attrs.of(e.file_manifest) for e in kids if not e.is_dir])

    def client(self, m):
        if self.client_of is None:
            raise AssertionError("the agent looked in the cache for a file the daemon's tree does not have")
        return self.client_of


def received(ours: socket.socket, theirs: socket.socket) -> list[dict]:
    """Every message the agent sent on `ours` (closed first: read to its end)."""
    ours.close()
    theirs.settimeout(10)
    data = b""
    while chunk := theirs.recv(1 << 16):
        data += chunk
    theirs.close()
    return [json.loads(line) for line in data.splitlines()]


def mirror(messages: list[dict]) -> tuple[int, dict[str, str]]:
    """What a daemon that had listed every directory builds from the messages: path ->
    generation ('' for a directory), as an independent reading of the protocol (a delta must
    follow the version before it; a listing replaces its directory's names)."""
    version, paths = -1, {}
    for m in messages:
        if m["op"] == "tree":
            assert m.get("lazy") and m["entries"] == [], "the start sends the root alone"
            version, paths = m["version"], {}
        elif m["op"] == "delta":
            assert m["since"] == version, "a delta that does not follow the daemon's tree"
            for p in m["gone"]:
                paths = {k: v for k, v in paths.items() if k != p and not k.startswith(p + "/")}
            paths.update({e["path"]: e["gen"] for e in m["entries"]})
            version = m["version"]
        elif m["op"] == "listing":
            prefix = m["path"] + "/" if m["path"] else ""
            paths = {k: v for k, v in paths.items() if not (k.startswith(prefix) and "/" not in k[len(prefix):])}
            paths.update({e["path"]: e.get("gen", "") for e in m["entries"]})
    return version, paths


def test_the_daemon_hears_the_root_then_each_change_alone():
    ns = ScriptedNamespace({"a/x": manifest("a/x", "g1"), "a/y": manifest("a/y", "g1")}, 1)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    agent.tree.start_tree()
    ns.publish({"a/x": manifest("a/x", "g2"), "b/c/d": manifest("b/c/d", "g1")}, 2)  # replaced, added
    ns.publish({"a/y": None}, 3)                                                      # removed
    ns.publish({"b/c/d": None, "a/x": None}, 4)                                       # a and b/c emptied
    ns.publish({"e": manifest("e", "g1")}, 5)
    refreshers = [threading.Thread(target=agent.tree.send_tree, kwargs={"force": True}) for _ in range(4)]
    for t in refreshers[:2]:
        t.start()
    ns.publish({"a/z": manifest("a/z", "g1")}, 6)
    for t in refreshers[2:]:
        t.start()
    for t in refreshers:
        t.join()
    messages = received(ours, theirs)
    assert [m["op"] for m in messages].count("tree") == 1 and messages[0]["op"] == "tree"
    version, paths = mirror(messages)
    expect = Tree({"e": manifest("e", "g1"), "a/z": manifest("a/z", "g1")}, 6)
    assert version == 6
    assert paths == {e.path: "" if e.is_dir else e.file_manifest.generation for e in expect.all_entries() if e.path}
    assert sum(len(m["entries"]) for m in messages[1:]) < 12  # each change its own paths, never the tree


def test_a_file_is_declared_hot_only_for_the_version_the_daemon_has(tmp_path):
    backing = tmp_path / "entry"
    backing.write_bytes(b"x" * 10)
    client = SimpleNamespace(open_cached=lambda i, count, verify: (os.open(backing, os.O_RDONLY),
                                                                   SimpleNamespace(fetched_ns=7), str(backing), 0),
                             mark_keys=lambda ids: ([11], "b"), marks_pin=lambda node: "/pin")
    a1, b1 = manifest("a", "g1"), manifest("b", "g1")
    ns = ScriptedNamespace({"a": a1, "b": b1}, 5, client)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    agent.tree.start_tree()
    hot = agent._hot(ns.tree.lookup("a"))
    assert hot is not None and hot["version"] == 5 and hot["inode"] == backing.stat().st_ino
    old_b = ns.tree.lookup("b")
    ns.publish({"b": manifest("b", "g2")}, 6)
    agent.tree.send_tree()
    ns.client_of = None  # the replaced `b`'s old entry: never declared (the cache is not asked)
    assert agent._hot(old_b) is None
    ns.client_of = client
    assert agent._hot(ns.tree.lookup("a"))["version"] == 6  # `a` unchanged: hot for the daemon's new version
    ours.close()
    theirs.close()


def messages_of(ns: ScriptedNamespace, act) -> list[dict]:
    """Every message an agent over `ns` sends from its start through `act(agent)`, the daemon's
    end read as it is written."""
    ours, theirs = socket.socketpair()
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.extend(received(SimpleNamespace(close=lambda: None), theirs)))
    reader.start()
    agent = Agent(ns, ours, threads=1)
    agent.tree.start_tree()
    act(agent)
    ours.close()
    reader.join(timeout=30)
    return got


def test_a_listing_carries_attributes_and_never_goes_ahead_of_the_deltas():
    """A directory of 1,000 files listed while the store is a change ahead of the agent: the
    change goes out first, then the listing, each name with its manifest's size and generation."""
    files = {f"d/f{i:04d}": manifest(f"d/f{i:04d}", "g1", size=i) for i in range(1000)}
    ns = ScriptedNamespace(files, 1)

    def list_d(agent):
        ns.publish({"d/new": manifest("d/new", "g7", size=3)}, 2)
        agent.tree.listing("d")
    got = messages_of(ns, list_d)
    assert [m["op"] for m in got] == ["tree", "delta", "listing"]
    listing = {e["path"]: (e["size"], e["gen"]) for e in got[2]["entries"]}
    assert listing == {**{n: (m.chunks[0].bytes, "g1") for n, m in files.items()}, "d/new": (3, "g7")}


def test_warming_lists_every_directory_once_up_to_its_bound():
    files = {f"t/d{i % 5}/f{i}": manifest(f"t/d{i % 5}/f{i}", "g1") for i in range(50)}
    got = messages_of(ScriptedNamespace(files, 1), lambda agent: agent.tree.warm(10**6))
    listed = [m["path"] for m in got if m["op"] == "listing"]
    assert sorted(listed) == ["", "t"] + [f"t/d{k}" for k in range(5)]  # each directory once
    assert mirror(got)[1] == {e.path: "" if e.is_dir else "g1" for e in Tree(files).all_entries() if e.path}
    got = messages_of(ScriptedNamespace(files, 1), lambda agent: agent.tree.warm(3))
    assert [m["path"] for m in got if m["op"] == "listing"] == ["", "t"]  # 1 + 5 entries: past 3, it stops
