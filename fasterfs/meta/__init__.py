"""The namespace store: one interface (engine.Engine) with one module per database behind it
(JuiceFS's pkg/meta shape), and the rules the cluster keeps over it (store.NamespaceStore).

    sqlite   the embedded default: one file on the head, <root>/namespace.db
"""
from __future__ import annotations

from pathlib import Path

from ..errors import FasterFSError
from .engine import Engine
from .sqlite import SQLiteEngine
from .store import Changes, Listing, NamespaceStore, Push, Resolved

__all__ = ["ENGINES", "Changes", "Engine", "Listing", "NamespaceStore", "Push", "Resolved", "open_engine"]
ENGINES = {"sqlite": SQLiteEngine}


def open_engine(kind: str, root: Path) -> Engine:
    """The engine `kind` for the cluster whose files are under `root`."""
    if kind not in ENGINES:
        raise FasterFSError(f"option cluster.namespace_store={kind!r}: one of {sorted(ENGINES)}")
    return ENGINES[kind](Path(root) / f"namespace.{kind}")
