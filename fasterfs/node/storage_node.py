"""StorageNode: the Ray actor pinned to each node that owns the node's storage.

It wires the node's components and answers management calls; each component is a plain class
tested without Ray or root:
- MinioSupervisor (the node's MinIO, bound to the node's own address, kept alive),
- the kernel programs (fasterfs.bpf: the TC request tracker, SOCK_OPS on the node's cgroup),
- ChunkCache and CacheFiller (fills when the kernel reports a chunk hot, from FillSources),
- Invalidations (kernel events and peers' writes: drops, and the outbox to the other nodes),
- PeerTier (the caches as one more copy), RepairLeader and MinioScrub (redundancy),
- Mounts (the host's FUSE daemons).
The namespace arrives as manifests and becomes one immutable NodeIndex per version. Clients
never read data through the actor: they talk to MinIO or read the cache directly.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from functools import partial

from ..bpf.events import key_hash
from ..control import credentials, identity, registry, s3
from ..control.node_directory import NodeDirectory
from ..control.state import host_id, ray_namespace
from ..core.config import Layout, as_cfg
from ..core.pace import every
from ..meta import Changes
from ..meta.follower import Change, Follower
from ..meta.replica import FILE as REPLICA_FILE
from ..meta.replica import Replica
from ..read import reader_stats
from ..write import bucket_walk
from .cache import ChunkCache, keep_capacity, kept_capacity
from .cache_filler import CacheFiller
from .fill_router import FillRouter
from .fill_sources import FillSources
from .invalidation import Invalidations, Write, WriteRouter, revalidate
from .kernel_view import KernelView
from .mark_keeper import MarkKeeper
from .minio_scrub import MinioScrub
from .minio_supervisor import MinioSupervisor
from .mount_supervisor import Mounts, daemon_overrides
from .node_index import NodeIndex
from .node_kernel import NodeKernel
from .node_repair import NodeRepair
from .node_status import CacheStatus, NodeStatus
from .peer_tier import CacheNews, PeerTier
from .peers import Peers
from .reachability import Reachability
from .repair_leader import RepairLeader, Timing
from .repair_rebuild import Rebuild

log = logging.getLogger("fasterfs.node.storage_node")
NAMESPACE_POLL_S = 5.0  # how often a node asks for changes whose push it missed (a full wait, a restart)


def _ray_get(refs: list) -> list:
    import ray

    return ray.get(refs)


def schedule(node: StorageNode, cfg) -> None:
    """The node's background work, each on a thread of its own until the node stops."""
    threading.Thread(target=node.mounts.adopt, name="mounts-adopt", daemon=True).start()
    threading.Thread(target=node.invalidations.run, args=(node.stopping,), name="tell-peers",
                     daemon=True).start()
    threading.Thread(target=node.mark_keeper.run, args=(node.stopping,), name="mark-keeper",
                     daemon=True).start()
    every(1.0, node.peer_tier.share, node.stopping, "cache-index")
    every(NAMESPACE_POLL_S, node.namespace.catch_up, node.stopping, "namespace")  # a push it missed
    every(cfg.repair.check_s, node.leader.tick, node.stopping, "repair-leader")
    every(cfg.cache.scrub_interval_s,
          partial(node.cache.scrub, int(cfg.cache.scrub_interval_s * cfg.cache.scrub_mb_per_s * 1e6)),
          node.stopping, "cache-scrub")
    every(cfg.scrub.interval_s, partial(node.scrub_minio, cfg.scrub.share), node.stopping, "minio-scrub")
    every(cfg.minio.supervise_interval_s, node.minio.tick, node.stopping, "minio-supervisor")
    every(cfg.minio.supervise_interval_s, node.mounts.supervise, node.stopping, "mount-supervisor")


