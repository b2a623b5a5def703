"""Sort-benchmark records: GraySort's 100-byte records with 10-byte keys, or the original
FasterFS's 64-byte records with 8-byte keys.

Record i depends only on (seed, i), so every node generates its own range with no
coordination. Keys come from a counter-based 64-bit mixer (splitmix64), vectorised in
NumPy; `skew` concentrates keys toward the low end (the key's top 64 bits are u**(1+skew)
of a uniform u), which sampled boundaries must absorb. The payload names the record's
index (hex). These records are NOT byte-compatible with sortbenchmark.org's gensort, and
FasterFS does not claim they are.

Validation follows valsort: record count, and the sum of every record's CRC32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import FasterFSError


@dataclass(frozen=True)
class Format:
    name: str
    record: int  # bytes per record
    key: int     # leading key bytes


FORMATS = {"gray": Format("gray", 100, 10), "fasterfs": Format("fasterfs", 64, 8)}


def record_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise FasterFSError(f"unknown record format {name!r}: use one of {sorted(FORMATS)}") from None


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def generate(fmt: Format, seed: int, start: int, count: int, skew: float = 0.0) -> np.ndarray:
    """Records start .. start+count-1 as a (count, fmt.record) uint8 array."""
    idx = np.arange(start, start + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
        hi = _splitmix64(idx ^ base)
        lo = _splitmix64(hi ^ np.uint64(0xA0761D6478BD642F))
    if skew > 0:  # push keys toward 0: many records share a narrow low key range
        u = (hi >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        hi = (u ** (1.0 + skew) * float(1 << 63)).astype(np.uint64) << np.uint64(1) | (hi & np.uint64(1))
    out = np.empty((count, fmt.record), dtype=np.uint8)
    out[:, 0:8] = hi.astype(">u8").view(np.uint8).reshape(count, 8)
    if fmt.key > 8:
        out[:, 8:fmt.key] = lo.astype(">u8").view(np.uint8).reshape(count, 8)[:, : fmt.key - 8]
    # payload: the record's index in 16 hex digits, then letters shifted by the index
    rest = fmt.record - fmt.key
    ndig = min(16, rest)
    shifts = np.arange(60, 60 - 4 * ndig, -4, dtype=np.uint64)
    nibbles = ((idx[:, None] >> shifts[None, :]) & np.uint64(15)).astype(np.uint8)
    out[:, fmt.key:fmt.key + ndig] = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)[nibbles]
    if rest > 16:  # the rows of a 26-row table (one per shift), gathered whole
        letters = ((np.arange(26)[:, None] + np.arange(rest - 16)[None, :]) % 26 + 65).astype(np.uint8)
        out[:, fmt.key + 16:] = letters.take((idx % np.uint64(26)).astype(np.intp), axis=0)
    return out


def key_prefix(records: np.ndarray) -> np.ndarray:
    """The first 8 key bytes as big-endian uint64: orders records by key (ties decided by
    the remaining key bytes, see sort_order)."""
    return np.ascontiguousarray(records[:, :8]).view(">u8").ravel().astype(np.uint64)


def sort_order(records: np.ndarray, fmt: Format) -> np.ndarray:
    """Indices that sort the records by their full key.

    A stable sort of the first 8 key bytes (timsort: fast on the concatenated sorted runs a
    reducer receives), then only records whose first 8 bytes tie are reordered by the rest."""
    k1 = key_prefix(records)
    order = np.argsort(k1, kind="stable")
    if fmt.key <= 8:
        return order
    ks = k1[order]
    dup = np.flatnonzero(ks[1:] == ks[:-1])
    if dup.size:
        pos = np.unique(np.concatenate([dup, dup + 1]))
        sub = order[pos]
        k2 = np.zeros(len(sub), dtype=np.uint64)
        for b in range(8, fmt.key):
            k2 = (k2 << np.uint64(8)) | records[sub, b].astype(np.uint64)
        order[pos] = sub[np.lexsort((k2, k1[sub]))]
    return order


def sort(records: np.ndarray, fmt: Format) -> np.ndarray:
    """The records in key order (a new array). `take` gathers whole rows 2x faster than
    fancy indexing."""
    return records.take(sort_order(records, fmt), axis=0)


def first_unsorted(records: np.ndarray, fmt: Format) -> int | None:
    """Index of the first record whose key is smaller than its predecessor's, or None."""
    if len(records) < 2:
        return None
    keys = np.ascontiguousarray(records[:, :fmt.key])
    a, b = keys[:-1], keys[1:]
    diff = a != b
    has = diff.any(axis=1)
    first = diff.argmax(axis=1)
    rows = np.arange(len(a))
    bad = has & (a[rows, first] > b[rows, first])
    hits = np.flatnonzero(bad)
    return int(hits[0]) + 1 if hits.size else None


# CRC32 (IEEE, as zlib) of every record at once: the records' 32-bit words are fed column by
# column, each through two 16-bit tables (slicing-by-4 with 64K-entry tables: half the lookups).
def _tables() -> np.ndarray:
    t = np.zeros((4, 256), dtype=np.uint32)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t[0, n] = c
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_T = _tables()
_V = np.arange(65536, dtype=np.uint32)
_LO16 = _T[3][_V & 0xFF] ^ _T[2][_V >> 8]  # the word's low 16 bits
_HI16 = _T[1][_V & 0xFF] ^ _T[0][_V >> 8]  # its high 16 bits
_BLOCK = 65536  # records per pass: the transposed words and the state stay in cache


def crc32_each(records: np.ndarray) -> np.ndarray:
    """zlib.crc32 of every row, vectorised (~900 MB/s here instead of a Python loop)."""
    n, width = records.shape
    words = width // 4
    out = np.empty(n, dtype=np.uint32)
    for s in range(0, n, _BLOCK):
        part = records[s:s + _BLOCK]
        cols = np.ascontiguousarray(np.ascontiguousarray(part[:, :words * 4]).view("<u4").T)
        crc = np.full(len(part), 0xFFFFFFFF, dtype=np.uint32)
        x, lo = np.empty_like(crc), np.empty_like(crc)
        for j in range(words):
            np.bitwise_xor(crc, cols[j], out=x)
            np.take(_LO16, x & 0xFFFF, out=lo)
            np.take(_HI16, x >> 16, out=crc)
            crc ^= lo
        for j in range(words * 4, width):
            crc = _T[0][(crc ^ part[:, j]) & 0xFF] ^ (crc >> 8)
        out[s:s + _BLOCK] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def checksum(records: np.ndarray) -> int:
    """valsort's checksum: the sum of every record's CRC32."""
    return int(crc32_each(records).astype(np.uint64).sum())
