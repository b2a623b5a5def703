"""A whole bucket listed in slices, paced: how background work (the repair leader's survey, a
node's object count) lists a MinIO.

MinIO lists by walking its disk and reading every object's metadata, and a listing's walk runs
on ahead of the pages asked for (its listing cache). Listed one slice at a time (each top-level
prefix, and `files/`, where every file's objects live under a hex hash of its path, by the hash's
first digit), each walk covers only its slice, and the walker rests between slices so that
listing takes at most `share` of the time. Measured at 869,602 objects on 2 nodes
(bench/listing_cost.py): one more `put` 58 ms alone, 100 ms beside both buckets listed whole at
once (1.04 cores of MinIO), 55 ms beside them walked at share 0.25 (which takes ~4x as long).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from ..core.manifest import HASHED
from ..core.pace import Pacer

DIGITS = "0123456789abcdef"


def slices(prefixes: list[str]) -> list[str]:
    """The prefixes a bucket is listed by, from its top-level ones."""
    return [s for p in prefixes for s in ([p + d for d in DIGITS] if p == HASHED else [p])]


def walk(getter, bucket: str, share: float = 1.0,
         rest: Callable[[float], None] = time.sleep) -> Iterator[tuple[str, int]]:
    """(key, size) of every object in `bucket` (`getter`: an s3.MarkedGetter), slice by slice,
    the slices taking at most `share` of the time (pace.Pacer)."""
    pacer = Pacer(share, rest)
    prefixes, top = getter.top(bucket)
    yield from top
    for part in slices(prefixes):
        with pacer.step():
            yield from getter.list(bucket, part)


class Paced:
    """A lister (`list(bucket)`) that walks, for whoever takes one (MinioSupervisor.count)."""

    def __init__(self, getter, share: float):
        self.getter, self.share = getter, share

    def list(self, bucket: str) -> Iterator[tuple[str, int]]:
        return walk(self.getter, bucket, self.share)
