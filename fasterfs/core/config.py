"""Configuration: the Hydra configs under conf/, composed with command-line overrides.

The CLI, the jobs and the notebooks all call `load(overrides)`, so an override such
as `nodes=4 data.rows_per_chunk=500` means the same thing everywhere.
"""
from __future__ import annotations

import functools
import ipaddress
import os
import pickle
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from . import composition
from .composition import one_line
from .errors import ConfigError, FasterFSError

# the values of options that name an implementation (fasterfs.node.cache, fasterfs.meta)
CACHE_POLICIES = ("s3fifo", "lru")
NAMESPACE_STORES = ("sqlite", "redis")
PROJECT_DIR = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_DIR / "conf"


def lobster_dir() -> str:
    """Where the LOBSTER sample is: FASTERFS_LOBSTER_DIR, else ../shared/data/lobster beside
    this checkout."""
    env = os.environ.get("FASTERFS_LOBSTER_DIR")
    return env or str((PROJECT_DIR.parent / "shared" / "data" / "lobster").resolve())


if not OmegaConf.has_resolver("lobster_dir"):
    OmegaConf.register_new_resolver("lobster_dir", lobster_dir)


def load(overrides: Sequence[str] = (), lab: bool = False) -> DictConfig:
    """Compose conf/config.yaml (with the lab group where `config_name` says) with Hydra
    overrides and check the result: a copy (unpickled: 0.9 ms, a deepcopy 7.7 ms) of the one
    composed before for the same overrides and FASTERFS_* environment (what conf/ reads of it)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("FASTERFS_")))
    return pickle.loads(_composed(tuple(overrides), env, _in_job(), config_name(overrides, lab)))


def _in_job() -> bool:
    """Inside a job's @hydra.main (Hydra then imported already: importing it only to ask takes
    a tenth of a second)."""
    if "hydra.core.global_hydra" not in sys.modules:
        return False
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().is_initialized()


def config_name(overrides: Sequence[str], lab: bool = False) -> str:
    """conf/with_lab.yaml for the lab's commands (lab=True) and wherever an override names the
    lab group (`lab=unlimited`, `lab.subnet=...`); conf/config.yaml, without it, elsewhere."""
    named = any((m := OVERRIDE.match(o)) and m.group(2) == "lab" for o in overrides)
    return "with_lab" if lab or named else "config"


@functools.lru_cache(maxsize=128)
def _composed(overrides: tuple[str, ...], env: tuple, in_job: bool, name: str) -> bytes:
    """The composition, pickled for load's copies: from this user's disk cache where another
    process composed it (fasterfs.core.config_cache), else by Hydra, then kept there."""
    from . import config_cache

    cached = None if in_job else config_cache.key(overrides, env, name, str(PROJECT_DIR), conf_dir=CONF_DIR)
    kept = config_cache.get(cached) if cached else None
    if kept is not None:
        cfg = OmegaConf.create(kept)
        OmegaConf.set_struct(cfg, True)  # as Hydra composes it: an unknown key is an error
        return pickle.dumps(checked(cfg))
    cfg = checked(composition.compose(CONF_DIR, overrides, in_job, name))
    if cached:
        config_cache.put(cached, cast(dict, OmegaConf.to_container(cfg)))
    return pickle.dumps(cfg)


OVERRIDE = re.compile(r"(\+{1,2}|~)?([A-Za-z_]\w*)(?:\.[\w-]+)*(=|$)")


def override_keys() -> set[str]:
    """What a Hydra override may start with: conf/config.yaml's top-level keys, its config
    groups (conf/<group>/) and hydra."""
    import yaml  # libyaml's parser: a tenth of OmegaConf.load's time, paid by every command

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    top = set(yaml.load((CONF_DIR / "config.yaml").read_bytes(), Loader=loader)) - {"defaults"}
    return top | {p.name for p in CONF_DIR.iterdir() if p.is_dir()} | {"hydra"}


def is_override(word: str, keys: set[str] | None) -> bool:
    """`nodes=4`, `data=synthetic`, `+x.y=1`, `~x`: an override; `nodes.csv`, `a=b.csv`, `dir/x=1`: not.
    keys=None: any key (Hydra then names one that does not exist)."""
    m = OVERRIDE.match(word)
    return m is not None and (keys is None or m.group(2) in keys) and (m.group(3) == "=" or m.group(1) == "~")


def checked(cfg: DictConfig) -> DictConfig:
    """`cfg` resolved and validated."""
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:  # an interpolation that cannot be resolved, e.g. a bad ${oc.env:...}
        raise ConfigError(f"bad configuration: {one_line(e)}") from None
    validate(cfg)
    return cfg


def mode(text) -> int:
    """A file mode written in octal ("0440"); ValueError unless 0 to 0o777."""
    value = int(str(text), 8)
    if not 0 <= value <= 0o777:
        raise ValueError(text)
    return value


def validate(cfg: DictConfig) -> None:
    def bad(option: str, why: str):
        raise ConfigError(f"option {option}={OmegaConf.select(cfg, option)!r}: {why}")

    if not isinstance(cfg.nodes, int) or cfg.nodes < 1:
        bad("nodes", "must be a whole number >= 1")
    if cfg.nodes > 250:
        bad("nodes", "at most 250 nodes fit in the loopback addresses FasterFS assigns")
    if not isinstance(cfg.replicas, int) or not 1 <= cfg.replicas <= cfg.nodes:
        bad("replicas", f"must be between 1 and nodes={cfg.nodes}")
    if not isinstance(cfg.data.rows_per_chunk, int) or cfg.data.rows_per_chunk < 1:
        bad("data.rows_per_chunk", "must be a whole number >= 1")
    if cfg.data.format not in ("csv", "arrow"):
        bad("data.format", "must be csv or arrow")
    if not isinstance(cfg.data.level, int) or cfg.data.level < 1:
        bad("data.level", "must be a whole number >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", str(cfg.cluster.name)):
        bad("cluster.name", "use 1-40 letters, digits, '-' or '_'")
    if cfg.cluster.namespace_store not in NAMESPACE_STORES:
        bad("cluster.namespace_store", f"must be one of {', '.join(NAMESPACE_STORES)}")
    if not isinstance(cfg.cluster.durable_copies, int) or cfg.cluster.durable_copies < 1:
        bad("cluster.durable_copies", "must be a whole number >= 1 (the head's store counts as one)")
    if cfg.dashboard.require_token not in ("auto", "always"):
        bad("dashboard.require_token", "must be auto or always")
    for flag in ("cluster.insecure", "credentials.rotate", "minio.tls"):
        if not isinstance(OmegaConf.select(cfg, flag), bool):
            bad(flag, "must be true or false")
    if not isinstance(cfg.kernel.hot_threshold, int) or cfg.kernel.hot_threshold < 1:
        bad("kernel.hot_threshold", "must be a whole number >= 1")
    if not isinstance(cfg.cache.capacity_mb, (int, float)) or cfg.cache.capacity_mb < 0:
        bad("cache.capacity_mb", "must be a number of megabytes >= 0")
    if not isinstance(cfg.cache.peer_slower_ms, (int, float)) or cfg.cache.peer_slower_ms < 0:
        bad("cache.peer_slower_ms", "must be a number of milliseconds >= 0 (0: peers only when holders are down)")
    if not isinstance(cfg.cache.prefetch.window, int) or cfg.cache.prefetch.window < 0:
        bad("cache.prefetch.window", "must be a whole number >= 0")
    shed = cfg.namespace.shed_read_ahead_above
    if not isinstance(shed, (int, float)) or isinstance(shed, bool) or not 0 <= shed <= 100:
        bad("namespace.shed_read_ahead_above", "must be a percentage, 0 to 100")
    for opt in ("ingest.keep_old_s", "cluster.idle_worker_s"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            bad(opt, "must be a number of seconds >= 0")
    for opt in ("files.batch_files", "files.batch_mb", "files.threads", "namespace.cached_paths"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(opt, "must be a whole number >= 1")
    for opt in ("repair.after_s", "repair.mb_per_s", "scrub.interval_s", "scrub.mb_per_s"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            bad(opt, "must be a number >= 0")
    for opt in ("client.hedge.min_ms", "client.hedge.first_ms"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            bad(opt, "must be a number of milliseconds >= 0")
    f = cfg.client.hedge.factor
    if not isinstance(f, (int, float)) or isinstance(f, bool) or f < 1:
        bad("client.hedge.factor", "must be a number >= 1 (times a MinIO's average GET here)")
    disk_mb = cfg.lab.get("disk_mb") if "lab" in cfg else None
    if disk_mb is not None and (not isinstance(disk_mb, int) or disk_mb < 64):
        bad("lab.disk_mb", "must be null (a directory) or a whole number of MB >= 64")
    for opt in ("repair.check_s", "repair.survey_s", "mount.hung_s"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            bad(opt, "must be a number of seconds > 0")
    q = cfg.repair.quiet_s
    if not isinstance(q, (int, float)) or isinstance(q, bool) or q < 0:
        bad("repair.quiet_s", "must be a number of seconds >= 0")
    for opt in ("minio.list_share", "scrub.share"):
        share = OmegaConf.select(cfg, opt)
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
            bad(opt, "must be a share of the time in (0, 1] (1: never rests)")
    for opt in ("repair.threads", "repair.move_threads"):
        n = OmegaConf.select(cfg, opt)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            bad(opt, "must be a whole number >= 1")
    if not isinstance(cfg.dashboard.refresh_s, (int, float)) or cfg.dashboard.refresh_s < 0.5:
        bad("dashboard.refresh_s", "must be a number of seconds >= 0.5")
    if cfg.cache.policy not in CACHE_POLICIES:
        bad("cache.policy", f"must be one of {', '.join(CACHE_POLICIES)}")
    if cfg.kernel.watch not in ("own", "any"):
        bad("kernel.watch", "must be own or any")
    if cfg.kernel.mode not in ("auto", "real", "simulated"):
        bad("kernel.mode", "must be auto, real or simulated")
    if not isinstance(cfg.mount.allow_other, bool):
        bad("mount.allow_other", "must be true or false")
    for opt in ("mount.uid", "mount.gid"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            bad(opt, "must be a numeric id >= 0")
    for opt in ("mount.file_mode", "mount.dir_mode"):
        try:
            mode(OmegaConf.select(cfg, opt))
        except ValueError:
            bad(opt, 'must be an octal mode in quotes, 0000 to 0777 (e.g. "0440")')
    for opt, low in (("kernel.stale_marks", 16), ("kernel.ring_pages", 1), ("kernel.count_keys", 64),
                     ("mount.warm_entries", 0),
                     ("mount.max_entries", 0), ("mount.sweep_mb", 0)):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            bad(opt, f"must be a whole number >= {low}")
    if cfg.kernel.ring_pages & (cfg.kernel.ring_pages - 1):
        bad("kernel.ring_pages", "must be a power of two (the kernel's ring buffer)")
    bits = OmegaConf.select(cfg, "kernel.seen_bits")
    if not isinstance(bits, int) or isinstance(bits, bool) or (bits and (bits < 64 or bits & (bits - 1))):
        bad("kernel.seen_bits", "must be 0 (no second chance) or a power of two >= 64")
    if not isinstance(cfg.kernel.mark_keep_s, (int, float)) or isinstance(cfg.kernel.mark_keep_s, bool) \
            or cfg.kernel.mark_keep_s < 1:
        bad("kernel.mark_keep_s", "must be a number of seconds >= 1")
    try:
        first = ipaddress.IPv4Address(cfg.cluster.first_address)
    except ValueError:
        bad("cluster.first_address", "must be an IPv4 address")
    if not first.is_loopback or first == ipaddress.IPv4Address("127.0.0.1"):
        bad("cluster.first_address", "must be in 127.0.0.0/8 and not 127.0.0.1 (Ray would swap 127.0.0.1 "
            "for the machine's external address)")
    last = first + (cfg.nodes - 1)
    if not last.is_loopback:
        bad("nodes", f"node addresses from {first} would leave 127.0.0.0/8")
    for opt in ("cluster.ray_port", "cluster.dashboard_port", "minio.port", "minio.console_port", "dashboard.port",
                "notebook.port"):
        v = OmegaConf.select(cfg, opt)
        if not isinstance(v, int) or not 1 <= v <= 65535:
            bad(opt, "must be a TCP port number")
    _check_worker_ports(cfg, bad)


# A head without storage (the lab's) takes node 99's ports: cluster.agent_port + 99 and
# cluster.node_ports + 10 * 99 + 0..6 (fasterfs.hosts.ray_nodes).
HEAD_SLOT = 99
NODE_PORT_STRIDE = 10


def _check_worker_ports(cfg: DictConfig, bad) -> None:
    """Ray refuses to start a node one of whose fixed ports lies among its workers' (and a head
    that fails there has already opened its GCS port): named here, before anything starts."""
    c = cfg.cluster
    ports = list(c.worker_ports) if OmegaConf.is_list(c.worker_ports) else []
    low, high = ports if len(ports) == 2 else (None, None)
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low < high <= 65535):
        bad("cluster.worker_ports", "must be a list of two TCP port numbers, the first below the last")
    fixed = {"cluster.ray_port": [c.ray_port], "cluster.dashboard_port": [c.dashboard_port],
             **({"cluster.client_port": [c.client_port]} if c.client_port is not None else {}),
             "cluster.agent_port": [c.agent_port, c.agent_port + HEAD_SLOT],  # node i: + i
             "cluster.node_ports": [c.node_ports, c.node_ports + NODE_PORT_STRIDE * HEAD_SLOT + 6]}  # + 10 i + 0..6
    for opt, (first, *rest) in fixed.items():
        last = rest[0] if rest else first
        if not isinstance(first, int) or not 1 <= first <= last <= 65535:
            bad(opt, f"must be a TCP port number (its ports {first}..{last} too)")
        if first <= high and low <= last:
            bad(opt, f"{first if first == last else f'{first}..{last}'} overlaps cluster.worker_ports "
                f"[{low}, {high}], where Ray puts its workers")


def to_dict(cfg: DictConfig) -> dict:
    """A plain dict, for shipping configuration to Ray actors and tasks."""
    return cast(dict, OmegaConf.to_container(cfg, resolve=True))  # a DictConfig's container is a dict


def as_cfg(cfg: DictConfig | dict) -> DictConfig:
    return cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)


@dataclass(frozen=True)
class Paths:
    """Where a cluster keeps its files, all under its root directory."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def credentials_file(self) -> Path:
        return self.root / "credentials.json"

    @property
    def ray_token_file(self) -> Path:
        return self.root / "ray_token"

    @property
    def tls_ca_dir(self) -> Path:
        """The cluster's TLS certificate authority, on the head only (its key 0600)."""
        return self.root / "tls-ca"

    def minio_certs_dir(self, index: int) -> Path:
        """A node's MinIO --certs-dir: its own key, made on its host, and its signed certificate."""
        return self.node_dir(index) / "minio-certs"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def node_dir(self, index: int) -> Path:
        return self.root / f"node-{index}"

    @property
    def bpffs(self) -> Path:
        """The cluster's own bpffs mount, where each node pins its kernel stale marks."""
        return self.root / "bpf"

    def stale_pin(self, index: int) -> Path:
        return self.bpffs / f"stale-{index}"

    def cache_dir(self, index: int) -> Path:
        return self.node_dir(index) / "cache"

    def reader_stats_dir(self, index: int) -> Path:
        return self.node_dir(index) / "readers"


@dataclass(frozen=True)
class Layout:
    """Where a cluster's nodes live, derived from config: node i has address first_address + i."""

    paths: Paths
    first_address: str
    nodes: int

    @classmethod
    def of(cls, cfg) -> Layout:
        return cls(Paths(Path(cfg.cluster.root)), cfg.cluster.first_address, cfg.nodes)

    def address(self, index: int) -> str:
        return str(ipaddress.IPv4Address(self.first_address) + index)

    @property
    def addresses(self) -> list[str]:
        return [self.address(i) for i in range(self.nodes)]


def minio_binary(cfg) -> Path:
    """The MinIO executable: configured path, else this checkout's .deps/bin, else $PATH."""
    if cfg.minio.binary:
        path = Path(cfg.minio.binary)
    else:
        path = PROJECT_DIR / ".deps" / "bin" / "minio"
        found = shutil.which("minio")
        if not path.exists() and found:
            path = Path(found)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FasterFSError(
            f"MinIO binary not found at {path}: run `make setup` (builds it with `go install` into .deps/bin) "
            "or set minio.binary=/path/to/minio"
        )
    return path
