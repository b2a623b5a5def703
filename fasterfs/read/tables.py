"""LOBSTER tables over the generic reader: `fasterfs.connect()` and `read_table`,
`chunks_between`, `read_between` (the windows a backtest replays).

Only this layer knows rows and columns (and imports polars); the mount, fsspec and repair read
bytes through fasterfs.read.client.Client.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import polars as pl

from ..control import registry
from ..core import config, lobster
from ..core.errors import FasterFSError, HeadUnreachable
from . import cache_entry
from .client import Client
from .head_link import HeadLink, without_head
from .read_session import ReadSession


class TableClient(Client):
    def read_table(self, i: int) -> pl.DataFrame:
        """Chunk i as a DataFrame with LOBSTER column names; prices are integers (USD x 10000).
        A cached Arrow chunk is memory-mapped and handed to polars without a copy."""
        if self.manifest.format == "arrow" and self.use_cache:
            import pyarrow as pa

            t = time.perf_counter()
            chunk = self.manifest.chunk(i)
            self._note_order(i)
            buf = self._cache_hit(i, cache_entry.map_entry)
            if buf is not None:
                table = pa.ipc.open_file(buf).read_all()
            else:
                table = pa.ipc.open_file(pa.py_buffer(self._read_minio(i, chunk))).read_all()
            self.stats(chunk.nodes[0]).latency(time.perf_counter() - t)
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)  # a table, not an array: always a frame
            return frame
        return lobster.decode_chunk(self.read_chunk(i), self.manifest.format, self.manifest.level)

    def chunks_between(self, start: float, end: float) -> list[int]:
        """Ids of the chunks holding messages with start <= Time < end (seconds after midnight)."""
        if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (start, end)) or not start < end:
            raise FasterFSError(f"time range [{start!r}, {end!r}) of dataset {self.manifest.dataset}: give numbers "
                                "start < end, in seconds after midnight (LOBSTER's Time)")
        return [c.id for c in self.manifest.chunks if c.first_time < end and c.last_time >= start]

    def read_between(self, start: float, end: float) -> pl.DataFrame:
        """Every message with start <= Time < end and its order-book row, in order: the window a
        backtest replays. Reads only the chunks overlapping it, each through the cache like
        read_table, so a window replayed again is served from local disk once it is hot."""
        ids = self.chunks_between(start, end)
        if not ids:
            return pl.DataFrame(schema=lobster.schema(self.manifest.level))
        frame = pl.concat([self.read_table(i) for i in ids])
        return frame.filter((pl.col("Time") >= start) & (pl.col("Time") < end))


def connect(root=None, overrides: Sequence[str] = (), use_cache: bool = True,
            dataset: str | None = None) -> TableClient:
    """A client of `dataset` (default: the one ingested last; or a file's path) in the running
    cluster, from any host: inside a Ray task or actor, the cluster it runs in; elsewhere
    the one at cluster.ray_address, or the one whose head state file is under `root`
    (default cluster.root). What it needs comes from the cluster's Registry; while the head does
    not answer (within namespace.head_timeout_s), on a storage host, from this host's copy of the
    namespace and keys (fasterfs.read.head_link). use_cache=False reads from MinIO only (baselines)."""
    cfg = config.load(overrides)
    try:
        state = registry.find(cfg, root)
        creds = registry.fetch_credentials(state.name)
        link = HeadLink(state.name, state.root, float(cfg.namespace.head_timeout_s), float(cfg.namespace.head_retry_s))
    except HeadUnreachable as e:
        state, creds, link = without_head(cfg, root, e)
    manifest = link.read("manifest", dataset)
    if manifest is None:
        if dataset is None:
            raise FasterFSError(f"no dataset has been ingested into cluster {state.name!r}: run `fasterfs ingest`")
        raise FasterFSError(f"{dataset!r}: no such dataset or file in cluster {state.name!r} (`fasterfs ls`)")
    session = ReadSession(state, creds, cfg, use_cache)
    return TableClient(session, manifest)
