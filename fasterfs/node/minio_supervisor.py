"""MinioSupervisor: keeps a node's MinIO serving, as readers need it.

A MinIO that died is started again at the next `tick`; one held for maintenance stays down until
released. On every start the server is made ready for readers: a MinIO whose disk was lost or
replaced comes back with neither the bucket nor the read-only reader user (MinIO keeps its users
on that disk), and readers' GETs would be refused until both were made again.
"""
from __future__ import annotations

import logging
import threading
import time
from functools import partial

from ..control import registry, s3, tls
from ..control.credentials import ClusterKeys, Credentials
from ..core.config import Layout, minio_binary
from .minio_server import MinioServer

log = logging.getLogger("fasterfs.node.minio_supervisor")


COUNT_SHARE = 0.02  # of a node's time its object count may take, asked as often as it may be
COUNT_WAIT_S = 5.0  # a count asked for now waits this long for its listing (a million objects take a minute)


def _signed_check(server: MinioServer) -> None:
    """A request signed with the server's keys (its liveness probe is not signed): raises if refused."""
    client = s3.client(server.endpoint, server.creds)
    try:
        client.list_buckets()
    finally:
        client.close()


class MinioSupervisor:
    def __init__(self, server: MinioServer, bucket: str, reader: Credentials, start_timeout_s: float):
        self.server, self.bucket, self.reader, self.start_timeout_s = server, bucket, reader, start_timeout_s
        self.restarts = 0
        self.held = False  # stopped on purpose: not restarted
        self._lock = threading.Lock()  # one start or stop at a time; status never sees half a restart
        self._counted = (float("-inf"), 0, 0, 0.0)  # (when, objects, bytes, seconds it took) of the last listing
        self._listing: threading.Thread | None = None  # the count being taken in the background
        self._listing_lock = threading.Lock()  # one listing at a time

    @classmethod
    def of_node(cls, cfg, index: int, address: str, keys: ClusterKeys) -> MinioSupervisor:
        """Node `index`'s, with a fresh TLS key signed by the head's Registry when minio.tls. A
        server an earlier incarnation of its actor left serving is taken over when it runs what
        this one would, with these keys (`fasterfs nodes restart`: its readers never see it
        stop), and stopped otherwise; `start` starts one only if none serves."""
        paths = Layout.of(cfg).paths
        certs = None
        if cfg.minio.tls:
            certs = paths.minio_certs_dir(index)
            tls.trust(tls.server_files(certs, address, partial(registry.issue_certificate, cfg.cluster.name)))
        server = MinioServer(minio_binary(cfg), address, cfg.minio.port, cfg.minio.console_port,
                             paths.node_dir(index) / "minio", paths.log_dir / f"minio-{index}.log", keys.admin,
                             cfg.minio.md5_etags, certs)
        adopted = server.adopt(_signed_check)
        if adopted:
            log.info("took over MinIO pid %d from the previous StorageNode", adopted)
        elif stale := server.reap_stale():
            log.warning("stopped MinIO pid %d left by a previous StorageNode", stale)
        return cls(server, cfg.minio.bucket, keys.reader, cfg.minio.health_timeout_s)

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        if not self.server.alive():
            self.server.start(self.start_timeout_s)
        admin = s3.client(self.server.endpoint, self.server.creds)
        try:
            admin.head_bucket(Bucket=self.bucket)
        except admin.exceptions.ClientError:
            admin.create_bucket(Bucket=self.bucket)
        finally:
            admin.close()
        self.server.ensure_reader(self.reader, self.bucket)

    def tick(self) -> bool:
        """Restart the server if it died (and is not held); whether it restarted it."""
        with self._lock:
            if self.held or self.server.alive():
                return False
            log.warning("MinIO on %s died; restarting", self.server.endpoint)
            self.restarts += 1
            self._start()  # a failure propagates; the next tick tries again
            return True

    def hold(self) -> None:
        """Stop the server for maintenance (or a failover drill) and keep it down until release."""
        with self._lock:
            self.held = True
            self.server.stop()

    def release(self) -> None:
        with self._lock:
            if self.held:
                self._start()  # its disk may have been replaced meanwhile
                self.held = False

    def health(self) -> tuple[bool, int | None, int, bool]:
        """(answers its liveness probe, pid, restarts, held), taken together."""
        with self._lock:
            return self.server.healthy(), self.server.pid, self.restarts, self.held

    def count(self, lister, max_age_s: float,
              wait_s: float = COUNT_WAIT_S) -> tuple[int | None, int | None, float | None]:
        """Objects and bytes in the bucket, from a listing (`lister.list(bucket)`: (key, bytes)
        pairs), and the listing's age (None, None, None before the first has ended). Listed in the
        background, since a million objects take about a minute, which the caller (a StorageNode,
        whose namespace pushes wait behind it) must not wait for: max_age_s 0 begins a listing
        (or joins the one running) and waits for it wait_s at most, then answers with the last
        count and its age; otherwise a listing begins once the last is older than max_age_s and
        than the spacing that keeps listing under COUNT_SHARE of the time, and is not waited for."""
        at, _, _, took = self._counted
        due = max_age_s <= 0 or time.monotonic() - at >= max(max_age_s, took / COUNT_SHARE)
        with self._listing_lock:
            if self._listing is None and due:
                self._listing = threading.Thread(target=self._list, args=(lister,), daemon=True, name="minio-count")
                self._listing.start()
            listing = self._listing
        if max_age_s <= 0 and listing is not None:
            listing.join(wait_s)
        at, objects, size, _ = self._counted
        if at == float("-inf"):
            return None, None, None
        return objects, size, time.monotonic() - at

    def _list(self, lister) -> None:
        began, objects, size = time.monotonic(), 0, 0
        try:
            for _, nbytes in lister.list(self.bucket):
                objects, size = objects + 1, size + nbytes
            self._counted = (time.monotonic(), objects, size, time.monotonic() - began)
        except Exception as e:  # MinIO down meanwhile: the count stays as it was, and says its age
            log.warning("counting the objects of bucket %s on %s failed: %s", self.bucket, self.server.endpoint, e)
        finally:
            with self._listing_lock:
                self._listing = None

    def stop(self) -> None:
        with self._lock:
            self.server.stop()
