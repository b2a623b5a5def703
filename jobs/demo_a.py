"""Demo A — the kernel learns what is hot: per-chunk read latency, pass by pass, in one run.

Passes over every chunk, from a Ray task pinned to node 0:
  local file        the chunk's bytes as a plain local file, open().read() (the floor)
  MinIO direct      boto3 get_object from the holder's MinIO
  FasterFS cold     cache cleared, new kernel epoch: every read a miss (kernel count 1)
  FasterFS warm     second read: count reaches kernel.hot_threshold -> HOT event -> node fills
  FasterFS hot      third read: served from the node cache, no network
  FasterFS hot+verify  the same with an xxh3 check of every hit (cache.verify_reads=true)
  prefetch          cache cleared, a sequential backtest (decode + mid price per chunk);
                    the node prefetches ahead of it
  fsspec first/hit  the peer a Python user would pick: fsspec simplecache over s3fs, same MinIO
  mount cold/warm/hot/page cache
                    an unmodified reader: open().read() of each chunk file of the FUSE mount
                    (cache cleared first); the kernel counts its reads and the cache fills as
                    for the client; the fourth pass is served from the kernel page cache
                    (keep_cache once a file's chunks are all cached)

    python jobs/demo_a.py [overrides]
    ray job submit --address http://127.0.0.2:8265 --working-dir . -- python jobs/demo_a.py

Writes demo_a.json and demo_a.png to <output_dir>/demo_a-<time>/.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import ray

import fasterfs
from fasterfs.control import registry, report, s3, tls
from fasterfs.core import config, lobster
from fasterfs.ops import cluster, job

PASSES = ["local file", "MinIO direct", "FasterFS cold", "FasterFS warm", "FasterFS hot", "FasterFS hot+verify",
          "prefetch", "fsspec first", "fsspec hit", "mount cold", "mount warm", "mount hot", "mount page cache"]


@ray.remote(num_cpus=1)
def run_passes(root: str, overrides: list[str]) -> dict:
    import fsspec

    cfg = config.load(overrides)
    client = fasterfs.connect(root, overrides)
    verifying = fasterfs.connect(root, overrides + ["cache.verify_reads=true"])
    state, manifest = client.state, client.manifest
    ids = list(range(len(manifest)))
    actors = cluster.storage_nodes(state)
    creds = registry.fetch_credentials(state.name)
    boto = [s3.client(n.endpoint, creds) for n in state.nodes]
    work = Path(tempfile.mkdtemp(prefix="ffs-demo-a-"))
    lat: dict[str, list[float]] = {}
    try:
        # the floor: the same bytes as plain local files, read once to be in the page cache
        raw = work / "raw"
        raw.mkdir()
        for i in ids:
            (raw / str(i)).write_bytes(boto[client.sources(i)[0]].get_object(
                Bucket=manifest.bucket, Key=manifest.chunk(i).key)["Body"].read())
            (raw / str(i)).read_bytes()
        lat["local file"] = report.timed(lambda i: open(raw / str(i), "rb").read(), ids)
        lat["MinIO direct"] = report.timed(lambda i: boto[client.sources(i)[0]].get_object(
            Bucket=manifest.bucket, Key=manifest.chunk(i).key)["Body"].read(), ids)

        no_prefetch = fasterfs.connect(root, overrides + ["cache.prefetch.enabled=false"])
        ray.get([a.cache_clear.remote() for a in actors])  # also a new kernel epoch: every key cold
        kernel_before = ray.get([a.kernel_status.remote() for a in actors])
        lat["FasterFS cold"] = report.timed(no_prefetch.read_chunk, ids)
        lat["FasterFS warm"] = report.timed(no_prefetch.read_chunk, ids)
        filled = report.wait_for_fills(actors, len(ids))
        lat["FasterFS hot"] = report.timed(no_prefetch.read_chunk, ids)
        lat["FasterFS hot+verify"] = report.timed(verifying.read_chunk, ids)
        kernel_after = ray.get([a.kernel_status.remote() for a in actors])

        ray.get([a.cache_clear.remote() for a in actors])
        before_pf = ray.get([a.cache_status.remote() for a in actors])
        prefetch_lat, mids = [], []
        for i in ids:  # a sequential backtest: read, decode, compute, next
            t = time.perf_counter()
            data = client.read_chunk(i)
            prefetch_lat.append(time.perf_counter() - t)
            mids.append(float(lobster.mid_price(lobster.decode_chunk(data, manifest.format, manifest.level)).mean()))
        lat["prefetch"] = prefetch_lat
        after_pf = ray.get([a.cache_status.remote() for a in actors])

        def s3fs_cached(endpoint: str, cache_dir: str):  # verifying MinIO as our client does (minio.tls)
            return fsspec.filesystem("simplecache", target_protocol="s3", cache_storage=str(work / cache_dir),
                                     target_options={"key": creds.access_key, "secret": creds.secret_key,
                                                     "client_kwargs": {"endpoint_url": endpoint,
                                                                       "region_name": "us-east-1",
                                                                       "verify": tls.ca_file(endpoint)}},
                                     skip_instance_cache=True)

        holders = {i: state.nodes[client.sources(i)[0]].endpoint for i in ids}
        fs_by_endpoint = {n.endpoint: s3fs_cached(n.endpoint, f"fsspec-{n.index}") for n in state.nodes}

        def fs_read(i):
            with fs_by_endpoint[holders[i]].open(f"{manifest.bucket}/{manifest.chunk(i).key}", "rb") as f:
                return f.read()
        lat["fsspec first"] = report.timed(fs_read, ids)
        lat["fsspec hit"] = report.timed(fs_read, ids)
        lat.update(mount_passes(actors, ids, manifest, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def kernel_summary(before, after):
        out = []
        for b, a in zip(before, after):
            ports = a["ports"].get(cfg.minio.port) or a["ports"].get(str(cfg.minio.port)) or {}
            out.append({"node": a["index"], "mode": a["mode"],
                        "requests": a["counters"].get("requests", 0) - b["counters"].get("requests", 0),
                        "hot_events": a["counters"].get("hot_events", 0) - b["counters"].get("hot_events", 0),
                        "hot_events_received": a["events_received"].get("HOT", 0) - b["events_received"].get("HOT", 0),
                        "filler_skipped": (a["counters"].get("filler_skipped", 0)
                                           - b["counters"].get("filler_skipped", 0)),
                        # MinIO over TLS: GETs the readers reported, the kernel reading no request line
                        "reported_gets": (a.get("reported_by_readers") or {}).get("gets", 0)
                        - (b.get("reported_by_readers") or {}).get("gets", 0),
                        "latency_avg_us": ports.get("latency_avg_us"), "latency_p50_us": ports.get("latency_p50_us")})
        return out

    pf_hits = sum(a["readers"]["hits"] - b["readers"]["hits"] for a, b in zip(after_pf, before_pf))
    pf_fills = sum(a["filler"].get("prefetch_fills", 0) - b["filler"].get("prefetch_fills", 0)
                   for a, b in zip(after_pf, before_pf))
    return {"latencies_s": lat, "chunks": len(ids), "chunk_bytes_avg": manifest.total_bytes / len(ids),
            "ran_on": ray.get_runtime_context().get_node_id(), "filled_after_warm": filled,
            "kernel": kernel_summary(kernel_before, kernel_after),
            "prefetch": {"hits": pf_hits, "reads": len(ids), "prefetch_fills": pf_fills,
                         "mid_mean": statistics.mean(mids)}}


def mount_passes(actors, ids, manifest, work: Path) -> dict:
    """The same chunks read by plain open().read() through this host's FUSE mount."""
    point = work / "mnt"
    point.mkdir()
    node0 = actors[0]  # this task runs on node 0's host
    ray.get(node0.mount.remote(str(point)))
    try:
        files = {i: point / manifest.name / "chunks" / manifest.chunk(i).key.rsplit("/", 1)[-1] for i in ids}

        def read(i):
            with open(files[i], "rb") as f:
                return f.read()
        ray.get([a.cache_clear.remote() for a in actors])
        lat = {"mount cold": report.timed(read, ids), "mount warm": report.timed(read, ids)}
        report.wait_for_fills(actors, len(ids))
        lat["mount hot"] = report.timed(read, ids)
        lat["mount page cache"] = report.timed(read, ids)
        return lat
    finally:
        ray.get(node0.umount.remote(str(point)))


