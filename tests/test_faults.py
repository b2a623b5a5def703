"""The fault harness, short and bounded, on the live cluster: every read right or named,
none failed (replicas=2), caches never past capacity, while nodes are hurt on purpose."""
from conftest import data_overrides, load_job


def test_fault_harness_short_run(live_cluster, overrides):
    result = load_job("faults").main(overrides + data_overrides() + [
        "faults.duration_s=30", "faults.every_s=1", "faults.seed=3", "faults.readers_per_node=2"])
    assert result["reads"] >= 500, result
    assert result["wrong"] == 0 and result["failed"] == 0, result["errors"]
    assert result["polls"] > 10 and result["polls_over_capacity"] == 0
    assert 0 < max(result["peak_fill_of_capacity"].values()) <= 1  # filled, never past its capacity
    assert result["kills"] >= 2 and result["writes"] + result["reingests"] >= 1, result["log"]
    assert result["passed"]
