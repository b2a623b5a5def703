"""LOBSTER reading and checking: real sample, generator, and every kind of bad input."""
import gzip
import re

import numpy as np
import polars as pl
import pytest
from conftest import HAVE_SAMPLE, LOBSTER, need_sample

from fasterfs.core import lobster
from fasterfs.core.errors import FasterFSError

pytestmark = pytest.mark.unit  # no root, no Ray, no MinIO

MSG = "AAPL_2012-06-21_34200000_37800000_message_30.csv.gz"
OB = "AAPL_2012-06-21_34200000_37800000_orderbook_30.csv.gz"


@pytest.fixture
def small_pair():
    return lobster.generate(50, 3, seed=1)


def write(tmp_path, message: bytes, orderbook: bytes):
    m, o = tmp_path / "m.csv", tmp_path / "o.csv"
    m.write_bytes(message)
    o.write_bytes(orderbook)
    return m, o


def test_real_sample_reads_and_checks():
    if not HAVE_SAMPLE:
        need_sample()
        pytest.skip("generated data asked for (FASTERFS_TEST_DATA=synthetic): the real sample is not here")
    pair = lobster.read_pair(LOBSTER / MSG, LOBSTER / OB, 30, "AAPL")
    assert pair.rows == 86616
    assert pair.frame.columns == lobster.columns(30)
    assert pair.frame["AskPrice1"].dtype == pl.Int64 and pair.frame["AskPrice1"][0] == 5859400


def test_excerpt_without_final_newline():
    d = LOBSTER / "excerpt_level10_first998rows"
    if not d.exists():
        pytest.skip("excerpt not present")
    pair = lobster.read_pair(d / "AAPL_2012-06-21_34200000_57600000_message_10.csv",
                             d / "AAPL_2012-06-21_34200000_57600000_orderbook_10.csv", 10, "x")
    assert pair.rows == 999


def test_generator_passes_checks_and_has_requested_shape(small_pair):
    pair = lobster.parse_pair(*small_pair, level=3, name="g")
    assert pair.rows == 50 and pair.frame.width == 6 + 12
    assert (pair.frame["AskPrice1"] > pair.frame["BidPrice1"]).all()
    assert lobster.generate(50, 3, seed=1) == small_pair  # deterministic in its seed


@pytest.mark.parametrize("fmt", ["csv", "arrow"])
def test_chunk_roundtrip(small_pair, fmt):
    pair = lobster.parse_pair(*small_pair, level=3, name="g")
    frame = lobster.decode_chunk(lobster.encode_chunk(pair, 10, 30, fmt), fmt, 3)
    assert frame.equals(pair.frame.slice(10, 20))


def test_csv_chunk_is_source_lines_side_by_side(small_pair):
    pair = lobster.parse_pair(*small_pair, level=3, name="g")
    lines = lobster.encode_chunk(pair, 0, 5, "csv").splitlines()
    assert lines == [m + b"," + o for m, o in zip(small_pair[0].splitlines()[:5], small_pair[1].splitlines()[:5])]


def test_crlf_files_read_as_their_lf_twins(tmp_path, small_pair):
    """A pair saved with Windows line ends: the same rows and values, and chunks of the same bytes
    (each row's two halves joined without a stray CR between them)."""
    crlf = [data.replace(b"\n", b"\r\n") for data in small_pair]
    pair = lobster.read_pair(*write(tmp_path, *crlf), 3, "w")
    plain = lobster.parse_pair(*small_pair, level=3, name="w")
    assert pair.frame.equals(plain.frame)
    assert lobster.encode_chunk(pair, 0, 50, "csv") == lobster.encode_chunk(plain, 0, 50, "csv")
    assert b"\r" not in lobster.encode_chunk(pair, 0, 50, "csv")


def test_missing_file_named(tmp_path):
    with pytest.raises(FasterFSError, match="data file not found: .*nope.csv"):
        lobster.read_pair(tmp_path / "nope.csv", tmp_path / "o.csv", 3, "x")


def test_unreadable_file_named(tmp_path, small_pair):
    m, o = write(tmp_path, *small_pair)
    o.unlink()
    o.mkdir()  # a directory where a file should be
    with pytest.raises(FasterFSError, match="o.csv is unreadable"):
        lobster.read_pair(m, o, 3, "x")


def test_damaged_gzip_named(tmp_path, small_pair):
    m, o = write(tmp_path, gzip.compress(small_pair[0])[:-20], small_pair[1])
    with pytest.raises(FasterFSError, match="m.csv is a damaged gzip"):
        lobster.read_pair(m, o, 3, "x")


