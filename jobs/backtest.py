"""A backtest the way researchers run one: a parameter sweep that replays the same time
windows of the order book again and again — with FasterFS's cache on the read path, and
side by side in the same run without it (every replay from MinIO).

Each window is one Ray task, pinned to the node holding most of the window's bytes; it
replays the window once per parameter set: read_between (only the chunks the window
spans), then a moving-average crossover on the mid price. The strategy code never
mentions the cache: after the first two replays the kernel has seen each chunk twice,
the nodes have cached them, and later replays read local files. Both modes must produce
the same P&L for every (window, parameters), or the job fails.

    python jobs/backtest.py [overrides]        e.g. backtest.windows=8 backtest.window_min=20
    ray job submit --address http://127.0.0.2:8265 --working-dir . -- python jobs/backtest.py

Writes backtest.json and backtest.png to <output_dir>/backtest-<time>/.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter

import numpy as np
import ray

import fasterfs
from fasterfs.control import report
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError
from fasterfs.ops import cluster, job

MODES = {"MinIO direct": False, "FasterFS": True}  # mode -> cache on the read path


def crossover_pnl(frame, fast: int, slow: int) -> float:
    """P&L in USD of holding +1/-1 share while the fast moving average of the mid price is
    above/below the slow one, flat when they are equal or not both there yet (averages over
    events). In LOBSTER's integer prices, so equal averages compare equal."""
    mid2 = (frame["AskPrice1"] + frame["BidPrice1"]).to_numpy()  # 2 x mid, USD x 10000
    if len(mid2) <= slow:
        return 0.0
    csum = np.concatenate([[0], np.cumsum(mid2)])
    fast_sum, slow_sum = csum[fast:] - csum[:-fast], csum[slow:] - csum[:-slow]
    position = np.sign(fast_sum[slow - fast:] * slow - slow_sum * fast)  # both averages end at the same event
    return float(np.sum(position[:-1] * np.diff(mid2[slow - 1:]))) / 20000


@ray.remote(num_cpus=1)
def replay(root: str, overrides: list[str], use_cache: bool, window: tuple[float, float],
           params: list[list[int]]) -> dict:
    client = fasterfs.connect(root, overrides, use_cache=use_cache)
    seconds, pnl, rows = [], [], 0
    for fast, slow in params:
        t = time.perf_counter()
        frame = client.read_between(*window)
        pnl.append(crossover_pnl(frame, fast, slow))
        seconds.append(time.perf_counter() - t)
        rows = frame.height
    return {"window": list(window), "seconds": seconds, "pnl": pnl, "rows": rows,
            "chunks": len(client.chunks_between(*window)), "ran_on": ray.get_runtime_context().get_node_id()}


def plan_windows(manifest, windows: int, minutes: float) -> list[tuple[float, float]]:
    """`windows` windows of `minutes`, spread evenly over the dataset's time range."""
    t0, t1 = manifest.chunks[0].first_time, manifest.chunks[-1].last_time
    width = minutes * 60
    if windows < 1 or width <= 0:
        raise FasterFSError("options backtest.windows and backtest.window_min must be > 0")
    if width > t1 - t0:
        raise FasterFSError(f"option backtest.window_min={minutes}: longer than dataset {manifest.dataset} "
                            f"({(t1 - t0) / 60:.0f} min)")
    step = (t1 - t0 - width) / max(windows - 1, 1)
    return [(t0 + k * step, t0 + k * step + width) for k in range(windows)]


def home_node(client, window) -> int:
    """The node holding most of the window's bytes: its task reads most chunks locally."""
    weight = Counter()
    for i in client.chunks_between(*window):
        weight[client.sources(i)[0]] += client.manifest.chunk(i).bytes
    return weight.most_common(1)[0][0]


