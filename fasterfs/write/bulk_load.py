"""Bulk load: a whole tree of files into the namespace, in batches. `fasterfs put -r` brings a
local directory, `fasterfs import` a prefix of an S3-compatible store (a team's existing bucket).

Each batch is one transaction of the namespace store: its files appear together or not at all.
Before a batch's objects are stored their keys are recorded as pending (the store collects them
after ingest.keep_old_s unless the batch is published first), so a load killed mid-way leaves
nothing visible and no orphan for good; a rerun skips the files already stored with the same
bytes (size and xxh3 of every chunk) and stores the rest. Objects are stored by a bounded pool of
threads (`files.threads`), and batch N is published while batch N+1 is stored. For `import`
each batch is stored by a Ray task, spread over the nodes (each reads the source store itself),
two per node at a time; batches are published in order.
"""
from __future__ import annotations

import collections
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ..control import registry, s3
from ..control.credentials import Credentials
from ..core import erasure
from ..core.config import as_cfg
from ..core.errors import FasterFSError
from ..core.manifest import Manifest, object_prefix
from ..core.namespace import check_path
from ..core.placement import chunk_homes
from .ingest import _target, collect_garbage, store_chunk

Progress = Callable[[int, int, int], None]  # (files done, files in all, bytes stored)


@dataclass(frozen=True)
class SourceFile:
    rel: str   # its path under the source's root, '/'-separated
    size: int


class LocalTree:
    """A local directory: its regular files (symbolic links followed to files), in path order."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FasterFSError(f"{root} is not a directory (put -r takes a directory)")

    def __str__(self) -> str:
        return str(self.root)

    def files(self) -> Iterator[SourceFile]:
        def walk(d: Path, rel: str) -> Iterator[SourceFile]:
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError as e:
                raise FasterFSError(f"cannot list {d}: {e.strerror}") from None
            for entry in entries:
                path = f"{rel}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    yield from walk(Path(entry.path), f"{path}/")
                elif entry.is_file():
                    yield SourceFile(path, entry.stat().st_size)
        yield from walk(self.root, "")

    def read(self, rel: str) -> bytes:
        try:
            with open(self.root / rel, "rb") as f:
                return f.read()
        except OSError as e:
            raise FasterFSError(f"cannot read {self.root / rel}: {e.strerror}") from None


class S3Prefix:
    """Objects under s3://BUCKET/PREFIX of an S3-compatible store at `endpoint`, in key order
    (keys ending in '/', folder markers, are not files)."""

    def __init__(self, url: str, endpoint: str, creds: Credentials):
        if not url.startswith("s3://") or not url[5:].split("/")[0]:
            raise FasterFSError(f"{url}: give the source as s3://BUCKET/PREFIX")
        self.url, self.endpoint, self.creds = url, endpoint, creds
        self.bucket, _, self.prefix = url[5:].partition("/")
        self._client = None

    def __str__(self) -> str:
        return f"{self.url} at {self.endpoint}"

    def __getstate__(self) -> dict:  # sent to Ray tasks: each makes its own client
        return dict(self.__dict__, _client=None)

    @property
    def client(self):
        if self._client is None:
            self._client = s3.client(self.endpoint, self.creds, connect_timeout=5.0, read_timeout=60.0)
        return self._client

    def files(self) -> Iterator[SourceFile]:
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for o in page.get("Contents", []):
                    rel = o["Key"][len(self.prefix):].lstrip("/")
                    if rel and not o["Key"].endswith("/"):
                        yield SourceFile(rel, o["Size"])
        except Exception as e:
            raise FasterFSError(f"cannot list {self}: {e}") from None

    def read(self, rel: str) -> bytes:
        key = f"{self.prefix.rstrip('/')}/{rel}" if self.prefix.rstrip("/") else rel
        try:
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as e:
            raise FasterFSError(f"cannot read s3://{self.bucket}/{key} at {self.endpoint}: {e}") from None


def source_credentials(keys_file: str | None) -> Credentials:
    """The source store's keys: from `keys_file` (JSON {"access_key", "secret_key"}, readable by
    its owner only) or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; never from the command line."""
    if keys_file:
        try:
            mode = os.stat(keys_file).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise FasterFSError(f"{keys_file}: keys readable by others (mode {stat.S_IMODE(mode):o}); "
                                    f"chmod 600 {keys_file}")
            data = json.loads(Path(keys_file).read_text())
            return Credentials(str(data["access_key"]), str(data["secret_key"]))
        except OSError as e:
            raise FasterFSError(f"cannot read {keys_file}: {e.strerror}") from None
        except (ValueError, KeyError, TypeError):
            raise FasterFSError(f"{keys_file}: give JSON with access_key and secret_key") from None
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not access or not secret:
        raise FasterFSError("no keys for the source store: --keys FILE (JSON with access_key and secret_key), "
                            "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment")
    return Credentials(access, secret)


@dataclass(frozen=True)
class Planned:
    """One file of a batch: its name, where its chunks go, and the keys they take."""
    file: SourceFile
    name: str
    generation: str
    placement: list[list[int]]

    def keys(self) -> list[str]:
        """Each chunk's key."""
        prefix = f"{object_prefix(self.name, 'file')}{self.generation}/"
        return [f"{prefix}part-{i:05d}" for i in range(len(self.placement))]

    def pieces(self, ec: bool) -> list[tuple[int, str, str]]:
        """(node, object key, name) of every object the file's chunks take (Manifest.pieces' rule)."""
        return [(node, erasure.shard_key(key, s) if ec else key, self.name)
                for key, nodes in zip(self.keys(), self.placement) for s, node in enumerate(nodes)]


