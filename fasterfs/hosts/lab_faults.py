"""The quiet failures of real clusters, made on lab hosts, each undone by its pair:

    fasterfs lab partition 0 1,2 [--one-way]   # host 0 cut from hosts 1 and 2 (or `head`)
    fasterfs lab heal                           # every cut, slow link and full disk undone
    fasterfs lab freeze 1 minio|storage-node    # SIGSTOP: accepts connections, never answers
    fasterfs lab thaw 1 [minio|storage-node]    # SIGCONT
    fasterfs lab slow 2 --mbit 2                # its link at 2 Mbit/s
    fasterfs lab fill 1 [--leave-mb 0]          # its disk full (a lab with lab.disk_mb=N)
    fasterfs lab flip 1 minio|cache [--count 1] # bytes flipped in MinIO's files or cache entries

A cut is a policy-routing rule of preference CUT_PREF in the cut host's own network namespace
(nothing changes on the others or on this machine): what arrives from a peer is dropped, silently,
so both sides wait for timeouts as across a real cut; --one-way drops only what comes from the
peers' listening ports (their replies), so host I cannot open a connection to them while they
still reach it. Frozen processes are recorded by PID and start time, so
`thaw` never signals a process that merely reused the PID. What is in force lives in
<cluster.root>/lab-faults.json; `lab down` undoes all of it before stopping anything.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

from ..control.state import ClusterState
from ..core.errors import FasterFSError
from . import lab_disks
from .lab_network import LINK, tbf_args

CUT_PREF = 1797  # the lab's own ip-rule preference: heal removes these rules and no other
LOCAL_PREF = 1798  # where a cut host's `local` table rule waits meanwhile (after the cuts)
NOTHING: dict = {"cuts": [], "frozen": [], "slow": {}, "filled": [], "flips": []}


def _record_file(state: ClusterState) -> Path:
    return Path(state.root) / "lab-faults.json"


def in_force(state: ClusterState) -> dict:
    f = _record_file(state)
    return json.loads(f.read_text()) if f.exists() else json.loads(json.dumps(NOTHING))


def _save(state: ClusterState, record: dict) -> None:
    f = _record_file(state)
    if record == NOTHING:
        f.unlink(missing_ok=True)
        return
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(f)


def _host(state: ClusterState, index: int):
    if not state.lab or not any(n.index == index for n in state.nodes):
        raise FasterFSError(f"no lab host with node id {index} in cluster {state.name!r} "
                            f"(hosts: {[n.index for n in state.nodes]})")
    return state.node(index)


def _ip(netns: str | None, *args: str) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FasterFSError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def _ephemeral(netns: str | None) -> tuple[int, int]:
    cmd = ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]
    out = subprocess.run(["ip", "netns", "exec", netns, *cmd] if netns else cmd, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def _local_rule_after_cuts(netns: str, restore: bool = False) -> None:
    """Cut rules drop what arrives, which the `local` table's rule (preference 0) would take
    first: in the host's own namespace it moves after them (and back, on heal)."""
    rules = json.loads(subprocess.run(["ip", "-n", netns, "-j", "rule", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    local = {r["priority"] for r in rules if r.get("table") == "local"}
    if not restore and 0 in local:
        _ip(netns, "rule", "add", "pref", str(LOCAL_PREF), "lookup", "local")
        _ip(netns, "rule", "del", "pref", "0", "lookup", "local")
    elif restore and LOCAL_PREF in local:
        _ip(netns, "rule", "add", "pref", "0", "lookup", "local")
        _ip(netns, "rule", "del", "pref", str(LOCAL_PREF), "lookup", "local")


def _rules(peer: str, one_way: bool, peer_ns: str | None) -> list[list[str]]:
    """The rules, on the cut host, that drop what arrives from `peer`: all of it (both ways: the
    peer's packets are lost, and so are its replies to the host's), or (one_way) only what comes
    from the peer's listening ports (ports outside its ephemeral range): the replies to the
    connections the host opens, so it cannot reach the peer while the peer still reaches it."""
    arrives = ["from", f"{peer}/32", "iif", LINK]
    if not one_way:
        return [[*arrives, "blackhole"]]
    lo, hi = _ephemeral(peer_ns)
    # (iproute2 refuses a range ending at 65535: 65534, and nothing of ours listens on 65535)
    return [[*arrives, "ipproto", "tcp", "sport", ports, "blackhole"] for ports in (f"1-{lo - 1}", f"{hi + 1}-65534")]


def partition(state: ClusterState, index: int, peers: list[str], one_way: bool = False) -> dict:
    """Cut host `index` from `peers` (host ids, or "head"): both ways, or (one_way) so that it
    cannot reach them while they still reach it. Packets are dropped where they arrive, silently,
    as a cut network loses them: whoever waits for an answer waits for its timeout."""
    me = _host(state, index)
    ends = []
    for p in peers:
        if p == "head":
            ends.append(("head", state.head_address, None))
        else:
            peer = _host(state, int(p))
            if peer.index == index:
                raise FasterFSError(f"lab partition: host {index} cannot be cut from itself")
            ends.append((str(peer.index), peer.address, peer.netns))
    netns = str(me.netns)
    _local_rule_after_cuts(netns)
    record = in_force(state)
    for name, address, peer_ns in ends:
        for rule in _rules(address, one_way, peer_ns):
            _ip(netns, "rule", "add", "pref", str(CUT_PREF), *rule)
            record["cuts"].append({"host": index, "peer": name, "one_way": one_way, "netns": netns, "rule": rule})
        _save(state, record)
    return {"host": index, "peers": [n for n, _, _ in ends], "one_way": one_way}


def slow(state: ClusterState, index: int, mbit: float) -> None:
    """Host `index`'s link to the others at `mbit` Mbit/s (a tbf in place of the profile's)."""
    if mbit <= 0:
        raise FasterFSError(f"lab slow: --mbit {mbit} must be > 0")
    node = _host(state, index)
    burst = (state.lab or {}).get("burst_kb", 256)
    subprocess.run(["ip", "netns", "exec", node.netns, *tbf_args("replace", LINK, mbit, burst)], check=True,
                   capture_output=True)
    record = in_force(state)
    record["slow"][str(index)] = mbit
    _save(state, record)


def fill(state: ClusterState, index: int, leave_mb: float = 0) -> int:
    node = _host(state, index)
    size = lab_disks.fill(Path(node.disk), leave_mb)
    record = in_force(state)
    if index not in record["filled"]:
        record["filled"].append(index)
    _save(state, record)
    return size


def heal(state: ClusterState) -> dict:
    """Undo every cut, slow link and full disk in force; returns how many of each."""
    record = in_force(state)
    done = {"cuts": 0, "slow": 0, "filled": 0}
    for cut in record["cuts"]:
        try:
            _ip(cut["netns"], "rule", "del", "pref", str(CUT_PREF), *cut["rule"])
            done["cuts"] += 1
        except FasterFSError:
            pass  # its namespace is gone (a host powered off and removed): so is the rule
    for netns in {cut["netns"] for cut in record["cuts"]}:
        try:
            _local_rule_after_cuts(netns, restore=True)
        except (FasterFSError, subprocess.CalledProcessError):
            pass
    for index in record["slow"]:
        node = state.node(int(index))
        lab = state.lab or {}
        link = lab.get("link_mbit")
        cmd = tbf_args("replace", LINK, link, lab.get("burst_kb", 256)) if link else \
            ["tc", "qdisc", "del", "dev", LINK, "root"]
        subprocess.run(["ip", "netns", "exec", str(node.netns), *cmd], capture_output=True)
        done["slow"] += 1
    for index in record["filled"]:
        done["filled"] += lab_disks.unfill(Path(str(state.node(index).disk)))
    record.update(cuts=[], slow={}, filled=[])
    _save(state, record)
    return done


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


WHAT = ("minio", "storage-node")


def freeze(state: ClusterState, index: int, what: str) -> int:
    """SIGSTOP host `index`'s MinIO or StorageNode: alive, connections accepted by the kernel,
    nothing answered. Returns the PID frozen."""
    from ..control.node_directory import NodeDirectory
    from ..control.state import connect_ray

    if what not in WHAT:
        raise FasterFSError(f"lab freeze: {what!r} is not one of {', '.join(WHAT)}")
    _host(state, index)
    ray = connect_ray(state)  # this lab's Ray, whichever others run on the machine
    status = ray.get(NodeDirectory(state.ray_namespace).require(index).status.remote(), timeout=60)
    pid = status["minio_pid"] if what == "minio" else status["actor_pid"]
    if not pid:
        raise FasterFSError(f"lab freeze: host {index}'s {what} is not running")
    os.kill(pid, signal.SIGSTOP)
    record = in_force(state)
    record["frozen"].append({"host": index, "what": what, "pid": pid, "start": _start_time(pid)})
    _save(state, record)
    return pid


def thaw(state: ClusterState, index: int | None = None, what: str | None = None) -> int:
    """SIGCONT what freeze stopped (on host `index`, of kind `what`; None: all). Returns how many."""
    record = in_force(state)
    keep, done = [], 0
    for f in record["frozen"]:
        if (index is None or f["host"] == index) and (what is None or f["what"] == what):
            if _start_time(f["pid"]) == f["start"]:  # the same process, not a reuse of its PID
                os.kill(f["pid"], signal.SIGCONT)
                done += 1
        else:
            keep.append(f)
    record["frozen"] = keep
    _save(state, record)
    return done


def flip(state: ClusterState, index: int, where: str, count: int = 1, seed: int = 0) -> list[dict]:
    """Flip one byte in each of `count` files (0: all) of host `index`'s disk: MinIO's object
    data files (where="minio") or cache entries (where="cache"), chosen by `seed`, as bit rot would.
    Returns what was flipped (path, offset)."""
    from ..core.config import Paths

    node = _host(state, index)
    disk_paths = Paths(Path(node.disk))
    base = {"minio": disk_paths.node_dir(index) / "minio", "cache": disk_paths.cache_dir(index)}.get(where)
    if base is None:
        raise FasterFSError(f"lab flip: {where!r} is not one of minio, cache")
    # MinIO's object data (part.N: a bad sector in the data; its metadata, xl.meta, is MinIO's
    # own business), or the cache's entries; never the dot directories (MinIO's system files)
    files = sorted(p for p in base.rglob("*") if p.is_file() and p.stat().st_size > 64
                   and (where == "cache" or p.name.startswith("part."))
                   and not any(part.startswith(".") for part in p.relative_to(base).parts))
    if len(files) < count or not files:
        raise FasterFSError(f"lab flip: host {index} has {len(files)} {where} files under {base}, {count} asked")
    rng = random.Random(seed)
    flipped = []
    for path in rng.sample(files, count or len(files)):
        size = path.stat().st_size
        offset = rng.randrange(size // 2, size)  # the payload's half: a header flip is a different failure
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 0xFF]))
        flipped.append({"path": str(path), "offset": offset})
    record = in_force(state)
    record["flips"] += [dict(host=index, where=where, **f) for f in flipped]
    _save(state, record)
    return flipped


def undo_all(state: ClusterState) -> dict:
    """What `lab down` does first: thaw everything (a stopped process ignores SIGTERM), heal."""
    thawed = thaw(state)
    healed = heal(state)
    _record_file(state).unlink(missing_ok=True)
    return dict(healed, thawed=thawed)

