"""`fasterfs://` for the tools users have: DuckDB (register_filesystem) reading Parquet and CSV,
fsspec's own abstract `get` tests (their sources stored by `fasterfs put`), and what fsspec's
caches and DuckDB ask of a file (modified, created, ukey, checksum). Expected values come from
the local files, read with pyarrow and the standard library."""
from __future__ import annotations

import csv
import errno
import posixpath
import time
from datetime import UTC, datetime

import duckdb
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.get import AbstractGetTests

from fasterfs.core import config
from fasterfs.write.ingest import put, remove


@pytest.fixture(scope="module")
def ffs(live_cluster, overrides):
    return fsspec.filesystem("fasterfs", overrides=overrides, skip_instance_cache=True)


@pytest.fixture(scope="module")
def stored(live_cluster, overrides, tmp_path_factory):
    """A Parquet and a CSV file made locally and `put` into the namespace; removed after."""
    local = tmp_path_factory.mktemp("duck")
    rng = np.random.default_rng(7)
    table = pa.table({"sym": np.array(["AAPL", "MSFT", "NVDA"])[rng.integers(0, 3, 20_000)],
                      "px": rng.normal(100, 5, 20_000), "qty": rng.integers(1, 500, 20_000)})
    pq.write_table(table, local / "book.parquet", row_group_size=4096)
    with open(local / "ticks.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sym", "px", "qty"])
        w.writerows(zip(table["sym"].to_pylist(), table["px"].to_pylist(), table["qty"].to_pylist()))
    cfg = config.load(overrides + ["files.chunk_mb=0.25"])  # several chunks per file: reads cross chunk ends
    names = {"parquet": "duck/book.parquet", "csv": "duck/ticks.csv"}
    put(cfg, local / "book.parquet", names["parquet"], force=True)
    put(cfg, local / "ticks.csv", names["csv"], force=True)
    yield local, names
    for name in names.values():
        remove(cfg, name)


def test_duckdb_reads_parquet_and_csv_through_fasterfs(ffs, stored):
    local, names = stored
    con = duckdb.connect()
    con.register_filesystem(ffs)
    expected = pq.read_table(local / "book.parquet").group_by("sym").aggregate([("qty", "sum"), ("px", "count")])
    want = {r["sym"]: (r["qty_sum"], r["px_count"]) for r in expected.to_pylist()}
    got = con.execute(f"SELECT sym, sum(qty), count(px) FROM read_parquet('fasterfs://{names['parquet']}') "
                  "GROUP BY sym").fetchall()
    assert {s: (q, n) for s, q, n in got} == want
    with open(local / "ticks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = con.execute(f"SELECT count(*), sum(qty), max(px) FROM read_csv('fasterfs://{names['csv']}')").fetchone()
    assert got[0] == len(rows) and got[1] == sum(int(r["qty"]) for r in rows)
    assert got[2] == pytest.approx(max(float(r["px"]) for r in rows))
    # a glob over the directory, as DuckDB expands it through the filesystem
    assert con.execute("SELECT count(*) FROM read_parquet('fasterfs://duck/*.parquet')").fetchone()[0] == len(rows)


def test_what_tools_ask_of_a_file(ffs, stored, overrides, tmp_path):
    local, names = stored
    before = time.time()
    path = "duck/v.bin"
    cfg = config.load(overrides)
    (tmp_path / "v").write_bytes(b"one" * 1000)
    put(cfg, tmp_path / "v", path)
    try:
        modified = ffs.modified(path)
        assert isinstance(modified, datetime) and modified.tzinfo == UTC
        assert before - 1 <= modified.timestamp() <= time.time() + 1
        assert ffs.created(path) == modified
        key, check = ffs.ukey(path), ffs.checksum(path)
        put(cfg, tmp_path / "v", path, force=True)  # the same bytes again: a new generation
        ffs.invalidate_cache()
        assert ffs.ukey(path) != key and ffs.checksum(path) == check
        (tmp_path / "v").write_bytes(b"two" * 1000)
        put(cfg, tmp_path / "v", path, force=True)
        ffs.invalidate_cache()
        assert ffs.checksum(path) != check and ffs.cat_file(path) == b"two" * 1000
        # read-only, whichever way a tool tries to change it
        for attempt in (lambda: ffs.rm(path), lambda: ffs.touch("duck/new"), lambda: ffs.pipe("duck/new", b"x"),
                        lambda: ffs.mkdir("duck/d"), lambda: ffs.mv(path, "duck/w.bin"),
                        lambda: ffs.put_file(str(tmp_path / "v"), "duck/w.bin"), lambda: ffs.open(path, "ab")):
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS and "read-only" in str(e.value)
    finally:
        remove(cfg, path)
    assert ffs.cat_file(names["csv"]) == (local / "ticks.csv").read_bytes()


class _Putter:
    """What fsspec's scenario builders call on a filesystem, done with `fasterfs put`: a
    read-only filesystem cannot build them itself. makedirs is a no-op (no empty directories)."""

    def __init__(self, cfg, tmp):
        self.cfg, self.tmp, self.paths = cfg, tmp, []

    def pipe(self, path: str, value: bytes) -> None:
        local = self.tmp / f"f{len(self.paths)}"
        local.write_bytes(value)
        put(self.cfg, local, path, force=True)
        self.paths.append(path)

    def touch(self, path: str) -> None:
        self.pipe(path, f"bytes of {path}".encode())

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass


@pytest.fixture(scope="class")
def scenarios(live_cluster, overrides, tmp_path_factory):
    """fsspec's four scenarios, stored once under fsspec-get/ (get changes nothing)."""
    putter = _Putter(config.load(overrides), tmp_path_factory.mktemp("scenarios"))
    base = AbstractFixtures()
    made = {}
    for scenario in ("bulk_operations_scenario_0", "glob_edge_cases_files", "dir_and_file_with_same_name_prefix",
                     "10_files_with_hashed_names"):
        made[scenario] = getattr(base, f"_{scenario}")(putter, posixpath.join, f"fsspec-get/{scenario}")
    yield made
    for path in putter.paths:
        remove(putter.cfg, path)


class TestFsspecGet(AbstractFixtures, AbstractGetTests):
    """fsspec's abstract tests of `get` (the namespace to local files), unchanged."""

    @pytest.fixture
    def fs(self, ffs):
        return ffs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def supports_empty_directories(self):
        return False

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, scenarios):
        return scenarios["bulk_operations_scenario_0"]

    @pytest.fixture
    def fs_glob_edge_cases_files(self, scenarios):
        return scenarios["glob_edge_cases_files"]

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, scenarios):
        return scenarios["dir_and_file_with_same_name_prefix"]

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, scenarios):
        return scenarios["10_files_with_hashed_names"]

    def test_get_directory_recursive(self, fs, fs_join, local_fs, local_join, local_target, overrides, tmp_path,
                                     monkeypatch):
        """fsspec's own test, unchanged; the source it makes with fs.mkdir and fs.touch (fasterfs://
        is read-only) made by `fasterfs put`."""
        putter = _Putter(config.load(overrides), tmp_path)
        monkeypatch.setattr(fs, "mkdir", putter.makedirs)
        monkeypatch.setattr(fs, "touch", putter.touch)
        try:
            super().test_get_directory_recursive(fs, fs_join, "fsspec-get/recursive", local_fs, local_join,
                                                 local_target)
        finally:
            for path in putter.paths:
                remove(putter.cfg, path)
