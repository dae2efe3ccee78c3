"""Input files as streams of bar tables: the contract every reader keeps, discovery and cleaning.

A :class:`Source` is one opened input file. Its ``pieces()`` yield bounded ``pyarrow``
tables with the columns ``symbol`` (string), ``ts`` (int64 ns since the epoch, UTC, the bar
start) and then ``columns`` (float64, or float32 where a Parquet column is float32). Rows
in a piece need not be sorted; a large file is never loaded whole.

Every reader applies one value policy (:func:`clean_piece`) before it yields a piece, and
counts what it drops in ``Source.drops`` (reason -> rows):

* ``timestamp out of range``: ``ts`` outside 1980-01-01 .. 2100-01-01 (this also catches
  DBN's undefined timestamp and integer timestamps that are not nanoseconds);
* ``non-finite price`` / ``non-positive price``: a price column (:data:`PRICE_COLUMNS`)
  that is NaN or infinite (DBN's undefined price included), or ``<= 0``;
* ``non-finite value``: NaN or infinity in any other column.

Which reader opens a file is decided by its first bytes (``PAR1`` for Parquet, ``DBN`` or
a zstd frame for DBN), so a misnamed file is still read or refused plainly. Files may be
local paths or fsspec URLs (``s3://bucket/prefix/*.dbn.zst``), see :mod:`.files`.
"""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import SourceError
from .files import find_urls, is_url, local_path, open_input, stat_input

__all__ = ["Source", "open_source", "open_sources", "expand_inputs", "clean_piece", "PRICE_COLUMNS", "parse_duration"]

