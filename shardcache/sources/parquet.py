"""Parquet bar tables as sources: one row per bar, any numeric columns as features.

* The timestamp column is ``ts_column`` or the first of :data:`TS_NAMES` present (also
  matched ignoring case). Timestamp types of any unit and time zone (stored as UTC),
  dates (midnight UTC) and integers (taken as ns since the epoch) are accepted.
* The symbol column is ``symbol_column`` or the first of :data:`SYMBOL_NAMES` present
  (strings or integers). With none, the symbol comes from a ``symbol=...`` folder of a
  hive-partitioned layout, else from the file name (``ESH3.parquet`` -> ``ESH3``).
* Value columns are ``columns`` (each must exist and be numeric) or else every numeric
  column but the timestamp and symbol; other columns are ignored. Integer, decimal and
  boolean columns become float64, float16 becomes float32, float32 and float64 stay.

The file is read in record batches (``ParquetFile.iter_batches``), never whole; a URL is
read through an fsspec file (``storage_options``). Rows with
a null symbol are dropped (``missing symbol``); a null timestamp counts as out of range.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import SourceError
from . import Source, clean_piece
from .files import is_url, open_input, url_fs

__all__ = ["ParquetSource", "TS_NAMES", "SYMBOL_NAMES"]

TS_NAMES = ("ts_event", "timestamp", "time", "ts", "datetime")
SYMBOL_NAMES = ("symbol", "instrument_id", "ticker")
_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_DAY_NS = 86_400_000_000_000
_INT_TS_FLOOR = 10**15  # ns integers below this all fall in 1970-01-01..12: seconds or milliseconds


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _is_numeric(t: pa.DataType) -> bool:
    types = pa.types
    return types.is_integer(t) or types.is_floating(t) or types.is_decimal(t) or types.is_boolean(t)


def _is_time(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_integer(t)


def _is_symbol(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


def _ts_ns(col: pa.Array) -> np.ndarray:
    """A timestamp, date or integer column as int64 ns; nulls and overflows as -1 (out of range)."""
    t = col.type
    if pa.types.is_timestamp(t):
        scale = _NS_PER[t.unit]
    elif pa.types.is_date32(t):
        scale = _DAY_NS
    elif pa.types.is_date64(t):
        scale = 1_000_000
    else:
        scale = 1
    if pa.types.is_unsigned_integer(t):
        ints = col.cast(pa.uint64()).view(pa.int64())
    elif pa.types.is_date32(t):
        ints = col.cast(pa.int32()).cast(pa.int64())
    else:
        ints = col.cast(pa.int64())
    values = ints.fill_null(-1).to_numpy(zero_copy_only=False)
    if scale == 1:
        return values
    limit = np.iinfo(np.int64).max // scale
    return np.where((values < 0) | (values > limit), -1, values * scale)


class ParquetSource(Source):
    """A Parquet file of bars; see the module docstring for how columns are found."""

    kind = "parquet"

    def __init__(
        self,
        path: str,
        *,
        ts_column: str | None = None,
        symbol_column: str | None = None,
        columns: list[str] | None = None,
        storage_options: dict | None = None,
    ) -> None:
        self.path = path
        self.storage_options = storage_options
        try:
            pf = self._open()
        except (pa.ArrowException, OSError) as exc:
            msg = _one_line(exc)
            if "magic" in msg.lower():
                with open_input(path, storage_options) as fh:
                    truncated = fh.read(4) == b"PAR1"
                if truncated:
                    raise SourceError(path, "truncated Parquet file (no footer)") from None
                raise SourceError(path, "not a Parquet file (bad magic bytes)") from None
            raise SourceError(path, f"corrupt Parquet metadata ({msg})") from None
        schema, meta = pf.schema_arrow, pf.metadata
        pf.close()
        self._types = {f.name: f.type for f in schema}
        names = list(schema.names)
        self.ts_column = self._find(ts_column, TS_NAMES, "timestamp", "--ts-column", names)
        if self.ts_column is None:
            looked = ", ".join(TS_NAMES)
            raise SourceError(path, f"no timestamp column (looked for {looked}; use --ts-column)")
        ts_type = self._types[self.ts_column]
        if not _is_time(ts_type):
            raise SourceError(
                path,
                f"timestamp column '{self.ts_column}' has type {ts_type}; "
                "expected a timestamp, a date or int64 nanoseconds since the epoch",
            )
        if pa.types.is_integer(ts_type):
            self._check_int_ts(meta)
        self.symbol_column = self._find(symbol_column, SYMBOL_NAMES, "symbol", "--symbol-column", names)
        if self.symbol_column is not None and not _is_symbol(self._types[self.symbol_column]):
            if symbol_column is not None:
                raise SourceError(
                    path,
                    f"symbol column '{self.symbol_column}' has type {self._types[self.symbol_column]}; "
                    "expected strings or integers",
                )
            self.symbol_column = None
        self.fixed_symbol = None if self.symbol_column else self._symbol_from_path(path)
        keys = {self.ts_column, self.symbol_column}
        if columns:
            for name in columns:
                if name not in self._types:
                    raise SourceError(path, f"no column '{name}' (columns are: {_listing(names)})")
                if name in keys:
                    raise SourceError(path, f"column '{name}' is the timestamp or symbol column")
                if not _is_numeric(self._types[name]):
                    problem = f"column '{name}' has type {self._types[name]}; feature columns must be numeric"
                    raise SourceError(path, problem)
            chosen = list(columns)
        else:
            chosen = [n for n in names if n not in keys and _is_numeric(self._types[n])]
            if not chosen:
                raise SourceError(path, f"no numeric feature columns (columns are: {_listing(names)})")
        super().__init__(path, "parquet", chosen, None)

    def _open(self) -> pq.ParquetFile:
        """The file's Parquet reader: Arrow's own file locally, an fsspec file for a URL (closed with it)."""
        if not is_url(self.path):
            # pre_buffer would hold every row group in memory at once: read them one at a time
            return pq.ParquetFile(self.path, pre_buffer=False)
        fs, path = url_fs(self.path, self.storage_options)
        return pq.ParquetFile(path, filesystem=fs, pre_buffer=False)

    def _find(
        self, given: str | None, candidates: tuple[str, ...], what: str, flag: str, names: list[str]
    ) -> str | None:
        """The column the user named (which must exist) or the first candidate present."""
        if given is not None:
            if given not in self._types:
                problem = f"no {what} column '{given}' (columns are: {_listing(names)}; see {flag})"
                raise SourceError(self.path, problem)
            return given
        lower = {n.lower(): n for n in reversed(names)}
        for cand in candidates:
            if cand in self._types:
                return cand
        for cand in candidates:
            if cand in lower:
                return lower[cand]
        return None

    def _check_int_ts(self, meta: pq.FileMetaData) -> None:
        """Refuse integer timestamps whose statistics show they cannot be nanoseconds."""
        top = None
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            for j in range(group.num_columns):
                col = group.column(j)
                stats = col.statistics
                if col.path_in_schema == self.ts_column and stats is not None and stats.has_min_max:
                    top = stats.max if top is None else max(top, stats.max)
        if top is not None and 0 < top < _INT_TS_FLOOR:
            raise SourceError(
                self.path,
                f"timestamp column '{self.ts_column}' holds integers up to {top}; "
                "expected nanoseconds since the epoch (are these seconds or milliseconds?)",
            )

    def _symbol_from_path(self, path: str) -> str:
        for part in reversed(os.path.normpath(os.path.dirname(os.path.abspath(path))).split(os.sep)):
            key, sep, value = part.partition("=")
            if sep and key.lower() in SYMBOL_NAMES and value:
                return value
        name = os.path.basename(path)
        for suffix in (".parquet", ".pq"):
            if name.lower().endswith(suffix):
                return name[: -len(suffix)]
        return name

    def _value(self, col: pa.Array) -> pa.Array:
        t = col.type
        if pa.types.is_float64(t) or pa.types.is_float32(t):
            return col
        return col.cast(pa.float32() if pa.types.is_float16(t) else pa.float64())

    def pieces(self, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
        if max_rows < 1:
            raise ValueError("max_rows must be positive")
        self.drops.clear()
        wanted = [self.ts_column, *([self.symbol_column] if self.symbol_column else []), *self.columns]
        done = 0
        try:
            with self._open() as pf:
                for batch in pf.iter_batches(batch_size=max_rows, columns=wanted):
                    done += batch.num_rows
                    table = self._piece(batch)
                    if table.num_rows:
                        yield table
        except (pa.ArrowException, OSError) as exc:
            problem = f"corrupt Parquet data after {done} rows ({_one_line(exc)})"
            raise SourceError(self.path, problem) from None

    def _piece(self, batch: pa.RecordBatch) -> pa.Table:
        n = batch.num_rows
        if self.symbol_column:
            sym = batch.column(self.symbol_column)
            if pa.types.is_dictionary(sym.type):
                sym = sym.dictionary_decode()
            sym = sym.cast(pa.string())
        else:
            sym = pa.repeat(pa.scalar(self.fixed_symbol, pa.string()), n)
        cols = {"symbol": sym, "ts": pa.array(_ts_ns(batch.column(self.ts_column)), pa.int64())}
        cols.update((name, self._value(batch.column(name))) for name in self.columns)
        table = pa.table(cols)
        if sym.null_count:
            self.drops["missing symbol"] += sym.null_count
            table = table.filter(sym.is_valid())
        return clean_piece(table, self.drops)
