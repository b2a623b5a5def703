"""CountingBloom, what a node keeps of each peer's cache, against a Python set of the same names
under the same random adds and removes (the set is the truth)."""
from __future__ import annotations

import random

import pytest

from fasterfs.node.counting_bloom import FALSE_POSITIVE, HASHES, SATURATED, CountingBloom

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


def test_no_name_held_is_ever_missed_and_strangers_are_rarely_found():
    rng = random.Random(5)
    truth: set[str] = set()
    f = CountingBloom(20_000)
    made = 0
    for _ in range(200):  # batches as deltas come: some names in, some out
        new = [f"{made + i:032x}.chunk" for i in range(rng.randrange(50, 200))]
        made += len(new)
        gone = rng.sample(sorted(truth), min(len(truth), rng.randrange(0, 120)))
        f.remove(gone)
        f.add(new)
        truth -= set(gone)
        truth |= set(new)
        assert f.count == len(truth)
    assert 10_000 < len(truth) <= 20_000 and not f.full()
    assert f.found(truth) == len(truth)  # no false negatives
    strangers = [f"stranger{i:024x}.chunk" for i in range(20_000)]
    assert f.found(strangers) / len(strangers) <= 2 * FALSE_POSITIVE
    f.remove(truth)
    assert f.count == 0 and not f.counters.any()  # every counter back to zero: nothing leaked


def test_a_saturated_counter_stays_and_a_filter_past_its_size_says_so():
    f = CountingBloom(1)
    many = [f"n{i}" for i in range(2_000)]
    f.add(many)
    assert f.full() and f.found(many) == len(many)
    f.counters[:] = SATURATED
    f.remove(many)  # a saturated counter no longer knows its count: it stays, never missing a name
    assert (f.counters == SATURATED).all()
    sized = CountingBloom.sized_for(set(many))
    assert not sized.full() and sized.found(many) == len(many)


def test_one_name_and_a_batch_land_on_the_same_counters():
    f = CountingBloom(5_000)
    names = [f"{i:032x}.chunk" for i in range(100)]
    assert f._positions(names).reshape(-1, HASHES).tolist() == [f._positions_of(n) for n in names]
