"""The `fasterfs` command. Every subcommand takes Hydra overrides, e.g.
`fasterfs up nodes=4`, `fasterfs ingest data.rows_per_chunk=500 replicas=2`."""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.table import Table

from . import auth, cluster, config, registry, repair, report
from .errors import ConfigError, FasterFSError, UsageError
from .mount_supervisor import mount_counts

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
    assert rec is not None  # lab.up records the lab network it made
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


def cmd_lab_exec(cfg, node: int, command: list[str]) -> int:
    """Run a command on a lab host, as on that machine (its own files and network)."""
    import os

    from . import lab

    state = _lab_state(cfg, node)
    args = lab.exec_args(state, node, list(command))
    os.execvp(args[0], args)


def _lab_state(cfg, node: int):
    state = cluster.ClusterState.load(config.Layout.of(cfg).paths.root)
    if node not in [n.index for n in state.nodes]:
        raise UsageError(f"argument NODE: lab host {node} does not exist (hosts: {[n.index for n in state.nodes]})")
    return state


def cmd_lab_power_off(cfg, node: int) -> None:
    from . import lab

    state, index = _lab_state(cfg, node), node
    killed = lab.power_off(state, index)
    console.print(f"lab host {index} powered off: {killed} processes killed at once; its disk is kept")


def cmd_lab_power_on(cfg, node: int, empty: bool = False) -> None:
    from . import lab

    _lab_state(cfg, node)
    index = node
    with console.status(f"starting lab host {index}"):
        state = lab.power_on(cfg, index, empty)
    console.print(f"lab host {index} back{' with a blank disk' if empty else ''}: Ray node "
                  f"{(state.node(index).ray_node_id or '-')[:12]}, StorageNode up; "
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
    console.print(f"Ray dashboard: {state.dashboard_url}"
                  + (f"   FasterFS dashboard: {state.web_url}" if state.web_url else ""))
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
                  f"{report['ray_nodes_stopped']} Ray nodes stopped, "
                  f"{report['processes_killed']} stray processes killed")
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
        table.add_row(str(r["index"]), mode, str(r["entries"]), report.fmt_bytes(r["bytes"]),
                      report.fmt_bytes(r["capacity"]), str(rd["hits"]), str(rd["misses"]),
                      report.fmt_bytes(rd["bytes_from_cache"]), report.fmt_bytes(rd["bytes_from_minio"]),
                      f"{f.get('hot_fills', 0)}/{f.get('prefetch_fills', 0)}/{f.get('warm_fills', 0)}",
                      str(r["evictions"]), str(f.get("prefetch_shed", 0)),
                      str(rd["damaged_dropped"] + r["scrub_dropped"]))
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

    from .tables import connect

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
    import ray

    state = registry.find(cfg)
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
                  f"{len(done)} host{'s' if len(done) > 1 else ''} "
                  f"(nodes {', '.join(str(n.index) for n, _, _ in done)})")


def cmd_umount(cfg, mountpoint: str) -> None:
    import ray

    state = registry.find(cfg)
    hosts = sum(ray.get([a.umount.remote(mountpoint) for a in cluster.storage_nodes(state)]))
    if not hosts:
        raise FasterFSError(f"{mountpoint} is not a FasterFS mount of cluster {state.name!r}")
    console.print(f"unmounted {mountpoint} on {hosts} host{'s' if hosts > 1 else ''}")


def cmd_put(cfg, sources: list[str], dest: str, force: bool = False) -> None:
    from .ingest import put

    into_dir = dest.endswith("/") or len(sources) > 1
    for src in sources:
        name = f"{dest.rstrip('/')}/{src.rstrip('/').rsplit('/', 1)[-1]}" if into_dir else dest
        from rich.progress import Progress, TaskID

        with Progress(console=console) as bar:
            task = bar.add_task(f"put {src} -> {name}", total=None)

            def progress(done: int, total: int, bar: Progress = bar, task: TaskID = task) -> None:
                bar.update(task, completed=done, total=total)  # called by put, within this iteration
            m = put(cfg, src, name, force, progress=progress)
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

    for ent in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(ent.mtime)) if ent.mtime else "-"
        kind = "dir " if ent.is_dir else (ent.manifest.kind if ent.manifest else "")
        console.print(f"{kind:8s} {report.fmt_bytes(ent.size) if not ent.is_dir else '':>10s}  {when}  "
                      f"{ent.path + ('/' if ent.is_dir else '')}", highlight=False)


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


