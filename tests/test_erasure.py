"""Reed-Solomon shards (fasterfs.erasure): any `data` of `data + parity` shards rebuild a chunk,
and the options of an erasure-coded write are checked before anything is stored. Reads of an
erasure-coded layout across hosts, degraded and with a bad shard, are tested on the lab."""
import itertools
import os

import pytest

from fasterfs import erasure
from fasterfs.errors import FasterFSError

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


@pytest.mark.parametrize("data,parity", [(1, 1), (2, 1), (4, 2), (8, 4)])
def test_any_data_shards_rebuild_the_chunk(data, parity):
    for size in (0, 1, 4 * 2**20 + 7):
        chunk = os.urandom(size)
        shards = erasure.encode(chunk, data, parity)
        assert len(shards) == data + parity
        assert b"".join(s[80:] for s in shards[:data])[:size] == chunk  # systematic: the data shards are the bytes
        for keep in itertools.islice(itertools.combinations(range(data + parity), data), 20):
            assert erasure.decode({i: shards[i] for i in keep}, data, parity, "chunk") == chunk


def test_too_few_shards_named():
    shards = erasure.encode(b"x" * 1000, 4, 2)
    with pytest.raises(FasterFSError, match="chunk 7: only 3 of its 6 shards are readable, 4 are needed"):
        erasure.decode({0: shards[0], 1: shards[1], 5: shards[5]}, 4, 2, "chunk 7")


def test_a_shard_of_another_chunk_fails_its_checksum():
    a, b = erasure.encode(os.urandom(5000), 2, 1), erasure.encode(os.urandom(5000), 2, 1)
    assert erasure.checksum(a[0]) != erasure.checksum(b[0])


def test_layout_options_checked():
    with pytest.raises(FasterFSError, match=r"ec.data=4 \+ ec.parity=2: .* the data goes on 4"):
        erasure.check_layout(4, 2, 4)
    with pytest.raises(FasterFSError, match="ec.parity=0: .* needs >= 1 parity"):
        erasure.check_layout(2, 0, 4)
    with pytest.raises(FasterFSError, match="ec.data=0"):
        erasure.check_layout(0, 1, 4)
    erasure.check_layout(4, 2, 6)
