"""Tables of bars (Parquet, CSV): one way to find the columns and to turn a record batch into a piece.

The timestamp is ``ts_column`` or one of :data:`TS_NAMES` (ignoring case): timestamps, dates, ISO-8601 text
(no zone: UTC) or integers in the unit that puts them in 1980-2100. The symbol is ``symbol_column``, one of
:data:`SYMBOL_NAMES`, a hive ``symbol=...`` folder or the file name. The values are ``columns`` or every other
numeric column, as float64 (float32 and float16 as float32); what cannot be read so is refused in one line.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import SourceError
from .base import DAY_NS, TS_MAX, TS_MIN, Source, clean_piece, parse_duration, refuse_empty_columns

__all__ = ["SYMBOL_NAMES", "TS_NAMES", "TabularSource"]

TS_NAMES = ("ts_event", "timestamp", "time", "ts", "datetime")
SYMBOL_NAMES = ("symbol", "instrument_id", "ticker")
_KNOWN = ("open", "high", "low", "close", "volume", "count", "price", "bid", "ask", "spread", "vwap")
_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_EXACT = 2**53  # float64 holds every integer up to this


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:12])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


def _is_numeric(t: pa.DataType) -> bool:
    """Columns read as float features (a null-typed column holds no value: refused when read)."""
    types = pa.types
    return bool(
        types.is_null(t) or types.is_integer(t) or types.is_floating(t) or types.is_decimal(t) or types.is_boolean(t)
    )


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_time(t: pa.DataType) -> bool:
    t = t.value_type if pa.types.is_dictionary(t) else t
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_integer(t) or _is_text(t))


def _is_symbol(t: pa.DataType) -> bool:
    t = t.value_type if pa.types.is_dictionary(t) else t
    return bool(_is_text(t) or _is_bytes(t) or pa.types.is_integer(t) or pa.types.is_floating(t))


def _is_bytes(t: pa.DataType) -> bool:
    types = pa.types
    return bool(types.is_binary(t) or types.is_large_binary(t) or types.is_fixed_size_binary(t))


class TabularSource(Source):
    """A table of bars with detected columns (see the module docstring); Parquet and CSV subclass it."""

    def __init__(
        self,
        path: str,
        *,
        ts_column: str | None = None,
        symbol_column: str | None = None,
        columns: list[str] | None = None,
        bar: str | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self.storage_options = storage_options
        schema = self._schema()
        names = list(schema.names)
        self._check_names(names)
        self._types = {f.name: f.type for f in schema}
        found = self._find(ts_column, TS_NAMES, "timestamp", "--ts-column", names)
        if found is None:
            raise SourceError(
                path,
                f"no timestamp column (looked for {', '.join(TS_NAMES)}; columns are: {_listing(names)}; "
                "use --ts-column)",
            )
        self.ts_column: str = found
        ts_type = self._types[self.ts_column]
        if not _is_time(ts_type):
            raise SourceError(
                path,
                f"timestamp column '{self.ts_column}' has type {ts_type}; expected a "
                "timestamp, a date, ISO-8601 text or integers since the epoch (s, ms, us or ns)",
            )
        self.symbol_column = self._find(symbol_column, SYMBOL_NAMES, "symbol", "--symbol-column", names)
        if self.symbol_column is not None and not _is_symbol(self._types[self.symbol_column]):
            raise SourceError(
                path,
                f"symbol column '{self.symbol_column}' has type "
                f"{self._types[self.symbol_column]}; expected strings or integers",
            )
        self.fixed_symbol = None if self.symbol_column else _symbol_from_path(path)
        self._source_name = self._value_columns(columns, names)  # value column -> its name in the file
        # value columns of whole numbers, read as floats by a reader (CSV) that cannot know a later block's type
        self._whole = {c for c, n in self._source_name.items() if pa.types.is_integer(self._types[n])}
        self.bar_request = None if bar is None else parse_duration(bar)
        self._unit: str | None = None
        super().__init__(path, self.kind, list(self._source_name), None)

    def _value_columns(self, columns: list[str] | None, names: list[str]) -> dict[str, str]:
        """The value columns, canonical name -> name in the file: ``columns`` (numeric, in any letter case),
        else every numeric column but the keys and their lookalikes."""
        keys = {self.ts_column, self.symbol_column}
        lookalikes = {n for n in names if n.lower() in TS_NAMES + SYMBOL_NAMES}
        chosen: dict[str, str] = {}
        if columns:
            for name in columns:
                actual = name if name in self._types else next((n for n in names if n.lower() == name.lower()), None)
                if actual is None:
                    raise SourceError(self.path, f"no column '{name}' (columns are: {_listing(names)})")
                if actual in keys:
                    raise SourceError(self.path, f"column '{name}' is the timestamp or symbol column")
                if not _is_numeric(self._types[actual]):
                    problem = f"column '{name}' has type {self._types[actual]}; feature columns must be numeric"
                    raise SourceError(self.path, problem)
                chosen[_canonical(actual)] = actual
        else:
            for n in names:
                if n not in keys and n not in lookalikes and _is_numeric(self._types[n]):
                    chosen[_canonical(n)] = n
                elif n.lower() in _KNOWN and not _is_numeric(self._types[n]):
                    raise SourceError(
                        self.path,
                        f"column '{n}' holds text ({self._types[n]}), not numbers; fix its values, "
                        "or pick the other columns with --columns",
                    )
            if not chosen:
                raise SourceError(self.path, f"no numeric feature columns (columns are: {_listing(names)})")
        return chosen

    def _schema(self) -> pa.Schema:
        """The file's Arrow schema, read by each subclass its own way (before any row is read)."""
        raise NotImplementedError

    def _check_names(self, names: list[str]) -> None:
        """Refuse a nameless column, and two columns whose names are equal, or equal ignoring case."""
        if (nameless := next((i for i, n in enumerate(names) if not n.strip()), None)) is not None:
            raise SourceError(
                self.path,
                f"column {nameless + 1} of {len(names)} has no name; name it in the header, "
                "or leave it out of the file",
            )
        if twice := [n for n, k in Counter(names).items() if k > 1]:
            raise SourceError(
                self.path,
                f"duplicate column name{'s' if len(twice) > 1 else ''} "
                f"{', '.join(repr(n) for n in twice)}; rename the columns so each name appears once",
            )
        folded: dict[str, list[str]] = {}
        for n in names:
            folded.setdefault(n.lower(), []).append(n)
        if clash := next((group for group in folded.values() if len(group) > 1), None):
            raise SourceError(
                self.path,
                f"columns {', '.join(repr(n) for n in clash)} differ only in case; "
                "rename one, or pick the columns with --columns",
            )

    def _find(
        self, given: str | None, candidates: tuple[str, ...], what: str, flag: str, names: list[str]
    ) -> str | None:
        """The column the user named (which must exist) or the one candidate present (ignoring case)."""
        if given is not None:
            if given not in self._types:
                problem = f"no {what} column '{given}' (columns are: {_listing(names)}; see {flag})"
                raise SourceError(self.path, problem)
            return given
        found = [n for n in names if n.lower() in candidates]
        if len(found) > 1:
            listed = ", ".join(f"'{n}' ({self._types[n]})" for n in found)
            raise SourceError(self.path, f"several {what} columns: {listed}; name the right one with {flag}")
        return found[0] if found else None

    # -- reading ----------------------------------------------------------------------------
    def _batches(self, max_rows: int, wanted: list[str]) -> Iterator[pa.RecordBatch]:
        """The file's record batches of the ``wanted`` columns (a subclass reads its format)."""
        raise NotImplementedError

    def pieces(self, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
        if max_rows < 1:
            raise ValueError("max_rows must be positive")
        self.drops.clear()
        wanted = [self.ts_column, *([self.symbol_column] if self.symbol_column else []), *self._source_name.values()]
        finite: set[str] = set()
        rows = timed = named = 0
        for batch in self._batches(max_rows, wanted):
            rows += batch.num_rows
            table, n_ts, n_sym = self._piece(batch, finite)
            timed += n_ts
            named += n_sym
            if table.num_rows:
                yield table
        self.records = rows
        if rows and not timed:
            raise SourceError(self.path, f"timestamp column '{self.ts_column}' is entirely null")
        if rows and self.symbol_column and not named:
            raise SourceError(
                self.path, f"symbol column '{self.symbol_column}' is entirely null; name another with --symbol-column"
            )
        refuse_empty_columns(self.path, self.columns, finite, rows)

    def _piece(self, batch: pa.RecordBatch, finite: set[str]) -> tuple[pa.Table, int, int]:
        n = batch.num_rows
        sym = (
            self._symbols(batch.column(self.symbol_column))
            if self.symbol_column
            else pa.repeat(pa.scalar(self.fixed_symbol, pa.string()), n)
        )
        ts_col = batch.column(self.ts_column)
        cols = {"symbol": sym, "ts": pa.array(self._ts_ns(ts_col), pa.int64())}
        cols.update((name, self._value(name, batch.column(actual))) for name, actual in self._source_name.items())
        table = pa.table(cols)
        if sym.null_count:
            self.drops["missing symbol"] += sym.null_count
            table = table.filter(sym.is_valid())
        return clean_piece(table, self.drops, finite), n - ts_col.null_count, n - sym.null_count

    def _symbols(self, col: pa.Array) -> pa.Array:
        """The symbol column as strings, surrounding blanks trimmed; an empty symbol is missing (null)."""
        sym = pc.utf8_trim_whitespace(self._text(col))
        return pc.if_else(pc.equal(sym, ""), pa.scalar(None, pa.string()), sym)

    def _text(self, col: pa.Array) -> pa.Array:
        """The symbol column as text: strings as they are, bytes decoded as UTF-8, numbers as whole numbers."""
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        t = col.type
        name = self.symbol_column
        if _is_bytes(t):
            try:
                return col.cast(pa.binary()).cast(pa.string())
            except pa.ArrowInvalid:
                raise SourceError(
                    self.path,
                    f"symbol column '{name}' holds bytes that are not UTF-8 text; write the symbols as strings",
                ) from None
        if pa.types.is_floating(t):
            values = col.to_numpy(zero_copy_only=False)
            valid = ~np.isnan(values)
            whole = valid & (values == np.round(values)) & (np.abs(values) < _EXACT)
            if (valid & ~whole).any():
                bad = float(values[valid & ~whole][0])
                raise SourceError(
                    self.path,
                    f"symbol column '{name}' holds {bad!r}, not a whole number; symbols must be text or whole numbers",
                )
            ints = pa.array(np.where(valid, values, 0).astype(np.int64), mask=~valid)
            return ints.cast(pa.string())
        return col.cast(pa.string())

    def _ts_ns(self, col: pa.Array) -> np.ndarray:
        """A timestamp, date, text or integer column as int64 ns; nulls and overflows as -1 (out of range)."""
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if _is_text(col.type):
            col = self._parse_times(col)
        t = col.type
        if pa.types.is_timestamp(t):
            scale = _NS_PER[t.unit]
        elif pa.types.is_date32(t):
            scale = DAY_NS
        elif pa.types.is_date64(t):
            scale = 1_000_000
        else:
            scale = None
        if pa.types.is_unsigned_integer(t):
            ints = pc.if_else(pc.greater(col.cast(pa.uint64()), np.iinfo(np.int64).max), None, col).cast(pa.int64())
        elif pa.types.is_date32(t):
            ints = col.cast(pa.int32()).cast(pa.int64())
        else:
            ints = col.cast(pa.int64())
        values: np.ndarray = ints.fill_null(-1).to_numpy(zero_copy_only=False)
        if scale is None:
            scale = self._int_scale(values[ints.is_valid().to_numpy(zero_copy_only=False)])
        if scale == 1:
            return values
        limit = np.iinfo(np.int64).max // scale
        return np.where((values < 0) | (values > limit), -1, values * scale)

    def _parse_times(self, col: pa.Array) -> pa.Array:
        """ISO-8601 text as timestamps (a zone or offset converted to UTC, none taken as UTC); refused, quoting
        the first text that fails, when one is neither or the column mixes both kinds."""
        for kind in _TEXT_TIMES:
            try:
                return col.cast(kind)
            except pa.ArrowInvalid:
                continue
        valid = col.drop_null()
        first = next((k for k in _TEXT_TIMES if _parses(valid.slice(0, 1), k)), None)
        if first is None:
            bad, after = valid[0].as_py(), None
        else:  # the first text that is not of the first one's kind: bisect on prefixes that parse
            lo, hi = 1, len(valid)  # valid[:lo] parses, valid[:hi] does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if _parses(valid.slice(0, mid), first) else (lo, mid)
            bad, after = valid[lo].as_py(), valid[0].as_py()
        if after is not None and _iso(bad):
            zoned = first == _TEXT_TIMES[0]
            raise SourceError(
                self.path,
                f"timestamp column '{self.ts_column}' holds {bad!r} ({'without' if zoned else 'with'} a zone or "
                f"offset) after {after!r} ({'with' if zoned else 'without'} one); write its ISO-8601 times of "
                "one kind throughout",
            )
        raise SourceError(
            self.path,
            f"timestamp column '{self.ts_column}' holds {bad!r}, not an ISO-8601 time "
            "(YYYY-MM-DD[THH:MM:SS][Z|+HH:MM]) of one kind throughout; write timestamps or integers since the epoch",
        )

    def _int_scale(self, values: np.ndarray) -> int:
        """ns per unit of integer timestamps: the unit that puts the first values' median in 1980-2100, kept."""
        if self._unit is None and len(values):
            mid = int(np.median(values))
            self._unit = next((u for u, k in _NS_PER.items() if TS_MIN <= mid * k < TS_MAX), None)
            if self._unit is None:
                raise SourceError(
                    self.path,
                    f"timestamp column '{self.ts_column}' holds integers around "
                    f"{int(np.median(values))}, which are not seconds, ms, us or ns "
                    "since the epoch in 1980-2100; what unit are they in?",
                )
        return _NS_PER[self._unit or "ns"]

    def _value(self, name: str, col: pa.Array) -> pa.Array:
        t = col.type
        whole = pa.types.is_integer(t) or name in self._whole
        if whole and len(col) - col.null_count:
            bounds = pc.min_max(col)
            top = max(abs(bounds["min"].as_py()), abs(bounds["max"].as_py()))
            if top > _EXACT:
                others = [c for c in self._source_name if c != name]
                hint = f"leave it out with --columns {','.join(others)}" if others else "convert it to float first"
                raise SourceError(
                    self.path,
                    f"column '{self._source_name[name]}' holds integers above 2**53 "
                    f"(up to {top:.0f}), which float64 features cannot hold exactly (the file is not corrupt); {hint}",
                )
        if pa.types.is_float64(t) or pa.types.is_float32(t):
            return col
        try:
            return col.cast(pa.float32() if pa.types.is_float16(t) else pa.float64())
        except pa.ArrowInvalid as exc:
            raise SourceError(
                self.path,
                f"column '{self._source_name[name]}' ({t}) cannot be read as numbers ({str(exc).splitlines()[0]})",
            ) from None


_TEXT_TIMES = (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns"))  # ISO-8601 with a zone, without one


def _parses(texts: pa.Array, kind: pa.DataType) -> bool:
    try:
        texts.cast(kind)
        return True
    except pa.ArrowInvalid:
        return False


def _iso(text: str) -> bool:
    """Whether one text parses as an ISO-8601 time (with or without a zone)."""
    return any(_parses(pa.array([text]), kind) for kind in _TEXT_TIMES)


def _canonical(name: str) -> str:
    """A value column's name in the cache: the usual OHLCV names in lower case, any other as it is."""
    return name.lower() if name.lower() in _KNOWN else name


def _symbol_from_path(path: str) -> str:
    for part in reversed(os.path.normpath(os.path.dirname(os.path.abspath(path))).split(os.sep)):
        key, sep, value = part.partition("=")
        if sep and key.lower() in SYMBOL_NAMES and value:
            return value
    name = os.path.basename(path)
    for suffix in (".parquet", ".parq", ".pq", ".csv.gz", ".csv.zst", ".csv"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name