class StorageNode:
    """Node `index` at `address`: everything it needs comes in its arguments (the MinIO keys
    included) or from the cluster's Registry, never from another host's files. It signs with the
    admin keys and sets up the read-only user its MinIO gives readers."""

    def __init__(self, index: int, address: str, config: dict):
        began = time.monotonic()
        self.started: dict[str, float] = {}  # seconds per phase of this start (a restart's recovery time)
        self.cfg = cfg = as_cfg(config)
        self.index, self.address, self.bucket = index, address, cfg.minio.bucket
        self.paths = paths = Layout.of(cfg).paths
        identity.record(paths, index, cfg.cluster.name, address)  # the id travels with the data
        self.stopping = threading.Event()
        self.nodes = NodeDirectory(ray_namespace(cfg.cluster.name))
        self.peers = Peers(index, cfg.cluster.name, self.nodes)
        # this host's durable copies of what names and unlocks the data (fasterfs.control.head_recovery)
        keys = registry.fetch_keys_kept(cfg.cluster.name, paths.node_dir(index) / credentials.NODE_COPY,
                                        f"node {index}")
        # cluster.durable_copies=1: the head's store alone holds the names (no replica here)
        self.replica = Replica(paths.node_dir(index) / REPLICA_FILE, cfg.cluster.name) \
            if cfg.cluster.durable_copies > 1 else None
        # every dataset's and file's current manifest, kept from the store's log
        self.namespace = Follower(partial(registry.fetch_changes, cfg.cluster.name),
                                  partial(registry.fetch_manifests, cfg.cluster.name), self._namespace_changed,
                                  self.replica)
        self.ns_index = NodeIndex.build({}, index)
        self.minio = MinioSupervisor.of_node(cfg, index, address, keys)
        server = self.minio.server
        phase = time.monotonic()
        # before MinIO, so its first connections are tuned too
        self.node_kernel = NodeKernel(cfg, index, address, paths, self._on_kernel_event)
        self.kernel = self.node_kernel.programs
        self.started["kernel_s"], phase = time.monotonic() - phase, time.monotonic()
        # The cache index is rebuilt from the directory: entries survive a restart, temp files do
        # not. After the kernel programs: a smaller capacity evicts, which resets kernel counts.
        self.cache = ChunkCache(paths.cache_dir(index), self._capacity(),
                                on_evict=self._on_evict, policy=cfg.cache.policy)
        self.minio.start()
        self.started["minio_s"], phase = time.monotonic() - phase, time.monotonic()
        self.marked = s3.MarkedPool(server.creds, cfg.kernel.fill_mark, self._endpoint)
        self.sources = FillSources(index, self.marked, lambda: self.ns_index, self.bucket)
        self.filler = CacheFiller(self.cache, self.sources.getter, self.bucket, cfg.cache.fill_threads,
                                  cfg.cache.prefetch.max_queue)
        self.router = FillRouter(index, self.cache, self.filler, lambda: self.ns_index, cfg.kernel.watch == "own",
                                 self.nodes.get, _ray_get)
        self.mark_keeper = MarkKeeper(self.kernel, self._check_entries,
                                      lambda: self.invalidations.queue((self.kernel.suspect_key, None)),
                                      cfg.kernel.mark_keep_s)
        self.invalidations = Invalidations(index, self.bucket, self.kernel, self.cache, self.filler,
                                           cfg.kernel.watch == "any", self.router.fill, self._tell_writes,
                                           self.mark_keeper.suspect, self._check_entries)
        self.kernel_view = KernelView(self.node_kernel, lambda: self.ns_index, self.namespace, self.cache,
                                      lambda: self.invalidations.recent, cfg.kernel.hot_threshold)
        self.peer_tier = PeerTier(index, self.cache, self.peers.tell_cache_news, self.peers.ask_cache_news,
                                  self.peers.reconnect)
        self.write_router = WriteRouter(self.peer_tier, cfg.kernel.mark_keep_s)
        self.node_repair = NodeRepair(cfg, index, self.peers.state, server.creds, self.namespace, self.nodes)
        reach = Reachability(self.peers.state, self.marked, lambda back: self._check_entries(held_by=back))
        self.leader = RepairLeader(index, Timing.of(cfg.repair), reach.probe,
                                   lambda: registry.namespace_version(cfg.cluster.name), self.node_repair.survey,
                                   self.node_repair.check_changes, self.node_repair.run, self.node_repair.lease)
        self.scrubber = MinioScrub(index, self.bucket, cfg.scrub.mb_per_s,
                                   lambda: s3.MarkedGetter(server.endpoint, server.creds, cfg.kernel.fill_mark),
                                   self._rebuild)
        if self.replica is not None and self.replica.version >= 0:  # this host's copy, then what changed since
            self.namespace.seed(*self.replica.load())
        self.namespace.catch_up()  # a restarted node learns the current ones (whole: the cache held to them)
        revalidate(self.cache, self.ns_index, self.bucket,
                   {n.index: n.endpoint for n in self.peers.state().nodes}, server.creds)
        self.started["cache_s"] = time.monotonic() - phase
        self.kernel.start_events()  # HOT and STALE events now have a filler to go to
        self.mounts = Mounts(paths.node_dir(index) / "mounts.json", paths.log_dir, daemon_overrides(cfg),
                             cfg.mount.read_ahead_kb, hung_s=cfg.mount.hung_s)
        schedule(self, cfg)
        self.started["total_s"] = time.monotonic() - began
        self.started = {k: round(v, 2) for k, v in self.started.items()}
        log.info("StorageNode %d started in %.2f s: %s", index, self.started["total_s"], self.started)

    def _on_evict(self, entry: str) -> None:
        if hasattr(self, "invalidations"):  # what the cache evicts as it opens is no known chunk's yet
            self.invalidations.on_evict(entry, self.ns_index)

    def _on_kernel_event(self, event: dict) -> None:
        self.invalidations.on_kernel_event(event, self.ns_index)  # one index version per event

    def _endpoint(self, node: int) -> str:
        return self.minio.server.endpoint if node == self.index else self.peers.state().node(node).endpoint

    def _tell_writes(self, batch: list[Write], seen: list[float]) -> None:
        for node, writes in self.write_router.route(batch, self.peers.others(), seen).items():
            self.peers.tell_writes(node, writes)

    def _check_entries(self, keys: list[str] | None = None, held_by: set[int] | None = None) -> int:
        """Every cache entry (or `keys`' alone, or those of chunks `held_by` these nodes) against
        its holders' ETags; what cannot be vouched for goes too, unless held_by."""
        endpoints = {n.index: n.endpoint for n in self.peers.state().nodes}
        return revalidate(self.cache, self.ns_index, self.bucket, endpoints, self.minio.server.creds,
                          keep_unverified=held_by is not None, only=keys, held_by=held_by)

    def _rebuild(self, bad_pieces: set[tuple[int, str]], bad: dict[str, set[int]]) -> int:
        out = self.node_repair.rebuild_bad(bad_pieces, bad)
        self.leader.record("scrub", out)
        return out.repaired

    def rebuild(self, jobs: list[Rebuild], down: Iterable[int], mb_per_s: float | None = None) -> list[int | str]:
        return self.node_repair.rebuild(jobs, down, mb_per_s)  # see NodeRepair.rebuild

    def _namespace_changed(self, changed: list[Change], whole: bool) -> None:
        """The NodeIndex with the changed names; the cache keeps no entry of a replaced
        generation or a removed name (they would only take room). `whole` (the namespace fetched
        whole: at start, or past the log's reach): rebuilt from every manifest, and the cache held
        to them (entries of names gone while the node was down, another cluster's)."""
        for _, before, now in changed:
            self.invalidations.mark_replaced(before, now)
        index = NodeIndex.build(self.namespace.manifests, self.index) if whole else self.ns_index.updated(changed)
        self.ns_index = index
        self.cache.set_places(index.places)
        if whole:
            self.cache.retain(index.holders)
        else:
            self.cache.forget([c.key for _, before, _ in changed if before is not None for c in before.chunks
                               if c.key not in index.holders])
        self.kernel_view.forget()
        if any(now is not None for _, _, now in changed):
            self.peers.state(refresh=True)  # a new generation may place data on nodes that joined since

    # -- the actor's surface: the namespace and peers -------------------------------------

    def apply_changes(self, changes: Changes) -> int:
        """Names a write changed (pushed by the Registry once stored); this node's namespace version after."""
        self.namespace.apply(changes)
        return self.namespace.version

    def nodes_changed(self) -> None:
        """A node joined, began draining or left: the cluster's state looked up again."""
        self.peers.reconnect()

    def invalidate(self, batch: list[Write], ages_s: list[float] | None = None) -> None:
        """Other hosts' kernels saw these keys written (None: unnamed), each `ages_s` ago if given."""
        self.invalidations.invalidate(batch, ages_s)

    def fill(self, key: str, reason: str) -> None:
        """Another node asks for a fill of a chunk at home here (its kernel found it hot, or its entry damaged)."""
        self.filler.request(key, reason)

    def peer_cache(self, news: CacheNews) -> None:
        """What another node's cache gained and lost (or holds: a snapshot)."""
        late = self.write_router.heard(news)
        if late:  # it gained keys written since, perhaps filled from before the write
            self.peers.tell_writes(news.node, [w for w, _ in late], [age for _, age in late])

    def tell_cache_index(self, node: int) -> None:
        """Node `node` asks for everything this node's cache holds."""
        self.peer_tier.tell_all(node)

    def cached_on(self, key: str) -> list[int]:
        """The nodes whose caches hold `key` (this one's included), as they last told."""
        return self.peer_tier.holders(key)

    def cache_read(self, key: str) -> bytes | None:
        """`key`'s bytes from this node's cache (checked), for a reader on another host whose
        holders are down; None if not cached (the caller checks it against its manifest)."""
        return self.peer_tier.read(key)

    def resolve(self, key: int) -> str | None:
        """The chunk a key hash names in the current generation, or None."""
        return self.ns_index.resolve(key)

    def survey(self) -> dict:
        """The namespace's redundancy surveyed now (Health.to_dict), kept as this node's latest."""
        return self.leader.survey_now()

    def scrub_minio(self, share: float = 1.0) -> dict:
        """One pass of the MinIO scrub over this node's objects now, its GETs taking at most
        `share` of the time (the periodic pass: scrub.share); returns its figures."""
        return self.scrubber.scrub(self.ns_index.pieces, self.stopping, share, current=lambda: self.ns_index.pieces)

    # -- status ---------------------------------------------------------------------------

    def ready(self) -> dict:
        import ray

        return {"index": self.index, "address": self.address, "endpoint": self.minio.server.endpoint,
                "node_id": ray.get_runtime_context().get_node_id(), "kernel_mode": self.kernel.mode,
                "host_id": host_id()}

    def status(self, max_age_s: float = 0.0) -> NodeStatus:
        """max_age_s: how old the object count may be (the dashboard asks every second, and
        listing many objects is not free; `fasterfs status` wants it now)."""
        import ray

        healthy, pid, restarts, held = self.minio.health()
        chunks = size = age = None
        if healthy:
            chunks, size, age = self.minio.count(bucket_walk.Paced(self.marked(self.index), self.cfg.minio.list_share),
                                                 max_age_s)
        return {"index": self.index, "address": self.address, "node_id": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid(), "namespace_version": self.namespace.version,
                "endpoint": self.minio.server.endpoint, "healthy": healthy, "held": held,
                "minio_pid": pid, "minio_restarts": restarts, "objects": chunks, "bytes": size,
                "objects_age_s": age, "placed_objects": len(self.ns_index.pieces),
                "placed_bytes": self.ns_index.placed_bytes,
                "kernel_mode": self.kernel.mode, "redundancy": self.leader.health, "repairs": self.leader.repairs[-5:],
                "scrub": self.scrubber.totals, "started": self.started, "mounts": self.mounts.status(),
                "namespace_replica": Replica.summary(self.replica.path).to_dict() if self.replica else {}}

    def kernel_status(self, top: int = 10) -> dict:
        return self.kernel_view.status(top, index=self.index, address=self.address)

    def heat_names(self, cells: int) -> tuple[int, list[tuple[str, int]] | None]:
        """KernelView.heat_names: the names this node would show in the /kernel view."""
        return self.kernel_view.heat_names(cells)

    def heat(self, names: list[str] | None = None) -> tuple[int, bytes]:
        """KernelView.heat: this node's row of the /kernel heatmap."""
        return self.kernel_view.heat(names)

    def kernel_key_count(self, path: str) -> int:
        """GETs of `path` (/bucket/key) the kernel counted in the current epoch."""
        return self.kernel.key_count(key_hash(path))

    def observe(self, method: str, path: str) -> None:
        """A request a reader reports because this host's kernel cannot read it: SIMULATED
        mode, or MinIO over TLS (the kernel sees the connection, not the request line)."""
        if self.kernel.mode == "simulated" or self.cfg.minio.tls:
            self.kernel.count_reported(method, path, self.cfg.minio.port)

    # -- cache ---------------------------------------------------------------------------

    def cache_status(self) -> CacheStatus:
        readers = reader_stats.collect(self.paths.reader_stats_dir(self.index))
        return {"index": self.index, "address": self.address, "kernel_mode": self.kernel.mode,  # type: ignore[typeddict-item]
                "directory": str(self.cache.dir), **self.cache.stats(), "readers": readers,
                "filler": {**self.filler.counters, "rotten_copies_refused": self.sources.rotten_refused},
                "fills_pending": self.filler.pending(),
                "last_invalidation": self.invalidations.last, "suspect_checks": self.mark_keeper.stats(),
                "writes_told": dict(self.write_router.counters)}

    def cache_contains(self, key: str) -> bool:
        return self.cache.contains(key)

    def cache_warm(self, keys: list[str]) -> int:
        """Fill these keys now, each at its home (waits); returns how many are cached afterwards."""
        return self.router.warm(keys)

    def prefetch(self, keys: list[str]) -> int:
        """Queue fills ahead of a sequential reader, each at its home; how many were queued here."""
        return self.router.prefetch(keys)

    def _capacity(self) -> int:
        import ray

        return kept_capacity(self.paths.node_dir(self.index) / "cache-capacity",
                             ray.get_runtime_context().was_current_actor_reconstructed,
                             int(self.cfg.cache.capacity_mb * 1_000_000))

    def cache_resize(self, capacity_bytes: int) -> dict:
        self.cache.resize(capacity_bytes)
        keep_capacity(self.paths.node_dir(self.index) / "cache-capacity", capacity_bytes)
        return self.cache.stats()

    def heal(self, key: str) -> None:
        """A reader found this key's entry damaged and dropped it: fetch it again (at its home)."""
        self.router.fill(key, "heal")

    def cache_scrub(self) -> int:
        """Verify every cache entry now; returns how many damaged ones were dropped."""
        return self.cache.scrub()

    def cache_clear(self) -> int:
        """Empty the cache and start a new kernel epoch (every key can become hot again)."""
        return self.invalidations.clear()

    def hold_minio(self) -> None:
        """Stop MinIO for maintenance (or a failover drill) and keep it down until release."""
        self.minio.hold()

    def release_minio(self) -> None:
        self.minio.release()

    def mount(self, path: str) -> str:
        """Mount the namespace read-only at `path` on this host (one daemon, supervised)."""
        return self.mounts.mount(path)

    def umount(self, path: str) -> bool:
        return self.mounts.unmount(path)

    def stop(self, hand_over: bool = False) -> None:  # hand_over (nodes restart): MinIO and mounts serve on
        self.stopping.set()
        if not hand_over:
            self.mounts.unmount_all()
        self.node_kernel.close()  # first: no kernel event reaches a filler that is closing
        self.filler.close()
        self.sources.close()
        self.cache.close()
        self.marked.close()
        if not hand_over:
            self.minio.stop()
        if self.replica:
            self.replica.close()
