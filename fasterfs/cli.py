"""The `fasterfs` command. Every subcommand takes Hydra overrides, e.g.
`fasterfs up nodes=4`, `fasterfs ingest data.rows_per_chunk=500 replicas=2`."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf
from rich.table import Table

from . import auth, cluster, config, registry, repair, report
from .errors import ConfigError, FasterFSError

console = report.console()


def cmd_up(cfg) -> None:
    with console.status(f"starting {cfg.nodes} Ray nodes with their MinIO servers"):
        state = cluster.up(cfg)
    console.print(f"[green]FasterFS cluster up[/]: {len(state.nodes)} nodes, Ray at {state.ray_address}, "
                  f"FasterFS dashboard {state.web_url or '(disabled)'}")
    cmd_status(cfg)


def cmd_lab_up(cfg) -> None:
    from . import lab

    with console.status(f"creating {cfg.nodes} lab hosts (profile {cfg.lab.profile}) and starting the cluster"):
        state = lab.up(cfg)
    rec = state.lab
    limits = (f"disk {rec['disk_mbit'] or 'unlimited'} Mbit/s, link {rec['link_mbit'] or 'unlimited'} Mbit/s per host")
    console.print(f"[green]FasterFS lab up[/]: {len(state.nodes)} hosts on bridge {rec['bridge']} "
                  f"({', '.join(f'{n.netns}={n.address}' for n in state.nodes)}); {limits}; "
                  f"Ray head {state.ray_address}")
    cmd_status(cfg)


def cmd_lab_down(cfg) -> None:
    from . import lab

    with console.status("stopping the lab"):
        report = lab.down(cfg)
    console.print(f"[green]FasterFS lab down[/]: {report['actors_stopped']} StorageNodes and "
                  f"{report['ray_nodes_stopped']} Ray nodes stopped; {report.get('lab_removed', 0)} namespaces, "
                  "links and bridges removed")


def cmd_lab_exec(cfg, host: str | None = None, command: list[str] = ()) -> int:
    """Run a command on a lab host, as on that machine (its own files and network)."""
    import os

    from . import lab

    if host is None or not host.isdigit() or not command:
        raise FasterFSError("usage: fasterfs lab exec NODE -- COMMAND... (NODE: a lab host's node id)")
    state = cluster.ClusterState.load(config.Layout.of(cfg).paths.root)
    args = lab.exec_args(state, int(host), list(command))
    os.execvp(args[0], args)


def _lab_host(cfg, host: str | None, command: str):
    if host is None or not host.isdigit():
        raise FasterFSError(f"usage: fasterfs lab {command} NODE (NODE: a lab host's node id)")
    return cluster.ClusterState.load(config.Layout.of(cfg).paths.root), int(host)


def cmd_lab_power_off(cfg, host: str | None = None) -> None:
    from . import lab

    state, index = _lab_host(cfg, host, "power-off")
    killed = lab.power_off(state, index)
    console.print(f"lab host {index} powered off: {killed} processes killed at once; its disk is kept")


def cmd_lab_power_on(cfg, host: str | None = None, empty: bool = False) -> None:
    from . import lab

    _, index = _lab_host(cfg, host, "power-on")
    with console.status(f"starting lab host {index}"):
        state = lab.power_on(cfg, index, empty)
    console.print(f"lab host {index} back{' with a blank disk' if empty else ''}: Ray node "
                  f"{state.node(index).ray_node_id[:12]}, StorageNode up; "
                  f"`fasterfs repair` (or the StorageNodes after repair.check_s) refills it")


def cmd_status(cfg) -> None:
    state, rows = cluster.status(cfg)
    table = Table(title=f"FasterFS cluster '{state.name}' ({state.root})")
    for col in ("node", "address", "Ray node id", "MinIO endpoint", "health", "objects", "bytes", "restarts"):
        table.add_column(col)
    for r in rows:
        health = "[green]healthy[/]" if r.get("healthy") else ("[yellow]held[/]" if r.get("held") else "[red]down[/]")
        if r.get("error"):
            health = f"[red]{r['error']}[/]"
        table.add_row(str(r["index"]), r["address"], (r.get("node_id") or "-")[:12], r["endpoint"], health,
                      str(r.get("objects", "-")), report.fmt_bytes(r.get("bytes")), str(r.get("minio_restarts", "-")))
    console.print(table)
    _print_redundancy(repair.survey(state, registry.fetch_credentials(state.name), cfg.placement.load_slack))
    console.print(f"Ray dashboard: {state.dashboard_url}" + (f"   FasterFS dashboard: {state.web_url}" if state.web_url else ""))
    if state.notebook:
        console.print(f"JupyterLab: {state.notebook['url']}   (token in {state.notebook['token_file']})")
    if state.insecure:
        console.print("[red]Insecure: Ray runs without token authentication (cluster.insecure=true): anyone who "
                      "reaches it can run code on the cluster.[/]")
    elif not state.attached:
        console.print(f"Access: Ray's token authentication; the token is in {auth.token_file(state.root)} (0600) on "
                      f"the head: `ray job submit` needs RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<that file>")


def _print_redundancy(health) -> None:
    colour = "red" if health.lost else "yellow" if health.degraded else "green"
    console.print(f"Redundancy: [{colour}]{health.summary()}[/]", highlight=False)


def cmd_repair(cfg) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    state = registry.find(cfg)
    creds = registry.fetch_credentials(state.name, "admin")
    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task(f"repairing (at most {cfg.repair.mb_per_s:g} MB/s)", total=None)
        out = repair.run(cfg, state, creds, progress=lambda done, total: bar.update(task, completed=done, total=total))
    console.print(f"found: {out.health.summary()}", highlight=False)
    console.print(f"repaired {out.repaired} chunks: {out.pieces_written} pieces written ({out.moved} moved back home), "
                  f"{report.fmt_bytes(out.bytes_written)} in {out.seconds:.1f} s ({out.mb_per_s:.0f} MB/s)")
    _print_redundancy(repair.survey(state, creds, cfg.placement.load_slack))
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
                  f"{report['ray_nodes_stopped']} Ray nodes stopped, {report['processes_killed']} stray processes killed")
    for err in report["actor_errors"]:
        console.print(f"[yellow]warning[/]: {err}")


def cmd_notebook(cfg) -> None:
    from . import notebook

    state = cluster.ClusterState.load(cfg.cluster.root)  # the head's: JupyterLab runs beside it
    if not state.running():
        raise FasterFSError(f"the cluster under {cfg.cluster.root} is not running: `fasterfs up` first")
    with console.status("starting JupyterLab"):
        info = notebook.start(cfg, state)
    token = Path(info["token_file"]).read_text().strip()
    console.print(f"JupyterLab: {info['url']}?token={token}", highlight=False, soft_wrap=True)
    console.print(f"  (the token is in {info['token_file']}; `fasterfs down` stops it)")


def cmd_ingest(cfg) -> None:
    from rich.progress import Progress

    from .ingest import ingest

    with Progress(console=console) as bar:
        task = bar.add_task(f"ingesting {cfg.data.name}", total=None)
        manifest = ingest(cfg, progress=lambda done, total: bar.update(task, completed=done, total=total))
    per_node = [len(manifest.on_node(i)) for i in range(manifest.node_count)]
    console.print(f"[green]ingested[/] {manifest.dataset}: {manifest.rows} rows in {len(manifest)} {manifest.format} "
                  f"chunks ({report.fmt_bytes(manifest.total_bytes)}), {manifest.redundancy()}, "
                  f"chunks per node {per_node}")


def cmd_kernel_status(cfg) -> None:
    import ray

    state = registry.find(cfg)
    snaps = ray.get([a.kernel_status.remote() for a in cluster.storage_nodes(state)], timeout=60)
    for snap in snaps:
        mode = snap["mode"]
        label = "[green]real eBPF[/]" if mode == "real" else f"[yellow]SIMULATED[/] ({snap.get('simulated_because')})"
        console.print(f"\n[bold]node {snap['index']}[/] ({snap['address']})  mode: {label}  "
                      f"hot_threshold={snap['hot_threshold']} epoch={snap['epoch']}")
        if snap["tc"]:
            console.print("  TC: " + ", ".join(f"{t['filter']} on {t['interface']} egress" for t in snap["tc"]))
        c = snap["counters"]
        console.print(f"  requests {c.get('requests', 0)}  HOT events {c.get('hot_events', 0)} "
                      f"(received {snap['events_received'].get('HOT', 0)})  stale marks {c.get('stale_marks', 0)}  "
                      f"filler skipped {c.get('filler_skipped', 0)}  not requests {c.get('not_request', 0)}  "
                      f"truncated {c.get('truncated', 0)}  ring-buffer drops {c.get('ringbuf_drops', 0)}")
        reported = snap.get("reported_by_readers")
        if reported:  # MinIO over TLS: the kernel reads no request line; readers report their GETs
            console.print(f"  reported by readers (TLS: the kernel sees ciphertext): {reported.get('gets', 0)} GET, "
                          f"{reported.get('hot_events', 0)} HOT")
        for port, p in snap["ports"].items():
            avg = f"{p['latency_avg_us']:.0f}" if p["latency_avg_us"] is not None else "-"
            console.print(f"  port {port}: {p['gets']} GET, {p['puts']} PUT, {p['deletes']} DELETE; request -> "
                          f"first response byte: avg {avg} µs, p50 <= {p['latency_p50_us']} µs over "
                          f"{p['latency_count']} (log2 µs histogram {p['latency_hist_log2_us']})")
        sock = snap["sockops"]
        if "options" in sock:
            opts = ", ".join(f"{name} ok {o['ok']} failed {o['fail']}" + (f" (errno {o['last_error']})" if o["last_error"] else "")
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
    import ray

    state = registry.find(cfg)
    rows = ray.get([a.cache_status.remote() for a in cluster.storage_nodes(state)], timeout=60)
    table = Table(title="FasterFS node caches")
    for col in ("node", "mode", "entries", "size", "capacity", "hits", "misses", "from cache", "from MinIO",
                "fills (hot/prefetch/warm)", "evictions", "prefetch shed", "damaged dropped"):
        table.add_column(col)
    for r in rows:
        f, rd = r["filler"], r["readers"]
        mode = r["kernel_mode"] if r["kernel_mode"] == "real" else "[yellow]SIMULATED[/]"
        table.add_row(str(r["index"]), mode, str(r["entries"]), report.fmt_bytes(r["bytes"]), report.fmt_bytes(r["capacity"]),
                      str(rd["hits"]), str(rd["misses"]), report.fmt_bytes(rd["bytes_from_cache"]),
                      report.fmt_bytes(rd["bytes_from_minio"]),
                      f"{f.get('hot_fills', 0)}/{f.get('prefetch_fills', 0)}/{f.get('warm_fills', 0)}",
                      str(r["evictions"]), str(f.get("prefetch_shed", 0)),
                      str(rd["damaged_dropped"] + r["scrub_dropped"]))
    console.print(table)


def parse_chunks(spec: str | None, count: int) -> list[int]:
    """'all', '5', '0-9', '0-9,20,30-31' -> chunk ids, checked against the dataset."""
    if spec in (None, "all"):
        return list(range(count))
    ids: list[int] = []
    for part in spec.split(","):
        try:
            lo, _, hi = part.partition("-")
            ids += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise FasterFSError(f"bad chunk list {spec!r}: use e.g. 0-9,20") from None
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise FasterFSError(f"chunk {bad[0]} does not exist: valid ids are 0..{count - 1}")
    return ids


def cmd_cache_warm(cfg, chunks: str | None = None) -> None:
    import ray
    from rich.progress import Progress

    from .client import connect

    client = connect(cfg.cluster.root)
    ids = parse_chunks(chunks, len(client))
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
    import ray

    state = registry.find(cfg)
    removed = ray.get([a.cache_clear.remote() for a in cluster.storage_nodes(state)])
    console.print(f"removed {sum(removed)} cache entries ({', '.join(f'node {i}: {n}' for i, n in enumerate(removed))}); "
                  "kernel counts start over")


def _one_node_per_host(state) -> list:
    """A StorageNode actor on each host of the cluster (a one-machine cluster is one host)."""
    seen, out = set(), []
    for node, actor in zip(state.nodes, cluster.storage_nodes(state)):
        if node.host_id not in seen:
            seen.add(node.host_id)
            out.append((node, actor))
    return out


def cmd_mount(cfg, mountpoint: str) -> None:
    import ray

    state = registry.find(cfg)
    done = []
    try:
        for node, actor in _one_node_per_host(state):
            done.append((node, actor, ray.get(actor.mount.remote(mountpoint))))
    except ray.exceptions.RayTaskError as e:
        for _, actor, path in done:  # all hosts or none
            ray.get(actor.umount.remote(path))
        raise e.as_instanceof_cause() from None
    console.print(f"[green]mounted[/] the namespace read-only at {mountpoint} on "
                  f"{len(done)} host{'s' if len(done) > 1 else ''} (nodes {', '.join(str(n.index) for n, _, _ in done)})")


def cmd_umount(cfg, mountpoint: str) -> None:
    import ray

    state = registry.find(cfg)
    hosts = sum(ray.get([a.umount.remote(mountpoint) for a in cluster.storage_nodes(state)]))
    if not hosts:
        raise FasterFSError(f"{mountpoint} is not a FasterFS mount of cluster {state.name!r}")
    console.print(f"unmounted {mountpoint} on {hosts} host{'s' if hosts > 1 else ''}")


def cmd_put(cfg, *paths: str, force: bool = False) -> None:
    from .ingest import put

    if len(paths) < 2:
        raise FasterFSError("usage: fasterfs put LOCAL... DEST (DEST ending in '/' or several LOCALs: a directory)")
    *sources, dest = paths
    into_dir = dest.endswith("/") or len(sources) > 1
    for src in sources:
        name = f"{dest.rstrip('/')}/{src.rstrip('/').rsplit('/', 1)[-1]}" if into_dir else dest
        from rich.progress import Progress

        with Progress(console=console) as bar:
            task = bar.add_task(f"put {src} -> {name}", total=None)
            m = put(cfg, src, name, force, progress=lambda done, total: bar.update(task, completed=done, total=total))
        console.print(f"[green]stored[/] {name}: {report.fmt_bytes(m.total_bytes)} in {len(m)} chunks, "
                      f"{m.redundancy()}")


def _namespace(cfg):
    from .reader import Namespace

    return Namespace(cfg)


def cmd_ls(cfg, path: str = "") -> None:
    ns = _namespace(cfg)
    try:
        entry = ns.lookup(path)
        entries = ns.listdir(path) if entry.is_dir else [entry]
    except FileNotFoundError as e:
        raise FasterFSError(str(e)) from None
    import time

    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime)) if e.mtime else "-"
        kind = "dir " if e.is_dir else (e.manifest.kind if e.manifest else "")
        console.print(f"{kind:8s} {report.fmt_bytes(e.size) if not e.is_dir else '':>10s}  {when}  "
                      f"{e.path + ('/' if e.is_dir else '')}", highlight=False)


def cmd_cat(cfg, path: str) -> None:
    ns = _namespace(cfg)
    try:
        f = ns.open(path)
    except (FileNotFoundError, IsADirectoryError) as e:
        raise FasterFSError(str(e)) from None
    out = sys.stdout.buffer
    step = 4 * 1024 * 1024
    for offset in range(0, f.entry.size, step):
        out.write(f.read(offset, step))
    out.flush()


def cmd_rm(cfg, *names: str) -> None:
    from .ingest import remove

    if not names:
        raise FasterFSError("usage: fasterfs rm NAME... (a dataset's name or a file's path)")
    for name in names:
        m = remove(cfg, name)
        console.print(f"removed {m.kind} {m.name} ({report.fmt_bytes(m.total_bytes)}); readers holding it keep "
                      f"reading it for ingest.keep_old_s={cfg.ingest.keep_old_s:g} s")


COMMANDS = {
    "up": (cmd_up, "start a local cluster: N Ray nodes, each with a StorageNode and its MinIO"),
    "status": (cmd_status, "show each node's Ray id, MinIO endpoint, health and contents"),
    "ingest": (cmd_ingest, "check a LOBSTER pair, cut it into chunks and store them on their nodes"),
    "down": (cmd_down, "stop everything the cluster started"),
    "notebook": (cmd_notebook, "start JupyterLab on the head's address (notebooks/, kernels that can fasterfs.connect())"),
    "cache status": (cmd_cache_status, "each node's cache: entries, size, hits, misses, fills, evictions"),
    "cache warm": (cmd_cache_warm, "fill the caches with chunks now: `fasterfs cache warm 0-9,20` (default all)"),
    "cache clear": (cmd_cache_clear, "empty every node's cache and start a new kernel epoch"),
    "lab up": (cmd_lab_up, "create N hosts as network namespaces with bandwidth limits and start the cluster on them"),
    "lab down": (cmd_lab_down, "stop the lab's cluster and remove its namespaces, links, bridge and qdiscs"),
    "lab exec": (cmd_lab_exec, "run a command on a lab host: `fasterfs lab exec 1 -- fasterfs status "
                              "cluster.ray_address=<head>:<port>`"),
    "lab power-off": (cmd_lab_power_off, "kill every process of a lab host at once, as a machine losing power"),
    "lab power-on": (cmd_lab_power_on, "start a powered-off lab host again (--empty: with a blank disk)"),
    "put": (cmd_put, "store files in the namespace: `fasterfs put book.parquet research/book.parquet` "
                     "(--force replaces)"),
    "ls": (cmd_ls, "list the namespace: datasets, their chunks, stored files"),
    "cat": (cmd_cat, "write a dataset's or file's bytes to stdout"),
    "rm": (cmd_rm, "remove datasets or files from the namespace"),
    "mount": (cmd_mount, "mount the namespace read-only with FUSE on every host: `fasterfs mount /mnt/ffs`"),
    "umount": (cmd_umount, "unmount it everywhere"),
    "repair": (cmd_repair, "put every missing replica or shard back (and pieces moved away back home); "
                           "names chunks that are lost"),
    "kernel status": (cmd_kernel_status, "what each node's eBPF programs have seen: requests, hot keys, latency, tuning"),
}


POSITIONAL = {"cache warm": 1, "lab exec": 1, "lab power-off": 1, "lab power-on": 1, "put": 10_000, "ls": 1, "cat": 1, "rm": 10_000, "mount": 1, "umount": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fasterfs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details and show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (_, help_text) in COMMANDS.items():
        if " " in name:  # `fasterfs kernel status`
            group, action = name.split(" ", 1)
            if group not in groups:
                groups[group] = sub.add_parser(group, help=f"{group} commands").add_subparsers(dest="action", required=True)
            p = groups[group].add_parser(action, help=help_text)
        else:
            p = sub.add_parser(name, help=help_text)
        p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. nodes=4")
        p.add_argument("--nodes", type=int, help="shorthand for the override nodes=N")
        p.add_argument("--cfg", choices=["job"], help="print the composed configuration (as Hydra's --cfg job) and exit")
        if name == "put":
            p.add_argument("--force", action="store_true", help="replace a file of the same name")
        if name == "lab power-on":
            p.add_argument("--empty", action="store_true", help="with a blank disk, as a replaced machine")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []  # `lab exec N -- COMMAND...`
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)
    if getattr(args, "action", None):
        args.command = f"{args.command} {args.action}"
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        overrides = ([f"nodes={args.nodes}"] if args.nodes else []) + [o for o in args.overrides if "=" in o]
        positional = [o for o in args.overrides if "=" not in o]
        cfg = config.load(overrides)
        if args.cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return 0
        takes = POSITIONAL.get(args.command, 0)
        if len(positional) > takes:
            raise FasterFSError(f"unexpected argument {positional[takes]!r}: overrides look like key=value")
        if args.command == "lab exec":
            cmd_lab_exec(cfg, *positional[:1], command=command)
        elif args.command in ("mount", "umount", "cat") and len(positional) != 1:
            raise FasterFSError(f"usage: fasterfs {args.command} PATH")
        elif args.command == "put":
            cmd_put(cfg, *positional, force=args.force)
        elif args.command == "lab power-on":
            cmd_lab_power_on(cfg, *positional, empty=args.empty)
        else:
            COMMANDS[args.command][0](cfg, *positional)
    except FasterFSError as e:
        if args.verbose:
            raise
        console.print(f"[red]fasterfs {args.command}: error:[/] {e}", highlight=False)
        return 2 if isinstance(e, ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
