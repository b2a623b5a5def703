"""Engine: what a namespace store needs of the database under it, one module per engine.

The NamespaceStore (store.py) keeps the rules (generations, repair moves, the version log's
meaning); an engine keeps rows. Each call runs inside `transaction()`, which commits all of
its changes or none. Every operation costs what it touches: a name, a directory's children,
the changes since a version; nothing scans or rewrites the whole namespace.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import NamedTuple

from ..core.manifest import Manifest

LOG_KEEP = 100_000  # versions the log reaches back; a consumer further behind reloads everything
PAGE = 20_000  # names a page of the whole namespace holds (~8 MB of JSON for files of one chunk)


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


class Attrs(NamedTuple):
    """What a listing shows of a name: a file's size, or a dataset (a directory)."""
    name: str
    kind: str
    size: int
    created: float
    generation: str

    @classmethod
    def of(cls, m: Manifest) -> Attrs:
        return cls(m.name, m.kind, sum(c.bytes for c in m.chunks), m.created, m.generation)


class Engine(ABC):
    kind: str  # as cluster.namespace_store names it

    @abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """All the calls within happen together or not at all (an exception rolls back)."""

    # -- names: one row each, found by name or by parent directory --------------------------
    @abstractmethod
    def get(self, name: str) -> Manifest | None: ...

    @abstractmethod
    def put(self, manifest: Manifest) -> None:
        """Set a name's manifest; a new name adds its directories (each counts the names under it)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove a name; directories left with nothing under them go too."""

    @abstractmethod
    def dir_mtime(self, path: str) -> float | None:
        """If names lie under `path` (the root "" always), the newest time among them; else None."""

    def is_dir(self, path: str) -> bool:
        return self.dir_mtime(path) is not None

    @abstractmethod
    def listdir(self, path: str) -> tuple[list[tuple[str, float]], list[Manifest]]:
        """Under `path`, one level: its directories as (path, newest mtime), its names' manifests."""

    def attrs(self, path: str) -> tuple[list[tuple[str, float]], list[Attrs]]:
        """`listdir` as a file system lists it: each name's attributes, not its manifest."""
        dirs, names = self.listdir(path)
        return dirs, [Attrs.of(m) for m in names]

    @abstractmethod
    def latest_dataset(self) -> Manifest | None: ...

    @abstractmethod
    def page(self, cursor: str) -> tuple[list[str], str | None]:
        """For a consumer starting from nothing or too far behind the log: some names' manifests
        as JSON texts, from `cursor` ("" first), and the cursor of the next page (None: that was
        the last). Texts, not manifests: whoever reads a whole namespace decodes it, not the head
        (`manifest.decode_many`). A name changed meanwhile may be in any state or page; the log
        since a version read before the first page says which (store.whole)."""

    @abstractmethod
    def count(self) -> int: ...

    # -- the version log -------------------------------------------------------------------
    @abstractmethod
    def version(self) -> int: ...

    @abstractmethod
    def log(self, names: list[str]) -> int:
        """A new version in which `names` changed; returns it."""

    @abstractmethod
    def changed_since(self, version: int) -> list[str] | None:
        """The names changed after `version`; None once the log no longer reaches back that far."""

    @abstractmethod
    def resume_log(self, version: int) -> None:
        """Within a transaction: the log taken up at `version` (the store filled from a copy at
        that version: its holders go on from it), nothing logged before it."""

    def read_ahead(self, names: list[str], pieces: list[tuple[int, str]]) -> None:
        """Within a transaction: what writing `names` (and forgetting or retiring `pieces`) will
        read, read now at once (for a server, one round trip instead of one per row). A hint:
        an embedded engine reads as cheaply row by row."""
        return None

    # -- generations: every generation each name had, until its objects are deleted ----------
    @abstractmethod
    def add_generation(self, name: str, generation: str, prefix: str, replaced: dict | None = None) -> None:
        """A generation of `name`: its current one, or one `replaced` at that stamp already."""

    @abstractmethod
    def replace_generations(self, name: str, when: dict) -> None:
        """`name`'s current generation (the one not yet replaced) replaced at `when` (a stamp)."""

    @abstractmethod
    def generations(self, name: str) -> list[str]: ...

    @abstractmethod
    def replaced(self) -> list[dict]:
        """Generations replaced and not yet forgotten: {dataset, generation, prefix, replaced}."""

    @abstractmethod
    def forget_generation(self, name: str, generation: str) -> None: ...

    # -- pieces repair moved away (and writes that may have left objects) --------------------
    @abstractmethod
    def retire(self, pieces: list[tuple[int, str, str]], when: dict) -> None:
        """(node, object key, the name it belonged to) retired at `when`; one already retired keeps its time."""

    @abstractmethod
    def retired(self) -> list[dict]:
        """{node, key, name, retired} of every retired piece."""

    @abstractmethod
    def forget_retired(self, pieces: list[tuple[int, str]]) -> int:
        """Forget these pieces; returns how many were retired."""

    @abstractmethod
    def close(self) -> None: ...
