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

from ..core.errors import FasterFSError
from ..core.fsutil import atomic_write_json, owned, read_json

ROLES = ("reader", "admin")
NODE_COPY = "cluster-keys.json"  # a storage host's copy, beside its data (a head that lost its disk takes it back)


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


def _save(path: Path, admin: Credentials, reader: Credentials) -> None:
    atomic_write_json(path, {"access_key": admin.access_key, "secret_key": admin.secret_key,
                             "reader": {"access_key": reader.access_key, "secret_key": reader.secret_key}},
                      mode=0o600)


def save(path: Path, keys: ClusterKeys) -> None:
    """The keys into `path`, 0600 (a storage host's copy, or the head's file restored from one)."""
    _save(path, keys.admin, keys.reader)


def create(path: Path, rotate: bool = False) -> ClusterKeys:
    """The cluster's keys: generated if the file is missing; otherwise the file's (the data on
    disk lives under them, and a file written before readers had their own keys gains them),
    with new keys for both users if `rotate` (the MinIO servers take them when they next start,
    the data stays)."""
    admin, reader = _read(path) if path.exists() else (None, None)
    if admin is not None and reader is not None and not rotate:
        return ClusterKeys(admin, reader)
    reader = reader or _generate("ffs-reader")
    if rotate:  # the same reader user, a new secret: MinIO then knows no old reader secret
        reader = Credentials(reader.access_key, secrets.token_urlsafe(30))
    admin = _generate("ffs") if rotate or admin is None else admin
    _save(path, admin, reader)
    return ClusterKeys(admin, reader)


def load(path: Path) -> ClusterKeys:
    admin, reader = _read(path)
    if reader is None:
        raise FasterFSError(f"credentials file {path} has no reader keys: `fasterfs up` adds them")
    return ClusterKeys(admin, reader)


def _read(path: Path) -> tuple[Credentials, Credentials | None]:
    owned(path, "credentials file")
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0
    if mode & 0o077:
        raise FasterFSError(f"credentials file {path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    data = read_json(path, "credentials file")
    try:
        reader = data.get("reader")
        return (Credentials(data["access_key"], data["secret_key"]),
                Credentials(reader["access_key"], reader["secret_key"]) if reader else None)
    except (KeyError, TypeError, AttributeError):
        raise FasterFSError(f"credentials file {path} lacks access_key/secret_key") from None