@dataclass
class Loaded:
    """What a load did."""
    files: int = 0       # files the source has
    stored: int = 0      # stored now
    skipped: int = 0     # already stored with the same bytes
    bytes: int = 0       # bytes stored now (one copy)
    batches: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, summed over batches


def _same(m: Manifest, body: bytes) -> bool:
    """Whether `m` (a stored file) holds exactly `body`, cut as it was stored."""
    if m.kind != "file" or m.total_bytes != len(body):
        return False
    at = m.offsets()
    return all(xxhash.xxh3_64_intdigest(body[at[c.id]:at[c.id + 1]]) == c.xxh3 for c in m.chunks)


def store_batch(cfg, state, source, batch: list[Planned], old: dict[str, Manifest], force: bool,
                admin: Credentials) -> tuple[list[tuple[Manifest, str]], int, int]:
    """Read and store a batch's files (the pending record already made). Returns the manifests to
    publish with their prefixes, the files skipped (the same bytes already stored), and the bytes
    stored. Runs in the driver (put -r) or in a Ray task (import)."""
    cfg = as_cfg(cfg)
    chunk_size = int(cfg.files.chunk_mb * 1024 * 1024)
    ec = cfg.layout == "ec"
    k, m = (int(cfg.ec.data), int(cfg.ec.parity)) if ec else (0, 0)
    clients = {n.index: s3.client(n.endpoint, admin, pool=int(cfg.files.threads)) for n in state.nodes}

    def one(p: Planned) -> tuple[Manifest, str] | None:
        body = source.read(p.file.rel)
        before = old.get(p.name)
        if before is not None and _same(before, body):
            return None
        if before is not None and not force:
            raise FasterFSError(f"{p.name} already exists in the namespace with other bytes (from {source}/"
                                f"{p.file.rel}): `fasterfs rm {p.name}` first, or --force")
        if len(body) != p.file.size:
            raise FasterFSError(f"{source}/{p.file.rel} changed while being stored ({p.file.size} bytes listed, "
                                f"{len(body)} read): run the load again")
        info = {"rows": 0, "first_row": 0, "first_time": 0.0, "last_time": 0.0}
        chunks = [store_chunk(clients, state, i, key, body[i * chunk_size:(i + 1) * chunk_size], p.placement[i],
                              k, m, info) for i, key in enumerate(p.keys())]
        manifest = Manifest(dataset=p.name, format="bytes", level=0, rows_per_chunk=0, rows=0, kind="file",
                            replicas=1 if ec else cfg.replicas, node_count=len(state.placing()),
                            bucket=state.settings.bucket, generation=p.generation, chunks=chunks,
                            layout=cfg.layout, ec_data=k, ec_parity=m)
        return manifest, object_prefix(p.name, "file")

    with ThreadPoolExecutor(int(cfg.files.threads), "bulk-store") as pool:
        done = list(pool.map(one, batch))
    items = [d for d in done if d is not None]
    return items, len(done) - len(items), sum(mf.total_bytes for mf, _ in items)


