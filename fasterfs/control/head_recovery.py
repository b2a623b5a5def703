"""A head rebuilt from what the storage hosts hold: the namespace and the MinIO keys.

Every StorageNode keeps, on its own disk beside its data, a Replica of the namespace (every
change fsynced there before the Registry acknowledges it: fasterfs.meta.replica) and a 0600
copy of the cluster's MinIO keys. `fasterfs up` asks every host what it holds (`survey`, a
task pinned to each) before the Registry opens the head's store, and `plan` decides:

- the head's store is empty and a host holds names: the newest replica is taken (verified on
  its host: SQLite's check, and its rows give the digest it records), and said where from;
- replicas at the newest version that disagree (other digests), or a head store behind a
  replica (an old disk put back), or hosts holding objects with no namespace anywhere:
  refused, naming what was found where — never an empty namespace over stored data;
- the head lost its keys: the hosts' copy is taken when every copy agrees.

`plan` is a plain function of what the hosts said: tested without Ray.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..core.config import Paths
from ..core.errors import FasterFSError
from ..meta.replica import FILE as REPLICA_FILE
from ..meta.replica import Replica, Summary
from . import credentials, identity

log = logging.getLogger("fasterfs.control.head_recovery")


def _fingerprint(keys: credentials.ClusterKeys) -> str:
    text = json.dumps([keys.admin.access_key, keys.admin.secret_key, keys.reader.access_key, keys.reader.secret_key])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _holds_objects(minio_dir: Path) -> bool:
    """Any object file under a node's MinIO directory (MinIO's own .minio.sys aside)."""
    if not minio_dir.is_dir():
        return False
    for top in os.scandir(minio_dir):
        if top.name == ".minio.sys" or not top.is_dir(follow_symlinks=False):
            continue
        for _, _, files in os.walk(top.path):
            if files:
                return True
    return False


def survey(root: str, cluster: str) -> dict:
    """What this host holds of `cluster` (run in a task pinned to it): per node directory of
    it, its replica's summary, a fingerprint of its keys' copy (the keys stay here), and whether
    its MinIO holds objects. With `identity.probe`'s answer for the same host."""
    out = identity.probe(root, cluster)
    held = []
    for ident in out["identities"]:
        d = Path(root) / f"node-{ident['node']}"
        replica = d / REPLICA_FILE
        keys = d / credentials.NODE_COPY
        fp = None
        if keys.exists():
            try:
                fp = _fingerprint(credentials.load(keys))
            except FasterFSError as e:
                fp = f"unusable: {e}"
        held.append({"node": ident["node"], "dir": str(d),
                     "replica": Replica.summary(replica).to_dict() if replica.exists() else None,
                     "keys": fp, "objects": _holds_objects(d / "minio")})
    return dict(out, held=held)


def read_replica(path: str) -> tuple[dict, list[str]]:
    """A replica's verified summary and manifests' texts (run on the host holding it)."""
    s, texts = Replica.verified(Path(path))
    return s.to_dict(), texts


def read_keys(path: str) -> credentials.ClusterKeys:
    """A host's copy of the keys (run on that host; checked as the head's own file is)."""
    p = Path(path)
    mode = stat.S_IMODE(os.stat(p).st_mode)
    if mode & 0o077:
        raise FasterFSError(f"keys file {p} has mode {mode:o}; it must be 0600")
    return credentials.load(p)


@dataclass
class Plan:
    """What `up` does before the Registry opens the head's store."""
    replica: tuple[str, Summary] | None = None   # (host address, the replica) to take the namespace from
    keys_from: tuple[str, str] | None = None     # (host address, path) of the keys' copy to take
    found: list[str] = field(default_factory=list)  # what each host holds, one line each (for the report)


def plan(hosts: list[dict], head_names: int, head_version: int, head_has_keys: bool) -> Plan:
    """hosts: `survey` answers, each with its "address". Raises FasterFSError naming the host and
    file at fault when the head must not start."""
    out = Plan()
    good: list[tuple[str, Summary]] = []
    with_objects: list[str] = []
    keys: dict[str, list[tuple[str, str]]] = {}  # fingerprint -> [(address, path)]
    seen: set[tuple[int, str]] = set()
    for h in hosts:
        for held in h.get("held", []):
            if (held["node"], held["dir"]) in seen:  # one machine's hosts share one disk: each reports every node's
                continue
            seen.add((held["node"], held["dir"]))
            where = f"{h['address']}:{held['dir']}"
            if held["objects"]:
                with_objects.append(where)
            if held["keys"] and not held["keys"].startswith("unusable"):
                keys.setdefault(held["keys"], []).append((h["address"], str(Path(held["dir"]) / credentials.NODE_COPY)))
            r = held["replica"]
            if r is None:
                out.found.append(f"{where}: no namespace replica" + (", objects stored" if held["objects"] else ""))
                continue
            s = Summary(**r)
            if s.error:
                out.found.append(f"{where}: namespace replica not usable ({s.error})")
                continue
            out.found.append(f"{where}: namespace replica at version {s.version}, {s.names} names")
            good.append((h["address"], s))
    if not head_has_keys:
        if len(keys) > 1:
            raise FasterFSError("the head has no MinIO keys and the storage hosts' copies differ: "
                                + "; ".join(f"{[f'{a}:{p}' for a, p in w]}" for w in keys.values())
                                + ": put the right one at the head's credentials.json (0600)")
        if keys:
            out.keys_from = next(iter(keys.values()))[0]
        elif with_objects:
            raise FasterFSError(f"the head has no MinIO keys, and {with_objects} hold objects stored under keys no "
                                "host has a copy of: restore the head's credentials.json, or move that data away")
    if not good:
        if head_names == 0 and with_objects:
            raise FasterFSError(f"the head's namespace is empty and no host holds a replica of it, yet {with_objects} "
                                "hold objects: refusing to start an empty namespace over stored data (restore the "
                                "head's namespace store, or move that data away)")
        return out
    newest = max(s.version for _, s in good)
    at_newest = [(a, s) for a, s in good if s.version == newest]
    if len({s.digest for _, s in at_newest}) > 1:
        raise FasterFSError(f"the storage hosts' namespace replicas at version {newest} disagree: "
                            + "; ".join(f"{a}:{s.path} digest {s.digest} ({s.names} names)" for a, s in at_newest)
                            + ": none is taken; move the wrong one away")
    address, best = at_newest[0]
    if head_names == 0 and best.names > 0:
        out.replica = (address, best)
    elif head_names and newest > head_version:
        raise FasterFSError(f"the head's namespace store reaches version {head_version}, but {address}:{best.path} "
                            f"holds version {newest} ({best.names} names): the head's store is behind (an old copy?). "
                            "Move the head's store away and `up` recovers from the hosts")
    return out


