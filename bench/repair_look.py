"""What the repair leader's look after a change of the nodes (one down, one back) costs, on a
running cluster at whatever size its namespace has, side by side in one run: the look as it
was (every node's bucket walked, paced at minio.list_share as the StorageNodes walk them) and
as it is (the nodes listed before believed: only asked whether they answer), both planned by
the real `repair_survey.survey` over the same manifests, which are fetched once first (a StorageNode
holds its own copy, caught up by deltas). Both must find the same redundancy here, nothing
having been lost behind MinIO's back.

    python bench/repair_look.py [cluster.root=...] [minio.list_share=0.25]

Writes repair_look.json to <output_dir>/bench-repair-look-<time>/ and prints one line per look.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import ray

from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.node import repair_survey
from fasterfs.ops import cluster


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    creds = registry.fetch_credentials(state.name, "admin")
    share = float(cfg.minio.list_share)
    began = time.monotonic()
    manifests = registry.fetch_manifests(state.name)[1]
    result: dict = {"names": len(manifests), "nodes": len(state.nodes), "list_share": share,
                    "manifests_fetch_s": time.monotonic() - began, "looks": {}}
    print(f"{len(manifests):,} names fetched in {result['manifests_fetch_s']:.1f} s", flush=True)
    everyone = frozenset(n.index for n in state.nodes)
    for name, trusted in (("every bucket walked", frozenset()), ("nodes listed before believed", everyone)):
        began = time.monotonic()
        health = repair_survey.survey(state, creds, cfg.placement.load_slack, lambda: manifests, share, trusted)
        row = {"seconds": time.monotonic() - began, "chunks": health.chunks, "degraded": health.degraded_count,
               "lost": health.lost_count, "nodes_down": health.nodes_down}
        result["looks"][name] = row
        print(f"{name}: {row['seconds']:.1f} s, {health.summary()}", flush=True)
    walked, believed = result["looks"].values()
    result["same_finding"] = all(walked[k] == believed[k] for k in ("chunks", "degraded", "lost", "nodes_down"))
    result["walked_vs_believed_x"] = walked["seconds"] / believed["seconds"]
    out = report.write_json(report.run_dir(cfg, "bench-repair-look"), "repair_look.json", result)
    print(f"the look believing the nodes: {result['walked_vs_believed_x']:.1f}x faster; same finding: "
          f"{result['same_finding']}; {out}")
    ray.shutdown()
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
