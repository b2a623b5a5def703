"""The fault harness, short and bounded, on the live cluster: every read right or named,
none failed (replicas=2), caches never past capacity, while nodes are hurt on purpose."""
from conftest import data_overrides, load_job


def test_fault_harness_short_run(live_cluster, overrides):
    result = load_job("faults").main(overrides + data_overrides() + [
        "faults.duration_s=30", "faults.every_s=1", "faults.seed=2", "faults.readers_per_node=2"])
    assert result["reads"] >= 500, result
    assert result["wrong"] == 0 and result["stale"] == 0 and result["failed"] == 0, result["errors"]
    assert result["polls"] > 10 and result["polls_over_capacity"] == 0
    assert 0 < max(result["peak_fill_of_capacity"].values()) <= 1  # filled, never past its capacity
    assert result["kills"] >= 2 and result["writes"] + result["reingests"] >= 1, result["log"]
    # every reader that died is one the harness killed (kill_reader, as its log says), and no other
    assert result["readers_lost"] == 0, result["errors"]
    assert result["readers_killed"] == sum(" kill_reader on node " in f" {line} " for line in result["log"])
    assert result["passed"]


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
