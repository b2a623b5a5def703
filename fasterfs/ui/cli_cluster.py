"""`fasterfs up / status / env / down / repair / notebook / kernel / cache / mount`: the cluster
and its nodes. Commands find their cluster before they load Ray (half a second of CPU): with
none running, they say so at once."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.table import Table

from ..control import auth, registry, report
from ..control.node_directory import LONG, NodeDirectory
from ..core import config
from ..core.errors import FasterFSError, UsageError
from ..node.mount_supervisor import mount_counts
from ..ops import cluster

SURVEY_WAIT_S = 10  # `up` and `status` wait this long for the survey (a million names' takes minutes)

console = report.console()


def cmd_up(cfg) -> None:
    doing = (f"attaching to the Ray cluster at {cfg.cluster.ray_address}: a StorageNode and MinIO on each of its "
             "nodes" if cfg.cluster.attach else f"starting {cfg.nodes} Ray nodes with their MinIO servers")
    with console.status(doing):
        state = cluster.up(cfg)
    console.print(f"[green]FasterFS cluster up[/]: {len(state.nodes)} nodes, Ray at {state.ray_address}, "
                  f"FasterFS dashboard {state.web_url or '(disabled)'}")
    if state.recovered:
        print_recovered(state.recovered)
    if state.resumed:
        r = state.resumed
        console.print(f"[yellow]The head was started again beside nodes that outlived it[/]: kept running "
                      f"{r['kept']}, StorageNodes started again {r['restarted']}"
                      + (f", [red]not back {r['not_back']}[/]" if r["not_back"] else ""), highlight=False)
    cmd_status(cfg)


def _objects(row: dict) -> str:
    """A node's object count, with its age once it is not from now (a million objects list in
    about a minute: `status` waits for a few seconds, then shows the last count)."""
    if row.get("error") or not row.get("healthy"):
        return "-"
    if row.get("objects") is None:
        return "counting"
    from ..node.minio_supervisor import COUNT_WAIT_S  # here: boto3 comes with it, which `ls` needs not

    age = row.get("objects_age_s") or 0
    return f"{row['objects']:,}" + (f" ({age:.0f} s ago)" if age > 1 + COUNT_WAIT_S else "")


def print_recovered(done: dict) -> None:
    """What `up` took back from the storage hosts for a head that had lost it."""
    ns = done.get("namespace")
    if ns:
        console.print(f"[yellow]The head's namespace was empty: recovered {ns['names']:,} names at version "
                      f"{ns['version']} from {ns['from']}[/]", highlight=False, soft_wrap=True)
    if done.get("keys"):
        console.print(f"[yellow]The head had no MinIO keys: taken from {done['keys']}[/]", highlight=False)
    for line in done.get("found", []):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


def _replica(row: dict, head_version: int | None) -> str:
    """How far a host's copy of the namespace reaches, beside the head's."""
    r = row.get("namespace_replica")
    if not r:
        return "-"
    if r.get("error"):
        return f"[red]{r['error'][:40]}[/]"
    behind = None if head_version is None else head_version - r["version"]
    return f"{r['names']:,} names, " + ("current" if behind == 0 else "?" if behind is None else f"{behind} behind")


def _placed(count: int | None) -> str:
    return "-" if count is None else f"{count:,}"


def cmd_status(cfg) -> None:
    state, rows = cluster.status(cfg)
    table = Table(title=f"FasterFS cluster '{state.name}' ({state.root})")
    # objects and bytes: what the namespace places on the node, current; listed: what its MinIO held
    # when last listed (seldom, paced: a million objects take minutes), pieces awaiting deletion too
    for col in ("node", "address", "Ray node id", "MinIO endpoint", "health", "objects", "bytes", "listed in MinIO",
                "restarts", "namespace copy"):
        table.add_column(col)
    try:
        head_version: int | None = registry.namespace_version(state.name)
    except Exception:
        head_version = None
    for r in rows:
        health = "[green]healthy[/]" if r.get("healthy") else ("[yellow]held[/]" if r.get("held") else "[red]down[/]")
        if r.get("error"):
            health = f"[red]{r['error']}[/]"
        table.add_row(str(r["index"]), r["address"], (r.get("node_id") or "-")[:12], r["endpoint"], health,
                      _placed(r.get("placed_objects")), report.fmt_bytes(r.get("placed_bytes")),
                      _objects(r), str(r.get("minio_restarts", "-")), _replica(r, head_version))
    console.print(table)
    _print_survey(state, rows)
    console.print(f"Ray dashboard: {state.dashboard_url}"
                  + (f"   FasterFS dashboard: {state.web_url} (log in with the token in "
                     f"{auth.token_file(state.root)})" if state.web_url else ""))
    if state.notebook:
        console.print(f"JupyterLab: {state.notebook['url']}   (token in {state.notebook['token_file']})")
    for r in rows:
        for m in r.get("mounts") or []:
            health = ("[green]healthy[/]" if m["healthy"] else
                      "[red]not mounted[/]" if m["alive"] else "[red]daemon dead[/]")
            console.print(f"Mount on node {r['index']} ({r['address']}): {m['path']}  FUSE daemon pid {m['pid']}  "
                          f"{health}  {mount_counts(m.get('daemon'))}", highlight=False, soft_wrap=True)
    if not any(r.get("mounts") for r in rows):
        console.print("Mounts: none (`fasterfs mount /mnt/ffs`)")
    if state.insecure:
        console.print("[red]Insecure: Ray runs without token authentication (cluster.insecure=true): anyone who "
                      "reaches it can run code on the cluster.[/]")
    elif not state.attached:
        console.print(f"Access: Ray's token authentication; the token is in {auth.token_file(state.root)} (0600) on "
                      "the head.")
    if not state.attached:
        console.print(f"Ray's own tools from any shell on this machine: eval \"$({shell_env_command(cfg)})\" then "
                      "ray job submit --working-dir . -- python jobs/graysort.py", highlight=False, soft_wrap=True)


def shell_env_command(cfg) -> str:
    """The `fasterfs env` command line for this cluster (its root named unless it is the default)."""
    line = f"{shlex.quote(str(Path(sys.prefix) / 'bin' / 'fasterfs'))} env"
    if cfg.cluster.root != config.load([]).cluster.root:
        line += f" cluster.root={shlex.quote(cfg.cluster.root)}"
    return line


def cmd_env(cfg) -> None:
    """Shell lines for Ray's own tools (`ray job submit`, `ray list actors`) and FasterFS's: the
    cluster's dashboard address, its token by file (never the token itself) and root, and this
    checkout's virtualenv first on PATH. Printed plainly, for `eval "$(fasterfs env)"`."""
    state = cluster.ClusterState.load(config.Layout.of(cfg).paths.root)
    if not state.running():
        raise FasterFSError(f"the cluster under {state.root} is not running: `fasterfs up` first")
    lines = [f"# FasterFS cluster {state.name!r} under {state.root}: Ray's own tools in this shell",
             f"export FASTERFS_CLUSTER={shlex.quote(state.name)} FASTERFS_ROOT={shlex.quote(str(state.root))}",
             f"export RAY_ADDRESS={shlex.quote(state.dashboard_url)}"]
    token = auth.token_file(state.root)
    if not state.insecure and token.exists():
        auth.read(token)  # refuses a token file others can read
        lines += ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN_PATH={shlex.quote(str(token))}",
                  "unset RAY_AUTH_TOKEN"]
    lines.append(f"export PATH={shlex.quote(str(Path(sys.prefix) / 'bin'))}${{PATH:+:$PATH}}")
    print("\n".join(lines))