def chart(result: dict, path) -> None:
    fig, ax = report.figure(figsize=(8, 4))
    replays = range(1, len(result["params"]) + 1)
    width = 0.4
    for k, (mode, color) in enumerate(zip(MODES, ("#888", "#06c"))):
        ax.bar([r + (k - 0.5) * width for r in replays], [s * 1e3 for s in result["modes"][mode]["replay_p50_s"]],
               width, color=color, label=mode)
    ax.set_xlabel("replay of each window (one per parameter set)")
    ax.set_ylabel("read + strategy, p50 over windows (ms)")
    ax.set_xticks(list(replays))
    ax.legend()
    fig.suptitle(f"Backtest: {len(result['windows'])} windows of {result['window_min']} min, "
                 f"{len(result['params'])} parameter sets (measured in one run)")
    report.save_figure(fig, path)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    client = fasterfs.connect(overrides=argv)
    state = client.state
    params = [list(p) for p in cfg.backtest.params]
    if not params or any(len(p) != 2 or not 0 < p[0] < p[1] for p in params):
        raise FasterFSError(f"option backtest.params={params}: give [fast, slow] pairs with 0 < fast < slow")
    windows = plan_windows(client.manifest, cfg.backtest.windows, cfg.backtest.window_min)
    homes = [home_node(client, w) for w in windows]
    cluster.connect_ray(state)
    actors = cluster.storage_nodes(state)

    def sweep(use_cache: bool, params: list) -> list[dict]:
        return ray.get([replay.options(**cluster.on_node(state.nodes[h], f"backtest.replay[window {i}")).remote(
            state.root, list(argv), use_cache, w, params) for i, (w, h) in enumerate(zip(windows, homes))])
    sweep(False, [])  # start the workers (imports, connections) before either mode is timed
    modes = {}
    for mode, use_cache in MODES.items():
        ray.get([a.cache_clear.remote() for a in actors])  # cold caches, every key cold in the kernel
        before = ray.get([a.cache_status.remote() for a in actors])
        t = time.perf_counter()
        runs = sweep(use_cache, params)
        wall = time.perf_counter() - t
        after = ray.get([a.cache_status.remote() for a in actors])
        modes[mode] = {"wall_s": wall, "runs": runs,
                       "replay_p50_s": [statistics.median(r["seconds"][k] for r in runs) for k in range(len(params))],
                       "cache_hits": sum(a["readers"]["hits"] - b["readers"]["hits"] for a, b in zip(after, before)),
                       "on_home_nodes": all(r["ran_on"] == state.nodes[h].ray_node_id for r, h in zip(runs, homes))}
    direct, cached = modes["MinIO direct"], modes["FasterFS"]
    same = [a["pnl"] == b["pnl"] for a, b in zip(direct["runs"], cached["runs"])]
    if not all(same):
        raise FasterFSError(f"P&L differs between the modes in window {same.index(False)}: the cache served other data")
    later = slice(2, None)  # after two reads of every chunk the kernel has made it hot
    result = {"dataset": client.manifest.dataset, "format": client.manifest.format,
              "window_min": cfg.backtest.window_min, "windows": windows, "params": params, "modes": modes,
              "speedup_wall": direct["wall_s"] / cached["wall_s"],
              "speedup_later_replays": (statistics.median(direct["replay_p50_s"][later]) /
                                        statistics.median(cached["replay_p50_s"][later])) if len(params) > 2 else None}
    result["headline"] = {"sweep wall time, cache vs none": f"{cached['wall_s']:.2f} s vs {direct['wall_s']:.2f} s "
                                                            f"({result['speedup_wall']:.2f}x)",
                          "P&L identical": "yes"}
    if result["speedup_later_replays"]:
        result["headline"]["replays 3+ (hot)"] = f"{result['speedup_later_replays']:.2f}x faster"
    result["figures"] = {"sweep with cache (s)": cached["wall_s"], "sweep without (s)": direct["wall_s"],
                         "speedup (x)": result["speedup_wall"]}
    out = report.run_dir(cfg, "backtest")
    report.write_json(out, "backtest.json", result)
    chart(result, out / "backtest.png")
    print(f"Backtest of {client.manifest.dataset} ({client.manifest.format}): {len(windows)} windows of "
          f"{cfg.backtest.window_min} min x {len(params)} parameter sets, "
          "tasks on the nodes holding most of each window")
    for mode, m in modes.items():
        print(f"  {mode:13s} wall {m['wall_s']:.2f} s; p50 per replay (ms): "
              + " ".join(f"{s * 1e3:.1f}" for s in m["replay_p50_s"]) + f"; cache hits {m['cache_hits']}")
    print(f"  cache on the read path: sweep {result['speedup_wall']:.2f}x faster"
          + (f", replays 3+ {result['speedup_later_replays']:.2f}x" if result["speedup_later_replays"] else "")
          + "; P&L identical in every window and parameter set")
    print(f"report: {out / 'backtest.json'}, chart: {out / 'backtest.png'}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "backtest")
