"""The namespace store: one interface (engine.Engine) with one module per database behind it
(JuiceFS's pkg/meta shape), and the rules the cluster keeps over it (store.NamespaceStore).
cluster.namespace_store chooses:

    sqlite   the embedded default: one file on the head, <root>/namespace.sqlite
    redis    a Redis server `fasterfs up` starts on the head (redis_server.RedisServer)
"""
from __future__ import annotations

from pathlib import Path

from ..core.config import NAMESPACE_STORES
from ..core.errors import FasterFSError
from .engine import Attrs, Engine
from .sqlite import SQLiteEngine
from .store import AttrsListing, Changes, Listing, Moves, NamespaceStore, Push, Resolved

__all__ = ["ENGINES", "Attrs", "AttrsListing", "Changes", "Engine", "Listing", "Moves", "NamespaceStore", "Push",
           "Resolved", "open_engine"]
ENGINES = NAMESPACE_STORES


def open_engine(kind: str, root: Path) -> Engine:
    """The engine `kind` for the cluster whose files are under `root` (its server running, for redis)."""
    if kind == "sqlite":
        return SQLiteEngine(Path(root) / "namespace.sqlite")
    if kind == "redis":
        from .redis import RedisEngine
        from .redis_server import RedisServer

        server = RedisServer(Path(root))
        return RedisEngine(str(server.socket), server.password())
    raise FasterFSError(f"option cluster.namespace_store={kind!r}: one of {', '.join(ENGINES)}")
