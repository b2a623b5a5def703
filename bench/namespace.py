"""Readers of a whole dataset, measured side by side in one run (on `fasterfs up`); fio and
`find`+`cat` through the mount and its peers are bench/mount_io.py's:

1. pandas.read_csv of the whole dataset through the mount and through fasterfs://, hot,
   against the same bytes as a local file.
2. Ray Data: rows/s reading the dataset with the node-1 readers only vs all nodes, and the
   share of rows read on the node holding them.

    python bench/namespace.py [overrides]

Writes namespace.json to <output_dir>/bench-namespace-<time>/.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fasterfs
from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.ops import cluster


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)
    work = Path(tempfile.mkdtemp(prefix="ffs-bench-", dir="/var/tmp"))
    point = work / "mnt"
    point.mkdir()
    result: dict = {"nodes": len(state.nodes), "targets": {}}
    try:
        ray.get(actors[0].mount.remote(str(point)))
        # pandas over the whole dataset, hot
        import pandas as pd

        data = fasterfs.connect(overrides=argv)
        ds = data.manifest
        csv_local = work / f"{ds.name}.csv"
        csv_local.write_bytes(b"".join(data.read_chunk(i) for i in range(len(ds))))
        ray.get([a.cache_warm.remote([c.key for c in ds.chunks if c.nodes[0] == k]) for k, a in enumerate(actors)])
        report.wait_for_fills(actors, len(ds), timeout=120)

        def best_of(fn, n=3):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                frame = fn()
                times.append(time.perf_counter() - t)
            assert len(frame) == ds.rows
            return min(times)
        pandas = {"local file": best_of(lambda: pd.read_csv(csv_local, header=None)),
                  "mount": best_of(lambda: pd.read_csv(point / ds.name / f"{ds.name}.csv", header=None)),
                  "fasterfs://": best_of(lambda: pd.read_csv(f"fasterfs://{ds.name}/{ds.name}.csv", header=None,
                                                             storage_options={"overrides": list(argv)}))}
        result["pandas_s"] = pandas
        result["targets"]["pandas through the mount, hot <= 1.2x local"] = pandas["mount"] <= 1.2 * pandas["local file"]
        result["targets"]["pandas through fasterfs://, hot <= 1.2x local"] = \
            pandas["fasterfs://"] <= 1.2 * pandas["local file"]

        # Ray Data: node 0's readers alone, then every node's
        rows = {}
        for label, nodes in (("1 node", [state.nodes[0].index]), (f"{len(state.nodes)} nodes", None)):
            fasterfs.data.read(ds.name, argv, nodes=nodes).count()  # workers started, caches as they are
            t = time.perf_counter()
            frame = fasterfs.data.read(ds.name, argv, nodes=nodes, with_node=True).to_pandas()
            wall = time.perf_counter() - t
            rows[label] = {"rows": len(frame), "rows_per_s": len(frame) / wall,
                           "share_on_holder": float((frame["_read_on"] == frame["_holder"]).mean())}
        result["ray_data"] = rows
    finally:
        try:
            ray.get(actors[0].umount.remote(str(point)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out = report.run_dir(cfg, "bench-namespace")
    report.write_json(out, "namespace.json", result)
    print(json.dumps(result, indent=1))
    print(f"report: {out / 'namespace.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
