"""Reed-Solomon shards (fasterfs.core.erasure): any `data` of `data + parity` shards rebuild a chunk,
and the options of an erasure-coded write are checked before anything is stored. Reads of an
erasure-coded layout across hosts, degraded and with a bad shard, are tested on the lab."""
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import xxhash

from fasterfs.core import erasure
from fasterfs.core.errors import FasterFSError
from fasterfs.core.manifest import ChunkInfo

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


@pytest.mark.parametrize("data,parity", [(1, 1), (2, 1), (4, 2), (8, 4)])
def test_any_data_shards_rebuild_the_chunk(data, parity):
    for size in (0, 1, 4 * 2**20 + 7):
        chunk = os.urandom(size)
        shards = erasure.encode(chunk, data, parity)
        assert len(shards) == data + parity
        assert b"".join(s[80:] for s in shards[:data])[:size] == chunk  # systematic: the data shards are the bytes
        for keep in itertools.combinations(range(data + parity), data):  # every one (495 for 8+4)
            assert erasure.decode({i: shards[i] for i in keep}, data, parity, "chunk") == chunk, keep


def test_too_few_shards_named():
    shards = erasure.encode(b"x" * 1000, 4, 2)
    with pytest.raises(FasterFSError, match="chunk 7: only 3 of its 6 shards are readable, 4 are needed"):
        erasure.decode({0: shards[0], 1: shards[1], 5: shards[5]}, 4, 2, "chunk 7")


def _chunk(body: bytes, shards: list[bytes], nodes: list[int]) -> ChunkInfo:
    """The manifest's record of a chunk, its checksums taken with the standard xxh3 of the bytes."""
    return ChunkInfo(0, "k", nodes, len(body), 0, 0, 0.0, 0.0, xxhash.xxh3_64_intdigest(body),
                     [xxhash.xxh3_64_intdigest(s) for s in shards])


def test_a_foreign_shard_is_read_around_and_named():
    body, other = os.urandom(50_000), os.urandom(50_000)
    shards, foreign = erasure.encode(body, 2, 1), erasure.encode(other, 2, 1)
    served = {0: shards[0], 1: foreign[1], 2: shards[2]}  # slot 1 holds another chunk's shard
    with ThreadPoolExecutor(3) as pool:
        out, degraded, why = erasure.gather(_chunk(body, shards, [0, 1, 2]), 2, 1, served.__getitem__, pool)
    assert out == body and degraded
    assert why == ["shard 1 on node 1 does not match its checksum"]


def test_a_shard_that_fools_its_checksum_is_caught_by_the_chunks():
    """A shard whose recorded checksum is wrong too (a manifest of another chunk's shards) reaches
    decode; what decode makes of it fails the chunk's own checksum and is refused."""
    body, other = os.urandom(50_000), os.urandom(50_000)
    shards, foreign = erasure.encode(body, 2, 1), erasure.encode(other, 2, 1)
    record = _chunk(body, [shards[0], foreign[1], shards[2]], [0, 1, 2])
    served = {0: shards[0], 1: foreign[1], 2: shards[2]}
    with ThreadPoolExecutor(3) as pool, pytest.raises(FasterFSError, match=r"rebuilt from shards \[0, 1\] it does "
                                                                           "not match its checksum"):
        erasure.gather(record, 2, 1, served.__getitem__, pool)


def test_silent_shards_are_hedged_around_but_never_to_a_hung_host():
    """Shards 0 (hung) and 1 (slow) silent past the hedge budget: as many parity shards are asked
    instead, but not those on hosts already hedged around (`late`: 2 and 3), whose requests would
    hang too and hold the pool's threads; shard 4 and the slow shard 1 make the chunk."""
    import threading
    import time
    body = os.urandom(60_000)
    shards = erasure.encode(body, 2, 3)
    release, asked = threading.Event(), []

    def fetch(slot: int) -> bytes:
        asked.append(slot)
        if slot == 1:
            time.sleep(0.3)
        elif slot != 4:
            release.wait(5)
        return shards[slot]
    with ThreadPoolExecutor(5) as pool:
        try:
            out, degraded, _ = erasure.gather(_chunk(body, shards, [0, 1, 2, 3, 4]), 2, 3, fetch, pool,
                                              late=lambda s: s in (2, 3), hedge_s=0.05)
        finally:
            release.set()
    assert out == body and degraded and sorted(asked) == [0, 1, 4]


def test_layout_options_checked():
    with pytest.raises(FasterFSError, match=r"ec.data=4 \+ ec.parity=2: .* the data goes on 4"):
        erasure.check_layout(4, 2, 4)
    with pytest.raises(FasterFSError, match="ec.parity=0: .* needs >= 1 parity"):
        erasure.check_layout(2, 0, 4)
    with pytest.raises(FasterFSError, match="ec.data=0"):
        erasure.check_layout(0, 1, 4)
    erasure.check_layout(4, 2, 6)