PRICE_COLUMNS = ("open", "high", "low", "close", "price", "bid", "ask")
INPUT_SUFFIXES = (".dbn", ".dbn.zst", ".parquet", ".pq")
TS_MIN = 315_532_800_000_000_000  # 1980-01-01T00:00:00Z in ns
TS_MAX = 4_102_444_800_000_000_000  # 2100-01-01T00:00:00Z in ns

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
DBN_MAGIC = b"DBN"

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}
_DURATION = re.compile(r"^\s*(\d+)\s*(ns|us|ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> int:
    """Nanoseconds in ``text`` such as ``1s``, ``1m``, ``5m``, ``1h``, ``1d`` or ``0``."""
    match = _DURATION.match(str(text))
    if not match or (match.group(2) is None and int(match.group(1)) != 0):
        raise ValueError(
            f"bad duration {text!r}: use a whole number and a unit "
            "(ns, us, ms, s, m, h, d), e.g. 30s, 1m, 5m, 1h, 1d, or 0"
        )
    return int(match.group(1)) * _UNITS[match.group(2) or "ns"]


class Source:
    """One opened input file; subclasses read DBN (``kind="dbn"``) or Parquet (``"parquet"``)."""

    kind = ""
    storage_options: dict | None = None

    def __init__(self, path: str, schema: str, columns: list[str], bar_ns: int | None) -> None:
        self.path = path
        self.schema = schema
        self.columns = list(columns)
        self.bar_ns = bar_ns
        self.drops: Counter = Counter()

    def pieces(self, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
        """Yield cleaned tables of at most ``max_rows`` rows, reading the file in bounded steps."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What the manifest records about this input, to tell later whether it changed."""
        if is_url(self.path):
            size, version = stat_input(self.path, self.storage_options)
            return {"path": self.path, "size": size, "version": version, "kind": self.kind, "schema": self.schema}
        st = os.stat(self.path)
        return {
            "path": self.path,
            "size": st.st_size,
            "mtime": st.st_mtime,
            "kind": self.kind,
            "schema": self.schema,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, schema={self.schema!r}, columns={self.columns})"


def keep_rows(
    ts: np.ndarray, prices: Sequence[np.ndarray], others: Sequence[np.ndarray], counter: Counter
) -> np.ndarray | None:
    """Row mask of the value policy, counting each dropped row once; None when all rows pass.

    Shared by :func:`clean_piece` and by readers that clean ticks before aggregating them.
    """
    ts = np.asarray(ts)
    bad_ts = (ts < TS_MIN) | (ts >= TS_MAX)
    nonfinite = np.zeros(len(ts), dtype=bool)
    nonpositive = np.zeros(len(ts), dtype=bool)
    for col in prices:
        finite = np.isfinite(col)
        nonfinite |= ~finite
        nonpositive |= finite & (col <= 0)
    other = np.zeros(len(ts), dtype=bool)
    for col in others:
        other |= ~np.isfinite(col)
    drop = bad_ts | nonfinite | nonpositive | other
    if not drop.any():
        return None
    for reason, mask in (
        ("timestamp out of range", bad_ts),
        ("non-finite price", nonfinite & ~bad_ts),
        ("non-positive price", nonpositive & ~nonfinite & ~bad_ts),
        ("non-finite value", other & ~nonpositive & ~nonfinite & ~bad_ts),
    ):
        n = int(np.count_nonzero(mask))
        if n:
            counter[reason] += n
    return ~drop


def _values(table: pa.Table, name: str) -> np.ndarray:
    """A value column as floats, nulls as NaN."""
    col = table.column(name)
    if col.null_count:
        col = col.cast(pa.float64()).fill_null(float("nan"))
    return col.to_numpy()


def clean_piece(table: pa.Table, counter: Counter) -> pa.Table:
    """Drop rows that break the value policy (see the module docstring), counting them by reason."""
    names = [n for n in table.column_names if n not in ("symbol", "ts")]
    ts = table.column("ts").to_numpy()
    prices = [_values(table, n) for n in names if n in PRICE_COLUMNS]
    others = [_values(table, n) for n in names if n not in PRICE_COLUMNS]
    keep = keep_rows(ts, prices, others, counter)
    return table if keep is None else table.filter(pa.array(keep))


def _is_input(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(INPUT_SUFFIXES) and not os.path.basename(name).startswith(".")


def _walk(root: str) -> list[str]:
    """Input files under ``root``, recursively, skipping hidden files and folders."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(os.path.join(folder, f) for f in files if _is_input(f))
    return found


def expand_inputs(specs: Sequence[str], storage_options: dict | None = None) -> list[str]:
    """Files named by ``specs`` (files, folders searched recursively, globs), sorted and unique.

    A spec may be an fsspec URL (an object, a prefix or a glob such as ``s3://b/dbn/*.dbn.zst``),
    listed with ``storage_options``; its files are returned as URLs.
    """
    seen: dict[str, str] = {}
    for spec in specs:
        spec = os.fspath(spec)
        if is_url(spec):
            found = find_urls(spec, storage_options, _is_input)
            if not found:
                raise SourceError(spec, "matches no input files (looked for *.dbn, *.dbn.zst, *.parquet, *.pq)")
            seen.update((url, url) for url in found)
            continue
        spec = local_path(spec)
        if os.path.isdir(spec):
            found = _walk(spec)
        elif os.path.isfile(spec):
            found = [spec]
        elif glob.has_magic(spec):
            found = []
            for hit in glob.glob(spec, recursive=True):
                if os.path.isdir(hit):
                    found.extend(_walk(hit))
                elif _is_input(hit):
                    found.append(hit)
        else:
            raise SourceError(spec, "no such file or directory")
        if not found:
            raise SourceError(spec, "matches no input files (looked for *.dbn, *.dbn.zst, *.parquet, *.pq)")
        for path in found:
            seen.setdefault(os.path.realpath(path), os.path.normpath(path))
    return sorted(set(seen.values()))


def _sniff(path: str, storage_options: dict | None = None) -> bytes:
    """The first bytes of ``path``, after the checks every input needs (exists, is a file, not empty)."""
    if is_url(path):
        try:
            with open_input(path, storage_options) as fh:
                head = fh.read(8)
        except FileNotFoundError:
            raise SourceError(path, "no such file or directory") from None
        except (OSError, IsADirectoryError) as exc:
            raise SourceError(path, f"cannot read: {exc}") from None
        if not head:
            raise SourceError(path, "empty file")
        return head
    if not os.path.exists(path):
        raise SourceError(path, "no such file or directory")
    if os.path.isdir(path):
        raise SourceError(path, "is a directory (give its files, or pass it through expand_inputs)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise SourceError(path, f"cannot read: {exc.strerror or exc}") from None
    if not head:
        raise SourceError(path, "empty file")
    return head


def open_source(
    path: str,
    *,
    bar: str | None = None,
    ts_column: str | None = None,
    symbol_column: str | None = None,
    columns: list[str] | None = None,
    storage_options: dict | None = None,
) -> Source:
    """Open ``path`` (a local path or an fsspec URL) as DBN or Parquet, checking only its header or footer metadata.

    ``bar`` sets the bar size DBN ticks are aggregated to (default ``1m``) or resamples DBN
    OHLCV bars to a multiple of their interval; Parquet bars are taken as they are.
    ``ts_column`` and ``symbol_column`` name Parquet columns. ``columns`` picks and orders
    the value columns of either format. ``storage_options`` are the fsspec arguments for a URL.
    """
    path = os.fspath(path)
    path = path if is_url(path) else local_path(path)
    head = _sniff(path, storage_options)
    if head.startswith(PARQUET_MAGIC):
        from .parquet import ParquetSource

        return ParquetSource(path, ts_column=ts_column, symbol_column=symbol_column, columns=columns,
                             storage_options=storage_options)
    lower = path.lower()
    if head.startswith((DBN_MAGIC, ZSTD_MAGIC)):
        from .dbn import DbnSource

        return DbnSource(path, bar=bar, columns=columns, storage_options=storage_options)
    if lower.endswith((".parquet", ".pq")):
        raise SourceError(path, "not a Parquet file (bad magic bytes)")
    if ".dbn" in lower:
        raise SourceError(path, "not a DBN file (bad magic bytes)")
    raise SourceError(path, "not a DBN or Parquet file (unrecognised magic bytes)")


def open_sources(paths: Sequence[str], storage_options: dict | None = None, **options: Any) -> list[Source]:
    """``[open_source(p, **options) for p in paths]``, opening URLs 16 at a time (each costs round trips)."""
    if not any(is_url(p) for p in paths):
        return [open_source(p, storage_options=storage_options, **options) for p in paths]
    with ThreadPoolExecutor(16, thread_name_prefix="shardcache-open") as pool:
        return list(pool.map(lambda p: open_source(p, storage_options=storage_options, **options), paths))
