"""`fasterfs nodes ...`: machines joining and leaving the running cluster (fasterfs.ops.node_join)."""
from __future__ import annotations

from ..control import report

console = report.console()


def how_many(text: str) -> int:
    """argparse type of `nodes add` and `lab add-host`'s COUNT: 1 or more."""
    import argparse

    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: give how many machines join, 1 or more")


def cmd_nodes_add(cfg, count: int = 1) -> None:
    from ..ops import attached_growth

    with console.status("adding nodes: their StorageNodes, MinIO, kernel programs and caches"):
        added = attached_growth.add_nodes(cfg, count)
    for node in added:
        print_joined(node)
    if not added:  # asked from a machine that joined earlier (cluster.yaml's worker start commands run again)
        console.print("every Ray node has its StorageNode already: nothing to add", highlight=False)


def print_joined(node) -> None:
    console.print(f"node {node.index} joined at {node.address} (Ray node {(node.ray_node_id or '-')[:12]}): every name "
                  "is now placed over every node; the repair leader moves the new node's share to it in the background"
                  " (repair.mb_per_s a node); `fasterfs status` shows the pieces left to move", highlight=False)


def cmd_nodes_drain(cfg, node: int) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ..ops import node_join

    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as bar:
        task = bar.add_task(f"moving node {node}'s pieces to the others", total=None)
        done = node_join.drain(cfg, node, lambda moved, total: bar.update(task, completed=moved, total=total))
    pace = f"at most {done['mb_per_s']:g} MB/s a node" if done["mb_per_s"] else "each node's repair.mb_per_s"
    console.print(f"node {done['node']} ({done['address']}) drained and stopped: {done['moved']} pieces moved, "
                  f"{report.fmt_bytes(done['bytes'])} in {done['seconds']:.1f} s ({pace}); "
                  "the namespace names nothing on it"
                  + ("; its Ray node runs on, its owner's to remove (`ray down`, or the machine out of cluster.yaml's"
                     " worker_ips and `ray up`)" if done["ray_node_left"] else ""), highlight=False)


def cmd_nodes_restart(cfg, nodes: list[int]) -> None:
    from ..ops import node_join

    def one(done: dict) -> None:
        served = "its MinIO and mounts served on" if done["minio_served_on"] else "its MinIO started anew"
        console.print(f"node {done['node']} restarted in {done['seconds']:.1f} s ({served})", highlight=False)
    changed = node_join.restart(cfg, nodes, node_join.settings_given(cfg), one)[1]
    console.print("restarted with " + (", ".join(f"{k}={v}" for k, v in changed.items()) or "the settings it had"),
                  highlight=False)
