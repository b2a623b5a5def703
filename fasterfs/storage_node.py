"""StorageNode: the Ray actor pinned to each node that owns the node's storage.

It launches the node's MinIO server bound to the node's own address and keeps it
alive (a supervisor thread restarts it when it dies); owns the node's kernel programs
(the TC request tracker and the SOCK_OPS tuner on the node's cgroup); and owns the
node's cache, which it fills when the kernel reports a chunk hot and empties of what
the kernel reports overwritten. Clients never go through the actor to read data: they
talk to MinIO or read the cache directly, and the actor answers management calls.
"""
from __future__ import annotations

import logging
import os
import threading

from . import bpf, credentials, reader_stats, s3
from .bpf.events import key_hash
from .cache import ChunkCache, entry_name
from .cache_filler import CacheFiller
from .cgroup import own_cgroup
from .config import Layout, as_cfg, minio_binary
from .minio_server import MinioServer

log = logging.getLogger("fasterfs.storage_node")


def actor_name(index: int) -> str:
    return f"storage-node-{index}"


def host_id() -> str:
    """This machine and network namespace: processes with the same id share a host, and so
    can read each other's cache directories as local files."""
    import socket

    return f"{socket.gethostname()}/{os.readlink('/proc/self/ns/net')}"


def filter_prefix(cluster_name: str) -> str:
    """Names of a cluster's TC filters start with this (see fasterfs.bpf.tc)."""
    return f"ffs:{cluster_name}:"


