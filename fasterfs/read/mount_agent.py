"""The mount's agent: the daemon's other half (fasterfs.read.mount starts both). It holds the
namespace and sends the daemon its tree, listings, deltas and hot declarations; it answers the
opens, reads, lookups and listings the daemon asks for, every message held to protocol.json
(fasterfs.read.wire)."""
from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..core.fsutil import atomic_write_json
from ..core.manifest import Manifest
from ..core.namespace import Entry, Tree
from . import wire
from .backings import Backings
from .open_file import OpenFile
from .reader import Namespace

log = logging.getLogger("fasterfs.read.mount")


class Agent:
    """The daemon's other half: the namespace, opens and reads of what is not hot."""

    REFRESH_AT_MOST_S = 0.1  # programs probing for names that do not exist cost a Registry call this often
    CACHED_EVERY_S = 0.025   # how often a handle's reads look for newly cached parts of its file
    PENDING_S = 5.0          # how long a file read through here is watched for its fills to land
    FETCH_URLS_S = 6 * 3600  # how long the GETs handed to the daemon at an open stay valid

    def __init__(self, ns: Namespace, sock: socket.socket, threads: int = 8, native_fetch: bool = True):
        self.ns, self.sock, self.native_fetch = ns, sock, native_fetch
        self.backings = Backings(ns)
        self._files: dict[int, OpenFile] = {}
        self._told: dict[int, tuple[float, int]] = {}  # handle -> when, and how many chunks, "cached" was sent
        self._pending: dict[str, tuple[Entry, float]] = {}  # path -> its entry, watched until (hot_soon)
        self._ids = itertools.count(1)
        self._barrier_ids = itertools.count(1)
        self._serving = False  # serve() reads the daemon's answers
        self._lock = threading.Lock()        # _files
        self._send_lock = threading.Lock()   # whole messages on the socket
        self._pool = ThreadPoolExecutor(threads, "mount-agent")  # reads may wait on MinIO
        self._sent_version = -1              # the daemon's tree: every change goes out as it is applied
        self._refreshed = 0.0
        self._asked = 0  # lookups and listings the daemon is waiting for: the warming gives way to them
        self._barriers: dict[int, threading.Event] = {}  # stats ids awaited: the daemon applied what came before
        self._asked_done = threading.Condition()  # notified when _asked falls to 0
        self.stopping = threading.Event()
        self.stats_file = os.environ.get("FASTERFS_MOUNT_STATS")

    # -- to the daemon ----------------------------------------------------------------------

    def _send(self, message: dict, payload: bytes | memoryview = b"", reply_to: str | None = None) -> None:
        """`message` to the daemon, held to protocol.json first: a message of its own, or the
        reply to a request of op `reply_to` ("error": an error reply to any request)."""
        if reply_to is None:
            wire.check("to_daemon", message)
        else:
            wire.check("error_reply", message) if reply_to == "error" else wire.check("reply", message, reply_to)
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            self.sock.sendall(line)
            if payload:
                self.sock.sendall(payload)

    def start_tree(self) -> None:
        """The root, then each change as a delta, in order (the Namespace calls `_tree_changed`
        under its lock as it applies them); directories go out as the daemon asks (`_list`)."""
        self.ns.watch(self._tree_changed)

    @staticmethod
    def _entry(path: str, is_dir: bool, size: int, mtime: float, generation: str) -> dict:
        """One entry of the daemon's tree. A file's generation is its identity: a replaced file
        gets a new inode, so a handle open on the old one (a passthrough backing the kernel holds
        per inode) never serves a new open."""
        return {"path": path, "dir": is_dir, "size": size, "mtime_ns": int(mtime * 1e9),
                "gen": "" if is_dir else generation}

    def _describe(self, e: Entry) -> dict:
        return self._entry(e.path, e.is_dir, e.size, e.mtime, "" if e.is_dir else e.file_manifest.generation)

    def _tree_changed(self, version: int, names: dict[str, Manifest | None] | None) -> None:
        if names is None:  # at the start, or the store's log lost: the daemon lists anew what it needs
            self._send({"op": "tree", "version": version, "lazy": True, "entries": []})
            self._sent_version = version
            return
        removed = [n for n, m in names.items() if m is None]
        entries = [self._describe(e) for n, m in sorted(names.items()) if m is not None
                   for e in Tree({n: m}).all_entries() if e.path]
        # a dataset's paths are all in its manifest: any other below it is of an older one
        exact = [n for n, m in names.items() if m is not None and m.kind == "dataset"]
        self._send({"op": "delta", "since": self._sent_version, "version": version, "entries": entries,
                    "gone": removed + self._emptied(removed), "exact": exact})
        self._sent_version = version

    def _emptied(self, removed: list[str]) -> list[str]:
        """The directories above `removed` names that are gone with them (the store keeps a
        directory only while names are under it): one store call per directory."""
        dirs = {"/".join(parts[:k]) for parts in (n.split("/") for n in removed) for k in range(1, len(parts))}
        return [d for d in dirs if not self.ns.is_dir(d)]

    def _lookup(self, path: str) -> None:
        """What `path` names, to the daemon, in order as `_list`'s."""
        with self.ns.lock:
            try:
                e = self.ns.lookup(path)
            except FileNotFoundError:
                return
            self._send({"op": "listing", "path": path.rpartition("/")[0], "partial": True,
                        "entries": [self._describe(e)]})

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
                entries = self._list(todo.popleft())
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # gone meanwhile
                return  # the daemon is gone
            except Exception:
                log.exception("warming the daemon's tree stopped; it asks for the rest as used")
                return
            sent += len(entries)
            todo.extend(e["path"] for e in entries if e.get("dir"))
            self._applied()  # one listing at a time in the daemon: a lookup's answer never queues behind many
        log.info("sent the daemon %d entries in %.1f s%s", sent, time.monotonic() - t,
                 "" if not todo else f"; {len(todo)} directories left to be asked for")

    def _applied(self, timeout: float = 30.0) -> None:
        """Until the daemon has applied everything sent before now (it answers a "stats" after
        the trees, deltas and listings before it)."""
        if not self._serving:  # nobody reads the daemon's answers
            return
        n = next(self._barrier_ids)  # the periodic stats' id is 0
        self._barriers[n] = done = threading.Event()
        self._send({"op": "stats", "id": n})
        done.wait(timeout)
        self._barriers.pop(n, None)

    @contextlib.contextmanager
    def _asking(self):
        with self._asked_done:
            self._asked += 1
        try:
            yield
        finally:
            with self._asked_done:
                self._asked -= 1
                if not self._asked:
                    self._asked_done.notify_all()

    def _list(self, path: str) -> list[dict]:
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
                entries = [self._entry(d, True, 0, t, "") for d, t in listed.dirs]
                entries += [self._entry(a.name, a.kind == "dataset", 0 if a.kind == "dataset" else a.size,
                                        a.created, a.generation) for a in listed.names]
            self._send({"op": "listing", "path": path, "entries": entries})
            return entries

    def _list_within(self, path: str) -> list[dict]:
        """A directory not in the store: one within a dataset (from its manifest), else none."""
        try:
            return [self._describe(e) for e in self.ns.listdir(path)]
        except FileNotFoundError:
            self.send_tree(force=True)  # the delta that removes it, if not gone out yet
            raise OSError(errno.ENOENT, path) from None
        except NotADirectoryError:
            raise OSError(errno.ENOTDIR, path) from None

    def send_tree(self, force: bool = False) -> None:
        """Whatever changed in the namespace, to the daemon (as deltas, by `_tree_changed`)."""
        self.ns.refresh(force)

    def _hot(self, entry: Entry) -> dict | None:
        """What lets the daemon open `entry` by passthrough: a file whose bytes are one local
        file of this host's cache, fresh (a file of one chunk: its entry; a stored file of
        several: its file entry, every chunk filled), with what the daemon checks before each
        such open (the file's inode; the kernel's stale marks of every chunk). None also when
        the daemon's tree has another file at that path: the declaration is of its version."""
        version = self.ns.version_of(entry)
        if version is None or version != self._sent_version:
            return None
        backing = self.backings.whole(entry)
        return None if backing is None else {**backing, "version": version}

    def _declare_hot(self, entry: Entry) -> bool:
        hot = self._hot(entry)
        if hot is not None:
            self._send({"op": "hot", "path": entry.path, **hot})
        return hot is not None

    def hot_soon(self, every_s: float = 0.05) -> None:
        """Files read through here but not cached at their release: the read that made their
        chunks hot has a fill running beside it. Declared hot as soon as it lands (looked at every
        `every_s` for PENDING_S), so even their next open is a passthrough one."""
        while not self.stopping.wait(every_s):
            with self._lock:
                pending = list(self._pending.items())
            for path, (entry, until) in pending:
                try:
                    done = time.monotonic() > until or self.ns.version_of(entry) is None \
                        or self._declare_hot(entry)
                except FileNotFoundError:
                    done = True  # gone from the namespace
                except OSError:
                    return
                if done:
                    with self._lock:
                        if self._pending.get(path, (None,))[0] is entry:
                            del self._pending[path]

    # -- from the daemon --------------------------------------------------------------------

    def serve(self) -> None:
        reader = self.sock.makefile("rb", buffering=1 << 16)
        self._serving = True
        for line in reader:
            message = json.loads(line)
            try:
                wire.check("request" if "op" in message else "stats_reply", message)
            except wire.WireError as e:
                log.error("the daemon sent what protocol.json does not allow: %s", e)
                if isinstance(message.get("id"), int) and "op" in message:
                    self._refuse(message["id"], errno.EPROTO)
                continue
            if "op" not in message:  # the reply to our stats request
                self._write_stats(message.get("stats") or {})
                barrier = self._barriers.pop(message.get("id"), None)
                if barrier is not None:
                    barrier.set()
                continue
            self._pool.submit(self._answer, message)
        self.stopping.set()

    def _write_stats(self, stats: dict) -> None:
        """The daemon's counters, for the StorageNode's status (FASTERFS_MOUNT_STATS): reads of
        passthrough opens never reach this agent nor the daemon, so only its opens count them."""
        if self.stats_file:
            atomic_write_json(self.stats_file, {**stats, "time": time.time()})

    def _refuse(self, request_id: int, code: int) -> None:
        self._send({"id": request_id, "errno": code}, reply_to="error")

    def _answer(self, m: dict) -> None:
        """One request of the daemon's (held to protocol.json by serve) answered."""
        op = m["op"]
        try:
            if op == "open":
                self._send({"id": m["id"], **self._open(m["path"], m.get("gen"))}, reply_to=op)
            elif op == "read":
                data = self._read(m["handle"], m["offset"], m["size"])
                cached = self._cached_since(m["handle"])
                self._send({"id": m["id"], "len": len(data), **({"cached": cached} if cached else {})}, data, op)
            elif op == "cached":  # the daemon reads a file itself: what of it is cached here now?
                cached = self._cached_since(m["handle"])
                self._send({"id": m["id"], **({"cached": cached} if cached else {})}, reply_to=op)
            elif op == "lookup":  # a name in a directory not listed: what it is, if anything, before the reply
                with self._asking():
                    self._lookup(m["path"])
                self._send({"id": m["id"]}, reply_to=op)
            elif op == "list":  # a directory not listed yet: its names, before the reply
                with self._asking():
                    self._list(m["path"])
                self._send({"id": m["id"]}, reply_to=op)
            elif op == "refresh":  # a name the daemon's tree lacks, or a hot file marked stale: newer?
                if m.get("why") == "stale" or time.monotonic() - self._refreshed > self.REFRESH_AT_MOST_S:
                    self._refreshed = time.monotonic()
                    self.send_tree(force=True)  # goes out before the reply: the daemon has it when it retries
                self._send({"id": m["id"]}, reply_to=op)
            elif op == "release":
                if m["handle"] is not None:
                    self._release(m["handle"])
                self._send({"id": m["id"]}, reply_to=op)
            else:  # in protocol.json, not served here (tests/test_mount_protocol.py says so first)
                self._refuse(m["id"], errno.ENOSYS)
        except OSError as e:
            self._refuse(m["id"], e.errno or errno.EIO)
        except Exception as e:  # holders down, generation gone: the application gets EIO, the log says why
            log.error("%s of %s failed: %s", op, m.get("path", m.get("handle")), e)
            self._refuse(m["id"], errno.EIO)

    def _open(self, path: str, gen: str | None = None) -> dict:
        """A handle for reads through here; and either what makes the file hot (the daemon then
        opens it by passthrough and releases the handle) or whether the kernel may keep its
        pages (Namespace.may_keep_pages). `gen`: the file's generation in the daemon's tree; if
        the path is another file here now, the newer tree goes out first and the open fails
        ESTALE (the kernel looks the path up again, finding the new file's inode)."""
        try:
            entry = self.ns.lookup(path)
        except FileNotFoundError:
            raise OSError(errno.ENOENT, path) from None
        if entry.is_dir:
            raise OSError(errno.EISDIR, path)
        if gen is not None and entry.file_manifest.generation != gen:
            self.send_tree()
            raise OSError(errno.ESTALE, path)
        with self._lock:
            handle = next(self._ids)
            self._files[handle] = self.ns.open_entry(entry)
        hot = self._hot(entry)
        if hot is not None:
            return {"handle": handle, "hot": hot}
        cached = self.backings.cached(entry)
        with self._lock:
            self._told[handle] = (time.monotonic(), len(cached["keys"]) if cached else 0)
        keep = self.ns.may_keep_pages(entry)
        # every chunk in a cache of this host: read here from those copies, not fetched from MinIO
        # again (GETs the kernel would count, refilling what is cached)
        fetch = None if self.ns.was_cached_here(entry) else self._fetch(entry)
        return {"handle": handle, "keep_cache": keep, **({"cached": cached} if cached else {}),
                **({"fetch": fetch} if fetch else {})}

    def _fetch(self, entry: Entry) -> dict | None:
        """Where `entry`'s bytes are, so that the daemon fetches its misses itself (checked
        against each chunk's xxh3 there); None leaves every read to this agent."""
        if not self.native_fetch:
            return None
        chunks = self.ns.client(entry.file_manifest).presigned(entry.chunk_ids, self.FETCH_URLS_S)
        if chunks is None:
            return None
        for start, c in zip(entry.starts, chunks):
            c["start"] = start
        return {"chunks": chunks}

    def _cached_since(self, handle: int) -> dict | None:
        """What the daemon may now read itself of this handle's file, if more than it was told
        (looked at most every CACHED_EVERY_S per handle: fills land while a file is read)."""
        with self._lock:
            told = self._told.get(handle)
            f = self._files.get(handle)
            if told is None or f is None or time.monotonic() - told[0] < self.CACHED_EVERY_S:
                return None
            self._told[handle] = (time.monotonic(), told[1])
        cached = self.backings.cached(f.entry)
        if cached is None or len(cached["keys"]) <= told[1]:
            return None
        with self._lock:
            self._told[handle] = (time.monotonic(), len(cached["keys"]))
        return cached

    def _read(self, handle: int, offset: int, size: int) -> bytes:
        f = self._files.get(handle)
        if f is None:
            raise OSError(errno.EBADF, f"handle {handle}")
        return f.read(offset, size)

    def _release(self, handle: int) -> None:
        with self._lock:
            f = self._files.pop(handle, None)
            self._told.pop(handle, None)
        if f is not None:
            if not self._declare_hot(f.entry):  # read through: its chunks may be cached by now, or soon
                with self._lock:
                    self._pending[f.entry.path] = (f.entry, time.monotonic() + self.PENDING_S)
            f.close()

    def watch(self, every_s: float = 0.5) -> None:
        """A new namespace version goes to the daemon (a replaced file: new attributes, and
        its hot declarations no longer hold, being of the old version); its counters come back."""
        while not self.stopping.wait(every_s):
            try:
                self.send_tree(force=True)
                self._send({"op": "stats", "id": 0})
            except OSError:
                return
            except Exception:
                log.exception("namespace refresh failed; the daemon keeps the last tree")