def _print_survey(state, rows: list[dict]) -> None:
    """The namespace's redundancy, surveyed now by the repair leader (the lowest node whose MinIO
    answers), which keeps it as the survey the dashboard shows."""
    import ray

    leader = min((r["index"] for r in rows if r.get("healthy")), default=None)
    if leader is None:
        console.print("Redundancy: [red]unknown: no node's MinIO answers[/]")
        return
    ref = NodeDirectory(state.ray_namespace).require(leader).survey.options(concurrency_group=LONG).remote()
    if not ray.wait([ref], timeout=SURVEY_WAIT_S)[0]:  # it goes on: its result is what the dashboard shows
        console.print(f"Redundancy: still being surveyed by node {leader}, the repair leader, after {SURVEY_WAIT_S} s "
                      "(a large namespace); the dashboard shows it once done", highlight=False)
        return
    found = ray.get(ref)
    colour = "red" if found["lost"] else "yellow" if found["degraded"] else "green"
    console.print(f"Redundancy: [{colour}]{found['summary']}[/] (surveyed now by node {leader}, the repair leader; "
                  "the dashboard shows this survey)", highlight=False)


def _print_redundancy(health) -> None:
    colour = "red" if health.lost else "yellow" if health.degraded else "green"
    console.print(f"Redundancy: [{colour}]{health.summary()}[/]", highlight=False)


