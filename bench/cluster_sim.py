"""The nodes' cache gossip at sizes no machine here runs as processes (issue 47): fasterfs.node.cluster_sim's
real PeerTiers over a simulated network, each cache holding bench.sim_entries names and changing
bench.sim_churn times a second (a fill evicting the oldest entry), for bench.sim_seconds simulated
seconds after every node has told its peers once; also with no change at all (no reads).

Today's design (each change told as a delta) at every size of bench.sim_nodes; the design before
(every change told as the whole set) at the sizes up to bench.sim_whole_max_nodes beside it. Per
node per second: messages and bytes sent, CPU seconds in the PeerTier (sending, and hearing on
bench.sim_observers nodes that keep what they hear: memory bounds how many can), and the bytes a
node keeps of its peers' names. Then invalidation: every node's kernel seeing bench.sim_writes
writes a second (a tenth of them of keys another node caches), told to every peer as before and to
the nodes whose caches may hold each key (WriteRouter) now: messages, bytes, writes each node
applies and of them needlessly (a filter's false positives), CPU routing and applying. Then the
namespace's pushes: batches of 1,000 one-chunk files published by a real store and pushed to every
node (the head's bytes and CPU per batch, pickled once as the Registry does and once per node as
before; a node's CPU applying one). Then repair after node 0's loss, with bench.sim_repair_chunks
chunks of 4 MiB in files of 16, 2 copies: the real planner's and target assignment's CPU, and the
seconds to move the bytes at repair.mb_per_s a node (modelled: the bytes each node reads and
writes, counted) for one leader rebuilding everything and for every target rebuilding its share.

    python bench/cluster_sim.py [bench.sim_nodes=[16,32,64,128]] [bench.sim_entries=100000]

Writes cluster_sim.json to <output_dir>/bench-cluster-sim-<time>/ and prints a table.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fasterfs.control import report
from fasterfs.core import config
from fasterfs.node.cluster_sim import measure
from fasterfs.node.cluster_sim_invalidation import measure_invalidation
from fasterfs.node.cluster_sim_pushes import measure_pushes
from fasterfs.node.cluster_sim_repair import measure_repair

TARGET_BYTES_S = 100_000  # background traffic per node with no reads (issue 47)


def main(argv: list[str]) -> dict:
    b = config.load(argv).bench
    entries, churn, seconds, observers = (int(b.sim_entries), int(b.sim_churn), int(b.sim_seconds),
                                          int(b.sim_observers))
    rows = []
    for nodes in [int(n) for n in b.sim_nodes]:
        designs = [True] + ([False] if nodes <= int(b.sim_whole_max_nodes) else [])
        for deltas in designs:
            for rate in (0, churn):
                row = measure(nodes, entries, rate, seconds, deltas, observers)
                rows.append(row)
                print(json.dumps(row), flush=True)
    targets = {}
    for r in rows:
        if r["deltas"] and r["churn_per_node_s"] == 0:
            ok = r["bytes_per_node_s"] <= TARGET_BYTES_S
            targets[f"{r['nodes']} nodes, {entries:,} entries each, no reads: "
                    f"{r['bytes_per_node_s']:,.0f} B/s per node <= {TARGET_BYTES_S:,}"] = ok
    writes = int(b.sim_writes)
    invalidation = [measure_invalidation(nodes, writes, seconds, targeted=targeted)
                    for nodes in [int(n) for n in b.sim_nodes] for targeted in (False, True)]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        pushes = [measure_pushes(nodes, 1000, int(b.sim_batches), observers, Path(work) / f"{nodes}-{once}", once)
                  for nodes in [int(n) for n in b.sim_nodes] for once in (True, False)]
    cfg = config.load(argv)
    repairs = []
    for nodes in [int(n) for n in b.sim_nodes]:
        repairs.append(measure_repair(nodes, int(b.sim_repair_chunks), mb_per_s=float(cfg.repair.mb_per_s),
                                      load_slack=float(cfg.placement.load_slack)))
        print(json.dumps(repairs[-1]), flush=True)
    result = {"rows": rows, "invalidation": invalidation, "pushes": pushes, "repairs": repairs, "targets": targets}
    out = report.write_json(report.run_dir(cfg, "bench-cluster-sim"), "cluster_sim.json", result)
    print(f"{'nodes':>5} {'design':>6} {'changes/s':>9} {'msgs/s':>7} {'bytes/s':>12} {'CPU s/s':>8} "
          f"{'index MB':>9} {'false +':>7} consistent")
    for r in rows:
        print(f"{r['nodes']:>5} {'deltas' if r['deltas'] else 'whole':>6} {r['churn_per_node_s']:>9} "
              f"{r['messages_per_node_s']:>7.1f} {r['bytes_per_node_s']:>12,.0f} {r['cpu_s_per_node_s']:>8.4f} "
              f"{r['index_bytes_per_node'] / 1e6:>9.1f} {r['false_positives']:>7.2%} {r['consistent']}")
    print(f"\ninvalidation, {writes} writes a second at each node, "
          f"{invalidation[0]['cached_share']:.0%} of keys another node caches:")
    print(f"{'nodes':>5} {'told':>9} {'msgs/s':>7} {'bytes/s':>12} {'applied/s':>10} {'needless/s':>10} {'CPU s/s':>8}")
    for r in invalidation:
        print(f"{r['nodes']:>5} {'holders' if r['targeted'] else 'everyone':>9} {r['messages_per_node_s']:>7.1f} "
              f"{r['bytes_per_node_s']:>12,.0f} {r['applied_per_node_s']:>10,.0f} "
              f"{r['needless_per_node_s']:>10,.1f} {r['cpu_s_per_node_s']:>8.4f}")
    print("\nthe namespace's pushes, a batch of 1,000 files:")
    print(f"{'nodes':>5} {'pickled':>8} {'KB/node':>8} {'head MB':>8} {'head CPU s':>10} {'apply CPU s':>11}")
    for r in pushes:
        print(f"{r['nodes']:>5} {'once' if r['pickled_once'] else 'per node':>8} "
              f"{r['bytes_per_node_per_batch'] / 1e3:>8.0f} {r['head_bytes_per_batch'] / 1e6:>8.1f} "
              f"{r['head_cpu_s_per_batch']:>10.3f} {r['apply_cpu_s_per_batch']:>11.4f}")
    print(f"\nrepair after node 0's loss, {int(b.sim_repair_chunks):,} chunks, moving at {cfg.repair.mb_per_s} MB/s "
          "a node (modelled):")
    print(f"{'nodes':>5} {'rebuilt GB':>10} {'plan s':>7} {'plan all s':>10} {'believed s':>10} {'same':>5} "
          f"{'assign s':>8} {'writers':>7} {'leader s':>9} {'spread s':>9} {'believed s':>10}")
    for r in repairs:
        print(f"{r['nodes']:>5} {r['bytes_rebuilt'] / 1e9:>10.1f} {r['plan_cpu_s']:>7.1f} "
              f"{r['plan_every_home_cpu_s']:>10.1f} {r['plan_believed_cpu_s']:>10.2f} {r['believed_same_plan']!s:>5} "
              f"{r['assign_cpu_s']:>8.2f} {r['writers']:>7} "
              f"{r['leader_total_s']:>9.0f} {r['spread_total_s']:>9.0f} {r['believed_total_s']:>10.0f}")
    print(json.dumps(targets, indent=1))
    print(f"report: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