def load(cfg, source: LocalTree | S3Prefix, dest: str, force: bool = False, progress: Progress | None = None,
         remote: bool = False) -> Loaded:
    """Store every file of `source` under `dest` ('' or '/': the root), a batch at a time;
    `remote`: each batch stored by a Ray task (import) instead of in this process."""
    cfg = as_cfg(cfg)
    began = time.monotonic()
    out = Loaded()
    state, n_nodes = _target(cfg, None)
    dest = check_path(dest) if dest.strip("/") else ""
    chunk_size = int(cfg.files.chunk_mb * 1024 * 1024)
    if chunk_size <= 0:
        raise FasterFSError(f"option files.chunk_mb={cfg.files.chunk_mb}: must be > 0")
    width = int(cfg.ec.data) + int(cfg.ec.parity) if cfg.layout == "ec" else int(cfg.replicas)
    node_ids = [n.index for n in state.placing()[:n_nodes]]
    # every name checked before anything is stored: a bad one is refused alone, naming it
    files = list(source.files())
    names = [check_path(f"{dest}/{f.rel}" if dest else f.rel) for f in files]
    out.files = len(files)
    admin = registry.fetch_credentials(state.name, "admin")
    collect_garbage(cfg, state)  # what an earlier load killed mid-way left, once keep_old_s has passed
    batches = _batches(files, names, int(cfg.files.batch_files), int(cfg.files.batch_mb) * 1024 * 1024)
    publisher = ThreadPoolExecutor(1, "bulk-publish")  # batch N published while N+1 is stored
    published: Future | None = None
    remote_store = _remote_store() if remote else None
    storing: collections.deque = collections.deque()  # batches being stored (Ray tasks), oldest first
    window = 2 * n_nodes if remote else 1

    def finish(stored_batch) -> None:
        """The oldest batch stored: published (after the one before it), counted."""
        nonlocal published
        with _timed(out.phases, "store"):
            items, skipped, stored = stored_batch if remote_store is None else _ray_get(stored_batch)
        with _timed(out.phases, "wait_publish"):
            if published is not None:
                published.result()
        published = publisher.submit(_publish, state.name, items, out.phases)
        out.stored, out.skipped, out.bytes, out.batches = (out.stored + len(items), out.skipped + skipped,
                                                           out.bytes + stored, out.batches + 1)
        if progress:
            progress(out.stored + out.skipped, out.files, out.bytes)

    try:
        for batch in batches:
            generation = time.strftime("g%Y%m%dT%H%M%S") + secrets.token_hex(4)
            with _timed(out.phases, "plan"):
                planned = [Planned(f, name, generation, chunk_homes(name, max(1, -(-f.size // chunk_size)),
                                                                    node_ids, width, cfg.placement.load_slack))
                           for f, name in batch]
                old = registry.fetch_manifests_of(state.name, [p.name for p in planned])
                registry.pending_write(state.name, [piece for p in planned for piece in p.pieces(cfg.layout == "ec")])
            if remote_store is not None:
                storing.append(remote_store.remote(cfg, state, source, planned, old, force, admin))
            else:
                with _timed(out.phases, "store"):
                    storing.append(store_batch(cfg, state, source, planned, old, force, admin))
            while len(storing) >= window:
                finish(storing.popleft())
        while storing:
            finish(storing.popleft())
        if published is not None:
            with _timed(out.phases, "wait_publish"):
                published.result()
    finally:
        if remote_store is not None:
            import ray

            for ref in storing:  # a failed load: batches still being stored stop (their pieces are pending)
                ray.cancel(ref)
        publisher.shutdown(wait=True)
    out.seconds = time.monotonic() - began
    return out


def _publish(cluster_name: str, items: list[tuple[Manifest, str]], phases: dict[str, float]) -> None:
    if items:
        with _timed(phases, "publish"):
            registry.publish_batch(cluster_name, items, pending=True)


@contextmanager
def _timed(phases: dict[str, float], phase: str) -> Iterator[None]:
    """Seconds spent in `phase`, summed over batches: where a load's time goes."""
    began = time.monotonic()
    try:
        yield
    finally:
        phases[phase] = phases.get(phase, 0.0) + time.monotonic() - began


def _batches(files: list[SourceFile], names: list[str], max_files: int,
             max_bytes: int) -> Iterator[list[tuple[SourceFile, str]]]:
    batch: list[tuple[SourceFile, str]] = []
    size = 0
    for f, name in zip(files, names):
        if batch and (len(batch) >= max_files or size + f.size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append((f, name))
        size += f.size
    if batch:
        yield batch


def _ray_get(ref):
    import ray

    return ray.get(ref)


def _remote_store():
    """store_batch as a Ray task, spread over the nodes."""
    import ray

    return ray.remote(store_batch).options(num_cpus=0, scheduling_strategy="SPREAD", max_retries=0)
