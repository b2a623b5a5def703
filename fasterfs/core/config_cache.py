"""Composed configurations kept on disk between processes, per user.

Every command, job, actor and task process composes conf/ with its overrides once; Hydra
takes about 0.17 s of CPU for it, of a command's 1.3 s. A composition depends only on conf/'s
files, the overrides, the FASTERFS_* environment and this checkout's place, so its result is
kept under the key of all four. Kept as JSON, never a pickle (a pickle read back runs whatever
its writer put in it), in a directory of the user's own that no one else may write to
(another user's file there would set this user's options); anything else and the cache is
not used. Bounded to MAX_FILES files, the oldest dropped.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

from .fsutil import atomic_write

MAX_FILES = 256


def directory() -> Path | None:
    """$XDG_CACHE_HOME/fasterfs/config (else ~/.cache/...), made 0700 if missing; None where it
    or its parent is not this user's (or root's) alone, or cannot be made (HOME of nobody)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base, "fasterfs", "config")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for p in (path, path.parent):
            st = p.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
                return None
    except OSError:
        return None
    return path


def key(*parts: object, conf_dir: Path) -> str:
    """A digest of `parts` and of every file under `conf_dir` (name and content)."""
    digest = hashlib.sha256(json.dumps(parts, default=str).encode())
    for f in sorted(conf_dir.rglob("*.yaml")):
        digest.update(str(f.relative_to(conf_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def get(name: str) -> dict | None:
    """The composition kept under `name`, or None (none, not this user's alone, or unreadable)."""
    where = directory()
    if where is None:
        return None
    try:
        with open(where / f"{name}.json", "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:  # only what this user alone could write
                return None
            kept = json.load(f)
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def put(name: str, composed: dict) -> None:
    """Keep `composed` under `name` (0600), dropping the oldest past MAX_FILES; a cache that
    cannot be written is no error."""
    where = directory()
    if where is None:
        return
    with contextlib.suppress(OSError):
        atomic_write(where / f"{name}.json", json.dumps(composed).encode(), mode=0o600)
        kept = list(where.glob("*.json"))
        if len(kept) > MAX_FILES:
            for old in sorted(kept, key=lambda p: p.stat().st_mtime)[:len(kept) - MAX_FILES]:
                old.unlink(missing_ok=True)
