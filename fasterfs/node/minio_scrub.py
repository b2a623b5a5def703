"""MinioScrub: re-read every object this node stores, at a bounded rate, and check it as a reader
would; bad ones, and ones missing (lost behind MinIO's back), are rebuilt from the chunk's other
pieces.

A shard is checked against the manifest's checksum; a replica against the one stored with it
(an object another tool rewrote is served as it now is). The reads carry the filler's mark, so
the kernel does not count them.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from ..control.s3 import ServerError
from ..core import erasure
from ..core.pace import Pacer, Throttle
from .node_index import Piece

log = logging.getLogger("fasterfs.node.minio_scrub")


class Getter(Protocol):
    def get_object(self, bucket: str, key: str) -> tuple[bytes, dict]: ...  # KeyError when missing
    def close(self) -> None: ...


class MinioScrub:
    """`open_getter()` -> a Getter of this node's MinIO; `rebuild(bad_pieces, bad_chunks)` ->
    chunks repaired."""

    def __init__(self, node: int, bucket: str, mb_per_s: float, open_getter: Callable[[], Getter],
                 rebuild: Callable[[set[tuple[int, str]], dict[str, set[int]]], int]):
        self.node, self.bucket, self.mb_per_s = node, bucket, mb_per_s
        self.open_getter, self.rebuild = open_getter, rebuild
        self.totals: dict = {"passes": 0, "objects": 0, "bytes": 0, "bad": 0, "missing": 0, "repaired": 0,
                             "last_bad": []}

    def scrub(self, pieces: Mapping[str, Piece], stopping: threading.Event | None = None, share: float = 1.0,
              current: Callable[[], Mapping[str, Piece]] | None = None) -> dict:
        """One pass over `pieces` (this node's objects when it began; `current()`: now, so that a
        piece replaced or removed during a long pass, then deleted, is not taken for one lost);
        returns its figures. Bounded in bytes
        (mb_per_s) and in time: its GETs take at most `share` of it (a million small objects are
        a million GETs, each costing MinIO more than its bytes)."""
        throttle, pacer = Throttle(self.mb_per_s * 1e6), Pacer(share)
        getter = self.open_getter()
        checked = nbytes = 0
        bad: dict[str, set[int]] = {}
        bad_pieces: set[tuple[int, str]] = set()
        missing: list[str] = []
        try:
            for key, piece in list(pieces.items()):
                if stopping is not None and stopping.is_set():
                    break
                try:
                    with pacer.step():
                        data, headers = getter.get_object(self.bucket, key)
                except KeyError:  # lost behind MinIO's back: put back now, not at the next survey
                    if current is not None and key not in current():
                        continue  # no longer this node's: replaced or removed since the pass began
                    log.warning("scrub: %s on node %d is missing", key, self.node)
                    missing.append(key)
                    bad.setdefault(piece.name, set()).add(piece.chunk_id)
                    bad_pieces.add((self.node, key))
                    continue
                except ServerError as e:
                    if e.status < 500:
                        raise
                    log.warning("scrub: %s on node %d cannot be served: %s", key, self.node, e)
                    bad.setdefault(piece.name, set()).add(piece.chunk_id)  # MinIO found it rotten itself
                    bad_pieces.add((self.node, key))
                    continue
                throttle.take(len(data))
                checked, nbytes = checked + 1, nbytes + len(data)
                stored = headers.get("x-amz-meta-xxh3")
                expected = piece.xxh3 if piece.xxh3 is not None else (
                    int(stored) if stored and stored.isdigit() else None)
                if expected is not None and erasure.checksum(data) != expected:
                    log.warning("scrub: %s on node %d does not match its checksum", key, self.node)
                    bad.setdefault(piece.name, set()).add(piece.chunk_id)
                    bad_pieces.add((self.node, key))
        finally:
            getter.close()
        repaired = self.rebuild(bad_pieces, bad) if bad else 0
        names = sorted({k for _, k in bad_pieces} - set(missing))
        t = self.totals
        t.update(passes=t["passes"] + 1, objects=t["objects"] + checked, bytes=t["bytes"] + nbytes,
                 bad=t["bad"] + len(names), missing=t["missing"] + len(missing), repaired=t["repaired"] + repaired,
                 last_bad=(names + sorted(missing))[:20])
        return {"checked": checked, "bytes": nbytes, "bad": names, "missing": sorted(missing), "repaired": repaired}