def restore(root: Path, engine_kind: str, cluster: str, host_task, the_plan: Plan) -> dict | None:
    """Carry out `the_plan` on the head's disk, before its Registry opens the store:
    `host_task(address, fn, *args)` runs fn on that host and returns its result. Returns what
    was recovered from where (None: nothing was)."""
    from ..core.manifest import decode_many
    from ..meta import NamespaceStore, open_engine

    paths = Paths(Path(root))
    done: dict = {}
    if the_plan.keys_from is not None:
        address, path = the_plan.keys_from
        credentials.save(paths.credentials_file, host_task(address, read_keys, path))
        done["keys"] = f"{address}:{path}"
    if the_plan.replica is not None:
        address, s = the_plan.replica
        summary, texts = host_task(address, read_replica, s.path)
        manifests = decode_many(texts, f"the namespace replica {address}:{s.path}")
        from ..core.manifest import object_prefix

        store = NamespaceStore(open_engine(engine_kind, paths.root), cluster, lambda method, arg: [])
        try:
            store.adopt(manifests, [{"dataset": m.name, "generation": m.generation,
                                     "prefix": object_prefix(m.name, m.kind), "replaced": None} for m in manifests], [],
                        version=summary["version"])  # the hosts' copies go on from theirs
        finally:
            store.engine.close()
        done["namespace"] = {"from": f"{address}:{s.path}", "version": summary["version"], "names": len(manifests)}
    if done:
        done["found"] = the_plan.found
        log.warning("the head was rebuilt from its storage hosts: %s", done)
    return done or None


def head_store(root: Path, engine_kind: str, cluster: str) -> tuple[int, int]:
    """(names, version) of the head's own namespace store."""
    from ..meta import open_engine

    engine = open_engine(engine_kind, Path(root))
    try:
        return engine.count(), engine.version()
    finally:
        engine.close()


# -- run by `up` on the head (fasterfs.ops.cluster) ---------------------------------------------


def on_ray_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def survey_hosts(cfg, state, head_id: str) -> tuple[dict[str, str], list[dict]]:
    """Every storage host's answer to FasterFS's probe (`survey`): who it
    is, the node ids its disk records, the namespace replica and keys it holds. Returns the
    Ray node id of each alive address and the answers (each with its "address")."""
    import ray

    alive = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    if state.attached:  # every node of the Ray cluster (the head too, unless told otherwise)
        addresses = sorted(a for a, nid in alive.items() if cfg.cluster.storage_on_head or nid != head_id)
    else:
        addresses = [n.address for n in state.nodes]
    if not addresses:
        raise FasterFSError(f"the Ray cluster at {state.ray_address} has no node to put a StorageNode on")
    probe = ray.remote(num_cpus=0)(survey)
    refs = {a: probe.options(scheduling_strategy=on_ray_node(alive[a])).remote(state.root, state.name)
            for a in addresses}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg.cluster.start_timeout_s)
    silent = [a for a, ref in refs.items() if ref not in done]
    if silent:
        raise FasterFSError(f"hosts {silent} did not answer FasterFS's probe within {cfg.cluster.start_timeout_s} s")
    answers: dict[str, dict] = {a: ray.get(refs[a]) for a in addresses}
    return alive, [dict(answers[a], address=a) for a in addresses]


def _run_on(alive: dict[str, str], timeout: float):
    """`restore`'s `host_task`: fn(*args) in a task pinned to the host at `address`."""
    import ray

    def run(address: str, fn, *args):
        return ray.get(ray.remote(num_cpus=0)(fn).options(scheduling_strategy=on_ray_node(alive[address]))
                       .remote(*args), timeout=timeout)
    return run


def recover_head(cfg, state, alive: dict[str, str], hosts: list[dict]) -> None:
    """The head's namespace and keys from the storage hosts when the head lost them; refused
    when what the hosts hold does not allow a safe start."""
    kind = cfg.cluster.namespace_store
    names, version = head_store(Path(state.root), kind, state.name)
    the_plan = plan(hosts, names, version, Paths(Path(state.root)).credentials_file.exists())
    state.recovered = restore(Path(state.root), kind, state.name, _run_on(alive, cfg.cluster.start_timeout_s),
                              the_plan)
