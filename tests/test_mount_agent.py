"""The mount's agent (fasterfs.mount.Agent) on a socket pair, its namespace scripted over a real
Tree: no Ray, no MinIO, no daemon. What the daemon is told must hold for the tree it has: the tree
whole once, then each change as a delta that follows the one before, and a file declared hot
only for the tree the daemon has."""
import json
import os
import socket
import threading
from types import SimpleNamespace

import pytest

from fasterfs.manifest import ChunkInfo, Manifest
from fasterfs.mount import Agent
from fasterfs.namespace import Tree

pytestmark = pytest.mark.unit


def manifest(name: str, generation: str, size: int = 10) -> Manifest:
    chunks = [ChunkInfo(0, f"{name}/{generation}/0", [0], size, 0, 0, 0.0, 0.0, 0)]
    return Manifest(name, "bytes", 0, 0, 0, 1, 1, "b", generation, chunks, kind="file")


class ScriptedNamespace:
    """reader.Namespace's surface as the agent uses it, over a real Tree: `publish` queues a
    change, refresh() applies what is queued and tells the watcher, under one lock."""

    def __init__(self, manifests: dict, version: int, client=None):
        self.tree, self.client_of = Tree(manifests, version), client
        self.queued: list[tuple[dict, int]] = []
        self.on_change = None
        self.lock = threading.RLock()

    def publish(self, names: dict, version: int) -> None:
        with self.lock:
            self.queued.append((names, version))

    def refresh(self, force: bool = False) -> Tree:
        with self.lock:
            while self.queued:
                names, version = self.queued.pop(0)
                entries, gone = self.tree.apply(names, version)
                if self.on_change:
                    self.on_change(version, entries, gone)
            return self.tree

    def watch(self, on_change) -> None:
        with self.lock:
            on_change(self.tree.version, self.tree.all_entries(), None)
            self.on_change = on_change

    def version_of(self, entry):
        with self.lock:
            try:
                current = self.tree.lookup(entry.path)
            except FileNotFoundError:
                return None
            return self.tree.version if current is entry or current == entry else None

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
    """What the daemon builds from the messages: path -> generation ('' for a directory), as an
    independent reading of the protocol (a delta must follow the version before it)."""
    version, paths = -1, {}
    for m in messages:
        if m["op"] == "tree":
            version, paths = m["version"], {e["path"]: e["gen"] for e in m["entries"]}
        elif m["op"] == "delta":
            assert m["since"] == version, "a delta that does not follow the daemon's tree"
            for p in m["gone"]:
                paths.pop(p, None)
            paths.update({e["path"]: e["gen"] for e in m["entries"]})
            version = m["version"]
    return version, paths


def test_the_tree_goes_whole_once_then_deltas_that_rebuild_it_exactly():
    ns = ScriptedNamespace({"a/x": manifest("a/x", "g1"), "a/y": manifest("a/y", "g1")}, 1)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    agent.start_tree()
    ns.publish({"a/x": manifest("a/x", "g2"), "b/c/d": manifest("b/c/d", "g1")}, 2)  # replaced, added
    ns.publish({"a/y": None}, 3)                                                      # removed
    ns.publish({"b/c/d": None, "a/x": None}, 4)                                       # a and b/c emptied
    ns.publish({"e": manifest("e", "g1")}, 5)
    refreshers = [threading.Thread(target=agent.send_tree, kwargs={"force": True}) for _ in range(4)]
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
    assert sum(len(m["entries"]) for m in messages[1:]) < 12  # each change its own paths, never the tree again


def test_a_file_is_declared_hot_only_for_the_tree_the_daemon_has(tmp_path):
    backing = tmp_path / "entry"
    backing.write_bytes(b"x" * 10)
    client = SimpleNamespace(open_cached=lambda i, count, verify: (os.open(backing, os.O_RDONLY),
                                                                   SimpleNamespace(fetched_ns=7), str(backing), 0),
                             mark_keys=lambda ids: ([11], "b"), marks_pin=lambda node: "/pin")
    a1, b1 = manifest("a", "g1"), manifest("b", "g1")
    ns = ScriptedNamespace({"a": a1, "b": b1}, 5, client)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    agent.start_tree()
    hot = agent._hot(ns.tree.lookup("a"))
    assert hot is not None and hot["version"] == 5 and hot["inode"] == backing.stat().st_ino
    old_b = ns.tree.lookup("b")
    ns.publish({"b": manifest("b", "g2")}, 6)
    agent.send_tree()
    ns.client_of = None  # the replaced `b`'s old entry: never declared (the cache is not asked)
    assert agent._hot(old_b) is None
    ns.client_of = client
    assert agent._hot(ns.tree.lookup("a"))["version"] == 6  # `a` unchanged: hot for the daemon's new tree
    ours.close()
    theirs.close()


def test_a_tree_past_the_sockets_buffer_goes_out_while_the_daemon_reads():
    """20,000 files (~3 MB of tree, a socket pair holds ~200 KB): the first tree is sent as the
    daemon reads it, not before it runs."""
    ns = ScriptedNamespace({f"d{i // 1000}/f{i}": manifest(f"d{i // 1000}/f{i}", "g1") for i in range(20000)}, 1)
    ours, theirs = socket.socketpair()
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.extend(received(SimpleNamespace(close=lambda: None), theirs)))
    reader.start()
    Agent(ns, ours, threads=1).start_tree()
    ours.close()
    reader.join(timeout=30)
    assert len(got) == 1 and len(got[0]["entries"]) == 20000 + 20  # the files and their 20 directories
