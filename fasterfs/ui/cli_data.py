"""`fasterfs ingest / put / ls / cat / rm`: the namespace's data, written and read."""
from __future__ import annotations

import sys

from ..control import report
from ..core.errors import FasterFSError

console = report.console()


def cmd_ingest(cfg) -> None:
    from rich.progress import Progress

    from ..write.ingest import ingest

    with Progress(console=console) as bar:
        task = bar.add_task(f"ingesting {cfg.data.name}", total=None)
        manifest = ingest(cfg, progress=lambda done, total: bar.update(task, completed=done, total=total))
    per_node = [len(manifest.on_node(i)) for i in range(manifest.node_count)]
    console.print(f"[green]ingested[/] {manifest.dataset}: {manifest.rows} rows in {len(manifest)} {manifest.format} "
                  f"chunks ({report.fmt_bytes(manifest.total_bytes)}), {manifest.redundancy()}, "
                  f"chunks per node {per_node}")


def cmd_put(cfg, sources: list[str], dest: str, force: bool = False, recursive: bool = False) -> None:
    from ..write.ingest import put

    if recursive:
        from ..write.bulk_load import LocalTree

        for src in sources:
            into = dest if len(sources) == 1 else f"{dest.rstrip('/')}/{src.rstrip('/').rsplit('/', 1)[-1]}"
            _bulk(cfg, LocalTree(src), into, force, f"put -r {src} -> {into}")
        return
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


def cmd_import(cfg, source: str, dest: str, endpoint: str, keys: str | None = None, force: bool = False) -> None:
    from ..write.bulk_load import S3Prefix, source_credentials

    _bulk(cfg, S3Prefix(source, endpoint, source_credentials(keys)), dest, force, f"import {source} -> {dest}",
          remote=True)


def _bulk(cfg, source, dest: str, force: bool, title: str, remote: bool = False) -> None:
    """A tree of files into the namespace with a progress bar (files, and bytes stored)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..write.bulk_load import load

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stored]}"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(title, total=None, stored="")
        done = load(cfg, source, dest, force, remote=remote, progress=lambda files, total, size: bar.update(
            task, completed=files, total=total, stored=report.fmt_bytes(size)))
    console.print(f"[green]stored[/] {done.stored} files ({report.fmt_bytes(done.bytes)}) in {done.batches} batches, "
                  f"{done.skipped} already there, in {done.seconds:.1f} s "
                  f"({done.files / max(done.seconds, 1e-9):.0f} files/s)")


def _namespace(cfg):
    from ..read.reader import Namespace

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
    from ..write.ingest import remove

    for name in names:
        m = remove(cfg, name)
        console.print(f"removed {m.kind} {m.name} ({report.fmt_bytes(m.total_bytes)}); readers holding it keep "
                      f"reading it for ingest.keep_old_s={cfg.ingest.keep_old_s:g} s")
