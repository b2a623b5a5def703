"""The backtest job on the live 2-node cluster: the same P&L with and without the cache on
the read path, replays served from the cache only in the FasterFS mode, tasks on the
nodes holding their windows; the strategy's vectorised P&L equals a plain loop's."""
from collections import Counter

import polars as pl
import pytest
import ray
from conftest import (
    first_source_rows,
    load_job,
    loop_pnl,
    minio_holdings,
    source_pnls,
    source_rows,
    submit_job,
    task_ids,
    tasks_ray_recorded,
)

from fasterfs.core import lobster
from fasterfs.core.errors import FasterFSError

SMALL = ["backtest.windows=2", "backtest.window_min=5", "backtest.params=[[2,5],[3,8],[5,13]]"]


@pytest.mark.unit
def test_crossover_pnl_equals_a_plain_loop():
    rows = first_source_rows(400)  # the source files' first rows (csv module): no cluster needed
    frame = pl.DataFrame(rows, schema=lobster.columns((len(rows[0]) - 6) // 4), orient="row")
    mid = [a + b for a, b in zip(frame["AskPrice1"], frame["BidPrice1"])]  # USD x 20000
    job = load_job("backtest")
    expected = {(f, s): loop_pnl(mid, f, s) for f, s in ((2, 5), (5, 20), (20, 100))}
    assert any(expected.values())  # positions were taken: the check is not 0 == 0
    for (fast, slow), pnl in expected.items():
        assert job.crossover_pnl(frame, fast, slow) == pytest.approx(pnl, rel=1e-12, abs=1e-12)
    assert job.crossover_pnl(frame.head(10), 5, 20) == 0.0  # too short for the slow average


@pytest.mark.parametrize("fmt, submitted", [("csv", True), ("arrow", False)])
def test_backtest_same_pnl_with_and_without_cache(ingest_as, overrides, live_cluster, fmt, submitted):
    """Submitted with `ray job submit` from a shell without the venv, or its main in this process."""
    manifest = ingest_as(fmt, reuse=True)
    run = (lambda args: submit_job(live_cluster, "backtest", args)) if submitted else load_job("backtest").main
    # the tasks of this run, as Ray lists them: its job's, or this process's since now
    here = None if submitted else [("job_id", "=", ray.get_runtime_context().get_job_id())]
    earlier = task_ids(live_cluster, here) if here else frozenset()
    result = run(overrides + SMALL)
    scope = here or [("job_id", "=", result["ray_job_id"])]
    direct, cached = result["modes"]["MinIO direct"], result["modes"]["FasterFS"]
    # the P&L each mode's tasks computed on their nodes, against a plain loop over the source
    # files' rows of each window (the csv module's parse: no FasterFS read, no job code)
    for (rows, expected), a, b in zip(source_pnls(result["windows"], result["params"]), direct["runs"],
                                      cached["runs"]):
        assert a["rows"] == b["rows"] == rows > 0
        assert a["pnl"] == b["pnl"] and any(expected)
        assert a["pnl"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert all(r["chunks"] > 0 and len(r["seconds"]) == 3 for r in cached["runs"])
    assert direct["cache_hits"] == 0  # no cache on its read path
    reads = sum(r["chunks"] for r in cached["runs"]) * 3
    assert 0 < cached["cache_hits"] <= reads  # later replays were served from the cache
    # each window's replays ran on the node whose MinIO holds most of its bytes: the chunks
    # overlapping it by the source's times, where MinIO lists them; where they ran as Ray recorded it
    rows = source_rows([])
    held = {o["Key"]: (node, o["Size"]) for node, objs in minio_holdings(live_cluster, manifest).items() for o in objs}
    for i, (start, end) in enumerate(result["windows"]):
        weight: Counter = Counter()
        for c in manifest.chunks:
            if rows[c.first_row][0] < end and rows[c.first_row + c.rows - 1][0] >= start:
                node, size = held[c.key]
                weight[node] += size
        home = weight.most_common(1)[0][0]
        ran = tasks_ray_recorded(live_cluster, [("name", "=", f"backtest.replay[window {i} @ node {home}]"), *scope],
                                 excluding=earlier)
        assert ran and {t.node_id for t in ran} == {live_cluster.node(home).ray_node_id}, (i, home, ran)


@pytest.mark.parametrize("extra, message", [
    (["backtest.params=[[5,2]]"], "backtest.params"),
    (["backtest.window_min=100000"], "backtest.window_min=100000: longer than dataset"),
    (["backtest.windows=0"], "backtest.windows"),
])
def test_bad_backtest_options_named(ingest_as, overrides, extra, message):
    ingest_as("csv", reuse=True)
    with pytest.raises(FasterFSError, match=message):
        load_job("backtest").main(overrides + extra)
