"""Chaos on the share-nothing lab: hosts lose power while a backtest sweep and a full read
of the dataset (Demo B's work) run; every read must succeed and every result must be the
same as without faults.

The dataset is ingested erasure-coded (default ec=4+2 on 6 hosts). The workload runs once
undisturbed (the reference), then again in rounds while one host is killed and later a
second — every process in its network namespace (Ray node, StorageNode, MinIO, mount) gets
SIGKILL at once, as when a machine loses power. Tasks go to the host holding most of their
data, and run elsewhere when it is gone (soft affinity; Ray retries a task whose node died).
Afterwards `repair` runs and the redundancy left is reported as found; then the hosts come
back with blank disks (chaos.back_empty; new machines in their place), are refilled by repair,
and the workload runs once more.

    fasterfs lab up --nodes 6 && python jobs/chaos.py [chaos.kill_at_s=[5,15]] ; fasterfs lab down

Writes chaos.json to <output_dir>/chaos-<time>/.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

import ray
from xxhash import xxh3_64_intdigest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backtest
from backtest import crossover_pnl, home_node, plan_windows

ray.cloudpickle.register_pickle_by_value(backtest)  # the workers have no jobs/ on their path

import fasterfs  # noqa: E402
from fasterfs.control import registry, report  # noqa: E402
from fasterfs.core import config  # noqa: E402
from fasterfs.core.errors import FasterFSError  # noqa: E402
from fasterfs.node import repair, repair_survey  # noqa: E402
from fasterfs.ops import cluster, job, lab  # noqa: E402
from fasterfs.write.ingest import ingest  # noqa: E402

READ_TRIES = 3  # a reader's own retries of a read that raised (each counted as a failed read)


def _read(what, failures: list):
    for _attempt in range(READ_TRIES):
        try:
            return what()
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}"[:300])
    raise FasterFSError(f"a read failed {READ_TRIES} times: {failures[-1]}")


@ray.remote(num_cpus=1, max_retries=3)
def replay(overrides: list[str], window: tuple[float, float], params: list[list[int]]) -> dict:
    client = fasterfs.connect(None, overrides)
    failures: list[str] = []
    pnl = [crossover_pnl(_read(lambda: client.read_between(*window), failures), f, s) for f, s in params]
    return {"pnl": pnl, "failures": failures, "degraded": client.degraded_reads, "peer": client.peer_reads,
            "ran_on": ray.get_runtime_context().get_node_id()}


@ray.remote(num_cpus=1, max_retries=3)
def read_chunks(overrides: list[str], ids: list[int]) -> dict:
    client = fasterfs.connect(None, overrides, use_cache=False)  # Demo B reads its partition from MinIO
    failures: list[str] = []
    sums = {i: xxh3_64_intdigest(_read(lambda i=i: client.read_chunk(i), failures)) for i in ids}
    return {"sums": sums, "bytes": sum(client.manifest.chunk(i).bytes for i in ids), "failures": failures,
            "degraded": client.degraded_reads}


def workload(argv, state, manifest, windows, homes, params) -> dict:
    """One backtest sweep and one full read, at once; tasks prefer their data's host."""
    def near(index: int, task: str) -> dict:
        return cluster.on_node(state.node(index), task, soft=True)
    parts: dict[int, list[int]] = {}
    for c in manifest.chunks:
        parts.setdefault(c.nodes[0], []).append(c.id)
    sweeps = [replay.options(**near(h, f"chaos.replay[window {i}")).remote(argv, w, params)
              for i, (w, h) in enumerate(zip(windows, homes))]
    reads = [read_chunks.options(**near(n, "chaos.read")).remote(argv, ids) for n, ids in parts.items()]
    sweep, full = ray.get(sweeps), ray.get(reads)
    return {"pnl": [r["pnl"] for r in sweep],
            "sums": {i: s for r in full for i, s in r["sums"].items()},
            "bytes": sum(r["bytes"] for r in full),
            "failed_reads": [f for r in sweep + full for f in r["failures"]],
            "degraded_reads": sum(r["degraded"] for r in sweep + full),
            "peer_reads": sum(r["peer"] for r in sweep)}


def _common(failures: list[str]) -> list:
    """The three most frequent reasons among repair's failures."""
    return Counter(f.split(": ", 1)[-1][:120] for f in failures).most_common(3)


