"""The mount agent's side of the daemon's tree: the namespace's root, its changes as deltas in
order, directory listings as the daemon asks or ahead of it (warm), and the barrier that says the
daemon applied what came before (a "stats" it answers after them)."""
from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import threading
import time
from collections.abc import Callable

from ..core.manifest import Manifest
from ..core.namespace import Entry, Tree
from .reader import Namespace

log = logging.getLogger("fasterfs.read.mount")


def entry(path: str, is_dir: bool, size: int, mtime: float, generation: str) -> dict:
    """One entry of the daemon's tree. A file's generation is its identity: a replaced file
    gets a new inode, so a handle open on the old one (a passthrough backing the kernel holds
    per inode) never serves a new open."""
    return {"path": path, "dir": is_dir, "size": size, "mtime_ns": int(mtime * 1e9),
            "gen": "" if is_dir else generation}


def describe(e: Entry) -> dict:
    return entry(e.path, e.is_dir, e.size, e.mtime, "" if e.is_dir else e.file_manifest.generation)


class TreeSender:
    """What the daemon's tree is made of, sent by `send` (the agent's, held to protocol.json)."""

    def __init__(self, ns: Namespace, send: Callable[[dict], None], stopping: threading.Event):
        self.ns, self.send, self.stopping = ns, send, stopping
        self.sent_version = -1  # the daemon's tree: every change goes out as it is applied
        self.serving = False  # the agent reads the daemon's answers (barriers are answered)
        self._barrier_ids = itertools.count(1)
        self._barriers: dict[int, threading.Event] = {}  # stats ids awaited: the daemon applied what came before
        self._asked = 0  # lookups and listings the daemon is waiting for: the warming gives way to them
        self._asked_done = threading.Condition()  # notified when _asked falls to 0

    def answered(self, stats_id) -> None:
        """The daemon's answer to a stats request: a barrier of `applied`, if one waits on it."""
        barrier = self._barriers.pop(stats_id, None)
        if barrier is not None:
            barrier.set()

    def start_tree(self) -> None:
        """The root, then each change as a delta, in order (the Namespace calls `changed`
        under its lock as it applies them); directories go out as the daemon asks (`listing`)."""
        self.ns.watch(self.changed)

    def changed(self, version: int, names: dict[str, Manifest | None] | None) -> None:
        if names is None:  # at the start, or the store's log lost: the daemon lists anew what it needs
            self.send({"op": "tree", "version": version, "lazy": True, "entries": []})
            self.sent_version = version
            return
        removed = [n for n, m in names.items() if m is None]
        entries = [describe(e) for n, m in sorted(names.items()) if m is not None
                   for e in Tree({n: m}).all_entries() if e.path]
        # a dataset's paths are all in its manifest: any other below it is of an older one
        exact = [n for n, m in names.items() if m is not None and m.kind == "dataset"]
        self.send({"op": "delta", "since": self.sent_version, "version": version, "entries": entries,
                   "gone": removed + self._emptied(removed), "exact": exact})
        self.sent_version = version

    def _emptied(self, removed: list[str]) -> list[str]:
        """The directories above `removed` names that are gone with them (the store keeps a
        directory only while names are under it): one store call per directory."""
        dirs = {"/".join(parts[:k]) for parts in (n.split("/") for n in removed) for k in range(1, len(parts))}
        return [d for d in dirs if not self.ns.is_dir(d)]

    def lookup(self, path: str) -> None:
        """What `path` names, to the daemon, in order as `listing`'s."""
        with self.ns.lock:
            try:
                e = self.ns.lookup(path)
            except FileNotFoundError:
                return
            self.send({"op": "listing", "path": path.rpartition("/")[0], "partial": True,
                       "entries": [describe(e)]})

    def warm(self, most: int) -> None:
        """Directories listed to the daemon unasked, breadth first from the root, until `most`
        entries are sent: a name looked up later is then at hand (no agent round trip). Each
        listing waits until no lookup or listing the daemon asked for is under way (a lock lets
        whoever is running take it again: a lookup queued behind the warming waited ~40 ms)."""
        todo, t, sent = collections.deque([""]), time.monotonic(), 0
        while todo and sent < most and not self.stopping.is_set():
            with self._asked_done:
                while self._asked and not self.stopping.is_set():
                    self._asked_done.wait(0.1)  # notified at once; the timeout only notices stopping
            try:
                entries = self.listing(todo.popleft())
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # gone meanwhile
                return  # the daemon is gone
            except Exception:
                log.exception("warming the daemon's tree stopped; it asks for the rest as used")
                return
            sent += len(entries)
            todo.extend(e["path"] for e in entries if e.get("dir"))
            self.applied()  # one listing at a time in the daemon: a lookup's answer never queues behind many
        log.info("sent the daemon %d entries in %.1f s%s", sent, time.monotonic() - t,
                 "" if not todo else f"; {len(todo)} directories left to be asked for")

    def applied(self, timeout: float = 30.0) -> None:
        """Until the daemon has applied everything sent before now (it answers a "stats" after
        the trees, deltas and listings before it)."""
        if not self.serving:  # nobody reads the daemon's answers
            return
        n = next(self._barrier_ids)  # the periodic stats' id is 0
        self._barriers[n] = done = threading.Event()
        self.send({"op": "stats", "id": n})
        done.wait(timeout)
        self._barriers.pop(n, None)

    @contextlib.contextmanager
    def asking(self):
        with self._asked_done:
            self._asked += 1
        try:
            yield
        finally:
            with self._asked_done:
                self._asked -= 1
                if not self._asked:
                    self._asked_done.notify_all()

    def listing(self, path: str) -> list[dict]:
        """Directory `path`'s names to the daemon (and returned), sent under the namespace's lock,
        so no delta newer than the listing goes out before it, nor one older after it. A directory
        of the store comes with its names' attributes alone (no manifest crosses); one within a
        dataset, from its manifest. The store is asked outside the lock (a lookup meanwhile need
        not wait for it), and again under it if a change went out in between."""
        listed = self.ns.listed(path)
        with self.ns.lock:
            if listed is not None and listed.version < self.ns.version:
                listed = self.ns.listed(path)
            if listed is None:
                entries = self._list_within(path)
            else:  # the Namespace caught up first: the listing is never newer than the deltas
                entries = [entry(d, True, 0, t, "") for d, t in listed.dirs]
                entries += [entry(a.name, a.kind == "dataset", 0 if a.kind == "dataset" else a.size,
                                  a.created, a.generation) for a in listed.names]
            self.send({"op": "listing", "path": path, "entries": entries})
            return entries

    def _list_within(self, path: str) -> list[dict]:
        """A directory not in the store: one within a dataset (from its manifest), else none."""
        try:
            return [describe(e) for e in self.ns.listdir(path)]
        except FileNotFoundError:
            self.send_tree(force=True)  # the delta that removes it, if not gone out yet
            raise OSError(errno.ENOENT, path) from None
        except NotADirectoryError:
            raise OSError(errno.ENOTDIR, path) from None

    def send_tree(self, force: bool = False) -> None:
        """Whatever changed in the namespace, to the daemon (as deltas, by `changed`)."""
        self.ns.refresh(force)

    def watch(self, every_s: float = 0.5) -> None:
        """A new namespace version goes to the daemon (a replaced file: new attributes, and
        its hot declarations no longer hold, being of the old version); its counters come back."""
        while not self.stopping.wait(every_s):
            try:
                self.send_tree(force=True)
                self.send({"op": "stats", "id": 0})
            except OSError:
                return
            except Exception:
                log.exception("namespace refresh failed; the daemon keeps the last tree")
