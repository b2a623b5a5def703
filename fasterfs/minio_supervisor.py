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

from . import s3
from .credentials import Credentials
from .minio_server import MinioServer

log = logging.getLogger("fasterfs.minio_supervisor")


class MinioSupervisor:
    def __init__(self, server: MinioServer, bucket: str, reader: Credentials, start_timeout_s: float):
        self.server, self.bucket, self.reader, self.start_timeout_s = server, bucket, reader, start_timeout_s
        self.restarts = 0
        self.held = False  # stopped on purpose: not restarted
        self._lock = threading.Lock()  # one start or stop at a time; status never sees half a restart
        self._counted = (float("-inf"), 0, 0)  # (when, objects, bytes) of the last listing

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
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

    def count(self, lister, max_age_s: float) -> tuple[int, int]:
        """Objects and bytes in the bucket, from a listing (`lister.list(bucket)`: (key, bytes)
        pairs) at most max_age_s old: the dashboard asks every second, and listing is not free."""
        at, objects, size = self._counted
        if time.monotonic() - at >= max_age_s:
            objects = size = 0
            for _, nbytes in lister.list(self.bucket):
                objects, size = objects + 1, size + nbytes
            self._counted = (time.monotonic(), objects, size)
        return objects, size

    def stop(self) -> None:
        with self._lock:
            self.server.stop()