def cmd_rm(cfg, names: list[str]) -> None:
    from .ingest import remove

    for name in names:
        m = remove(cfg, name)
        console.print(f"removed {m.kind} {m.name} ({report.fmt_bytes(m.total_bytes)}); readers holding it keep "
                      f"reading it for ingest.keep_old_s={cfg.ingest.keep_old_s:g} s")


@dataclass(frozen=True)
class Command:
    run: Callable
    help: str
    example: str
    args: tuple[tuple[str, dict], ...] = ()  # positional arguments: (name, argparse keywords)
    flags: tuple[tuple[str, dict], ...] = ()


NODE = ("node", dict(type=int, metavar="NODE", help="a lab host's node id (0, 1, ...)"))
COMMANDS = {
    "up": Command(cmd_up, "start a local cluster: N Ray nodes, each with a StorageNode and its MinIO",
                  "fasterfs up nodes=4"),
    "status": Command(cmd_status, "show each node's Ray id, MinIO endpoint, health, contents and mounts",
                      "fasterfs status cluster.ray_address=127.0.0.2:6379"),
    "env": Command(cmd_env, "print the shell lines that let Ray's own tools (`ray job submit`) drive this cluster",
                   'eval "$(.venv/bin/fasterfs env)"; ray job submit --working-dir . -- python jobs/graysort.py'),
    "ingest": Command(cmd_ingest, "check a LOBSTER pair, cut it into chunks and store them on their nodes",
                      "fasterfs ingest data.rows_per_chunk=500 replicas=2"),
    "down": Command(cmd_down, "stop everything the cluster started", "fasterfs down"),
    "notebook": Command(cmd_notebook, "start JupyterLab on the head's address (notebooks/, kernels that can "
                        "fasterfs.connect())", "fasterfs notebook"),
    "cache status": Command(cmd_cache_status, "each node's cache: entries, size, hits, misses, fills, evictions",
                            "fasterfs cache status"),
    "cache warm": Command(cmd_cache_warm, "fill the caches with chunks of the dataset ingested last, now",
                          "fasterfs cache warm 0-9,20",
                          (("chunks", dict(nargs="?", type=chunk_list, metavar="CHUNKS",
                                           help="chunk ids: 'all' (the default), 5, 0-9 or 0-9,20,30-31")),)),
    "cache clear": Command(cmd_cache_clear, "empty every node's cache and start a new kernel epoch",
                           "fasterfs cache clear"),
    "lab up": Command(cmd_lab_up, "create N hosts as network namespaces with bandwidth limits and start the cluster "
                      "on them", "fasterfs lab up --nodes 4 lab=laptops"),
    "lab down": Command(cmd_lab_down, "stop the lab's cluster and remove its namespaces, links, bridge and qdiscs",
                        "fasterfs lab down"),
    "lab exec": Command(cmd_lab_exec, "run a command on a lab host, as on that machine (its own files and network)",
                        "fasterfs lab exec 1 -- fasterfs status cluster.ray_address=198.18.0.1:6391",
                        (NODE, ("command", dict(nargs="+", metavar="COMMAND",
                                                help="the command and its arguments, after --")))),
    "lab power-off": Command(cmd_lab_power_off, "kill every process of a lab host at once, as a machine losing "
                             "power", "fasterfs lab power-off 2", (NODE,)),
    "lab power-on": Command(cmd_lab_power_on, "start a powered-off lab host again", "fasterfs lab power-on 2 --empty",
                            (NODE,), (("--empty", dict(action="store_true",
                                                       help="with a blank disk, as a replaced machine")),)),
    "put": Command(cmd_put, "store local files in the namespace (DEST ending in '/', or several LOCALs: a directory)",
                   "fasterfs put book.parquet research/book.parquet",
                   (("sources", dict(nargs="+", metavar="LOCAL", help="local files to store")),
                    ("dest", dict(metavar="DEST", help="their path in the namespace"))),
                   (("--force", dict(action="store_true", help="replace a file of the same name")),)),
    "ls": Command(cmd_ls, "list the namespace: datasets, their chunks, stored files", "fasterfs ls research/",
                  (("path", dict(nargs="?", default="", metavar="PATH",
                                 help="a directory or file of the namespace (default: its top)")),)),
    "cat": Command(cmd_cat, "write a dataset's or file's bytes to stdout", "fasterfs cat research/book.parquet > b.pq",
                   (("path", dict(metavar="PATH", help="a file of the namespace")),)),
    "rm": Command(cmd_rm, "remove datasets or files from the namespace", "fasterfs rm research/book.parquet",
                  (("names", dict(nargs="+", metavar="NAME", help="a dataset's name or a file's path")),)),
    "mount": Command(cmd_mount, "mount the namespace read-only with FUSE on every host", "fasterfs mount /mnt/ffs",
                     (("mountpoint", dict(metavar="MOUNTPOINT",
                                          help="an absolute path to an empty directory, the same on every host")),)),
    "umount": Command(cmd_umount, "unmount it on every host", "fasterfs umount /mnt/ffs",
                      (("mountpoint", dict(metavar="MOUNTPOINT", help="the path given to `fasterfs mount`")),)),
    "repair": Command(cmd_repair, "put every missing replica or shard back (and pieces moved away back home); names "
                      "chunks that are lost", "fasterfs repair repair.mb_per_s=50"),
    "kernel status": Command(cmd_kernel_status, "what each node's eBPF programs have seen: requests, hot keys, "
                             "latency, tuning", "fasterfs kernel status"),
}

