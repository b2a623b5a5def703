"""Backings: what of a file this host's cache holds as local files the mount's daemon may read
itself, as the daemon is told of them: the whole file (declared hot: opened by passthrough) or
some of its chunks (read by the daemon from the file entry), each with what the daemon checks
before it trusts the file (its inode; the kernel's stale marks of its chunks)."""
from __future__ import annotations

import os

from ..core.namespace import Entry
from .reader import Namespace


class Backings:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def whole(self, entry: Entry) -> dict | None:
        """The one local file of this host's cache holding all of `entry`, fresh, if any."""
        client = self.ns.client(entry.file_manifest)
        if len(entry.chunk_ids) > 1:
            whole = self.file_entry(client, entry)
            return whole[0] if whole is not None and len(whole[1]) == len(entry.chunk_ids) else None
        got = client.open_cached(entry.chunk_ids[0], count=False, verify=True)  # checked when declared hot
        if got is None:
            return None
        fd, header, path, node = got
        try:
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        return self.backing(client, path, inode, entry.chunk_ids, header.fetched_ns, node)

    def file_entry(self, client, entry: Entry) -> tuple[dict, list[int]] | None:
        """The file entry holding `entry`'s chunks in this host's cache (a stored file of
        several chunks), as the daemon is told of a backing, and the chunks it holds so far."""
        got = client.cached_parts(entry.chunk_ids)
        if got is None or not got[2]:
            return None
        path, inode, have, fetched, node = got
        return self.backing(client, path, inode, have, fetched, node), have

    def backing(self, client, path: str, inode: int, ids, fetched_ns: int, node: int) -> dict:
        """A local file holding chunks `ids` (fetched at `fetched_ns` at the oldest), with the
        stale marks the daemon checks before it trusts it."""
        declared = {"backing": path, "inode": inode, "fetched_ns": fetched_ns}
        pin = client.marks_pin(node)
        if pin is not None:  # else the node keeps no marks to check (simulated mode)
            keys, bucket = client.mark_keys(ids)
            declared.update(pin=pin, keys=keys, bucket=bucket)
        return declared

    def cached(self, entry: Entry) -> dict | None:
        """The parts of `entry` (a stored file of several chunks) that its file entry in this
        host's cache holds, at the same offsets: the daemon reads those itself."""
        got = self.file_entry(self.ns.client(entry.file_manifest), entry) if len(entry.chunk_ids) > 1 else None
        if got is None:
            return None
        backing, have = got
        held = set(have)
        ranges: list[list[int]] = []
        for k, i in enumerate(entry.chunk_ids):  # a file's chunks, in order: file offsets are entry offsets
            if i in held:
                start, end = entry.starts[k], entry.starts[k] + entry.file_manifest.chunks[i].bytes
                if ranges and ranges[-1][1] == start:
                    ranges[-1][1] = end
                else:
                    ranges.append([start, end])
        return {**backing, "ranges": ranges}
