"""StorageNode: the Ray actor pinned to each node that owns the node's storage.

It launches the node's MinIO server bound to the node's own address and keeps it
alive (a supervisor thread restarts it when it dies). Later components (kernel
programs, the cache) hang off the same actor. Clients never go through the actor
to read data: they talk to MinIO (or the cache) directly, and the actor answers
management calls: status, maintenance holds, stop.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from . import credentials, s3
from .config import Layout, as_cfg, minio_binary
from .minio_server import MinioServer

log = logging.getLogger("fasterfs.storage_node")


def actor_name(index: int) -> str:
    return f"storage-node-{index}"


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

        stale = self.minio.reap_stale()  # an earlier incarnation of this actor may have left one
        if stale:
            log.warning("stopped MinIO pid %d left by a previous StorageNode", stale)
        self.minio.start(self.cfg.minio.health_timeout_s)
        self._s3 = s3.client(self.minio.endpoint, self.minio.creds)
        self._ensure_bucket()
        self._supervisor = threading.Thread(target=self._supervise, name="minio-supervisor", daemon=True)
        self._supervisor.start()

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
                "node_id": ray.get_runtime_context().get_node_id()}

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
                "minio_pid": self.minio.pid, "minio_restarts": self.restarts, "objects": chunks, "bytes": size}

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
