"""Atomic file writes: a reader sees the old file or the new one, never half of one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to a temporary file beside `path`, fsync it, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # before any byte lands, so secrets are never world-readable
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj, mode: int = 0o644) -> Path:
    return atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), mode)


def owned(path: str | os.PathLike, what: str) -> Path:
    """`path`, refused if it exists and is not this user's: under a directory others can write
    to, another local user may have made it first to have it used (a token, a key, a state file
    naming what `down` removes). Not followed if it is a symbolic link."""
    from .errors import FasterFSError

    path = Path(path)
    try:
        uid = path.lstat().st_uid
    except FileNotFoundError:
        return path
    if uid != os.geteuid():
        raise FasterFSError(f"{what} {path} belongs to uid {uid}, not to this user (uid {os.geteuid()}): "
                            "another local user may have planted it; remove it, or choose another root")
    return path


def private_dir(path: str | os.PathLike, what: str) -> Path:
    """A directory only this user can enter: made 0700, or this user's already (then made 0700)."""
    path = owned(path, what)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.is_dir() or path.is_symlink():
        from .errors import FasterFSError

        raise FasterFSError(f"{what} {path} is not a directory")
    os.chmod(path, 0o700)
    return path


def read_json(path: str | os.PathLike, what: str):
    """Load JSON, turning a missing or corrupt file into an error that names it."""
    from .errors import FasterFSError

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FasterFSError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as e:
        raise FasterFSError(f"{what} at {path} is unreadable: {e}") from None


def log_tail(path: str | os.PathLike, lines: int = 15) -> str:
    """A log's last lines, for an error that names the log (a process that ended at start)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