class StorageNode:
    def __init__(self, index: int, address: str, cfg: dict):
        self.cfg = as_cfg(cfg)
        self.index, self.address = index, address
        paths = Layout.of(self.cfg).paths
        self.minio = MinioServer(minio_binary(self.cfg), self.address, self.cfg.minio.port,
                                 self.cfg.minio.console_port, paths.node_dir(index) / "minio",
                                 paths.log_dir / f"minio-{index}.log", credentials.load(paths.credentials_file),
                                 self.cfg.minio.md5_etags)
        self.bucket = self.cfg.minio.bucket
        self.restarts = 0
        self._held = False  # maintenance hold: MinIO stopped on purpose, not restarted
        self._lock = threading.Lock()
        self._stopping = threading.Event()

        self.paths = paths
        self._manifest_cache: tuple[float, dict] = (0.0, {})
        # The cache index is rebuilt from the directory: entries survive a restart, temp files do not.
        self.cache = ChunkCache(paths.cache_dir(index), int(self.cfg.cache.capacity_mb * 1_000_000),
                                on_evict=self._on_evict)
        stale = self.minio.reap_stale()  # an earlier incarnation of this actor may have left one
        if stale:
            log.warning("stopped MinIO pid %d left by a previous StorageNode", stale)
        self.kernel = self._load_kernel()  # before MinIO, so its first connections are tuned too
        self.minio.start(self.cfg.minio.health_timeout_s)
        self._s3 = s3.client(self.minio.endpoint, self.minio.creds)
        self._ensure_bucket()
        self._getters: dict[str, s3.MarkedGetter] = {}
        self._endpoints: list[str] | None = None
        self.filler = CacheFiller(self.cache, self._getter_for, self.bucket, self.cfg.cache.fill_threads,
                                  self.cfg.cache.prefetch.max_queue)
        self.kernel.start_events()  # HOT and STALE events now have a filler to go to
        threading.Thread(target=self._scrub, name="cache-scrub", daemon=True).start()
        self._supervisor = threading.Thread(target=self._supervise, name="minio-supervisor", daemon=True)
        self._supervisor.start()

    def _load_kernel(self):
        k = self.cfg.kernel
        programs = bpf.load(k.mode, k.hot_threshold, k.fill_mark, k.delack_max_us, on_event=self._on_kernel_event)
        try:
            programs.watch(self.address if k.watch == "own" else None, self.cfg.minio.port)
            # Replaces a filter of the same name that a crashed earlier incarnation left.
            programs.attach_tc(k.interface, f"{filter_prefix(self.cfg.cluster.name)}{self.index}")
            if os.path.ismount(self.paths.bpffs):
                programs.pin_stale_marks(str(self.paths.stale_pin(self.index)))
            cgroup = own_cgroup()
            self.sockops_skipped = None
            if k.tune_sockets and cgroup is not None:
                programs.attach_sockops(str(cgroup))
            elif k.tune_sockets:
                # the root cgroup would mean every socket on the host: not ours to tune
                self.sockops_skipped = "this process is in the root cgroup (or there is no cgroup2)"
        except BaseException:
            programs.close()
            raise
        return programs

    def _on_kernel_event(self, event: dict) -> None:
        """HOT: fill the cache with the chunk. STALE: drop it, and let the key become hot anew."""
        prefix = f"/{self.bucket}/"
        if not event["path"].startswith(prefix):
            return
        key = event["path"][len(prefix):]
        if event["key"] != key_hash(event["path"]):
            return  # path cut at the kernel's bound: not one of ours to resolve
        if event["type"] == "HOT":
            self.filler.request(key, "hot")
        else:
            self.filler.mark_stale(key)
            self.kernel.reset_key(event["key"])

    def _getter_for(self, key: str) -> s3.MarkedGetter:
        """Where a fill fetches `key`: this node if it holds a copy, else the chunk's owner
        (a reader on this host made the chunk hot, wherever it lives)."""
        endpoint = self.minio.endpoint
        holders = self._manifest_names()["holders"].get(key)
        if holders and self.index not in holders:
            if self._endpoints is None:  # the cluster's nodes, fixed once the cluster is up
                from .cluster import ClusterState

                self._endpoints = [n.endpoint for n in ClusterState.load(self.paths.root).nodes]
            endpoint = self._endpoints[holders[0]]
        if endpoint not in self._getters:
            self._getters[endpoint] = s3.MarkedGetter(endpoint, self.minio.creds, self.cfg.kernel.fill_mark)
        return self._getters[endpoint]

    def _on_evict(self, entry: str) -> None:
        key = self._manifest_names()["entries"].get(entry)
        if key:  # the key may become hot again, and be cached again
            self.kernel.reset_key(key_hash(f"/{self.bucket}/{key}"))

    def _manifest_names(self) -> dict:
        """Lookups derived from the manifest (reloaded when it changes): key hash -> chunk,
        cache entry -> object key, object key -> holding nodes."""
        try:
            mtime = self.paths.manifest_file.stat().st_mtime
        except OSError:
            return {"hashes": {}, "entries": {}, "holders": {}}
        if mtime != self._manifest_cache[0]:
            from .manifest import Manifest

            m = Manifest.load(self.paths.manifest_file)
            self._manifest_cache = (mtime, {
                "hashes": {key_hash(f"/{m.bucket}/{c.key}"): c for c in m.chunks},
                "entries": {entry_name(c.key): c.key for c in m.chunks},
                "holders": {c.key: c.nodes for c in m.chunks}})
        return self._manifest_cache[1]

    def _resolve(self, key: int) -> str | None:
        chunk = self._manifest_names()["hashes"].get(key)
        return chunk and f"chunk {chunk.id} ({chunk.key})"

    def _scrub(self) -> None:
        interval = self.cfg.cache.scrub_interval_s
        while interval and not self._stopping.wait(interval):
            try:
                self.cache.scrub()
            except Exception:
                log.exception("cache scrub failed")

    def _ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except self._s3.exceptions.ClientError:
            self._s3.create_bucket(Bucket=self.bucket)

    def _supervise(self) -> None:
        while not self._stopping.wait(self.cfg.minio.supervise_interval_s):
            with self._lock:
                if self._held or self._stopping.is_set() or self.minio.alive():
                    continue
                log.warning("MinIO on %s died; restarting", self.minio.endpoint)
                self.restarts += 1
                try:
                    self.minio.start(self.cfg.minio.health_timeout_s)
                except Exception:  # keep supervising; the next round tries again
                    log.exception("MinIO restart failed")

    # -- management API ------------------------------------------------------------

    def ready(self) -> dict:
        import ray

        return {"index": self.index, "address": self.address, "endpoint": self.minio.endpoint,
                "node_id": ray.get_runtime_context().get_node_id(), "kernel_mode": self.kernel.mode,
                "host_id": host_id()}

    def status(self) -> dict:
        import ray

        with self._lock:  # not in the middle of a restart
            healthy, pid, restarts = self.minio.healthy(), self.minio.pid, self.restarts
        chunks = size = None
        if healthy:
            chunks = size = 0
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for obj in page.get("Contents", []):
                    chunks += 1
                    size += obj["Size"]
        return {"index": self.index, "address": self.address, "node_id": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid(),
                "endpoint": self.minio.endpoint, "healthy": healthy, "held": self._held,
                "minio_pid": pid, "minio_restarts": restarts, "objects": chunks, "bytes": size,
                "kernel_mode": self.kernel.mode}

    def kernel_status(self, top: int = 10) -> dict:
        snap = self.kernel.snapshot(top, resolve=self._resolve)
        snap.update(index=self.index, address=self.address)
        chunks = self._manifest_names()["hashes"]
        for t in snap["top_keys"]:  # did the hot chunk reach this node's cache?
            chunk = chunks.get(int(t["key"], 16))
            t["cached"] = None if chunk is None else self.cache.contains(chunk.key)
        if self.sockops_skipped:
            snap["sockops"]["skipped"] = self.sockops_skipped
        return snap

    def kernel_key_count(self, path: str) -> int:
        """GETs of `path` (/bucket/key) the kernel counted in the current epoch."""
        return self.kernel.key_count(key_hash(path))

    def kernel_reset(self, key: int | None = None) -> int:
        """Forget one key's count (key given) or start a new epoch (every key cold again)."""
        if key is None:
            return self.kernel.new_epoch()
        self.kernel.reset_key(key)
        return self.kernel.epoch

    def observe(self, method: str, path: str) -> None:
        """SIMULATED mode only: a request reported by the client's read path."""
        if self.kernel.mode == "simulated":
            self.kernel.observe(method, path, self.cfg.minio.port)

    # -- cache ---------------------------------------------------------------------------

    def cache_status(self) -> dict:
        readers = reader_stats.collect(self.paths.reader_stats_dir(self.index))
        return {"index": self.index, "address": self.address, "kernel_mode": self.kernel.mode,
                "directory": str(self.cache.dir), **self.cache.stats(), "readers": readers,
                "filler": dict(self.filler.counters), "fills_pending": self.filler.pending()}

    def cache_warm(self, keys: list[str]) -> int:
        """Fill these keys now (waits); returns how many are cached afterwards."""
        futures = [self.filler.request(k, "warm") for k in keys]
        for f in futures:
            if f is not None:
                f.result()
        return sum(self.cache.contains(k) for k in keys)

    def prefetch(self, keys: list[str]) -> int:
        """Queue fills ahead of a sequential reader; sheds them under load. Returns how many were queued."""
        return sum(self.filler.request(k, "prefetch") is not None for k in keys)

    def cache_resize(self, capacity_bytes: int) -> dict:
        self.cache.resize(capacity_bytes)
        return self.cache.stats()

    def heal(self, key: str) -> None:
        """A reader found this key's entry damaged and dropped it: fetch it again."""
        self.filler.request(key, "heal")

    def cache_scrub(self) -> int:
        """Verify every cache entry now; returns how many damaged ones were dropped."""
        return self.cache.scrub()

    def cache_clear(self) -> int:
        """Empty the cache and start a new kernel epoch, so every key can become hot again."""
        removed = self.cache.clear()
        self.kernel.new_epoch()
        return removed

    def hold_minio(self) -> None:
        """Stop MinIO for maintenance (or a failover drill) and keep it down until release."""
        with self._lock:
            self._held = True
            self.minio.stop()

    def release_minio(self) -> None:
        with self._lock:
            if self._held:
                self.minio.start(self.cfg.minio.health_timeout_s)
                self._held = False

    def stop(self) -> None:
        self._stopping.set()
        self.kernel.close()
        self.filler.close()
        for getter in self._getters.values():
            getter.close()
        with self._lock:
            self.minio.stop()