def cmd_repair(cfg) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ..node import repair, repair_rebuild, repair_survey  # here: every other command starts without them

    state = registry.find(cfg)
    creds = registry.fetch_credentials(state.name, "admin")
    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task(f"repairing (at most {cfg.repair.mb_per_s:g} MB/s a node)", total=None)
        out = repair.run(cfg, state, creds, progress=lambda done, total: bar.update(task, completed=done, total=total),
                         spread=repair_rebuild.through(NodeDirectory(state.ray_namespace)))
    console.print(f"found: {out.health.summary()}", highlight=False)
    by = ", ".join(f"{n}: {k}" for n, k in sorted(out.by_node.items()))
    console.print(f"repaired {out.repaired} chunks: {out.pieces_written} pieces written ({out.moved} moved back home), "
                  f"{report.fmt_bytes(out.bytes_written)} in {out.seconds:.1f} s ({out.mb_per_s:.0f} MB/s)"
                  + (f"; chunks rebuilt by node: {by}" if by else ""))
    _print_redundancy(repair_survey.survey(state, creds, cfg.placement.load_slack))
    for why in out.failed:
        console.print(f"[red]not repaired[/]: {why}", highlight=False)
    if out.health.lost:
        raise FasterFSError(f"{out.health.lost_count} chunks are lost, fewer good pieces than rebuild them; left as "
                            f"they are (a host that comes back may hold what they miss): {out.health.lost_names()}")
    if out.failed:
        raise FasterFSError(f"{len(out.failed)} chunks could not be repaired (above); run `fasterfs repair` again")


def cmd_down(cfg) -> None:
    with console.status("stopping the cluster"):
        report = cluster.down(cfg)
    console.print(f"[green]FasterFS cluster down[/]: {report['actors_stopped']} StorageNodes and "
                  f"{report['ray_nodes_stopped']} Ray nodes stopped, "
                  f"{report['processes_killed']} stray processes killed")
    for err in report["actor_errors"]:
        console.print(f"[yellow]warning[/]: {err}")


def cmd_notebook(cfg) -> None:
    from ..dashboard import notebook

    state = cluster.ClusterState.load(cfg.cluster.root)  # the head's: JupyterLab runs beside it
    if not state.running():
        raise FasterFSError(f"the cluster under {cfg.cluster.root} is not running: `fasterfs up` first")
    with console.status("starting JupyterLab"):
        info = notebook.start(cfg, state)
    token = Path(info["token_file"]).read_text().strip()
    console.print(f"JupyterLab: {info['url']}?token={token}", highlight=False, soft_wrap=True)
    console.print(f"  (the token is in {info['token_file']}; `fasterfs down` stops it)")