OVERRIDES_RULE = """overrides: KEY=VALUE words whose KEY starts with a top-level option of conf/config.yaml
(nodes=4, cluster.root=/data/ffs, data=synthetic, +x=1, ~x) are Hydra overrides, in any place;
every other word is an argument. After `--` every word is an argument (fasterfs ls -- nodes=1.csv)."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (naming the argument) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = Parser(prog="fasterfs", description=__doc__, epilog=OVERRIDES_RULE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details and show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    groups: dict[str, argparse._SubParsersAction] = {}
    parsers = {}
    for name, c in COMMANDS.items():
        kw: dict[str, Any] = dict(help=c.help, description=c.help,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=f"example:\n  {c.example}\n\n{OVERRIDES_RULE}")
        if " " in name:  # `fasterfs kernel status`
            group, action = name.split(" ", 1)
            if group not in groups:
                groups[group] = sub.add_parser(group, help=f"{group} commands").add_subparsers(
                    dest="action", required=True, metavar="ACTION", parser_class=Parser)
            p = groups[group].add_parser(action, **kw)
        else:
            p = sub.add_parser(name, **kw)
        for arg, spec in c.args:
            p.add_argument(arg, **spec)
        p.add_argument("--nodes", type=int, metavar="N", help="shorthand for the override nodes=N")
        p.add_argument("--cfg", choices=["job"],
                       help="print the composed configuration (as Hydra's --cfg job) and exit")
        for flag, spec in c.flags:
            p.add_argument(flag, **spec)
        parsers[name] = p
    return parser, parsers


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the words argparse reads, the Hydra overrides), by OVERRIDES_RULE. A command that takes
    no arguments hands every KEY=VALUE word to Hydra, which names a key that does not exist."""
    keys: set[str] | None = config.override_keys()
    plain = [w for w in argv if not w.startswith("-")]
    name = next((n for n in (" ".join(plain[:2]), " ".join(plain[:1])) if n in COMMANDS), None)
    if name is not None and not COMMANDS[name].args:
        keys = None
    words: list[str] = []
    overrides: list[str] = []
    for n, word in enumerate(argv):
        if word == "--":
            return words + argv[n:], overrides
        (overrides if config.is_override(word, keys) else words).append(word)
    return words, overrides


def main(argv: list[str] | None = None) -> int:
    parser, parsers = _parser()
    words, overrides = split_overrides(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(words)
    if getattr(args, "action", None):
        args.command = f"{args.command} {args.action}"
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    command = COMMANDS[args.command]
    try:
        cfg = config.load(([f"nodes={args.nodes}"] if args.nodes else []) + overrides)
        if args.cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return 0
        names = [name for name, _ in command.args] + [flag.lstrip("-").replace("-", "_") for flag, _ in command.flags]
        command.run(cfg, **{name: getattr(args, name) for name in names})
    except UsageError as e:  # an argument that parsed but names nothing there: as argparse, exit 2
        parsers[args.command].error(str(e))
    except FasterFSError as e:
        if args.verbose:
            raise
        console.print(f"[red]fasterfs {args.command}: error:[/] {e}", highlight=False)
        return 2 if isinstance(e, ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
