"""`fasterfs lab ...`: share-nothing hosts on this machine (fasterfs.ops.lab), made and broken."""
from __future__ import annotations

from ..control import report
from ..core import config
from ..core.errors import UsageError
from ..ops import cluster
from .cli_cluster import cmd_status, print_recovered
from .cli_nodes import print_joined

console = report.console()


def cmd_lab_up(cfg) -> None:
    from ..ops import lab

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
    from ..ops import lab

    with console.status("stopping the lab"):
        report = lab.down(cfg)
    console.print(f"[green]FasterFS lab down[/]: {report['actors_stopped']} StorageNodes and "
                  f"{report['ray_nodes_stopped']} Ray nodes stopped; {report.get('lab_removed', 0)} namespaces, "
                  "links and bridges removed")


def cmd_lab_exec(cfg, node: int, command: list[str]) -> int:
    """Run a command on a lab host, as on that machine (its own files and network)."""
    import os

    from ..ops import lab

    state = _lab_state(cfg, node)
    args = lab.exec_args(state, node, list(command))
    os.execvp(args[0], args)


def _lab_state(cfg, node: int):
    state = cluster.ClusterState.load(config.Layout.of(cfg).paths.root)
    if node not in [n.index for n in state.nodes]:
        raise UsageError(f"argument NODE: lab host {node} does not exist (hosts: {[n.index for n in state.nodes]})")
    return state


def host_or_head(text: str) -> int | str:
    """argparse type of `lab power-off/on`'s NODE: a host's id, or head."""
    import argparse

    if text == "head" or text.isdigit():
        return text if text == "head" else int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: give a lab host's node id (0, 1, ...) or head")


def cmd_lab_power_off(cfg, node: int | str) -> None:
    from ..ops import lab

    if node == "head":
        killed = lab.power_off_head(cluster.ClusterState.load(config.Layout.of(cfg).paths.root))
        console.print(f"the lab's head powered off: {killed} processes killed at once; the hosts run on, waiting "
                      "for it; `fasterfs lab power-on head` brings it back")
        return
    assert isinstance(node, int)
    state, index = _lab_state(cfg, node), node
    killed = lab.power_off(state, index)
    console.print(f"lab host {index} powered off: {killed} processes killed at once; its disk is kept")


def cmd_lab_add_host(cfg, count: int = 1) -> None:
    from ..ops import lab

    with console.status("adding lab hosts" if count > 1 else "adding a lab host"):
        added = lab.add(cfg, count)
    for node in added:
        print_joined(node)


def cmd_lab_power_on(cfg, node: int | str, empty: bool = False) -> None:
    from ..ops import lab

    if node == "head":
        with console.status("starting the lab's head"):
            state = lab.power_on_head(cfg, empty)
        if empty:
            console.print("the lab's head back with a blank disk; the hosts started again on their disks")
            if state.recovered:
                print_recovered(state.recovered)
        else:
            resumed = state.resumed or {}
            console.print(f"the lab's head back: kept running {resumed.get('kept')}, StorageNodes started again "
                          f"{resumed.get('restarted')}", highlight=False)
        return
    assert isinstance(node, int)
    _lab_state(cfg, node)
    index = node
    with console.status(f"starting lab host {index}"):
        state = lab.power_on(cfg, index, empty)
    console.print(f"lab host {index} back{' with a blank disk' if empty else ''}: Ray node "
                  f"{(state.node(index).ray_node_id or '-')[:12]}, StorageNode up; "
                  f"`fasterfs repair` (or the StorageNodes after repair.check_s) refills it")


def peer_list(text: str) -> list[str]:
    """argparse type of `lab partition`'s PEERS: host ids and/or head, comma-separated."""
    import argparse

    peers = [p.strip() for p in text.split(",") if p.strip()]
    if not peers or not all(p == "head" or p.isdigit() for p in peers):
        raise argparse.ArgumentTypeError(f"{text!r}: give host ids and/or 'head', comma-separated (1,2 or head)")
    return peers


def _lab_faults(cfg, node: int | None = None):
    from ..hosts import lab_faults

    state = _lab_state(cfg, node) if node is not None else cluster.ClusterState.load(config.Layout.of(cfg).paths.root)
    return lab_faults, state


def cmd_lab_partition(cfg, node: int, peers: list[str], one_way: bool = False) -> None:
    faults, state = _lab_faults(cfg, node)
    faults.partition(state, node, peers, one_way)
    how = "cannot reach" if one_way else "cut both ways from"
    console.print(f"lab host {node} {how} {', '.join(peers)}; `fasterfs lab heal` undoes it")


def cmd_lab_heal(cfg) -> None:
    faults, state = _lab_faults(cfg)
    done = faults.heal(state)
    console.print(f"lab healed: {done['cuts']} cut rules removed, {done['slow']} links back to their profile, "
                  f"{done['filled']} disks emptied of their filler")


def cmd_lab_freeze(cfg, node: int, what: str) -> None:
    faults, state = _lab_faults(cfg, node)
    pid = faults.freeze(state, node, what)
    console.print(f"lab host {node}'s {what} frozen (pid {pid}, SIGSTOP); `fasterfs lab thaw {node}` undoes it")


def cmd_lab_thaw(cfg, node: int, what: str | None = None) -> None:
    faults, state = _lab_faults(cfg, node)
    console.print(f"lab host {node}: {faults.thaw(state, node, what)} processes thawed (SIGCONT)")


def cmd_lab_slow(cfg, node: int, mbit: float) -> None:
    faults, state = _lab_faults(cfg, node)
    faults.slow(state, node, mbit)
    console.print(f"lab host {node}'s link limited to {mbit:g} Mbit/s; `fasterfs lab heal` undoes it")


def cmd_lab_fill(cfg, node: int, leave_mb: float = 0) -> None:
    faults, state = _lab_faults(cfg, node)
    size = faults.fill(state, node, leave_mb)
    console.print(f"lab host {node}'s disk filled ({report.fmt_bytes(size)} of filler, {leave_mb:g} MB left free); "
                  "`fasterfs lab heal` undoes it")


def cmd_lab_flip(cfg, node: int, where: str, count: int = 1, seed: int = 0) -> None:
    faults, state = _lab_faults(cfg, node)
    for f in faults.flip(state, node, where, count, seed):
        console.print(f"flipped the byte at {f['offset']} of {f['path']}")
