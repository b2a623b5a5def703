"""The fault harness's judge of reads (right, stale or wrong against the history of writes) and
its reconciliation of the readers it lost with the kills it made. (The harness itself runs on
the lab: test_lab_faults.py.)"""
import os
import signal
import time

import pytest
from conftest import load_job, wait_until

from fasterfs.core import config


@pytest.mark.unit  # no root, no Ray, no MinIO
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


def test_a_reader_dying_unkilled_is_lost_and_fails_the_run(live_cluster, overrides, ingest_as, monkeypatch):
    """Three readers on node 0: one killed by the harness (kill_reader), one SIGKILLed from
    outside it, as a crash would end it. The first is reconciled with its kill; the second is
    lost, named by its pid, and the run does not pass; the replacement and the third reader's
    reads are all checked and right."""
    faults = load_job("faults")
    argv = overrides + ["faults.readers_per_node=1"]
    monkeypatch.setattr(faults, "ingest", lambda cfg: ingest_as("csv", reuse=True))  # the session's dataset
    harness = faults.Harness(config.load(argv), argv)
    node = live_cluster.nodes[0]
    harness.start_readers([node] * 3, seconds=20)  # alive past the kills on a loaded machine (6 s was not)
    harness.deadline = time.monotonic() + 6  # what act() gives a replacement reader
    (crashed, _, _), _, (killed, _, _) = harness.readers[node.index]
    harness.act("kill_reader", node)  # the last reader started: its pid recorded as the harness's kill
    os.kill(crashed, signal.SIGKILL)
    assert wait_until(lambda: not os.path.exists(f"/proc/{crashed}"), timeout=10, what="the crashed reader gone")
    harness.stop_readers()  # the kills are made: the others' reads so far are what is checked
    got = harness.collect()
    assert (got["readers_killed"], got["readers_lost"]) == (1, 1), got["errors"]
    lost = [e for e in got["errors"] if e.startswith("lost:")]
    assert len(lost) == 1 and lost[0].startswith(f"lost: reader pid {crashed} on node {node.index} died unkilled")
    assert got["reads"] > 0 and (got["wrong"], got["stale"], got["failed"]) == (0, 0, 0), got["errors"]
    assert not faults.passed({**got, "polls_over_capacity": 0, "not_back": 0})
    assert faults.passed({**got, "readers_lost": 0, "polls_over_capacity": 0, "not_back": 0})
    assert harness.killed_readers == {killed}
