"""The mount's agent: the daemon's other half (fasterfs.read.mount starts both). It holds the
namespace and sends the daemon its tree, listings, deltas and hot declarations; it answers the
opens, reads, lookups and listings the daemon asks for, every message held to protocol.json
(fasterfs.read.wire)."""
from __future__ import annotations

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
from ..core.namespace import Entry
from . import wire
from .backings import Backings
from .mount_tree import TreeSender
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
        self._lock = threading.Lock()        # _files
        self._send_lock = threading.Lock()   # whole messages on the socket
        self._pool = ThreadPoolExecutor(threads, "mount-agent")  # reads may wait on MinIO
        self._refreshed = 0.0
        self.stopping = threading.Event()
        self.tree = TreeSender(ns, self._send, self.stopping)  # the namespace, to the daemon
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

    def _hot(self, entry: Entry) -> dict | None:
        """What lets the daemon open `entry` by passthrough: a file whose bytes are one local
        file of this host's cache, fresh (a file of one chunk: its entry; a stored file of
        several: its file entry, every chunk filled), with what the daemon checks before each
        such open (the file's inode; the kernel's stale marks of every chunk). None also when
        the daemon's tree has another file at that path: the declaration is of its version."""
        version = self.ns.version_of(entry)
        if version is None or version != self.tree.sent_version:
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
        self.tree.serving = True
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
                self.tree.answered(message.get("id"))
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
                with self.tree.asking():
                    self.tree.lookup(m["path"])
                self._send({"id": m["id"]}, reply_to=op)
            elif op == "list":  # a directory not listed yet: its names, before the reply
                with self.tree.asking():
                    self.tree.listing(m["path"])
                self._send({"id": m["id"]}, reply_to=op)
            elif op == "refresh":  # a name the daemon's tree lacks, or a hot file marked stale: newer?
                if m.get("why") == "stale" or time.monotonic() - self._refreshed > self.REFRESH_AT_MOST_S:
                    self._refreshed = time.monotonic()
                    self.tree.send_tree(force=True)  # goes out before the reply: the daemon has it when it retries
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
            self.tree.send_tree()
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
