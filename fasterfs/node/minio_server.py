"""One MinIO server process: started bound to its node's address, health-checked,
and stopped by the PID it was started with (recorded in a pidfile, so a restarted
StorageNode can take over the server its previous incarnation left serving, or stop it)."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import urllib3

from ..control import tls
from ..control.credentials import Credentials
from ..control.s3 import MarkedGetter
from ..core import process
from ..core.errors import FasterFSError
from ..core.fsutil import log_tail
from ..core.process import spawn_detached, terminate

READER_POLICY = "fasterfs-reader"


def check_port_free(address: str, port: int, what: str) -> None:
    """Fail with the port's name if something already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as e:
            raise FasterFSError(f"port {address}:{port} ({what}) is already in use: {e.strerror}; "
                                f"stop what holds it or choose another port in the configuration") from None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def endpoint(address: str, port: int, tls_on: bool) -> str:
    return f"{'https' if tls_on else 'http'}://{address}:{port}"


class MinioServer:
    """One MinIO server; with `certs_dir` (fasterfs.control.tls.server_files made it) it speaks HTTPS."""

    def __init__(self, binary: Path, address: str, port: int, console_port: int, data_dir: Path,
                 log_path: Path, creds: Credentials, md5_etags: bool = True, certs_dir: Path | None = None):
        self.binary, self.address, self.port, self.console_port = binary, address, port, console_port
        self.md5_etags, self.certs_dir = md5_etags, certs_dir
        self.data_dir, self.log_path, self.creds = Path(data_dir), Path(log_path), creds
        self.pidfile = self.data_dir.parent / "minio.pid"
        self.pid: int | None = None  # the server's, started by this incarnation or taken over from the last
        self._health: MarkedGetter | None = None

    @property
    def endpoint(self) -> str:
        return endpoint(self.address, self.port, self.certs_dir is not None)

    def command(self) -> list[str]:
        return [str(self.binary), "server", str(self.data_dir), "--quiet",
                "--address", f"{self.address}:{self.port}",
                "--console-address", f"{self.address}:{self.console_port}",
                *([] if self.md5_etags else ["--no-compat"]),
                *([] if self.certs_dir is None else ["--certs-dir", str(self.certs_dir)])]

    def _left(self) -> int | None:
        """The pid of a server an earlier incarnation left running (same binary, same data dir)."""
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return None
        cmd = _cmdline(pid)
        return pid if cmd and cmd[0] == str(self.binary) and str(self.data_dir) in cmd else None

    def adopt(self, signed_check) -> int | None:
        """Serve on with the server an earlier incarnation left (a rolling restart: readers of
        this host's chunks never see it stop): taken only if it runs exactly what `start` would
        run, answers, and `signed_check(self)` passes with this incarnation's keys (rotated keys
        mean a new server). Its pid, or None (the caller then stops it: reap_stale)."""
        pid = self._left()
        if pid is None or _cmdline(pid)[:-1] != self.command() or not self.healthy():
            return None
        try:
            signed_check(self)
        except Exception:
            return None
        self.pid = pid
        return pid

    def reap_stale(self) -> int | None:
        """Stop a server left by an earlier incarnation and not adopted."""
        pid = self._left()
        if pid is not None:
            terminate(pid)
        return pid

    def start(self, timeout: float) -> None:
        check_port_free(self.address, self.port, "MinIO API")
        check_port_free(self.address, self.console_port, "MinIO console")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MINIO_ROOT_USER=self.creds.access_key, MINIO_ROOT_PASSWORD=self.creds.secret_key,
                   MINIO_UPDATE="off", MINIO_CALLHOME_ENABLE="off",
                   MINIO_BROWSER="off")  # no web console: one listener per MinIO, its S3 API
        self.pid = spawn_detached(self.command(), self.log_path, env)  # not our child: a restart hands it over
        self.pidfile.write_text(str(self.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise FasterFSError(f"MinIO on {self.endpoint} exited at start; its log {self.log_path} ends:\n"
                                    f"{log_tail(self.log_path, 5)}")
            if self.healthy():
                return
            time.sleep(0.1)
        self.stop()
        raise FasterFSError(f"MinIO on {self.endpoint} was not healthy within {timeout:.0f} s; see {self.log_path}")

    def ensure_reader(self, reader: Credentials, bucket: str, timeout: float = 30.0) -> None:
        """The read-only user readers sign with: may list and GET `bucket`, nothing else
        (MinIO refuses its PUTs and DELETEs). Idempotent; sets the secret (rotation)."""
        from minio.credentials import StaticProvider
        from minio.error import MinioAdminException
        from minio.minioadmin import MinioAdmin

        admin = MinioAdmin(endpoint=f"{self.address}:{self.port}", secure=self.certs_dir is not None,
                           credentials=StaticProvider(self.creds.access_key, self.creds.secret_key),
                           http_client=urllib3.PoolManager(timeout=urllib3.Timeout(connect=2, read=30), retries=False,
                                                           **tls.urllib3_options(self.endpoint)))
        policy = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}
        # MinIO answers its liveness probe before its IAM has loaded; until then admin
        # requests get 503 XMinioServerNotInitialized, which is "wait", not "refused".
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin.policy_add(READER_POLICY, policy=policy)
                admin.user_add(reader.access_key, reader.secret_key)
                try:
                    admin.attach_policy([READER_POLICY], user=reader.access_key)
                except MinioAdminException as e:
                    if "AlreadyApplied" not in str(e):
                        raise
                return
            except MinioAdminException as e:  # the message names the request, never the keys
                if "XMinioServerNotInitialized" in str(e) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise FasterFSError(f"MinIO on {self.endpoint} refused to set up its reader user: "
                                    f"{str(e).splitlines()[0][:300]}") from None

    def alive(self) -> bool:
        """Its pid still runs this server (a pid taken by another process does not)."""
        return self.pid is not None and process.running(self.pid) and _cmdline(self.pid)[:-1] == self.command()

    def healthy(self, timeout: float = 1.0) -> bool:
        """MinIO's liveness probe, over one kept-alive connection: the dashboard asks every
        second, and a new connection each time is a MinIO connection for SOCK_OPS to count."""
        if self._health is None:
            self._health = MarkedGetter(self.endpoint, self.creds, 0, pool=1)
        return self._health.live(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.pid is not None:
            terminate(self.pid, timeout)
            self.pid = None
        if self._health is not None:
            self._health.close()
            self._health = None
        self.pidfile.unlink(missing_ok=True)
