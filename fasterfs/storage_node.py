"""StorageNode: the Ray actor pinned to each node that owns the node's storage.

It launches the node's MinIO server bound to the node's own address and keeps it
alive (a supervisor thread restarts it when it dies), and owns the node's kernel
programs: the TC request tracker watching that MinIO's traffic and the SOCK_OPS
tuner on the node's cgroup. Clients never go through the actor to read data: they
talk to MinIO (or the cache) directly, and the actor answers management calls.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from . import bpf, credentials, s3
from .bpf.events import key_hash
from .cgroup import own_cgroup
from .config import Layout, as_cfg, minio_binary
from .minio_server import MinioServer

log = logging.getLogger("fasterfs.storage_node")


def actor_name(index: int) -> str:
    return f"storage-node-{index}"


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
                                 paths.log_dir / f"minio-{index}.log", credentials.load(paths.credentials_file))
        self.bucket = self.cfg.minio.bucket
        self.restarts = 0
        self.started_at = time.time()
        self._held = False  # maintenance hold: MinIO stopped on purpose, not restarted
        self._lock = threading.Lock()
        self._stopping = threading.Event()

        self.paths = paths
        self._names: tuple[float, dict[int, str]] = (0.0, {})
        stale = self.minio.reap_stale()  # an earlier incarnation of this actor may have left one
        if stale:
            log.warning("stopped MinIO pid %d left by a previous StorageNode", stale)
        self.kernel = self._load_kernel()  # before MinIO, so its first connections are tuned too
        self.minio.start(self.cfg.minio.health_timeout_s)
        self._s3 = s3.client(self.minio.endpoint, self.minio.creds)
        self._ensure_bucket()
        self._supervisor = threading.Thread(target=self._supervise, name="minio-supervisor", daemon=True)
        self._supervisor.start()

    def _load_kernel(self):
        k = self.cfg.kernel
        programs = bpf.load(k.mode, k.hot_threshold, k.fill_mark, k.delack_max_us, on_event=self._on_kernel_event)
        try:
            programs.watch(self.address, self.cfg.minio.port)
            # Replaces a filter of the same name that a crashed earlier incarnation left.
            programs.attach_tc(k.interface, f"{filter_prefix(self.cfg.cluster.name)}{self.index}")
            cgroup = own_cgroup()
            self.sockops_skipped = None
            if k.tune_sockets and cgroup is not None:
                programs.attach_sockops(str(cgroup))
            elif k.tune_sockets:
                # the root cgroup would mean every socket on the host: not ours to tune
                self.sockops_skipped = "this process is in the root cgroup (or there is no cgroup2)"
            programs.start_events()
        except BaseException:
            programs.close()
            raise
        return programs

    def _on_kernel_event(self, event: dict) -> None:
        log.info("kernel event %s %s (count %d)", event["type"], event["path"], event["count"])

    def _resolve(self, key: int) -> str | None:
        """A key hash's chunk, from the manifest (reloaded when it changes)."""
        try:
            mtime = self.paths.manifest_file.stat().st_mtime
        except OSError:
            return None
        if mtime != self._names[0]:
            from .manifest import Manifest

            m = Manifest.load(self.paths.manifest_file)
            self._names = (mtime, {key_hash(f"/{m.bucket}/{c.key}"): f"chunk {c.id} ({c.key})" for c in m.chunks})
        return self._names[1].get(key)

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
                try:
                    self.minio.start(self.cfg.minio.health_timeout_s)
                    self.restarts += 1
                except Exception:  # keep supervising; the next round tries again
                    log.exception("MinIO restart failed")

    # -- management API ------------------------------------------------------------

    def ready(self) -> dict:
        import ray

        return {"index": self.index, "address": self.address, "endpoint": self.minio.endpoint,
                "node_id": ray.get_runtime_context().get_node_id(), "kernel_mode": self.kernel.mode}

    def status(self) -> dict:
        import ray

        healthy = self.minio.healthy()
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
                "minio_pid": self.minio.pid, "minio_restarts": self.restarts, "objects": chunks, "bytes": size,
                "kernel_mode": self.kernel.mode}

    def kernel_status(self, top: int = 10) -> dict:
        snap = self.kernel.snapshot(top, resolve=self._resolve)
        snap.update(index=self.index, address=self.address)
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
        with self._lock:
            self.minio.stop()
        self.kernel.close()
