"""CountingBloom: a set of names that can only err towards "present", in COUNTERS_PER_NAME bytes
a name of its capacity (a Python set of cache entry names costs ~128 a name).

What a node keeps of each peer's cache. A name added is always found (no false negatives, as long
as every name removed was added: the change log tells transitions only); a name never added is
found with probability about FALSE_POSITIVE at `capacity` names, which costs a reader one question
to a peer that then says no. A counter that reaches SATURATED stays there: it can only make more
names look present, never fewer.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import xxhash

HASHES = 7                # positions per name
COUNTERS_PER_NAME = 10    # with HASHES, ~0.8 % false positives at capacity
FALSE_POSITIVE = (1 - math.exp(-HASHES / COUNTERS_PER_NAME)) ** HASHES  # ~0.8 %
MIN_CAPACITY = 1024
SATURATED = 255
SMALL = 64                # names up to which a change is applied one by one
MASK64 = (1 << 64) - 1
STEPS = range(HASHES)


def digest(name: str) -> tuple[int, int]:
    """The two 64-bit halves of `name`'s xxh3-128 that place its counters in any filter."""
    d = xxhash.xxh3_128_digest(name)
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little") | 1


class CountingBloom:
    def __init__(self, capacity: int, names: Iterable[str] = ()):
        self.capacity = max(int(capacity), MIN_CAPACITY)
        self._bytes = bytearray(self.capacity * COUNTERS_PER_NAME)  # fast one at a time ...
        self.counters = np.frombuffer(self._bytes, dtype=np.uint8)  # ... and as an array in bulk
        self.count = 0  # names added and not removed
        self.add(names)

    @classmethod
    def sized_for(cls, names: frozenset[str] | set[str]) -> CountingBloom:
        """A filter holding `names`, with room for a quarter more before it needs re-sizing."""
        return cls(len(names) + len(names) // 4, names)

    def full(self) -> bool:
        """Past its capacity: false positives grow; rebuild from a snapshot."""
        return self.count > self.capacity

    def _positions(self, names: Iterable[str]) -> np.ndarray:
        """Each name's HASHES counters, by double hashing of its xxh3-128 (two 64-bit halves)."""
        digests = b"".join(xxhash.xxh3_128_digest(n) for n in names)
        h = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
        steps = np.arange(HASHES, dtype=np.uint64)
        with np.errstate(over="ignore"):  # wraps around 2^64, as _positions_of does
            return ((h[:, :1] + steps * (h[:, 1:] | np.uint64(1))) % np.uint64(len(self.counters))).ravel()

    def _positions_of(self, name: str) -> list[int]:
        """_positions of one name in plain integers: a delta's few names cost less so."""
        a, b = digest(name)
        m = len(self._bytes)
        return [((a + i * b) & MASK64) % m for i in STEPS]

    def _change(self, names: Iterable[str], sign: int) -> None:
        names = list(names)
        if len(names) <= SMALL:
            c = self._bytes
            for name in names:
                for p in self._positions_of(name):
                    v = c[p]
                    if v != SATURATED and (v or sign > 0):
                        c[p] = v + sign
        else:
            at, times = np.unique(self._positions(names), return_counts=True)
            now = self.counters[at].astype(np.int64)
            self.counters[at] = np.where(now == SATURATED, SATURATED, np.clip(now + sign * times, 0, SATURATED))
        self.count += sign * len(names)

    def add(self, names: Iterable[str]) -> None:
        self._change(names, +1)

    def remove(self, names: Iterable[str]) -> None:
        self._change(names, -1)

    def __contains__(self, name: str) -> bool:
        return self.holds(digest(name))

    def holds(self, hashed: tuple[int, int], at: dict[int, list[int]] | None = None) -> bool:
        """Whether the name whose `digest` is `hashed` looks present. A name asked of many filters
        is hashed once, its positions worked out once per size (`at`: size -> positions, filled
        here), and one absent stops at its first empty counter."""
        c, m = self._bytes, len(self._bytes)
        where = at.get(m) if at is not None else None
        if where is None:
            a, b = hashed
            where = [((a + i * b) & MASK64) % m for i in STEPS]
            if at is not None:
                at[m] = where
        for p in where:
            if not c[p]:
                return False
        return True

    def found(self, names: Iterable[str]) -> int:
        """How many of `names` it would say are present."""
        names = list(names)
        if not names:
            return 0
        return int(self.counters[self._positions(names)].reshape(-1, HASHES).all(axis=1).sum())

    @property
    def nbytes(self) -> int:
        return self.counters.nbytes
