"""The namespace in Redis (Debian's redis-server, on a unix socket of the head's with a password of
its own, no TCP port): for a head whose namespace must live apart from it, as Ray's own head
fault tolerance keeps the GCS in Redis. One key per name, a sorted set per directory (listed in
name order), the version log as a sorted set by version.

A transaction is one MULTI/EXEC: the writes are queued and applied together or not at all;
reads within it see what the transaction wrote so far (an overlay here), else what is committed.
One writer (the Registry, under the store's lock) is assumed, as for SQLite's one connection."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.errors import FasterFSError
from ..core.manifest import Manifest
from . import engine
from .engine import Engine, parent_of

GONE = object()  # the overlay's mark of a key or field deleted in this transaction


class RedisEngine(Engine):
    kind = "redis"

    def __init__(self, socket_path: str, password: str, prefix: str = "ffs:"):
        import redis

        self.where, self.p = socket_path, prefix
        self.r: Any = redis.Redis(unix_socket_path=socket_path, password=password, decode_responses=True)
        self._tx: Any = None      # the MULTI pipeline of the transaction under way
        self._overlay: dict = {}  # (key, field or None) -> what this transaction wrote
        self._ahead: dict = {}    # (key, field) -> what read_ahead found committed (None: nothing)
        self._ahead_all: dict = {}  # key -> the hash read_ahead found
        try:
            born = time.time_ns()  # from the clock: a store made anew never repeats a number a reader saw
            self.r.hsetnx(self._k("facts"), "version", born)
            self.r.hsetnx(self._k("facts"), "log_floor", born)
            self.r.hsetnx(self._k("facts"), "born", born)
            # log scores count from here: a version itself (~2**60) is past a double's exact integers
            self.born = int(str(self.r.hget(self._k("facts"), "born")))
        except redis.RedisError as e:
            raise FasterFSError(f"the namespace store (Redis at {socket_path}) cannot be reached: {e}") from None

    def _k(self, *parts: str) -> str:
        return self.p + ":".join(parts)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        import redis

        if self._tx is not None:
            yield  # nested: part of the transaction around it
            return
        self._tx, self._overlay = self.r.pipeline(transaction=True), {}
        try:
            yield
            self._tx.execute()
        except redis.RedisError as e:
            raise FasterFSError(f"the head cannot write the namespace store (Redis at {self.where}): {e}; "
                                "the namespace is unchanged") from None
        finally:
            self._tx, self._overlay, self._ahead, self._ahead_all = None, {}, {}, {}

    # -- reads through the overlay, writes into the transaction ------------------------------
    def _hget(self, key: str, field: str):
        got = self._overlay.get((key, field))
        if got is None:
            return self._ahead[key, field] if (key, field) in self._ahead else self.r.hget(key, field)
        return None if got is GONE else got

    def _hgetall(self, key: str) -> dict:
        got = self._ahead_all.get(key)
        return self.r.hgetall(key) if got is None else got

    def read_ahead(self, names: list[str], pieces: list[tuple[int, str]]) -> None:
        wanted = {(self._k("facts"), f) for f in ("version", "log_floor", "root_mtime")}
        for name in names:  # the name, and each directory above it: a file or a directory there
            parts = name.split("/")
            for k in range(1, len(parts) + 1):
                wanted |= {(self._k("names"), "/".join(parts[:k])), (self._k("dirs"), "/".join(parts[:k]))}
        wanted |= {(self._k("retired"), f"{node}\0{key}") for node, key in pieces}
        fields = [f for f in wanted if f not in self._overlay and f not in self._ahead]
        hashes = [self._k("gen", n) for n in names]
        pipe = self.r.pipeline(transaction=False)
        for key, field in fields:
            pipe.hget(key, field)
        for key in hashes:
            pipe.hgetall(key)
        got = pipe.execute()
        self._ahead.update(zip(fields, got[:len(fields)]))
        self._ahead_all.update(zip(hashes, got[len(fields):]))

    def _hset(self, key: str, field: str, value) -> None:
        self._overlay[(key, field)] = value
        self._tx.hset(key, field, value)

    def _hdel(self, key: str, field: str) -> None:
        self._overlay[(key, field)] = GONE
        self._tx.hdel(key, field)

    # -- names ------------------------------------------------------------------------------
    def get(self, name: str) -> Manifest | None:
        text = self._hget(self._k("names"), name)
        return None if text is None else Manifest.from_json(text, f"{name!r} in Redis at {self.where}")

    def put(self, manifest: Manifest) -> None:
        name = manifest.name
        new = self._hget(self._k("names"), name) is None
        self._hset(self._k("names"), name, manifest.to_json())
        self._tx.zadd(self._k("kids", parent_of(name)), {name: 0})
        if manifest.kind == "dataset":
            self._tx.zadd(self._k("datasets"), {name: manifest.created})
        root = float(self._hget(self._k("facts"), "root_mtime") or 0)
        self._hset(self._k("facts"), "root_mtime", max(root, manifest.created))
        d = parent_of(name)
        while d:  # the directories on the way, counting the names under them, dated by the newest
            count, mtime = self._dir(d)
            self._hset(self._k("dirs"), d, json.dumps([count + int(new), max(mtime, manifest.created)]))
            self._tx.zadd(self._k("subdirs", parent_of(d)), {d: 0})
            d = parent_of(d)

    def _dir(self, path: str) -> tuple[int, float]:
        text = self._hget(self._k("dirs"), path)
        if text is None:
            return 0, 0.0
        count, mtime = json.loads(text)
        return int(count), float(mtime)

    def delete(self, name: str) -> None:
        if self._hget(self._k("names"), name) is None:
            return
        self._hdel(self._k("names"), name)
        self._tx.zrem(self._k("kids", parent_of(name)), name)
        self._tx.zrem(self._k("datasets"), name)
        d = parent_of(name)
        while d:
            count, mtime = self._dir(d)
            if count <= 1:
                self._hdel(self._k("dirs"), d)
                self._tx.zrem(self._k("subdirs", parent_of(d)), d)
            else:
                self._hset(self._k("dirs"), d, json.dumps([count - 1, mtime]))
            d = parent_of(d)

    def dir_mtime(self, path: str) -> float | None:
        if path == "":
            return float(self._hget(self._k("facts"), "root_mtime") or 0)
        text = self._hget(self._k("dirs"), path)
        return None if text is None else float(json.loads(text)[1])

    def listdir(self, path: str) -> tuple[list[tuple[str, float]], list[Manifest]]:
        dirs = self.r.zrange(self._k("subdirs", path), 0, -1)
        mtimes = self.r.hmget(self._k("dirs"), dirs) if dirs else []
        names = self.r.zrange(self._k("kids", path), 0, -1)
        texts = self.r.hmget(self._k("names"), names) if names else []
        return ([(d, float(json.loads(t)[1])) for d, t in zip(dirs, mtimes) if t is not None],
                [Manifest.from_json(t, f"{n!r} in Redis at {self.where}") for n, t in zip(names, texts)
                 if t is not None])

    def latest_dataset(self) -> Manifest | None:
        newest = self.r.zrange(self._k("datasets"), -1, -1)
        return self.get(newest[0]) if newest else None

    def page(self, cursor: str) -> tuple[list[str], str | None]:
        # HSCAN's cursor: every name present throughout is returned at least once
        after, found = self.r.hscan(self._k("names"), int(cursor or 0), count=engine.PAGE)
        return list(found.values()), str(after) if after else None

    def count(self) -> int:
        return int(self.r.hlen(self._k("names")))

    # -- the version log --------------------------------------------------------------------
    def version(self) -> int:
        return int(self._hget(self._k("facts"), "version"))

    def log(self, names: list[str]) -> int:
        version = self.version() + 1
        self._hset(self._k("facts"), "version", version)
        if names:
            self._tx.zadd(self._k("log"), {f"{version}\0{n}": version - self.born for n in names})
        floor = version - engine.LOG_KEEP
        if floor > int(self._hget(self._k("facts"), "log_floor")):
            self._tx.zremrangebyscore(self._k("log"), "-inf", floor - self.born)
            self._hset(self._k("facts"), "log_floor", floor)
        return version

    def resume_log(self, version: int) -> None:
        self._tx.delete(self._k("log"))
        for fact in ("version", "log_floor", "born"):  # born: the log's scores stay small (exact as doubles)
            self._hset(self._k("facts"), fact, version)
        self.born = version

    def changed_since(self, version: int) -> list[str] | None:
        if version < int(self.r.hget(self._k("facts"), "log_floor")):
            return None
        return list(dict.fromkeys(m.split("\0", 1)[1] for m in
                                  self.r.zrangebyscore(self._k("log"), f"({version - self.born}", "+inf")))

    # -- generations ------------------------------------------------------------------------
    def add_generation(self, name: str, generation: str, prefix: str, replaced: dict | None = None) -> None:
        self._hset(self._k("gen", name), generation, json.dumps({"prefix": prefix, "replaced": replaced}))
        if replaced is not None:
            self._tx.sadd(self._k("replaced"), f"{name}\0{generation}")

    def replace_generations(self, name: str, when: dict) -> None:
        for generation, text in self._hgetall(self._k("gen", name)).items():
            g = json.loads(text)
            if g["replaced"] is None:
                self._hset(self._k("gen", name), generation, json.dumps(dict(g, replaced=when)))
                self._tx.sadd(self._k("replaced"), f"{name}\0{generation}")

    def generations(self, name: str) -> list[str]:
        got = {g: json.loads(t) for g, t in self.r.hgetall(self._k("gen", name)).items()}
        return sorted(got, key=lambda g: (got[g]["replaced"] is None, g))

    def replaced(self) -> list[dict]:
        out = []
        for member in self.r.smembers(self._k("replaced")):
            name, generation = member.split("\0", 1)
            text = self.r.hget(self._k("gen", name), generation)
            if text is not None:
                g = json.loads(text)
                out.append({"dataset": name, "generation": generation, "prefix": g["prefix"],
                            "replaced": g["replaced"]})
        return out

    def forget_generation(self, name: str, generation: str) -> None:
        self._hdel(self._k("gen", name), generation)
        self._tx.srem(self._k("replaced"), f"{name}\0{generation}")

    # -- retired pieces ---------------------------------------------------------------------
    def retire(self, pieces: list[tuple[int, str, str]], when: dict) -> None:
        for node, key, name in pieces:
            field = f"{node}\0{key}"
            if self._hget(self._k("retired"), field) is None:
                self._hset(self._k("retired"), field, json.dumps({"name": name, "retired": when}))

    def retired(self) -> list[dict]:
        out = []
        for field, text in self.r.hscan_iter(self._k("retired"), count=1000):
            node, key = field.split("\0", 1)
            out.append({"node": int(node), "key": key, **json.loads(text)})
        return out

    def forget_retired(self, pieces: list[tuple[int, str]]) -> int:
        forgotten = 0
        for node, key in pieces:
            field = f"{node}\0{key}"
            if self._hget(self._k("retired"), field) is not None:
                self._hdel(self._k("retired"), field)
                forgotten += 1
        return forgotten

    def close(self) -> None:
        self.r.close()
