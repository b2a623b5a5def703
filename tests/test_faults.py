"""The fault harness's judge of reads: right, stale or wrong against the history of writes. (The
harness itself runs on the lab: test_lab_faults.py.)"""
import pytest
from conftest import load_job

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO


def test_write_history_tells_right_stale_and_wrong_reads():
    history = load_job("faults").WriteHistory()
    history.versions["k"] = [(1, float("-inf"), 10.0)]
    history.add("k", 2, 20.0, 20.5)  # other bytes written from 20.0 to 20.5
    history.add("k", 1, 21.0, 21.5)  # the original back
    assert history.check("k", 1, 5, 6) is None
    assert history.check("k", 1, 20.2, 20.3) is None       # during the write: old or new is right
    assert history.check("k", 2, 20.2, 20.3) is None
    assert history.check("k", 1, 20.6, 20.7).startswith("stale: k: a version replaced 100.0 ms")
    assert history.check("k", 2, 21.2, 21.3) is None       # during the write back
    assert history.check("k", 2, 21.6, 21.7).startswith("stale")
    assert history.check("k", 3, 1, 2).startswith("wrong")
    assert history.check("missing", 1, 1, 2).startswith("wrong")
