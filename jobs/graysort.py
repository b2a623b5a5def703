"""Demo C — GraySort with an object-store shuffle and no single coordinator.

    ray job submit --working-dir . -- python jobs/graysort.py nodes=2 graysort.size=100MB
    python jobs/graysort.py nodes=2 graysort.size=1GB graysort.format=fasterfs graysort.skew=2

Overrides: nodes (default: every node of the cluster), graysort.size, graysort.format (gray |
fasterfs), graysort.skew, graysort.partitions_per_node, graysort.baseline, and the object
store per node with `fasterfs up cluster.object_store_mb=...` (Ray spills beyond it to
cluster.spill_dir). Writes graysort.json and graysort.png to <output_dir>/graysort-<time>/;
fails with the first bad position if validation fails.
"""
from __future__ import annotations

from rich.progress import Progress

from fasterfs.control import registry, report
from fasterfs.core import config
from fasterfs.ops import cluster, graysort, job


def chart(result: dict, path) -> None:
    """Top: the phases of both designs side by side. Bottom: every task of the shuffle on
    its node's row (where the cores went, and where they waited)."""
    t = result["times"]
    bars = [("object-store shuffle", [("generate", t["generate_s"]), ("map + shuffle + reduce", t["map_reduce_s"]),
                                      ("validate", t["validate_s"])])]
    if "baseline" in result:
        b = result["baseline"]
        bars.append(("single coordinator", [("generate", t["generate_s"]), ("download", b["download_s"]),
                                            ("sort + partition", b["sort_partition_s"]), ("upload", b["upload_s"])]))
    colors = {"generate": "#888", "map + shuffle + reduce": "#06c", "validate": "#6a6", "download": "#c60",
              "sort + partition": "#a40", "upload": "#e90", "map": "#06c", "reduce": "#0a8"}
    fig, (ax, tl) = report.figure(2, 1, figsize=(10, 6), gridspec_kw={"height_ratios": [1, 2]})
    for y, (_label, parts) in enumerate(bars):
        left = 0.0
        for name, secs in parts:
            ax.barh(y, secs, left=left, color=colors[name], label=name)
            left += secs
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.set_xlabel("seconds")
    p = result["plan"]
    ax.set_title(f"GraySort {result['bytes'] / 1e6:.0f} MB on {p['nodes']} nodes ({p['format']} records)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    rows = p["nodes"] * 3  # per node: generate, map, reduce lanes
    lane = {"generate": 0, "map": 1, "reduce": 2}
    for task in result["timeline"]:
        y = task["node"] * 3 + lane[task["phase"]]
        tl.barh(y, task["end_s"] - task["start_s"], left=task["start_s"], height=0.8, color=colors[task["phase"]],
                edgecolor="white", linewidth=0.5)
    tl.set_yticks(range(rows), [f"node {n} {ph}" for n in range(p["nodes"]) for ph in lane], fontsize=7)
    tl.invert_yaxis()
    tl.set_xlabel("seconds since the first task started (each bar: one task's steps)")
    report.save_figure(fig, path)


def main(argv: list[str]) -> dict:
    cfg = config.load(argv)
    state = registry.find(cfg)
    explicit = any(a.startswith("nodes=") for a in argv)
    p = graysort.plan(cfg, len(state.nodes), cfg.nodes if explicit else None)  # bad input fails here
    cluster.connect_ray(state)
    console = report.console()
    with Progress(console=console, transient=True) as bar:
        tasks = {}

        def tick(phase, done, total):
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done)
        try:
            result = graysort.run(state, p, cfg.graysort.baseline, cfg.graysort.reference_mb, tick)
        finally:
            if not cfg.graysort.keep:
                graysort.delete_run(state, p)
    t = result["times"]
    result["headline"] = {"sorted": f"{p.size / 1e6:.0f} MB on {p.nodes} nodes, valid",
                          "end to end (generate + sort)": f"{t['sort_s']:.2f} s",
                          "map+shuffle+reduce": f"{t['map_reduce_s']:.2f} s "
                                                f"({p.size / 1e6 / t['map_reduce_s']:.0f} MB/s)"}
    if "baseline" in result:
        result["headline"]["vs single coordinator"] = report.fmt_speedup(result["speedup_vs_baseline"])
    result["figures"] = {"sort end to end (s)": t["sort_s"], "map+shuffle+reduce (s)": t["map_reduce_s"],
                         "sort (MB/s)": result["sort_mb_s"]}
    out = report.run_dir(cfg, "graysort")
    report.write_json(out, "graysort.json", result)
    chart(result, out / "graysort.png")
    console.print(f"GraySort {p.size / 1e6:.0f} MB ({p.records} {p.format} records, skew {p.skew}) on {p.nodes} nodes, "
                  f"{p.parts} partitions; MinIO {'MD5' if result['minio_md5_etags'] else 'random (--no-compat)'} ETags")
    console.print(f"  generate {t['generate_s']:.2f} s | map+shuffle+reduce {t['map_reduce_s']:.2f} s | "
                  f"sort end to end {t['sort_s']:.2f} s ({result['sort_mb_s']:.0f} MB/s) | "
                  f"validate {t['validate_s']:.2f} s")
    steps = " | ".join(f"{phase}: " + ", ".join(f"{k} {v:.1f}" for k, v in st.items())
                       for phase, st in result["task_seconds"].items())
    console.print(f"  task seconds, summed over each phase's tasks: {steps}; every task ran on its data's node: "
                  f"{result['tasks_on_their_nodes']}")
    v = result["validation"]
    console.print(f"  valid: {v['records']} records, checksum {v['checksum']:#x}, "
                  f"{v['partitions']} partitions sorted and ordered")
    if "baseline" in result:
        b = result["baseline"]
        console.print(f"  single-coordinator baseline: {b['total_s']:.2f} s (download {b['download_s']:.2f}, "
                      f"sort+partition {b['sort_partition_s']:.2f}, upload {b['upload_s']:.2f}); "
                      f"object-store shuffle is {result['headline']['vs single coordinator']} "
                      "(map+reduce vs the whole baseline)")
    if "reference" in result:
        r = result["reference"]
        console.print(f"  in-memory NumPy sort, one process: {r['single_process_mb_s']:.0f} MB/s; sort phase "
                      f"{r['sort_phase_mb_s']:.0f} MB/s = {r['fraction_of_cores_x_single']:.0%} of "
                      f"{r['cores']} cores x that")
    console.print(f"report: {out / 'graysort.json'}, chart: {out / 'graysort.png'}")
    return result


if __name__ == "__main__":
    job.run(main, __doc__, "graysort")
