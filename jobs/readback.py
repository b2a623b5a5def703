"""Read-back summary: every node reads the chunks it holds, in a Ray task pinned to that
node, checks each against the manifest's checksum, and reports what it read.

    python jobs/readback.py [overrides]
    ray job submit --address http://127.0.0.2:8265 --working-dir . -- python jobs/readback.py
"""
from __future__ import annotations

import time

import ray
from rich.table import Table

import fasterfs
from fasterfs.control import report
from fasterfs.core import config
from fasterfs.ops import cluster, job


@ray.remote(num_cpus=1)
def read_partition(root: str, node_index: int) -> dict:
    client = fasterfs.connect(root)
    mine = [c.id for c in client.manifest.on_node(node_index)]
    start = time.perf_counter()
    size = sum(len(client.read_chunk(i)) for i in mine)  # read_chunk verifies each checksum
    seconds = time.perf_counter() - start
    return {"node": node_index, "ran_on": ray.get_runtime_context().get_node_id(), "local_node": client.local_node,
            "chunks": len(mine), "bytes": size, "seconds": seconds}


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    client = fasterfs.connect(overrides=argv)
    state, manifest = client.state, client.manifest
    cluster.connect_ray(state)
    results = ray.get([read_partition.options(**cluster.on_node(n, "readback.read")).remote(state.root, n.index)
                       for n in state.nodes])
    table = Table(title=f"Read-back of {manifest.dataset} ({len(manifest)} {manifest.format} chunks)")
    for col in ("node", "ran on its node", "chunks", "MB", "MB/s"):
        table.add_column(col)
    for r, node in zip(results, state.nodes):
        r["on_own_node"] = r["ran_on"] == node.ray_node_id
        r["mb_s"] = r["bytes"] / 1e6 / max(r["seconds"], 1e-9)
        table.add_row(str(r["node"]), "yes" if r["on_own_node"] else "NO", str(r["chunks"]), f"{r['bytes'] / 1e6:.1f}",
                      f"{r['mb_s']:.0f}")
    report.console().print(table)
    result = {"dataset": manifest.dataset, "chunks": len(manifest), "nodes": results,
              "all_read": sum(r["chunks"] for r in results) == len(manifest) * manifest.replicas}
    result["headline"] = {"chunks read back and checked": sum(r["chunks"] for r in results),
                          "MB/s per node": ", ".join(f"{r['mb_s']:.0f}" for r in results)}
    result["figures"] = {"MB/s, all nodes": sum(r["mb_s"] for r in results)}
    out = report.write_json(report.run_dir(cfg, "readback"), "readback.json", result)
    print(f"all {len(manifest)} chunks read back and checked; report: {out}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "readback")