def chart(stats: dict, path: Path) -> None:
    names = [p for p in PASSES if p in stats]
    p50 = [stats[n]["p50_ms"] for n in names]
    p95 = [stats[n]["p95_ms"] for n in names]
    fig, ax = report.figure(figsize=(10, 4.5))
    colors = ["#888" if n in ("local file", "MinIO direct") else "#c60" if n.startswith("fsspec") else
              "#393" if n.startswith("mount") else "#06c" for n in names]
    ax.bar(names, p50, color=colors, label="p50")
    ax.scatter(names, p95, color="k", marker="_", s=300, label="p95", zorder=3)
    ax.set_yscale("log")
    ax.set_ylabel("per-chunk read latency (ms, log)")
    ax.set_title("Demo A: per-chunk latency by pass (measured in one run)")
    ax.tick_params(axis="x", rotation=30)
    ax.legend()
    report.save_figure(fig, path)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    client = fasterfs.connect(overrides=argv)
    state = client.state
    cluster.connect_ray(state)
    raw = ray.get(run_passes.options(**cluster.on_node(state.nodes[0], "demo_a.passes")).remote(state.root, list(argv)))
    stats = {name: report.quantiles(xs) for name, xs in raw["latencies_s"].items()}
    p50 = {k: v["p50_ms"] for k, v in stats.items()}
    speedups = {
        "hot vs MinIO direct (x faster)": p50["MinIO direct"] / p50["FasterFS hot"],
        "hot / local file (x of the floor)": p50["FasterFS hot"] / p50["local file"],
        "hot / fsspec hit": p50["FasterFS hot"] / p50["fsspec hit"],
        "cold / MinIO direct": p50["FasterFS cold"] / p50["MinIO direct"],
        "hot+verify / local file": p50["FasterFS hot+verify"] / p50["local file"],
        "prefetch vs MinIO direct (x faster)": p50["MinIO direct"] / p50["prefetch"],
        "mount hot vs mount cold (x faster)": p50["mount cold"] / p50["mount hot"],
        "mount page cache / local file": p50["mount page cache"] / p50["local file"],
    }
    targets = {
        "hot p50 <= 1.3x local file": speedups["hot / local file (x of the floor)"] <= 1.3,
        "hot p50 <= 0.8x fsspec hit": speedups["hot / fsspec hit"] <= 0.8,
        "hot >= 20x faster than MinIO direct": speedups["hot vs MinIO direct (x faster)"] >= 20,
        "cold p50 <= 1.1x MinIO direct": speedups["cold / MinIO direct"] <= 1.1,
    }
    result = {"dataset": client.manifest.dataset, "format": client.manifest.format, "chunks": raw["chunks"],
              "chunk_bytes_avg": raw["chunk_bytes_avg"], "passes": stats, "speedups": speedups, "targets": targets,
              "kernel": raw["kernel"], "prefetch": raw["prefetch"], "filled_after_warm": raw["filled_after_warm"],
              "latencies_s": raw["latencies_s"],
              "headline": {"hot read vs MinIO direct":
                           report.fmt_speedup(speedups["hot vs MinIO direct (x faster)"], 1),
                           "p50 hot / MinIO": f"{p50['FasterFS hot']:.3f} / {p50['MinIO direct']:.3f} ms",
                           "targets met": f"{sum(targets.values())} of {len(targets)}"},
              "figures": {"hot vs MinIO direct (x)": speedups["hot vs MinIO direct (x faster)"],
                          "p50 hot (ms)": p50["FasterFS hot"], "p50 MinIO direct (ms)": p50["MinIO direct"]}}
    out = report.run_dir(cfg, "demo_a")
    report.write_json(out, "demo_a.json", result)
    chart(stats, out / "demo_a.png")

    from rich.table import Table

    table = Table(title=f"Demo A: {raw['chunks']} chunks of {client.manifest.dataset} "
                        f"({raw['chunk_bytes_avg'] / 1e3:.0f} KB avg), one reader on node 0")
    for col in ("pass", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(col)
    for name in PASSES:
        s = stats[name]
        table.add_row(name, f"{s['p50_ms']:.3f}", f"{s['p95_ms']:.3f}", f"{s['p99_ms']:.3f}")
    console = report.console()
    console.print(table)
    for k, v in speedups.items():
        console.print(f"  {k}: {v:.2f}")
    for k, ok in targets.items():
        console.print(f"  target {k}: {'[green]met[/]' if ok else '[red]MISSED[/]'}")
    for k in raw["kernel"]:
        console.print(f"  kernel node {k['node']} ({k['mode']}): {k['requests']} requests, "
                      f"{k['hot_events']} HOT events ({k['hot_events_received']} received), "
                      f"filler GETs skipped {k['filler_skipped']}, "
                      f"request->first byte avg {k['latency_avg_us'] or 0:.0f} µs"
                      + (f"; {k['reported_gets']} GETs reported by readers (TLS)" if k["reported_gets"] else ""))
    pf = raw["prefetch"]
    console.print(f"  prefetch pass: {pf['hits']} of {pf['reads']} reads hit the cache, "
                  f"{pf['prefetch_fills']} prefetch fills")
    console.print(f"report: {out / 'demo_a.json'}, chart: {out / 'demo_a.png'}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "demo_a")
