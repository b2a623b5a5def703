"""Per-cluster MinIO keys, generated at `fasterfs up` and kept in a 0600 file on the head.

Two users on every MinIO, least privilege: `admin` (MinIO's root user) for the StorageNodes
(fills, repair, scrub) and for whatever writes (ingest, `put`, GraySort's own data); `reader`,
a user that may only list and GET the cluster's bucket, for every reader (clients, jobs'
tasks, the FUSE mount, fasterfs://). Readers are handed the reader keys by the Registry."""
from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import FasterFSError
from .fsutil import atomic_write_json, read_json

ROLES = ("reader", "admin")


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(access_key={self.access_key!r}, secret_key='***')"


@dataclass(frozen=True)
class ClusterKeys:
    admin: Credentials
    reader: Credentials

    def role(self, name: str) -> Credentials:
        if name not in ROLES:
            raise FasterFSError(f"no MinIO role {name!r}: one of {', '.join(ROLES)}")
        return getattr(self, name)

    def secrets(self) -> list[str]:
        """Every secret value here (what must never appear in a log)."""
        return [self.admin.secret_key, self.reader.secret_key]


def _generate(prefix: str) -> Credentials:
    return Credentials(f"{prefix}-{secrets.token_hex(8)}", secrets.token_urlsafe(30))


def _save(path: Path, keys: ClusterKeys) -> None:
    atomic_write_json(path, {"access_key": keys.admin.access_key, "secret_key": keys.admin.secret_key,
                             "reader": {"access_key": keys.reader.access_key, "secret_key": keys.reader.secret_key}},
                      mode=0o600)


def create(path: Path, rotate: bool = False) -> ClusterKeys:
    """The cluster's keys: generated if the file is missing; otherwise the file's (the data on
    disk lives under them), with new keys for both users if `rotate` (the MinIO servers take
    them when they next start, the data stays)."""
    old = load(path) if path.exists() else None
    if old and not rotate and old.reader is not None:
        return old
    reader = old.reader if old and old.reader else _generate("ffs-reader")
    if rotate:  # the same reader user, a new secret: MinIO then knows no old reader secret
        reader = Credentials(reader.access_key, secrets.token_urlsafe(30))
    keys = ClusterKeys(_generate("ffs") if rotate or not old else old.admin, reader)
    _save(path, keys)
    return keys


def load(path: Path) -> ClusterKeys:
    """The keys in `path`; `reader` is None in a file written before readers had their own."""
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0
    if mode & 0o077:
        raise FasterFSError(f"credentials file {path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    data = read_json(path, "credentials file")
    try:
        reader = data.get("reader")
        return ClusterKeys(Credentials(data["access_key"], data["secret_key"]),
                           Credentials(reader["access_key"], reader["secret_key"]) if reader else None)
    except (KeyError, TypeError, AttributeError):
        raise FasterFSError(f"credentials file {path} lacks access_key/secret_key") from None