def cmd_kernel_status(cfg) -> None:
    state = registry.find(cfg)
    import ray

    snaps = ray.get([a.kernel_status.remote() for a in cluster.storage_nodes(state)], timeout=60)
    for snap in snaps:
        mode = snap["mode"]
        label = "[green]real eBPF[/]" if mode == "real" else f"[yellow]SIMULATED[/] ({snap['simulated_because']})"
        console.print(f"\n[bold]node {snap['index']}[/] ({snap['address']})  mode: {label}  "
                      f"hot_threshold={snap['hot_threshold']} epoch={snap['epoch']}")
        if snap["tc"]:
            console.print("  TC: " + ", ".join(f"{t['filter']} on {t['interface']} egress" for t in snap["tc"]))
        c = snap["counters"]
        console.print(f"  requests {c.get('requests', 0)}  HOT events {c.get('hot_events', 0)} "
                      f"(received {snap['events_received'].get('HOT', 0)})  stale marks {c.get('stale_marks', 0)}  "
                      f"filler skipped {c.get('filler_skipped', 0)}  not requests {c.get('not_request', 0)}  "
                      f"truncated {c.get('truncated', 0)}  ring-buffer drops {c.get('ringbuf_drops', 0)}")
        if snap["stale_marks"]:  # the real kernel's maps
            marks = snap["stale_marks"]
            now = "  (suspect now: entries being checked)" if marks["suspect_since_ns"] else ""
            console.print(f"  refused by MinIO (not counted) {c.get('refused', 0)}  marks held {marks['held']} of "
                          f"{marks['capacity']}  map full {c.get('marks_full', 0)}  suspect marks "
                          f"{c.get('suspect_marks', 0)}{now}")
            counts = snap["key_counts"]
            console.print(f"  keys counted {counts['held']} of {counts['capacity']}  counts let go "
                          f"{counts['evicted']}  known again by the second-chance filter "
                          f"{counts['second_chances']} (of {counts['second_chance_bits']:,} bits a generation; "
                          f"0 bits: a key read again after more others than the map holds starts from 0)")
        reported = snap["reported_by_readers"]
        if mode == "real" and reported:  # MinIO over TLS: the kernel reads no request line; readers report GETs
            console.print(f"  reported by readers (TLS: the kernel sees ciphertext): {reported['gets']} GET, "
                          f"{reported['hot_events']} HOT")
        for port, p in snap["ports"].items():
            avg = f"{p['latency_avg_us']:.0f}" if p["latency_avg_us"] is not None else "-"
            console.print(f"  port {port}: {p['gets']} GET, {p['puts']} PUT, {p['deletes']} DELETE; request -> "
                          f"first response byte: avg {avg} µs, p50 <= {p['latency_p50_us']} µs over "
                          f"{p['latency_count']} (log2 µs histogram {p['latency_hist_log2_us']})")
        sock = snap["sockops"]
        if "options" in sock:
            opts = ", ".join(f"{name} ok {o['ok']} failed {o['fail']}"
                             + (f" (errno {o['last_error']})" if o["last_error"] else "")
                             for name, o in sock["options"].items())
            console.print(f"  SOCK_OPS on {snap['sockops_cgroup']}: {sock.get('connections_matched', 0)} MinIO "
                          f"connections of {sock.get('connections_seen', 0)}; {opts}")
        if sock.get("skipped"):
            console.print(f"  SOCK_OPS skipped: {sock['skipped']}")
        console.print(f"  {sock['note']}")
        if snap["top_keys"]:
            table = Table("count", "key", "chunk", title=f"hottest keys (of {snap['keys_tracked']})")
            for k in snap["top_keys"]:
                table.add_row(str(k["count"]), k["key"], k["name"] or "?")
            console.print(table)


def cmd_cache_status(cfg) -> None:
    state = registry.find(cfg)
    import ray

    rows = ray.get([a.cache_status.remote() for a in cluster.storage_nodes(state)], timeout=60)
    table = Table(title="FasterFS node caches")
    for col in ("node", "mode", "entries", "size", "capacity", "hits", "misses", "from cache", "from MinIO",
                "fills (hot/prefetch/warm)", "evictions", "prefetch shed", "damaged dropped",
                "writes seen / peers told (late)"):
        table.add_column(col)
    for r in rows:
        f, rd = r["filler"], r["readers"]
        mode = r["kernel_mode"] if r["kernel_mode"] == "real" else "[yellow]SIMULATED[/]"
        table.add_row(str(r["index"]), mode, str(r["entries"]), report.fmt_bytes(r["bytes"]),
                      report.fmt_bytes(r["capacity"]), str(rd["hits"]), str(rd["misses"]),
                      report.fmt_bytes(rd["bytes_from_cache"]), report.fmt_bytes(rd["bytes_from_minio"]),
                      f"{f.get('hot_fills', 0)}/{f.get('prefetch_fills', 0)}/{f.get('warm_fills', 0)}",
                      str(r["evictions"]), str(f.get("prefetch_shed", 0)),
                      str(rd["damaged_dropped"] + r["scrub_dropped"]), report.fmt_writes_told(r["writes_told"]))
    console.print(table)


