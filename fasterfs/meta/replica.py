"""Replica: a storage host's own durable copy of the namespace, so that no name lives on the
head's disk alone.

Each StorageNode's Follower writes every change it takes into one SQLite file beside the node's
data (`node-<id>/namespace-replica.sqlite`), in one transaction committed with fsync, before it
acknowledges the push; the Registry counts a change published only once enough hosts have it
(cluster.durable_copies). A head that lost its disk is rebuilt from the newest replica
(fasterfs.control.head_recovery).

A replica records the version it reaches and a digest of its content (the XOR of one hash per
name and manifest, kept as names change, so equal contents give equal digests whatever order
they arrived in): two replicas at one version whose digests differ disagree, and neither is
taken; a replica whose rows do not give its recorded digest (a torn or tampered file) is not
either.
"""
from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.manifest import Manifest, decode_many
from .engine import Attrs
from .store import AttrsListing, Listing, Resolved

FILE = "namespace-replica.sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS names(name TEXT PRIMARY KEY, manifest TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS facts(k TEXT PRIMARY KEY, v NOT NULL) WITHOUT ROWID;  -- cluster, version, digest, updated
"""


def _hash(name: str, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\0{text}".encode(), digest_size=16).digest(), "big")


@dataclass(frozen=True)
class Summary:
    """What a replica says of itself, read without trusting it further (`Replica.summary`)."""
    path: str
    cluster: str
    version: int
    names: int
    digest: str
    updated: float  # wall time of its last change
    error: str | None = None  # why it cannot be taken (unreadable, damaged), else None

    def to_dict(self) -> dict:
        return asdict(self)


class Replica:
    """One host's copy; its owner (the StorageNode's Follower) writes it under its own lock."""

    def __init__(self, path: Path, cluster: str):
        self.path, self.cluster = Path(path), cluster
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # a change acknowledged survives this host's power loss
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO facts VALUES ('cluster', ?), ('version', -1), ('digest', '0'), "
                            "('updated', 0)", (cluster,))
            self.path.chmod(0o600)  # the namespace names every file: the owner's alone, as on the head
        except sqlite3.Error as e:
            raise FasterFSError(f"the namespace replica {self.path} cannot be opened: {e}") from None
        theirs = self._fact("cluster")
        if theirs != cluster:
            raise FasterFSError(f"the namespace replica {self.path} belongs to cluster {theirs!r}, not {cluster!r}")

    def _fact(self, k: str):
        row = self.db.execute("SELECT v FROM facts WHERE k = ?", (k,)).fetchone()
        return None if row is None else row[0]

    @property
    def version(self) -> int:
        return int(self._fact("version"))

    @contextlib.contextmanager
    def whole(self) -> Iterator[WholeWrite]:
        """The table written anew as a whole namespace's pages arrive (`meta.store.whole` fills
        it as its `texts`), in one transaction that `keep(..., whole=True, texts=it)` ends; rolled
        back if that never comes. The store's texts go in as they are: no million manifests
        encoded again, none held until the last page."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield WholeWrite(self)
        finally:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")

    def keep(self, names: dict[str, Manifest | None], version: int, whole: bool = False,
             texts: WholeWrite | None = None) -> None:
        """Each name's manifest at `version` (None: removed), in one transaction, on disk when this
        returns. `whole`: `names` is every name (any other row goes); `texts`: the rows written
        already in this transaction (`Replica.whole`), the names' others are encoded here."""
        try:
            if texts is None:
                self.db.execute("BEGIN IMMEDIATE")
                digest = 0 if whole else int(self._fact("digest"), 16)
                if whole:
                    self.db.execute("DELETE FROM names")
            else:
                digest = texts.digest
            if whole:  # a million names: one statement, not a million
                written = texts.names if texts is not None else set()
                rows = [(name, m.to_json()) for name, m in names.items() if m is not None and name not in written]
                for name, text in rows:
                    digest ^= _hash(name, text)
                self.db.executemany("INSERT INTO names VALUES (?, ?)", rows)
                names = {}
            for name, m in names.items():
                row = self.db.execute("SELECT manifest FROM names WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    digest ^= _hash(name, row[0])
                if m is None:
                    self.db.execute("DELETE FROM names WHERE name = ?", (name,))
                    continue
                text = m.to_json()
                digest ^= _hash(name, text)
                self.db.execute("INSERT OR REPLACE INTO names VALUES (?, ?)", (name, text))
            self.db.executemany("UPDATE facts SET v = ? WHERE k = ?",
                                [(version, "version"), (f"{digest:x}", "digest"), (time.time(), "updated")])
            self.db.execute("COMMIT")
            if whole:  # the log of a whole rewrite is as large as the file: given back now
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except BaseException as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise FasterFSError(f"the namespace replica {self.path} cannot be written: {e}") from None
            raise

    def load(self) -> tuple[int, dict[str, Manifest]]:
        """(version, every name's manifest) as this copy holds them: a StorageNode's start."""
        texts = [text for (text,) in self.db.execute("SELECT manifest FROM names")]
        return self.version, {m.name: m for m in decode_many(texts, str(self.path))}

    def close(self) -> None:
        self.db.close()

    # -- read by recovery, never trusted further than checked --------------------------------
    @staticmethod
    def summary(path: Path) -> Summary:
        """Version, size and digest as the file records them (no check of its rows: `verified`)."""
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                facts = dict(db.execute("SELECT k, v FROM facts").fetchall())
                count = db.execute("SELECT count(*) FROM names").fetchone()[0]
            finally:
                db.close()
            return Summary(str(path), str(facts["cluster"]), int(facts["version"]), count, str(facts["digest"]),
                           float(facts["updated"]))
        except (sqlite3.Error, KeyError, ValueError) as e:
            return Summary(str(path), "", -1, 0, "", 0.0, f"unreadable: {e}")

    @staticmethod
    def verified(path: Path) -> tuple[Summary, list[str]]:
        """The summary and every manifest's text, once SQLite's own check passes and the rows give
        the recorded digest; FasterFSError naming the file otherwise."""
        s = Replica.summary(path)
        if s.error:
            raise FasterFSError(f"namespace replica {path}: {s.error}")
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise FasterFSError(f"namespace replica {path} is damaged (SQLite: {check})")
            rows = db.execute("SELECT name, manifest FROM names").fetchall()
        except sqlite3.Error as e:
            raise FasterFSError(f"namespace replica {path} cannot be read: {e}") from None
        finally:
            db.close()
        digest = 0
        for name, text in rows:
            digest ^= _hash(name, text)
        if f"{digest:x}" != s.digest:
            raise FasterFSError(f"namespace replica {path}: its {len(rows)} names do not give the digest it "
                                f"records for version {s.version} (torn or altered): not taken")
        return s, [text for _, text in rows]


class WholeWrite:
    """The texts of a whole namespace's pages, written into a replica as they come (the
    `texts` of `meta.store.whole`: cleared when its reading starts over, a name dropped when the
    log changed it after its page)."""

    def __init__(self, replica: Replica):
        self.db, self.names, self.digest = replica.db, set(), 0  # type: sqlite3.Connection, set[str], int

    def clear(self) -> None:
        self.db.execute("DELETE FROM names")
        self.names, self.digest = set(), 0

    def update(self, pairs: Iterable[tuple[str, str]]) -> None:
        rows = []
        for name, text in pairs:
            # Redis's HSCAN may give a name twice: one row, hashed into the digest once (a name
            # changed meanwhile is the log's, `pop`)
            if name not in self.names:
                self.names.add(name)
                self.digest ^= _hash(name, text)
                rows.append((name, text))
        self.db.executemany("INSERT INTO names VALUES (?, ?)", rows)

    def pop(self, name: str, default=None):
        if name in self.names:
            (text,) = self.db.execute("SELECT manifest FROM names WHERE name = ?", (name,)).fetchone()
            self.db.execute("DELETE FROM names WHERE name = ?", (name,))
            self.digest ^= _hash(name, text)
            self.names.discard(name)
        return default


class ReplicaView:
    """Read-only answers from a replica, as the Registry's store would give them: for a reader on a
    storage host while the head is away (fasterfs.read.head_link). A directory is found by the names
    under it (a range of the primary key): a listing costs the names below it, not the namespace."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)

    def summary(self) -> Summary:
        return Replica.summary(self.path)

    def _get(self, name: str) -> Manifest | None:
        row = self.db.execute("SELECT manifest FROM names WHERE name = ?", (name,)).fetchone()
        return None if row is None else Manifest.from_json(row[0], f"{name!r} in {self.path}")

    def manifest(self, name: str | None = None) -> Manifest | None:
        """As the store's: `name`'s, or (None) the dataset ingested last. The latter reads every
        name's kind and time (no index for it here: only while the head is away)."""
        if name is not None:
            return self._get(name)
        row = self.db.execute("SELECT name, manifest FROM names WHERE json_extract(manifest, '$.kind') = 'dataset' "
                              "ORDER BY json_extract(manifest, '$.created') DESC LIMIT 1").fetchone()
        return None if row is None else Manifest.from_json(row[1], f"{row[0]!r} in {self.path}")

    def _under(self, path: str) -> list[Manifest]:
        if not path:
            rows = self.db.execute("SELECT manifest FROM names").fetchall()
        else:  # '0' follows '/': every name that starts with path + '/'
            rows = self.db.execute("SELECT manifest FROM names WHERE name > ? AND name < ?",
                                   (path + "/", path + "0")).fetchall()
        return [Manifest.from_json(text, str(self.path)) for (text,) in rows]

    def resolve(self, path: str) -> Resolved:
        version = self.summary().version
        m = self._get(path)
        if m is not None:
            return Resolved(version, m, None)
        under = self._under(path)
        if under or not path:
            return Resolved(version, None, max((u.created for u in under), default=0.0))
        top = self._get(path.split("/")[0]) if "/" in path else None
        return Resolved(version, top if top is not None and top.kind == "dataset" else None, None)

    def listdir(self, path: str) -> Listing | None:
        """One directory as the store lists it (None: no such directory)."""
        under = self._under(path)
        if not under and path:
            return None
        dirs: dict[str, float] = {}
        names = []
        for m in under:
            rest = m.name[len(path) + 1:] if path else m.name
            if "/" in rest:
                d = f"{path}/{rest.split('/')[0]}" if path else rest.split("/")[0]
                dirs[d] = max(dirs.get(d, 0.0), m.created)
            else:
                names.append(m)
        return Listing(self.summary().version, sorted(dirs.items()), sorted(names, key=lambda m: m.name))

    def attrs(self, path: str) -> AttrsListing | None:
        listing = self.listdir(path)
        if listing is None:
            return None
        return AttrsListing(listing.version, listing.dirs, [Attrs.of(m) for m in listing.names])

    def close(self) -> None:
        self.db.close()
