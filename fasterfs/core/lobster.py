"""The LOBSTER limit-order-book format: reading and checking a message/order-book pair,
generating data of the same shape, and encoding/decoding chunks of rows.

A LOBSTER pair is two header-less CSV files with one row per event: the message
file (Time, Type, OrderID, Size, Price, Direction) and the order book after that
event (AskPrice1, AskSize1, BidPrice1, BidSize1, ... down to the file's level).
Prices are integers, USD x 10000, as in the source; FasterFS keeps them so.

A FasterFS chunk holds rows [start, stop) of both files side by side: in CSV each
line is the message line, a comma, and the order-book line, byte for byte as in
the source; in Arrow IPC the same rows as typed columns.
"""
from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from .errors import FasterFSError

MESSAGE_COLUMNS = ["Time", "Type", "OrderID", "Size", "Price", "Direction"]
EMPTY_ASK, EMPTY_BID = 9999999999, -9999999999  # LOBSTER's placeholders for an empty level


def orderbook_columns(level: int) -> list[str]:
    return [f"{name}{lvl}" for lvl in range(1, level + 1) for name in ("AskPrice", "AskSize", "BidPrice", "BidSize")]


def columns(level: int) -> list[str]:
    return MESSAGE_COLUMNS + orderbook_columns(level)


def schema(level: int) -> dict[str, type[pl.DataType]]:
    return {c: pl.Float64 if c == "Time" else pl.Int64 for c in columns(level)}


@dataclass
class Pair:
    """A checked LOBSTER pair: raw lines (for byte-exact CSV chunks) and typed columns."""

    name: str
    level: int
    message_lines: list[bytes]
    orderbook_lines: list[bytes]
    frame: pl.DataFrame  # message and order-book columns side by side

    @property
    def rows(self) -> int:
        return len(self.message_lines)

    def head(self, rows: int) -> Pair:
        """The pair's first `rows` rows."""
        return Pair(self.name, self.level, self.message_lines[:rows], self.orderbook_lines[:rows],
                    self.frame.head(rows))


# -- reading and checking ----------------------------------------------------------


