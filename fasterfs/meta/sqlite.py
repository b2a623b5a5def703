"""The namespace in SQLite (Python's own sqlite3, WAL): the embedded default, as JuiceFS and
CVMFS keep theirs. One row per name, indexed by its parent directory; directories as rows that
count the names under them; the version log, generations and retired pieces in the same file,
so one transaction changes them together."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..core.errors import FasterFSError
from ..core.manifest import Manifest
from . import engine
from .engine import Attrs, Engine, parent_of

CACHE_KB = 131072  # SQLite's page cache (128 MB: the hot part of a namespace of millions)
MMAP_BYTES = 1 << 30  # the file read through the page cache without copies, up to this size

SCHEMA = """
CREATE TABLE IF NOT EXISTS names(name TEXT PRIMARY KEY, parent TEXT NOT NULL, kind TEXT NOT NULL,
                                 created REAL NOT NULL, manifest TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS names_by_parent ON names(parent);
CREATE INDEX IF NOT EXISTS datasets_by_created ON names(created) WHERE kind = 'dataset';
CREATE TABLE IF NOT EXISTS dirs(path TEXT PRIMARY KEY, parent TEXT NOT NULL, names INTEGER NOT NULL,
                                mtime REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dirs_by_parent ON dirs(parent);
CREATE TABLE IF NOT EXISTS log(version INTEGER NOT NULL, name TEXT NOT NULL, PRIMARY KEY(version, name))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS generations(name TEXT NOT NULL, generation TEXT NOT NULL, prefix TEXT NOT NULL,
                                       replaced TEXT, PRIMARY KEY(name, generation)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS generations_replaced ON generations(name) WHERE replaced IS NOT NULL;
CREATE TABLE IF NOT EXISTS retired(node INTEGER NOT NULL, key TEXT NOT NULL, name TEXT NOT NULL,
                                   retired TEXT NOT NULL, PRIMARY KEY(node, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS facts(k TEXT PRIMARY KEY, v NOT NULL) WITHOUT ROWID;  -- version, log_floor, root_mtime
"""


class SQLiteEngine(Engine):
    kind = "sqlite"

    def __init__(self, file: Path):
        self.file = Path(file)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        try:
            # one connection, used under the store's lock (the Registry's threads)
            self.db = sqlite3.connect(self.file, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # a published batch survives the head's power loss
            # the indexes' upper pages stay in memory at millions of names (the default 2 MB did not:
            # a publish cost 5x more at 200,000 names than at 10,000)
            self.db.execute(f"PRAGMA cache_size=-{CACHE_KB}")
            self.db.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
            self.db.executescript(SCHEMA)
            # from the clock: a store made anew never repeats a number a reader saw before
            born = time.time_ns()
            self.db.execute("INSERT OR IGNORE INTO facts VALUES ('version', ?), ('log_floor', ?)", (born, born))
        except sqlite3.Error as e:
            raise FasterFSError(f"the namespace store {self.file} cannot be opened: {e}") from None
        self._local = threading.local()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            yield  # nested: part of the transaction around it
            return
        self._local.depth = 1
        try:
            self.db.execute("BEGIN IMMEDIATE")
            yield
            self.db.execute("COMMIT")
        except sqlite3.Error as e:  # the head's disk full, or the file gone
            self._rollback()
            raise FasterFSError(f"the head cannot write the namespace store {self.file}: {e}; "
                                "the namespace is unchanged") from None
        except BaseException:
            self._rollback()
            raise
        finally:
            self._local.depth = 0

    def _rollback(self) -> None:
        if self.db.in_transaction:  # SQLite may have rolled back by itself (SQLITE_FULL)
            self.db.execute("ROLLBACK")

    def _one(self, sql: str, *args):
        row = self.db.execute(sql, args).fetchone()
        return None if row is None else row[0]

    # -- names ------------------------------------------------------------------------------
    def get(self, name: str) -> Manifest | None:
        text = self._one("SELECT manifest FROM names WHERE name = ?", name)
        return None if text is None else Manifest.from_json(text, f"{name!r} in {self.file}")

    def put(self, manifest: Manifest) -> None:
        name = manifest.name
        new = self._one("SELECT 1 FROM names WHERE name = ?", name) is None
        self.db.execute("INSERT OR REPLACE INTO names VALUES (?, ?, ?, ?, ?)",
                        (name, parent_of(name), manifest.kind, manifest.created, manifest.to_json()))
        self.db.execute("INSERT INTO facts VALUES ('root_mtime', ?) ON CONFLICT(k) DO UPDATE SET v = max(v, "
                        "excluded.v)", (manifest.created,))
        d = parent_of(name)
        while d:  # the directories on the way, dated by their newest content
            self.db.execute("INSERT INTO dirs VALUES (?, ?, ?, ?) ON CONFLICT(path) DO UPDATE SET "
                            "names = names + excluded.names, mtime = max(mtime, excluded.mtime)",
                            (d, parent_of(d), int(new), manifest.created))
            d = parent_of(d)

    def delete(self, name: str) -> None:
        if self.db.execute("DELETE FROM names WHERE name = ?", (name,)).rowcount == 0:
            return
        d = parent_of(name)
        while d:
            self.db.execute("UPDATE dirs SET names = names - 1 WHERE path = ?", (d,))
            self.db.execute("DELETE FROM dirs WHERE path = ? AND names <= 0", (d,))
            d = parent_of(d)

    def dir_mtime(self, path: str) -> float | None:
        if path == "":
            return self._one("SELECT v FROM facts WHERE k = 'root_mtime'") or 0.0
        return self._one("SELECT mtime FROM dirs WHERE path = ?", path)

    def listdir(self, path: str) -> tuple[list[tuple[str, float]], list[Manifest]]:
        dirs = self.db.execute("SELECT path, mtime FROM dirs WHERE parent = ? ORDER BY path", (path,)).fetchall()
        names = [Manifest.from_json(text, f"{name!r} in {self.file}") for name, text in self.db.execute(
            "SELECT name, manifest FROM names WHERE parent = ? ORDER BY name", (path,))]
        return dirs, names

    def attrs(self, path: str) -> tuple[list[tuple[str, float]], list[Attrs]]:
        # read out of the manifests' JSON by SQLite itself: a 1,000-name directory lists several
        # times faster than parsing each manifest in Python
        dirs = self.db.execute("SELECT path, mtime FROM dirs WHERE parent = ? ORDER BY path", (path,)).fetchall()
        names = [Attrs(n, k, int(size), created, gen) for n, k, created, gen, size in self.db.execute(
            "SELECT name, kind, created, json_extract(manifest, '$.generation'), (SELECT total(json_extract("
            "c.value, '$.bytes')) FROM json_each(manifest, '$.chunks') AS c) FROM names WHERE parent = ? "
            "ORDER BY name", (path,))]
        return dirs, names

    def latest_dataset(self) -> Manifest | None:
        row = self.db.execute("SELECT name, manifest FROM names WHERE kind = 'dataset' "
                              "ORDER BY created DESC LIMIT 1").fetchone()
        return None if row is None else Manifest.from_json(row[1], f"{row[0]!r} in {self.file}")

    def page(self, cursor: str) -> tuple[list[str], str | None]:
        rows = self.db.execute("SELECT name, manifest FROM names WHERE name > ? ORDER BY name LIMIT ?",
                               (cursor, engine.PAGE)).fetchall()
        return [text for _, text in rows], rows[-1][0] if len(rows) == engine.PAGE else None

    def count(self) -> int:
        return self._one("SELECT count(*) FROM names")

    # -- the version log --------------------------------------------------------------------
    def version(self) -> int:
        return self._one("SELECT v FROM facts WHERE k = 'version'")

    def log(self, names: list[str]) -> int:
        version = self.version() + 1
        self.db.execute("UPDATE facts SET v = ? WHERE k = 'version'", (version,))
        self.db.executemany("INSERT OR IGNORE INTO log VALUES (?, ?)", ((version, n) for n in names))
        floor = version - engine.LOG_KEEP
        if floor > self._one("SELECT v FROM facts WHERE k = 'log_floor'"):
            self.db.execute("DELETE FROM log WHERE version <= ?", (floor,))
            self.db.execute("UPDATE facts SET v = ? WHERE k = 'log_floor'", (floor,))
        return version

    def resume_log(self, version: int) -> None:
        self.db.execute("DELETE FROM log")
        self.db.executemany("UPDATE facts SET v = ? WHERE k = ?", [(version, "version"), (version, "log_floor")])

    def changed_since(self, version: int) -> list[str] | None:
        if version < self._one("SELECT v FROM facts WHERE k = 'log_floor'"):
            return None
        return [n for (n,) in self.db.execute("SELECT DISTINCT name FROM log WHERE version > ?", (version,))]

    # -- generations ------------------------------------------------------------------------
    def add_generation(self, name: str, generation: str, prefix: str, replaced: dict | None = None) -> None:
        self.db.execute("INSERT OR REPLACE INTO generations VALUES (?, ?, ?, ?)",
                        (name, generation, prefix, None if replaced is None else json.dumps(replaced)))

    def replace_generations(self, name: str, when: dict) -> None:
        self.db.execute("UPDATE generations SET replaced = ? WHERE name = ? AND replaced IS NULL",
                        (json.dumps(when), name))

    def generations(self, name: str) -> list[str]:
        return [g for (g,) in self.db.execute("SELECT generation FROM generations WHERE name = ? ORDER BY "
                                              "replaced IS NULL, generation", (name,))]

    def replaced(self) -> list[dict]:
        return [{"dataset": n, "generation": g, "prefix": p, "replaced": json.loads(r)} for n, g, p, r in
                self.db.execute("SELECT name, generation, prefix, replaced FROM generations "
                                "WHERE replaced IS NOT NULL")]

    def forget_generation(self, name: str, generation: str) -> None:
        self.db.execute("DELETE FROM generations WHERE name = ? AND generation = ?", (name, generation))

    # -- retired pieces ---------------------------------------------------------------------
    def retire(self, pieces: list[tuple[int, str, str]], when: dict) -> None:
        stamp = json.dumps(when)
        self.db.executemany("INSERT OR IGNORE INTO retired VALUES (?, ?, ?, ?)",
                            ((node, key, name, stamp) for node, key, name in pieces))

    def retired(self) -> list[dict]:
        return [{"node": n, "key": k, "name": name, "retired": json.loads(r)} for n, k, name, r in
                self.db.execute("SELECT node, key, name, retired FROM retired")]

    def forget_retired(self, pieces: list[tuple[int, str]]) -> int:
        return sum(self.db.execute("DELETE FROM retired WHERE node = ? AND key = ?", p).rowcount for p in pieces)

    def close(self) -> None:
        self.db.close()
