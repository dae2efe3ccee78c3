"""Databento DBN files (``.dbn``, ``.dbn.zst``, DBN versions 1-3) as bar tables.

The header is decoded by ``databento_dbn`` (upgraded to v3); records are numpy views (:func:`record_dtype`)
of bounded blocks, a body that mixes record types walked record by record. Prices are fixed-point (1e-9),
``UNDEF_PRICE`` NaN; symbols come from the mappings by instrument id and UTC date (:mod:`.symbology`).
OHLCV records are bars, resampled to ``bar``; trades fold into ``bar`` bars by ``ts_event`` (no trade, no
bar); a bbo sample belongs to the bar holding ``ts_recv - 1``, its volume only its interval's last trade's (a
lower bound). A bar stays open until the newest timestamp read is :data:`LATE_NS` past its end, so folding is
exact across blocks; a later record is a ``late record``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any, Self

import databento_dbn as dbn
import numpy as np
import pyarrow as pa

from ...errors import SourceError, one_line
from ...format.paths import is_url
from ...tuning import DBN_BLOCK_ROWS, ZSTD_STEP
from .base import DBN_MAGIC, ZSTD_MAGIC, Source, clean_piece, keep_rows, parse_duration
from .files import open_input
from .symbology import Symbols

__all__ = ["SCHEMAS", "UNDEF_PRICE", "DbnSource", "record_dtype"]

UNDEF_PRICE = np.int64(dbn.UNDEF_PRICE)
LATE_NS = 60_000_000_000
SECOND, MINUTE, HOUR, DAY = (parse_duration(t) for t in ("1s", "1m", "1h", "1d"))
_I64_MIN, _I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max

# (name, numpy format, byte offset) of the record fields, after the DBN specification.
_HEADER = [
    ("length", "u1", 0),
    ("rtype", "u1", 1),
    ("publisher_id", "<u2", 2),
    ("instrument_id", "<u4", 4),
    ("ts_event", "<u8", 8),
]
_TRADE = [
    ("price", "<i8", 16),
    ("size", "<u4", 24),
    ("action", "S1", 28),
    ("side", "S1", 29),
    ("flags", "u1", 30),
    ("depth", "u1", 31),
    ("ts_recv", "<u8", 32),
    ("ts_in_delta", "<i4", 40),
    ("sequence", "<u4", 44),
]
_LEVEL = [
    ("bid_px", "<i8", 48),
    ("ask_px", "<i8", 56),
    ("bid_sz", "<u4", 64),
    ("ask_sz", "<u4", 68),
    ("bid_ct", "<u4", 72),
    ("ask_ct", "<u4", 76),
]
_OHLCV_FIELDS = [
    ("open", "<i8", 16),
    ("high", "<i8", 24),
    ("low", "<i8", 32),
    ("close", "<i8", 40),
    ("volume", "<u8", 48),
]
_BBO = [f for f in _TRADE if f[0] not in ("action", "depth", "ts_in_delta")]  # the same offsets
_LAYOUTS: dict[str, tuple[list[tuple[str, str, int]], int]] = {
    "ohlcv": (_OHLCV_FIELDS, 56),
    "trade": (_TRADE, 48),
    "mbp1": (_TRADE + _LEVEL, 80),
    "bbo": (_BBO + _LEVEL, 80),
}

# schema -> (record layout, bar interval in ns or None for ticks, accepted rtypes)
SCHEMAS: dict[str, tuple[str, int | None, tuple[int, ...]]] = {
    "ohlcv-1s": ("ohlcv", SECOND, (0x20, 0x11)),
    "ohlcv-1m": ("ohlcv", MINUTE, (0x21, 0x11)),
    "ohlcv-1h": ("ohlcv", HOUR, (0x22, 0x11)),
    "ohlcv-1d": ("ohlcv", DAY, (0x23, 0x11)),
    "ohlcv-eod": ("ohlcv", DAY, (0x24,)),
    "trades": ("trade", None, (0x00,)),
    "tbbo": ("mbp1", None, (0x01, 0xC5)),
    "mbp-1": ("mbp1", None, (0x01,)),
    "bbo-1s": ("bbo", SECOND, (0xC3,)),
    "bbo-1m": ("bbo", MINUTE, (0xC4,)),
}
# record types by schema name, for drop reasons: databento_dbn's names, but for four the DBN docs name otherwise
_RENAMED = {0x00: "trades", 0x11: "ohlcv", 0x13: "definition", 0x16: "symbol mapping"}
_RTYPE_NAMES = {r.value: r.name.lower().replace("_", "-") for r in dbn.RType.variants()} | _RENAMED
_SUPPORTED = "shardcache builds from ohlcv-*, trades, tbbo, mbp-1, bbo-1s, bbo-1m"
_OHLCV = ["open", "high", "low", "close", "volume"]
_COLUMNS = {
    "ohlcv": _OHLCV,
    "trade": [*_OHLCV, "count"],
    "mbp1": [*_OHLCV, "count", "bid", "ask", "spread"],
    "bbo": [*_OHLCV, "count", "bid", "ask", "spread"],
}


@functools.cache  # one dtype object per layout, not one (~1.3 KB) per opened file
def record_dtype(schema: str, ts_out: bool = False) -> np.dtype:
    """The numpy layout of one DBN record of ``schema`` (``ts_out`` appends the send time)."""
    fields, size = _LAYOUTS[SCHEMAS[schema][0]]
    fields = _HEADER + fields + ([("ts_out", "<u8", size)] if ts_out else [])
    names, formats, offsets = (list(x) for x in zip(*fields))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size + 8 * ts_out})


def _prices(px: np.ndarray) -> np.ndarray:
    """Fixed-point prices as float64 (``px / 1e9``), ``UNDEF_PRICE`` as NaN."""
    out = px.astype(np.float64)
    undefined = out == float(UNDEF_PRICE)
    out /= 1e9
    out[undefined] = np.nan
    return out


class _Stream:
    """The decompressed bytes of a DBN file in bounded blocks (a file memory-mapped, a URL through fsspec)."""

    def __init__(self, path: str, storage_options: dict[str, Any] | None = None) -> None:
        self.path = path
        try:
            if is_url(path):
                self.file = pa.PythonFile(open_input(path, storage_options), mode="r")
            else:
                self.file = pa.memory_map(path, "r")
            self.zstd = self.file.read(4) == ZSTD_MAGIC
            self.file.seek(0)
        except OSError as exc:
            raise SourceError(path, f"cannot read: {one_line(exc)}") from None
        self.stream = pa.CompressedInputStream(self.file, "zstd") if self.zstd else self.file
        self.records = 0

    def read(self, n: int) -> bytes | pa.Buffer:
        """Up to ``n`` bytes (fewer only at the end of the data)."""
        parts = []
        try:
            while n > 0:
                buf = self.stream.read_buffer(min(n, ZSTD_STEP) if self.zstd else n)
                if not buf.size:
                    break
                parts.append(buf)
                n -= buf.size
        except OSError as exc:
            what = "truncated" if "truncated" in str(exc).lower() else "corrupt"
            problem = f"{what} DBN data after {self.records} records ({one_line(exc)})"
            raise SourceError(self.path, problem) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()
        self.file.close()


def _read_metadata(path: str, stream: _Stream) -> tuple[int, dbn.Metadata]:
    """The DBN version and metadata at the start of ``stream``, which is left at the first record."""
    prelude = bytes(stream.read(8))
    if not prelude.startswith(DBN_MAGIC):
        raise SourceError(path, "not a DBN file (bad magic bytes)")
    if len(prelude) < 8:
        raise SourceError(path, "truncated DBN header")
    version = prelude[3]
    if not 1 <= version <= 3:
        raise SourceError(path, f"DBN version {version} is not supported (this reader reads versions 1-3)")
    length = int.from_bytes(prelude[4:8], "little")
    body = bytes(stream.read(length))
    if len(body) < length:
        raise SourceError(path, "truncated DBN metadata")
    try:
        policy = dbn.VersionUpgradePolicy.UPGRADE_TO_V3  # the stub types VersionUpgradePolicy's members as int:
        meta = dbn.Metadata.decode(prelude + body, upgrade_policy=policy)  # type: ignore[arg-type]
    except (dbn.DBNError, ValueError) as exc:
        raise SourceError(path, f"corrupt DBN metadata ({one_line(exc)})") from None
    return version, meta


def _pick(t: np.ndarray, valid: np.ndarray, starts: np.ndarray, group: np.ndarray, first: bool) -> np.ndarray:
    """Per group, the row of the earliest (or latest) valid ``t``; out-of-range when none is valid."""
    n = len(t)
    reduce, none, missing = (np.minimum, _I64_MAX, n) if first else (np.maximum, _I64_MIN, -1)
    key = np.where(valid, t, none)
    best = reduce.reduceat(key, starts)
    return reduce.reduceat(np.where(valid & (key == best[group]), np.arange(n), missing), starts)


def _take(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    ok = (idx >= 0) & (idx < len(values))
    return np.where(ok, values[np.clip(idx, 0, max(len(values) - 1, 0))], np.nan)


def _fold(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge rows (ticks or partial bars) into one row per (symbol code, bar)."""
    n = len(f["bar"])
    if not n:
        return f
    order = np.lexsort((f["bar"], f["code"]))
    f = {k: v[order] for k, v in f.items()}
    code, bar = f["code"], f["bar"]
    new = np.ones(n, dtype=bool)
    new[1:] = (code[1:] != code[:-1]) | (bar[1:] != bar[:-1])
    if new.all():
        return f
    starts = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    out = {
        "code": code[starts],
        "bar": bar[starts],
        "t0": np.minimum.reduceat(f["t0"], starts),
        "t1": np.maximum.reduceat(f["t1"], starts),
        "open": _take(f["open"], _pick(f["t0"], np.isfinite(f["open"]), starts, group, True)),
        "high": np.fmax.reduceat(f["high"], starts),
        "low": np.fmin.reduceat(f["low"], starts),
        "close": _take(f["close"], _pick(f["t1"], np.isfinite(f["close"]), starts, group, False)),
        "iid": f["iid"][np.maximum.reduceat(np.arange(n), starts)],
    }
    for name in ("volume", "count"):
        if name in f:
            out[name] = np.add.reduceat(f[name], starts)
    if "bid" in f:
        last = _pick(f["t1"], np.isfinite(f["bid"]) & np.isfinite(f["ask"]), starts, group, False)
        out["bid"], out["ask"] = _take(f["bid"], last), _take(f["ask"], last)
    return out