def read_file(path: str | Path) -> bytes:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FasterFSError(f"data file not found: {path}") from None
    except OSError as e:
        raise FasterFSError(f"data file {path} is unreadable: {e.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise FasterFSError(f"data file {path} is a damaged gzip file: {e}") from None
    return raw


def read_pair(message_path: str | Path, orderbook_path: str | Path, level: int, name: str) -> Pair:
    return parse_pair(read_file(message_path), read_file(orderbook_path), level, name,
                      str(message_path), str(orderbook_path))


def _lines(data: bytes) -> list[bytes]:
    """The rows, without their line ends: LF, or CRLF (a file saved on Windows)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":  # trailing newline (LOBSTER's files may lack one)
        lines.pop()
    if b"\r" in data:
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    return lines


def _check_columns(lines: list[bytes], expected: int, where: str, hint: str = "") -> None:
    commas = expected - 1
    for number, line in enumerate(lines, 1):
        if line.count(b",") != commas:
            got = line.count(b",") + 1 if line.strip() else 0
            raise FasterFSError(f"{where} line {number}: {got} columns, expected {expected}{hint}")


def _parse(data: bytes, names: list[str], lines: list[bytes], where: str) -> pl.DataFrame:
    sch = {n: pl.Float64 if n == "Time" else pl.Int64 for n in names}
    try:
        return pl.read_csv(io.BytesIO(data), has_header=False, new_columns=names, schema=sch)
    except Exception:
        pass
    # polars does not say which line failed: find it ourselves.
    for number, line in enumerate(lines, 1):
        for col, field in zip(names, line.split(b",")):
            try:
                float(field) if sch[col] == pl.Float64 else int(field)
            except ValueError:
                raise FasterFSError(f"{where} line {number}: column {col} has malformed value {field[:40]!r}") from None
    raise FasterFSError(f"{where}: could not be parsed as CSV")


def parse_pair(message: bytes, orderbook: bytes, level: int, name: str,
               message_where: str = "message file", orderbook_where: str = "order book file") -> Pair:
    """Check a pair the way LOBSTER's own readme describes it and return its rows."""
    mlines, olines = _lines(message), _lines(orderbook)
    if not mlines:
        raise FasterFSError(f"{message_where} is empty")
    if len(mlines) != len(olines):
        raise FasterFSError(f"row count mismatch: {message_where} has {len(mlines)} rows, "
                            f"{orderbook_where} has {len(olines)}; row i of one must describe row i of the other")
    _check_columns(mlines, len(MESSAGE_COLUMNS), message_where)
    _check_columns(olines, 4 * level, orderbook_where,
                   f" (4 x level {level}); is data.level right for this file?")
    mframe = _parse(message, MESSAGE_COLUMNS, mlines, message_where)
    oframe = _parse(orderbook, orderbook_columns(level), olines, orderbook_where)

    time = mframe["Time"].to_numpy()
    back = np.flatnonzero(np.diff(time) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise FasterFSError(f"{message_where} line {i + 1}: time {time[i]} is earlier than the line before "
                            f"({time[i - 1]})")
    ask, bid = oframe["AskPrice1"].to_numpy(), oframe["BidPrice1"].to_numpy()
    crossed = np.flatnonzero((ask <= bid) & (ask != EMPTY_ASK) & (bid != EMPTY_BID))
    if crossed.size:
        i = int(crossed[0])
        raise FasterFSError(f"{orderbook_where} line {i + 1}: best ask {ask[i]} is not above best bid {bid[i]}")
    return Pair(name, level, mlines, olines, pl.concat([mframe, oframe], how="horizontal"))


# -- chunks --------------------------------------------------------------------------


def encode_chunk(pair: Pair, start: int, stop: int, fmt: str) -> bytes:
    if fmt == "csv":
        rows = [m + b"," + o for m, o in zip(pair.message_lines[start:stop], pair.orderbook_lines[start:stop])]
        return b"\n".join(rows) + b"\n"
    if fmt == "arrow":
        buf = io.BytesIO()
        # Uncompressed, so a cached chunk can be memory-mapped and used without a copy.
        pair.frame.slice(start, stop - start).write_ipc(buf, compression="uncompressed")
        return buf.getvalue()
    raise FasterFSError(f"unknown chunk format {fmt!r} (data.format must be csv or arrow)")


def decode_chunk(data, fmt: str, level: int) -> pl.DataFrame:
    """A chunk's rows as a DataFrame with LOBSTER column names."""
    if fmt == "csv":
        return pl.read_csv(io.BytesIO(data) if isinstance(data, bytes) else data, has_header=False,
                           new_columns=columns(level), schema=schema(level))
    if fmt == "arrow":
        return pl.read_ipc(io.BytesIO(data) if isinstance(data, bytes) else data)
    raise FasterFSError(f"unknown chunk format {fmt!r}")


def mid_price(frame: pl.DataFrame) -> pl.Series:
    """Mid price in USD from the best ask and bid."""
    return ((frame["AskPrice1"] + frame["BidPrice1"]) / 20000.0).alias("mid")


# -- generator -----------------------------------------------------------------------


def generate(rows: int, level: int, seed: int = 0) -> tuple[bytes, bytes]:
    """A LOBSTER-format pair of the requested shape (message CSV, order-book CSV).

    A random walk of the best quotes in one-cent ticks with the book stacked a
    tick apart behind them; times increase from the 09:30 open. It satisfies every
    check `parse_pair` makes, so it stands in for the real sample on machines without it.
    """
    if rows < 1 or level < 1:
        raise FasterFSError(f"generator needs rows >= 1 and level >= 1 (got rows={rows}, level={level})")
    rng = np.random.default_rng(seed)
    tick = 100
    time = 34200.0 + np.cumsum(rng.exponential(0.04, rows))
    mid = 5_850_000 + tick * np.cumsum(rng.integers(-1, 2, rows))
    half_spread = tick * rng.integers(1, 4, rows)
    ask1, bid1 = mid + half_spread, mid - half_spread
    direction = rng.choice(np.array([-1, 1]), rows)
    msg = pl.DataFrame({
        "Time": time.round(9),
        "Type": rng.choice(np.array([1, 2, 3, 4, 5]), rows, p=[0.45, 0.05, 0.4, 0.08, 0.02]),
        "OrderID": 16_000_000 + np.cumsum(rng.integers(1, 20, rows)),
        "Size": rng.integers(1, 500, rows),
        "Price": np.where(direction > 0, bid1, ask1),
        "Direction": direction,
    })
    book = {}
    for lvl in range(1, level + 1):
        book[f"AskPrice{lvl}"] = ask1 + tick * (lvl - 1)
        book[f"AskSize{lvl}"] = rng.integers(1, 1000, rows)
        book[f"BidPrice{lvl}"] = bid1 - tick * (lvl - 1)
        book[f"BidSize{lvl}"] = rng.integers(1, 1000, rows)
    return (msg.write_csv(include_header=False, float_precision=9).encode(),
            pl.DataFrame(book).write_csv(include_header=False).encode())