def chunk_list(spec: str) -> list[int] | None:
    """'all' (None), '5', '0-9', '0-9,20,30-31' -> chunk ids; argparse's type for CHUNKS."""
    if spec == "all":
        return None
    ids: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"{spec!r}: {part!r} is not a chunk id or range (e.g. 0-9,20)")
        if dash and int(hi) < int(lo):
            raise argparse.ArgumentTypeError(f"{spec!r}: range {part!r} runs backwards (write {hi}-{lo})")
        ids += list(range(int(lo), int(hi or lo) + 1))
    return ids


def cmd_cache_warm(cfg, chunks: list[int] | None = None) -> None:
    import ray
    from rich.progress import Progress

    from ..read.tables import connect

    client = connect(cfg.cluster.root)
    ids = list(range(len(client))) if chunks is None else chunks
    bad = [i for i in ids if not 0 <= i < len(client)]
    if bad:
        raise UsageError(f"argument CHUNKS: chunk {bad[0]} does not exist in {client.manifest.name} "
                         f"(chunks 0-{len(client) - 1})")
    actors = cluster.storage_nodes(client.state)
    cached = 0
    with Progress(console=console) as bar:
        task = bar.add_task(f"warming {len(ids)} chunks", total=len(ids))
        for start in range(0, len(ids), 8):
            batch = ids[start:start + 8]
            by_node: dict[int, list[str]] = {}
            for i in batch:
                by_node.setdefault(client.sources(i)[0], []).append(client.manifest.chunk(i).key)
            cached += sum(ray.get([actors[n].cache_warm.remote(keys) for n, keys in by_node.items()]))
            bar.update(task, advance=len(batch))
    console.print(f"{cached} of {len(ids)} chunks cached")


def cmd_cache_clear(cfg) -> None:
    state = registry.find(cfg)
    import ray

    removed = ray.get([a.cache_clear.remote() for a in cluster.storage_nodes(state)])
    per_node = ", ".join(f"node {i}: {n}" for i, n in enumerate(removed))
    console.print(f"removed {sum(removed)} cache entries ({per_node}); kernel counts start over")


def _one_node_per_host(state) -> list:
    """A StorageNode actor on each host of the cluster (a one-machine cluster is one host)."""
    seen, out = set(), []
    for node, actor in zip(state.nodes, cluster.storage_nodes(state)):
        if node.host_id not in seen:
            seen.add(node.host_id)
            out.append((node, actor))
    return out


def cmd_mount(cfg, mountpoint: str) -> None:
    state = registry.find(cfg)
    import ray

    done = []
    try:
        for node, actor in _one_node_per_host(state):
            done.append((node, actor, ray.get(actor.mount.remote(mountpoint))))
    except ray.exceptions.RayTaskError as e:
        for _, actor, path in done:  # all hosts or none
            ray.get(actor.umount.remote(path))
        raise e.as_instanceof_cause() from None
    console.print(f"[green]mounted[/] the namespace read-only at {mountpoint} on "
                  f"{len(done)} host{'s' if len(done) > 1 else ''} "
                  f"(nodes {', '.join(str(n.index) for n, _, _ in done)})")


def cmd_umount(cfg, mountpoint: str) -> None:
    state = registry.find(cfg)
    import ray

    hosts = sum(ray.get([a.umount.remote(mountpoint) for a in cluster.storage_nodes(state)]))
    if not hosts:
        raise FasterFSError(f"{mountpoint} is not a FasterFS mount of cluster {state.name!r}")
    console.print(f"unmounted {mountpoint} on {hosts} host{'s' if hosts > 1 else ''}")
