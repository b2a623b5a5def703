"""What an open FasterFS dashboard costs the cluster: milliseconds per fresh snapshot (every
StorageNode asked for its status, kernel and cache figures) and per reused one, for the
JSON API, the page and the Prometheus metrics, measured against the running cluster.

    .venv/bin/python bench/dashboard_cost.py [--rounds 8] [overrides...]

A fresh snapshot is at most one per second (the monitor reuses it in between), so the
cost of a page left open is (fresh ms) per refresh interval.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request

from fasterfs.control import auth, registry, report
from fasterfs.core import config
from fasterfs.core.errors import FasterFSError

PATHS = ("/api/snapshot", "/", "/metrics")


def fetch_ms(url: str, headers: dict) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        r.read()
    return (time.perf_counter() - t) * 1e3


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    args, overrides = ap.parse_known_args(argv)
    cfg = config.load(overrides)
    state = registry.find(cfg)
    if not state.web_url:
        raise FasterFSError(f"the cluster under {state.root} runs without its dashboard (dashboard.enabled=false)")
    result = {"nodes": len(state.nodes), "rounds": args.rounds, "refresh_s": cfg.dashboard.refresh_s, "paths": {}}
    for path in PATHS:
        fresh, reused = [], []
        for _ in range(args.rounds):
            time.sleep(1.05)  # past the monitor's reuse interval: the next request asks every node
            fresh.append(fetch_ms(state.web_url + path, auth.bearer(state.root)))
            reused.append(fetch_ms(state.web_url + path, auth.bearer(state.root)))
        result["paths"][path] = {"fresh_p50_ms": statistics.median(fresh), "fresh_max_ms": max(fresh),
                                 "reused_p50_ms": statistics.median(reused)}
        print(f"{path:14s} fresh p50 {statistics.median(fresh):6.1f} ms (max {max(fresh):6.1f}); "
              f"reused p50 {statistics.median(reused):5.1f} ms")
    page = result["paths"]["/"]["fresh_p50_ms"]
    result["open_page_busy_share"] = page / 1e3 / cfg.dashboard.refresh_s
    print(f"an open page refreshing every {cfg.dashboard.refresh_s} s waits on a fresh snapshot {page:.0f} ms of each "
          f"{cfg.dashboard.refresh_s} s ({result['open_page_busy_share']:.1%} of the time)")
    out = report.write_json(report.run_dir(cfg, "dashboard-cost"), "dashboard_cost.json", result)
    print(f"report: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