def come_back(cfg, argv, state, manifest, victims, creds, reference, plan) -> dict:
    """The victims power on (blank disks when chaos.back_empty), repair refills them, and the
    workload runs once more."""
    t = time.perf_counter()
    for v in victims:
        lab.power_on(cfg, v, empty=cfg.chaos.back_empty)
    state = registry.find(cfg)  # the hosts' new Ray nodes
    started_s = time.perf_counter() - t
    refill = repair.run(cfg, state, creds)
    after = repair_survey.survey(state, creds, cfg.placement.load_slack)
    got = workload(argv, state, manifest, *plan)
    return {"start_s": started_s, "found": refill.health.summary(), "pieces_written": refill.pieces_written,
            "moved": refill.moved, "failed": len(refill.failed), "mb_per_s": refill.mb_per_s,
            "failures": _common(refill.failed),
            "after": after.summary(), "misplaced": after.misplaced,
            "full": after.degraded_count == 0 and not after.lost and not after.nodes_down,
            "pieces_on": {v: sum(v in c.nodes for c in registry.fetch_manifests(cfg.cluster.name)[1][
                manifest.name].chunks) for v in victims},
            "failed_reads": len(got["failed_reads"]), "pnl": got["pnl"], "sums": got["sums"],
            "all_same": got["pnl"] == reference["pnl"] and got["sums"] == reference["sums"]}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    c = cfg.chaos
    state = registry.find(cfg)
    if not state.lab:
        raise FasterFSError("the chaos run powers hosts off: run it on the lab (`fasterfs lab up --nodes 6`)")
    victims = [int(v) for v in c.victims]
    if len(victims) != len(c.kill_at_s) or not all(0 <= v < len(state.nodes) for v in victims):
        raise FasterFSError(f"options chaos.victims={victims} / chaos.kill_at_s={list(c.kill_at_s)}: one time per "
                            f"victim, victims among hosts 0..{len(state.nodes) - 1}")
    layout = [f"layout={c.layout}"]  # ec: its shards as ec.data and ec.parity say
    manifest = ingest(config.load(argv + layout))
    client = fasterfs.connect(None, argv)
    params = [list(p) for p in cfg.backtest.params]
    windows = plan_windows(manifest, cfg.backtest.windows, cfg.backtest.window_min)
    homes = [home_node(client, w) for w in windows]
    t = time.perf_counter()
    reference = workload(argv, state, manifest, windows, homes, params)
    reference_s = time.perf_counter() - t
    if reference["failed_reads"]:
        raise FasterFSError(f"reads failed with every host up: {reference['failed_reads'][:3]}")

    killed: list[dict] = []
    start = time.monotonic()

    def chaos():
        for victim, at in zip(victims, c.kill_at_s):
            time.sleep(max(0.0, at - (time.monotonic() - start)))
            killed.append({"host": victim, "at_s": round(time.monotonic() - start, 2),
                           "processes": lab.power_off(state, victim)})
    threading.Thread(target=chaos, daemon=True).start()
    rounds = []
    # rounds until rounds_after of them ran entirely with every victim down (bounded in count and time)
    while len(rounds) < c.max_rounds and time.monotonic() - start < c.max_s and \
            sum(r["hosts_down"] == len(victims) for r in rounds) < c.rounds_after:
        t, down = time.perf_counter(), len(killed)
        got = workload(argv, state, manifest, windows, homes, params)
        rounds.append({"seconds": time.perf_counter() - t, "hosts_down": down,  # when the round began
                       "pnl_same": got["pnl"] == reference["pnl"], "bytes_same": got["bytes"] == reference["bytes"],
                       "chunks_same": got["sums"] == reference["sums"],
                       "failed_reads": len(got["failed_reads"]), "failures": got["failed_reads"][:5],
                       "pnl": got["pnl"], "sums": got["sums"],  # what was read, for a check against the source
                       "degraded_reads": got["degraded_reads"], "peer_reads": got["peer_reads"]})
        print(f"round {len(rounds)}: began with {down} hosts down, {rounds[-1]['seconds']:.1f} s, "
              f"P&L same: {rounds[-1]['pnl_same']}, chunks same: {rounds[-1]['chunks_same']}, "
              f"failed reads {rounds[-1]['failed_reads']}, degraded reads {got['degraded_reads']}")
    creds = registry.fetch_credentials(state.name, "admin")
    fixed = repair.run(cfg, state, creds)
    after = repair_survey.survey(state, creds, cfg.placement.load_slack)
    back = come_back(cfg, argv, state, manifest, victims, creds, reference, (windows, homes, params)) \
        if c.power_on else None
    result = {"dataset": manifest.dataset, "layout": manifest.redundancy(), "hosts": len(state.nodes),
              "chunks": len(manifest), "windows": windows, "params": params,
              "reference": {"pnl": reference["pnl"], "sums": reference["sums"]},
              "reference_s": reference_s, "killed": killed, "rounds": rounds,
              "failed_reads": sum(r["failed_reads"] for r in rounds),
              "all_same": all(r["pnl_same"] and r["chunks_same"] and r["bytes_same"] for r in rounds),
              "repair": {"found": fixed.health.summary(), "repaired": fixed.repaired,
                         "pieces_written": fixed.pieces_written, "failed": len(fixed.failed),
                         "failures": _common(fixed.failed),
                         "mb_per_s": fixed.mb_per_s, "after": after.summary()},
              "back": back}
    result["figures"] = {"reference (s)": reference_s, "failed reads": result["failed_reads"],
                         **{f"round {i + 1} (s)": r["seconds"] for i, r in enumerate(rounds)}}
    out = report.run_dir(cfg, "chaos")
    report.write_json(out, "chaos.json", result)
    print(f"chaos: {len(killed)} hosts powered off at {[k['at_s'] for k in killed]} s; {len(rounds)} rounds; "
          f"failed reads {result['failed_reads']}; results same as without faults: {result['all_same']}")
    print(f"repair: found {result['repair']['found']}; repaired {fixed.repaired} chunks at {fixed.mb_per_s:.0f} MB/s; "
          f"{len(fixed.failed)} not repaired; now {result['repair']['after']}")
    if back:
        print(f"hosts {victims} back {'empty' if c.back_empty else 'with their disks'}: refilled "
              f"{back['pieces_written']} pieces ({back['moved']} moved home) at {back['mb_per_s']:.0f} MB/s; now "
              f"{back['after']}; results then same as without faults: {back['all_same']}")
    print(f"report: {out / 'chaos.json'}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "chaos")
