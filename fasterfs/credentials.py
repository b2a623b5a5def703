"""Per-cluster MinIO credentials, generated at `fasterfs up` and kept in a 0600 file."""
from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import FasterFSError
from .fsutil import atomic_write_json, read_json


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"Credentials(access_key={self.access_key!r}, secret_key='***')"


def create(path: Path) -> Credentials:
    """Generate fresh credentials unless the file exists (data on disk was written with them)."""
    if path.exists():
        return load(path)
    creds = Credentials("ffs-" + secrets.token_hex(8), secrets.token_urlsafe(30))
    atomic_write_json(path, {"access_key": creds.access_key, "secret_key": creds.secret_key}, mode=0o600)
    return creds


def load(path: Path) -> Credentials:
    mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0
    if mode & 0o077:
        raise FasterFSError(f"credentials file {path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    data = read_json(path, "credentials file")
    try:
        return Credentials(data["access_key"], data["secret_key"])
    except (KeyError, TypeError):
        raise FasterFSError(f"credentials file {path} lacks access_key/secret_key") from None
