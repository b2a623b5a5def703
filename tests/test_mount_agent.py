"""The mount's agent (fasterfs.mount.Agent) on a socket pair, its namespace scripted: no Ray,
no MinIO, no daemon. What the daemon is told must hold for the tree it has: a tree goes out
with its own version, the newest last, and a file is declared hot only for the tree holding it."""
import json
import os
import socket
import threading
import time
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
    """Namespace's surface as the agent uses it: refresh() answers the newest published tree,
    `delay_first` seconds after it looked (a Registry slow to answer)."""

    def __init__(self, tree: Tree, client=None):
        self.trees, self.client_of, self.delay_first = [tree], client, 0.0

    def refresh(self, force: bool = False) -> Tree:
        tree = self.trees[-1]
        delay, self.delay_first = self.delay_first, 0.0
        time.sleep(delay)
        return tree

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


def entries_of(tree: Tree) -> list[tuple[str, str]]:
    return sorted((e.path, "" if e.is_dir else e.file_manifest.generation) for e in tree.all_entries() if e.path)


def test_trees_sent_at_once_go_out_whole_each_under_its_own_version_the_newest_last():
    old, new = Tree({"a": manifest("a", "g1")}, 1), Tree({"a": manifest("a", "g2")}, 2)
    ns = ScriptedNamespace(old)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    ns.delay_first = 0.3  # the watch's refresh answers the old tree, late
    watch = threading.Thread(target=agent.send_tree, kwargs={"force": True})
    watch.start()
    time.sleep(0.1)
    ns.trees.append(new)  # published meanwhile; an open that sees it sends too
    agent.send_tree()
    watch.join()
    trees = [m for m in received(ours, theirs) if m["op"] == "tree"]
    by_version = {1: entries_of(old), 2: entries_of(new)}
    assert [m["version"] for m in trees] == [1, 2]
    for m in trees:
        assert sorted((e["path"], e["gen"]) for e in m["entries"]) == by_version[m["version"]]


def test_a_file_is_declared_hot_only_for_the_tree_the_daemon_has(tmp_path):
    backing = tmp_path / "entry"
    backing.write_bytes(b"x" * 10)
    client = SimpleNamespace(open_cached=lambda i, count: (os.open(backing, os.O_RDONLY), SimpleNamespace(fetched_ns=7),
                                                           str(backing), 0),
                             mark_keys=lambda ids: ([11], "b"), paths=SimpleNamespace(stale_pin=lambda node: "/pin"))
    a1, b = manifest("a", "g1"), manifest("b", "g1")
    sent = Tree({"a": a1, "b": b}, 5)
    ns = ScriptedNamespace(sent, client)
    ours, theirs = socket.socketpair()
    agent = Agent(ns, ours, threads=1)
    agent.send_tree()
    # a later tree, not sent yet: `b` replaced, `a` the same file: `a` is hot for the daemon's tree
    later = Tree({"a": a1, "b": manifest("b", "g2")}, 6)
    hot = agent._hot(later.lookup("a"))
    assert hot is not None and hot["version"] == 5 and hot["inode"] == backing.stat().st_ino
    # `b` of the later tree is another file than the daemon's `b`: never declared (the cache is not asked)
    ns.client_of = None
    assert agent._hot(later.lookup("b")) is None
    ours.close()
    theirs.close()
