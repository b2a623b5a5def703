"""The user-space mirror of fasterfs.h (the one place it is mirrored) and the key hash."""
from __future__ import annotations

import ctypes as ct
import re
from pathlib import Path

HEADER = Path(__file__).with_name("fasterfs.h")


def _define(name: str) -> int:
    m = re.search(rf"#define {name} (\w+)", HEADER.read_text())
    if m is None:
        raise LookupError(f"{HEADER} has no #define {name}")
    return int(m.group(1).rstrip("UL"), 0)  # without its ULL, UL, LL, U or L suffix


MAX_PATH = _define("FFS_MAX_PATH")
KEY_COUNTS = _define("FFS_KEY_COUNTS")
STALE_MARKS = _define("FFS_STALE_MARKS")
RING_PAGES = _define("FFS_RING_PAGES")
SEEN_WORDS = _define("FFS_SEEN_WORDS")
LAT_SLOTS = _define("FFS_LAT_SLOTS")
FNV_OFFSET = _define("FFS_FNV_OFFSET")
FNV_PRIME = _define("FFS_FNV_PRIME")

EVENT_TYPES = {1: "HOT", 2: "STALE"}
METHODS = {1: "GET", 2: "PUT", 3: "DELETE", 4: "POST"}
COUNTERS = ["packets", "requests", "not_request", "truncated", "hot_events", "stale_marks", "filler_skipped",
            "ringbuf_drops", "responses", "writes_committed", "refused", "marks_full", "suspect_marks", "pipelined",
            "keys_new", "second_chances", "seen_set"]
SOCKOPTS = ["TCP_NODELAY", "TCP_BPF_DELACK_MAX"]
SOCK_COUNTERS = ["connections_seen", "connections_matched"]


def key_hash(path: str | bytes) -> int:
    """FNV-1a 64 of a request path exactly as the kernel computes it: up to a space or
    '?', over at most MAX_PATH bytes."""
    h = FNV_OFFSET
    for byte in _hashed(path.encode() if isinstance(path, str) else path):
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def _hashed(data: bytes) -> bytes:
    """What of a request path the kernel hashes: up to a space or '?', at most MAX_PATH bytes."""
    return _HASHED.match(data[:MAX_PATH]).group()  # type: ignore[union-attr]  # [^ ?]* matches always


_HASHED = re.compile(rb"[^ ?]*")


def key_hashes(paths: list[str]) -> list[int]:
    """`key_hash` of each path, computed for all at once (a byte position of every path per
    step, in numpy): a StorageNode indexing a million names at its start hashes each object's
    path, ~20 us apiece one at a time."""
    import numpy as np

    cut = [_hashed(p.encode()) for p in paths]
    width = max(map(len, cut), default=0)
    grid = np.frombuffer(b"".join(c.ljust(width, b"\0") for c in cut), dtype=np.uint8).reshape(len(cut), width).T.copy()
    lengths = np.fromiter(map(len, cut), dtype=np.int64, count=len(cut))
    h = np.full(len(cut), FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    for j in range(width):  # uint64 arithmetic wraps, as the kernel's does
        h = np.where(lengths > j, (h ^ grid[j]) * prime, h)
    return h.tolist()


class Config(ct.Structure):
    _fields_ = [("hot_threshold", ct.c_uint64), ("suspect_key", ct.c_uint64), ("fill_mark", ct.c_uint32),
                ("epoch", ct.c_uint32),
                ("delack_max_us", ct.c_uint32), ("seen_gen", ct.c_uint32)]


class Endpoint(ct.Structure):
    _fields_ = [("addr", ct.c_uint32 * 4), ("port", ct.c_uint16), ("pad", ct.c_uint16)]


class KeyStat(ct.Structure):
    _fields_ = [("count", ct.c_uint64), ("last_ns", ct.c_uint64), ("epoch", ct.c_uint32), ("pad", ct.c_uint32)]


class PortStats(ct.Structure):
    _fields_ = [("requests", ct.c_uint64), ("gets", ct.c_uint64), ("puts", ct.c_uint64), ("deletes", ct.c_uint64),
                ("lat_sum_ns", ct.c_uint64), ("lat_count", ct.c_uint64)]


class LatKey(ct.Structure):
    _fields_ = [("port", ct.c_uint16), ("slot", ct.c_uint16)]


class OptStats(ct.Structure):
    _fields_ = [("ok", ct.c_uint64), ("fail", ct.c_uint64), ("last_error", ct.c_int64)]


class Event(ct.Structure):
    _fields_ = [("ts_ns", ct.c_uint64), ("key", ct.c_uint64), ("count", ct.c_uint64), ("type", ct.c_uint32),
                ("port", ct.c_uint16), ("path_len", ct.c_uint16), ("method", ct.c_uint32), ("pad", ct.c_uint32),
                ("path", ct.c_char * MAX_PATH)]

    @property
    def path_str(self) -> str:
        return bytes(self.path[: self.path_len]).decode(errors="replace")

    def to_dict(self) -> dict:
        return {"type": EVENT_TYPES.get(self.type, "?"), "method": METHODS.get(self.method, "?"),
                "key": self.key, "path": self.path_str, "count": self.count, "port": self.port, "ts_ns": self.ts_ns}


def hist_quantile(hist: dict[int, int], q: float) -> float | None:
    """Upper edge (µs) of the log2 bucket holding quantile q; slot s holds 2^(s-1) <= µs+1 < 2^s."""
    total = sum(hist.values())
    if not total:
        return None
    seen = 0
    for slot in sorted(hist):
        seen += hist[slot]
        if seen >= q * total:
            return float(2 ** slot - 1)
    return None


def becomes_hot(count: int, threshold: int) -> bool:
    """The kernel's rule (requests.bpf.c): a key is HOT exactly when its count in the epoch
    reaches the threshold, so each key makes one HOT event per epoch."""
    return count == threshold