class _Bars:
    """Folds a file's records into bars, keeping recent bars open across read blocks."""

    def __init__(self, layout: str, interval: int | None, bar_ns: int, drops: Counter[str]) -> None:
        self.layout, self.interval, self.bar_ns, self.drops = layout, interval, bar_ns, drops
        self.pending: dict[str, np.ndarray] | None = None
        self.cutoff = self.newest = _I64_MIN

    def _rows(self, recs: np.ndarray, symbols: Symbols) -> dict[str, np.ndarray]:
        """One row per usable record, in the shape of a partial bar."""
        layout = self.layout
        ts = np.ascontiguousarray(recs["ts_recv" if layout == "bbo" else "ts_event"]).view(np.int64)
        f: dict[str, np.ndarray] = {}
        if layout == "ohlcv":
            f = {name: _prices(recs[name]) for name in ("open", "high", "low", "close")}
            keep = keep_rows(ts, list(f.values()), [], self.drops)
            f["volume"] = recs["volume"].astype(np.float64)
        elif layout == "bbo":
            bid, ask = _prices(recs["bid_px"]), _prices(recs["ask_px"])
            keep = keep_rows(ts, [bid, ask], [], self.drops)
            mid = (bid + ask) / 2
            assert self.interval is not None  # every bbo schema has one (SCHEMAS)
            f.update(open=mid, high=mid, low=mid, close=mid, bid=bid, ask=ask)
            last_trade = np.ascontiguousarray(recs["ts_event"]).view(np.int64)
            traded = (last_trade > ts - self.interval) & (last_trade <= ts) & (recs["price"] != UNDEF_PRICE)
            f["volume"] = np.where(traded, recs["size"], 0).astype(np.float64)
            f["count"] = traded.astype(np.float64)
        else:
            price = _prices(recs["price"])
            trade = recs["action"] == b"T" if layout == "mbp1" else np.ones(len(recs), dtype=bool)
            keep = keep_rows(ts, [np.where(trade, price, 1.0)], [], self.drops)
            price = np.where(trade, price, np.nan)
            f.update(open=price, high=price, low=price, close=price)
            f["volume"] = np.where(trade, recs["size"], 0).astype(np.float64)
            f["count"] = trade.astype(np.float64)
            if layout == "mbp1":
                bid, ask = _prices(recs["bid_px"]), _prices(recs["ask_px"])
                bad = ~(np.isfinite(bid) & np.isfinite(ask)) | (bid <= 0) | (ask <= 0)
                f["bid"], f["ask"] = np.where(bad, np.nan, bid), np.where(bad, np.nan, ask)
        if keep is not None:
            ts = ts[keep]
            f = {k: v[keep] for k, v in f.items()}
            recs = recs[keep]
        start = ts - 1 if layout == "bbo" else ts
        f["bar"] = start - start % self.bar_ns
        f["t0"] = f["t1"] = ts
        f["iid"] = recs["instrument_id"].astype(np.int64)
        f["code"] = symbols.codes(recs["instrument_id"], ts)
        return f

    def add(self, recs: np.ndarray, symbols: Symbols) -> dict[str, np.ndarray]:
        """Fold a block of records in; return the bars now closed."""
        f = self._rows(recs, symbols)
        late = f["bar"] < self.cutoff
        if late.any():
            self.drops["late record"] += int(np.count_nonzero(late))
            f = {k: v[~late] for k, v in f.items()}
        if len(f["t1"]):
            self.newest = max(self.newest, int(f["t1"].max()))
            self.cutoff = max(self.cutoff, self.newest - LATE_NS - self.bar_ns + 1)
        if self.pending is not None:
            f = {k: np.concatenate([self.pending[k], v]) for k, v in f.items()}
        f = _fold(f)
        done = f["bar"] < self.cutoff
        self.pending = {k: v[~done] for k, v in f.items()}
        return {k: v[done] for k, v in f.items()}

    def finish(self) -> dict[str, np.ndarray] | None:
        """The bars still open at the end of the file."""
        rest, self.pending = self.pending, None
        return rest