def test_row_count_mismatch(tmp_path, small_pair):
    m, o = write(tmp_path, small_pair[0], b"\n".join(small_pair[1].splitlines()[:-1]) + b"\n")
    with pytest.raises(FasterFSError, match="row count mismatch: .*m.csv has 50 rows, .*o.csv has 49"):
        lobster.read_pair(m, o, 3, "x")


def test_malformed_row_reports_line(tmp_path, small_pair):
    lines = small_pair[0].splitlines()
    lines[17] = lines[17].replace(b",", b",x", 1)
    m, o = write(tmp_path, b"\n".join(lines), small_pair[1])
    with pytest.raises(FasterFSError, match=r"m.csv line 18: column Type has malformed value"):
        lobster.read_pair(m, o, 3, "x")


def test_short_row_reports_line(tmp_path, small_pair):
    lines = small_pair[1].splitlines()
    lines[4] = lines[4].rsplit(b",", 1)[0]
    m, o = write(tmp_path, small_pair[0], b"\n".join(lines))
    with pytest.raises(FasterFSError, match=r"o.csv line 5: 11 columns, expected 12"):
        lobster.read_pair(m, o, 3, "x")


def test_wrong_level_explained(tmp_path, small_pair):
    m, o = write(tmp_path, *small_pair)
    with pytest.raises(FasterFSError, match=r"line 1: 12 columns, expected 40 \(4 x level 10\); is data.level right"):
        lobster.read_pair(m, o, 10, "x")


def test_time_going_backwards(tmp_path, small_pair):
    lines = small_pair[0].splitlines()
    lines[9], lines[10] = lines[10], lines[9]
    m, o = write(tmp_path, b"\n".join(lines), small_pair[1])
    with pytest.raises(FasterFSError, match=r"m.csv line 11: time .* is earlier"):
        lobster.read_pair(m, o, 3, "x")


def test_crossed_book(tmp_path, small_pair):
    lines = small_pair[1].splitlines()
    fields = lines[3].split(b",")
    fields[0] = fields[2]  # best ask == best bid
    lines[3] = b",".join(fields)
    m, o = write(tmp_path, small_pair[0], b"\n".join(lines))
    with pytest.raises(FasterFSError, match=r"o.csv line 4: best ask .* is not above best bid"):
        lobster.read_pair(m, o, 3, "x")


def test_empty_file(tmp_path):
    m, o = write(tmp_path, b"", b"")
    with pytest.raises(FasterFSError, match="m.csv is empty"):
        lobster.read_pair(m, o, 3, "x")


def test_mid_price_in_dollars(small_pair):
    pair = lobster.parse_pair(*small_pair, level=3, name="g")
    mid = lobster.mid_price(pair.frame).to_numpy()
    expected = (pair.frame["AskPrice1"].to_numpy() + pair.frame["BidPrice1"].to_numpy()) / 2 / 10000
    assert np.allclose(mid, expected)


def test_data_rows_takes_the_files_first_rows_and_bad_counts_are_named(tmp_path, small_pair):
    """data.rows=N ingests the files' first N rows (as the standard library reads the files);
    a count that is not a whole number >= 1, or more rows than the files have, is named."""
    from fasterfs.core import config
    from fasterfs.write.ingest import load_source

    m, o = write(tmp_path, gzip.compress(small_pair[0]), gzip.compress(small_pair[1]))
    files = [f"data.message={m}", f"data.orderbook={o}", "data.level=3"]
    pair = load_source(config.load(files + ["data.rows=20"]))
    with gzip.open(m) as fm, gzip.open(o) as fo:
        want_m, want_o = fm.read().splitlines()[:20], fo.read().splitlines()[:20]
    assert pair.rows == 20 and pair.message_lines == want_m and pair.orderbook_lines == want_o
    assert pair.frame.height == 20 and pair.frame["Time"].to_list() == [float(x.split(b",")[0]) for x in want_m]
    assert load_source(config.load(files)).rows == len(small_pair[0].splitlines())
    for bad, said in (("0", "must be a whole number >= 1"), ("x", "must be a whole number >= 1"),
                      ("51", re.escape(f"{m} has 50 rows"))):
        with pytest.raises(FasterFSError, match=rf"option data.rows={bad}.*{said}"):
            load_source(config.load(files + [f"data.rows={bad}"]))
