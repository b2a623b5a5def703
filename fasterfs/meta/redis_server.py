"""The namespace's Redis server (cluster.namespace_store=redis), started by `fasterfs up` on the
head and stopped by `down` by its PID. It listens on a unix socket in a directory only root may
enter (no TCP port: nothing on the network reaches it), asks for a password generated for this
cluster (kept 0600 beside its configuration, never on a command line), and keeps an append-only
file fsynced at every write, as the SQLite engine fsyncs every transaction."""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write, owned


class RedisServer:
    def __init__(self, root: Path):
        self.dir = Path(root) / "redis"
        self.socket = self.dir / "redis.sock"
        self.password_file = self.dir / "password"
        self.conf = self.dir / "redis.conf"
        self.log = self.dir / "redis.log"

    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError as e:
            raise FasterFSError(f"the namespace store's password {self.password_file}: {e.strerror}") from None

    def start(self, timeout: float) -> int:
        """Start it (a password made on first start); returns its PID once it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise FasterFSError("option cluster.namespace_store=redis needs redis-server: run `make setup`")
        self.dir.mkdir(parents=True, exist_ok=True)
        owned(self.dir, "the namespace store's directory")  # another local user's, made before us: never trusted
        owned(self.password_file, "the namespace store's password file")
        os.chmod(self.dir, 0o700)
        if not self.password_file.exists():
            atomic_write(self.password_file, secrets.token_urlsafe(32).encode(), 0o600)
        atomic_write(self.conf, "\n".join([
            "port 0", f"unixsocket {self.socket}", "unixsocketperm 700", f"dir {self.dir}",
            f"requirepass {self.password()}", "appendonly yes", "appendfsync always", 'save ""',
            f"logfile {self.log}", "daemonize no", "protected-mode yes",
            'proc-title-template "{title} {config-file}"', ""]).encode(), 0o600)  # is_ours reads it
        proc = subprocess.Popen([binary, str(self.conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FasterFSError(f"redis-server for the namespace exited ({proc.returncode}): see {self.log}")
            if self.answers():
                return proc.pid
            time.sleep(0.05)
        proc.kill()
        raise FasterFSError(f"redis-server for the namespace did not answer on {self.socket} in {timeout:g} s: "
                            f"see {self.log}")

    def is_ours(self, pid: int | None) -> bool:
        """Whether `pid` is this server (started with this configuration), not a PID reused since."""
        try:
            return bool(pid) and str(self.conf).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(unix_socket_path=str(self.socket), password=self.password(),
                                    socket_timeout=1).ping())
        except (redis.RedisError, OSError, FasterFSError):
            return False