class DbnSource(Source):
    """A DBN file of bars or ticks; see the module docstring for what becomes a bar."""

    kind = "dbn"
    bar_ns: int  # always known: the schema's interval, a minute for ticks, or ``bar``

    def __init__(
        self,
        path: str,
        *,
        bar: str | None = None,
        columns: list[str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.storage_options = storage_options
        with _Stream(path, storage_options) as stream:
            self.version, meta = _read_metadata(path, stream)
        self.dataset = meta.dataset  # the symbol mappings are read again by pieces(): a build holds every source
        schema = None if meta.schema is None else str(meta.schema)
        if schema is None:
            raise SourceError(path, f"mixed-schema DBN data is not supported; {_SUPPORTED}")
        if schema not in SCHEMAS:
            raise SourceError(path, f"schema '{schema}' is not bars or ticks; {_SUPPORTED}")
        self.layout, self.interval, rtypes = SCHEMAS[schema]
        self.rtypes = np.array(rtypes, dtype=np.uint8)
        self.dtype = record_dtype(schema, bool(meta.ts_out))
        if bar is None:
            bar_ns = self.interval if self.layout == "ohlcv" and self.interval is not None else MINUTE
        else:
            bar_ns = parse_duration(bar)
            if bar_ns <= 0:
                raise ValueError(f"bar must be a positive duration, got {bar!r}")
        if self.interval is not None and bar_ns % self.interval:
            problem = f"cannot make {bar} bars from {schema} (the bar must be a multiple of its interval)"
            raise SourceError(path, problem)
        self.resample = not (self.layout == "ohlcv" and bar_ns == self.interval)
        available = _COLUMNS[self.layout]
        chosen = list(columns) if columns else list(available)
        if (unknown := next((name for name in chosen if name not in available), None)) is not None:
            raise SourceError(path, f"no column '{unknown}' in {schema} data (it has {', '.join(available)})")
        super().__init__(path, schema, chosen, bar_ns)

    def _blocks(self, stream: _Stream, max_rows: int) -> Iterator[np.ndarray]:
        """The schema's records, at most ``max_rows`` at a time; SourceError on truncation."""
        size = self.dtype.itemsize
        want = min(max_rows, DBN_BLOCK_ROWS) * size
        rest = b""
        while True:
            block = stream.read(want)
            at_end = len(block) < want
            data = block if not rest else rest + bytes(block)
            if not len(data):
                return
            raw = np.frombuffer(data, dtype=np.uint8)
            n = len(raw) // size
            rows = raw[: n * size].reshape(n, size)
            if (rows[:, 0] == size // 4).all() and np.isin(rows[:, 1], self.rtypes).all():
                recs, used = rows.view(self.dtype).reshape(n), n * size
                stream.records += n
            else:
                recs, used = self._walk(raw, stream)
            rest = bytes(raw[used:])
            if len(recs):
                yield recs
            if at_end:
                if rest:
                    raise SourceError(self.path, f"truncated DBN data after {stream.records} records")
                return

    def _walk(self, raw: np.ndarray, stream: _Stream) -> tuple[np.ndarray, int]:
        """Records of a block that mixes record types, found by walking their length bytes."""
        size = self.dtype.itemsize
        lengths = raw.data
        offsets: list[int] = []
        o, n = 0, len(raw)
        while o < n:
            length = lengths[o] * 4
            if length < 16:
                done = stream.records + len(offsets)
                raise SourceError(self.path, f"corrupt DBN data after {done} records (record length {length})")
            if o + length > n:
                break
            offsets.append(o)
            o += length
        offs = np.array(offsets, dtype=np.int64)
        stream.records += len(offs)
        is_mine = np.isin(raw[offs + 1], self.rtypes) if len(offs) else np.zeros(0, dtype=bool)
        if not is_mine.all():
            kinds, counts = np.unique(raw[offs[~is_mine] + 1], return_counts=True)
            for kind, count in zip(kinds.tolist(), counts.tolist()):
                self.drops[f"other record type ({_RTYPE_NAMES.get(kind, f'rtype 0x{kind:02x}')})"] += count
        mine = offs[is_mine]
        if (raw[mine] != size // 4).any():
            raise SourceError(self.path, f"corrupt DBN data: a {self.schema} record is not {size} bytes long")
        recs = raw[mine[:, None] + np.arange(size)].view(self.dtype).reshape(len(mine))
        return recs, o

    def _table(
        self, codes: np.ndarray, iid: np.ndarray, ts: np.ndarray, values: dict[str, np.ndarray], symbols: Symbols
    ) -> pa.Table:
        cols = {name: values["ask"] - values["bid"] if name == "spread" else values[name] for name in self.columns}
        return pa.table(
            {
                "symbol": symbols.column(codes),
                "ts": pa.array(ts, pa.int64()),
                **cols,
                "instrument": pa.array(iid.astype(np.int64), pa.int64()),
            }
        )

    def _bars_table(self, f: dict[str, np.ndarray] | None, symbols: Symbols) -> pa.Table | None:
        if f is None or not len(f["bar"]):
            return None
        traded = np.isfinite(f["open"])
        if not traded.all():
            f = {k: v[traded] for k, v in f.items()}
        return self._table(f["code"], f["iid"], f["bar"], f, symbols)

    def pieces(self, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
        if max_rows < 1:
            raise ValueError("max_rows must be positive")
        self.drops.clear()
        bars = _Bars(self.layout, self.interval, self.bar_ns, self.drops) if self.resample else None
        with _Stream(self.path, self.storage_options) as stream:
            symbols = Symbols(self.path, _read_metadata(self.path, stream)[1].mappings)
            for recs in self._blocks(stream, max_rows):
                if bars is not None:
                    table = self._bars_table(bars.add(recs, symbols), symbols)
                else:
                    ts = np.ascontiguousarray(recs["ts_event"]).view(np.int64)
                    values = {n: _prices(recs[n]) for n in self.columns if n != "volume"}
                    values["volume"] = recs["volume"].astype(np.float64)
                    iid = recs["instrument_id"]
                    table = self._table(symbols.codes(iid, ts), iid, ts, values, symbols)
                yield from self._emit(table, max_rows)
            self.records = stream.records
        if bars is not None:
            yield from self._emit(self._bars_table(bars.finish(), symbols), max_rows)
        # read by the build, to name unmapped ids from other files; string keys keep it plain JSON
        self.symbology = {
            "unmapped": {str(i): n for i, n in symbols.unmapped_records.items()},
            "outside": symbols.outside,
            "ids": {str(i): n for i, n in symbols.mapped.items()},
        }

    def _emit(self, table: pa.Table | None, max_rows: int) -> Iterator[pa.Table]:
        if table is None:
            return
        table = clean_piece(table, self.drops)
        for start in range(0, table.num_rows, max_rows):
            yield table.slice(start, max_rows)
