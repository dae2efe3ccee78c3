"""Synthetic market data for demos, tests and benchmarks, deterministic by seed.

* :func:`make_sample`: CME-like 1-minute DBN v3 ``ohlcv-1m`` files (zstd), one per trade date, of four
  contracts on Globex sessions (DST shifts, weekends closed, minutes without trades missing).
* :func:`make_sample_parquet`: wide Parquet bars (``ts``, ``symbol``, ``f000``...), in bounded row groups.
* :func:`write_dbn`: any bar or tick schema the reader accepts, from numpy arrays (for crafted bad values).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from databento_dbn.metadata import MappingInterval

from .sources.base import DAY_NS, TS_MAX
from .sources.dbn import SCHEMAS, UNDEF_PRICE, record_dtype

__all__ = [
    "CONTRACTS",
    "SYMBOLS",
    "Contract",
    "make_sample",
    "make_sample_parquet",
    "sample_files",
    "session_minutes",
    "write_dbn",
]

MINUTE_NS = 60_000_000_000
SESSION_MINUTES = 23 * 60
ROW_GROUP_ROWS = 65_536


@dataclass(frozen=True)
class Contract:
    """One synthetic futures contract: how it is named, priced and traded."""

    symbol: str
    instrument_id: int
    tick: float
    price: float
    daily_vol: float
    liquidity: float
    volume: float


CONTRACTS = (
    Contract("ESH3", 206299, 0.25, 3850.0, 0.012, 1.00, 1800.0),
    Contract("NQH3", 206317, 0.25, 11000.0, 0.016, 0.95, 700.0),
    Contract("RTYH3", 206323, 0.10, 1760.0, 0.015, 0.80, 160.0),
    Contract("YMH3", 206305, 1.00, 33000.0, 0.010, 0.75, 140.0),
)
SYMBOLS = tuple(c.symbol for c in CONTRACTS)  # the contracts' symbols: make_sample_parquet's default

# Minutes after the 17:00 CT open where the chance of a bar (and its volume) changes:
# evening (Asia), 02:00 Europe, 07:00 pre-open, 08:30 regular hours, 15:15 post-close.
_PERIODS = np.array([0, 540, 840, 930, 1335])
_PRESENCE = np.array([0.2, 0.312, 0.444, 0.666, 0.358])
_ACTIVITY = np.array([0.08, 0.2, 0.35, 1.0, 0.25])
_VOLATILITY = np.array([0.55, 0.8, 0.9, 1.35, 0.7])


def _nth_sunday(year: int, month: int, n: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(6 - first.weekday()) % 7 + 7 * (n - 1))


def _central_offset_hours(opening: dt.date) -> int:
    """UTC offset of US/Central on the evening of ``opening`` (CDT -5 or CST -6, rules since 2007)."""
    dst = _nth_sunday(opening.year, 3, 2) <= opening < _nth_sunday(opening.year, 11, 1)
    return -5 if dst else -6


def session_minutes(trade_date: dt.date) -> np.ndarray:
    """Start times (ns, UTC) of the 1,380 Globex minutes of ``trade_date`` (17:00 CT the eve to 16:00 CT)."""
    opening = trade_date - dt.timedelta(days=1)
    local_open = dt.datetime(opening.year, opening.month, opening.day, 17, tzinfo=dt.UTC)
    first = int(local_open.timestamp()) - 3600 * _central_offset_hours(opening)
    return first * 1_000_000_000 + np.arange(SESSION_MINUTES, dtype=np.int64) * MINUTE_NS


def _contracts(symbols: Sequence[str] | None) -> list[Contract]:
    if symbols is None:
        return list(CONTRACTS)
    known = {c.symbol: c for c in CONTRACTS}
    generic = [Contract(name, 300000 + i, 0.25, 100.0 * (i + 2), 0.015, 0.8, 200.0) for i, name in enumerate(symbols)]
    return [known.get(c.symbol, c) for c in generic]


def _day_bars(rng: np.random.Generator, c: Contract, minutes: np.ndarray, last: float) -> tuple[np.ndarray, float]:
    """One contract's bars for one session as ``ohlcv-1m`` records; returns them and the closing price."""
    period = np.searchsorted(_PERIODS, np.arange(SESSION_MINUTES), side="right") - 1
    sigma = c.daily_vol / np.sqrt(SESSION_MINUTES) * _VOLATILITY[period] * rng.lognormal(0.0, 0.3)
    steps = rng.standard_normal(SESSION_MINUTES) * sigma
    steps[0] += rng.standard_normal() * c.daily_vol * 0.15
    path = last * np.exp(np.cumsum(steps))
    opens = np.concatenate([[last], path[:-1]])
    present = rng.random(SESSION_MINUTES) < np.minimum(1.0, _PRESENCE[period] * c.liquidity)
    o = np.round(opens / c.tick).astype(np.int64)
    cl = np.round(path / c.tick).astype(np.int64)
    reach = np.abs(rng.standard_normal((2, SESSION_MINUTES))) * sigma * path * 0.6 / c.tick
    hi = np.maximum(o, cl) + reach[0].astype(np.int64)
    lo = np.minimum(o, cl) - reach[1].astype(np.int64)
    volume = np.maximum(1, np.round(c.volume * _ACTIVITY[period] * rng.lognormal(0.0, 0.7, SESSION_MINUTES)))
    recs = np.zeros(int(present.sum()), dtype=record_dtype("ohlcv-1m"))
    tick = round(c.tick * 1e9)
    recs["publisher_id"] = 1
    recs["instrument_id"] = c.instrument_id
    recs["ts_event"] = minutes[present]
    for name, ticks in (("open", o), ("high", hi), ("low", lo), ("close", cl)):
        recs[name] = ticks[present] * tick
    recs["volume"] = volume[present].astype(np.uint64)
    return recs, float(path[-1])


def make_sample(
    out_dir: str | os.PathLike[str],
    *,
    days: int = 360,
    symbols: Sequence[str] | None = None,
    seed: int = 0,
    start: str = "2023-01-02",
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Write ``days`` daily files ``glbx-mdp3-YYYYMMDD.ohlcv-1m.dbn.zst``, one per weekday from ``start``.

    ``symbols`` picks contracts from :data:`CONTRACTS` (other names get generic ones).
    ``progress(done, total)`` is called after each file. The first days are the same
    whatever ``days`` is, so a short sample is a prefix of the long one.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dates = _dates(days, start)
    contracts = _contracts(symbols)
    prices = [c.price for c in contracts]
    names = {c.instrument_id: c.symbol for c in contracts}
    written = []
    for n, date in enumerate(dates, 1):
        rng = np.random.default_rng([seed, date.toordinal()])
        minutes = session_minutes(date)
        parts = []
        for i, c in enumerate(contracts):
            recs, prices[i] = _day_bars(rng, c, minutes, prices[i])
            parts.append(recs)
        recs = np.concatenate(parts)
        recs = recs[np.lexsort((recs["instrument_id"], recs["ts_event"]))]
        path = out / _name(date)
        written.append(write_dbn(path, "ohlcv-1m", recs, symbols=names))
        if progress is not None:
            progress(n, len(dates))
    return written


def sample_files(out_dir: str | os.PathLike[str], *, days: int = 360, start: str = "2023-01-02") -> list[Path]:
    """The files ``make_sample`` writes for these arguments, unwritten (a shorter sample is a longer one's prefix)."""
    return [Path(out_dir) / _name(d) for d in _dates(days, start)]


def _dates(days: int, start: str) -> list[dt.date]:
    first = dt.date.fromisoformat(start)
    weekdays = (first + dt.timedelta(days=i) for i in range(7 * days))
    return [d for d in weekdays if d.weekday() < 5][:days]


def _name(date: dt.date) -> str:
    return f"glbx-mdp3-{date:%Y%m%d}.ohlcv-1m.dbn.zst"


def _fixed_prices(values: np.ndarray) -> np.ndarray:
    """Float prices to fixed-point int64 (NaN -> ``UNDEF_PRICE``); integers are taken as fixed-point."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return values.astype(np.int64)
    finite = np.isfinite(values)
    out = np.round(np.where(finite, values, 0.0) * 1e9).astype(np.int64)
    out[~finite] = UNDEF_PRICE
    return out


def _records(schema: str, fields: Mapping[str, np.ndarray] | np.ndarray) -> np.ndarray:
    """A structured array of ``schema`` records; header fields and defaults are filled in."""
    dtype = record_dtype(schema)
    names = dtype.names or ()
    if isinstance(fields, np.ndarray):
        if not fields.dtype.names:
            raise TypeError("records must be a structured array or a mapping of field name to values")
        recs = fields.astype(dtype, copy=True)
    else:
        lengths = {len(np.asarray(v)) for v in fields.values()}
        if len(lengths) > 1:
            raise ValueError(f"record fields have different lengths: {sorted(lengths)}")
        unknown = set(fields) - set(names)
        if unknown:
            known = ", ".join(names)
            raise ValueError(f"no field {sorted(unknown)} in {schema} records (fields: {known})")
        recs = np.zeros(lengths.pop() if lengths else 0, dtype=dtype)
        if "action" in names:
            recs["action"] = b"T"
        if "side" in names:
            recs["side"] = b"N"
        recs["publisher_id"] = 1
        for name, values in fields.items():
            is_price = name in ("open", "high", "low", "close", "price", "bid_px", "ask_px")
            recs[name] = _fixed_prices(values) if is_price else values
        if "ts_recv" in names and "ts_recv" not in fields:
            recs["ts_recv"] = recs["ts_event"]
    recs["length"] = dtype.itemsize // 4
    recs["rtype"] = SCHEMAS[schema][2][0]
    return recs


def _mappings(recs: np.ndarray, symbols: Mapping[int, str]) -> list[_Mapping]:
    """Metadata symbol mappings: each instrument over the UTC dates its records span."""
    ts = recs["ts_event"].view(np.int64)
    valid = (ts > 0) & (ts < TS_MAX)
    days = ts[valid] // DAY_NS
    lo = dt.date(1970, 1, 1) + dt.timedelta(days=int(days.min()) if len(days) else 0)
    hi = dt.date(1970, 1, 1) + dt.timedelta(days=int(days.max()) + 1 if len(days) else 1)
    by_name = sorted(symbols.items(), key=lambda kv: kv[1])
    return [_Mapping(name, [_Interval(lo, hi, str(iid))]) for iid, name in by_name]


@dataclass
class _Interval:
    start_date: dt.date
    end_date: dt.date
    symbol: str


@dataclass
class _Mapping:
    raw_symbol: str
    intervals: Sequence[MappingInterval]  # databento_dbn's SymbolMapping protocol


def write_dbn(
    path: str | os.PathLike[str],
    schema: str,
    records: Mapping[str, np.ndarray] | np.ndarray,
    *,
    symbols: Mapping[int, str] | None = None,
    dataset: str = "GLBX.MDP3",
) -> Path:
    """Write a DBN v3 file of ``schema`` records, in the order given (zstd when the name ends in ``.zst``):
    ``records`` a :func:`~shardcache.ingest.sources.dbn.record_dtype` array or field -> values (float prices
    to fixed point, NaN to ``UNDEF_PRICE``), ``symbols`` instrument ids -> the mappings' raw symbols."""
    path = Path(path)
    recs = _records(schema, records)
    ts = recs["ts_event"].view(np.int64)
    sane = ts[(ts > 0)]
    meta = dbn.Metadata(
        dataset=dataset,
        start=int(sane.min()) if len(sane) else 0,
        end=int(sane.max()) + 1 if len(sane) else 0,
        stype_in=dbn.SType.from_str("raw_symbol"),  # not SType.RAW_SYMBOL: the stub types members as str
        stype_out=dbn.SType.from_str("instrument_id"),
        schema=dbn.Schema.from_str(schema),
        symbols=sorted((symbols or {}).values()),
        mappings=_mappings(recs, symbols or {}),
        version=3,
    )
    zstd = path.name.endswith(".zst")
    with pa.CompressedOutputStream(str(path), "zstd") if zstd else pa.OSFile(str(path), "wb") as fh:
        fh.write(meta.encode())
        fh.write(recs.tobytes())
    return path


def make_sample_parquet(
    path: str | os.PathLike[str],
    *,
    n_bars: int = 665_000,
    n_features: int = 256,
    symbols: Sequence[str] = SYMBOLS,
    seed: int = 0,
    rows_per_file: int | None = None,
    start: str = "2023-01-02",
) -> list[Path]:
    """Write ``n_bars`` wide bars (``ts``, ``symbol``, ``f000``... standard normal float32) as Parquet files
    ``bars-00000.parquet``... in ``path``, at most ``rows_per_file`` rows each (one file if None): split evenly
    over ``symbols``, each on Globex session minutes from ``start``, written a row group at a time."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema(
        [("ts", pa.timestamp("ns", tz="UTC")), ("symbol", pa.string())]
        + [(f"f{i:03d}", pa.float32()) for i in range(n_features)]
    )
    share, extra = divmod(n_bars, len(symbols))
    first = dt.date.fromisoformat(start)
    ts = np.concatenate([_minutes_from(first, share + (i < extra)) for i in range(len(symbols))])
    code = np.repeat(np.arange(len(symbols)), [share + (i < extra) for i in range(len(symbols))])
    names = pa.array(list(symbols), pa.string())
    rng = np.random.default_rng(seed)
    per_file = rows_per_file or max(n_bars, 1)
    written: list[Path] = []
    for begin in range(0, n_bars, per_file):
        end = min(begin + per_file, n_bars)
        written.append(out / f"bars-{len(written):05d}.parquet")
        with pq.ParquetWriter(written[-1], schema, use_dictionary=["symbol"]) as writer:
            for lo in range(begin, end, ROW_GROUP_ROWS):
                hi = min(lo + ROW_GROUP_ROWS, end)
                feats = rng.standard_normal((n_features, hi - lo), dtype=np.float32)
                cols = [pa.array(ts[lo:hi], schema.field("ts").type), pc.take(names, pa.array(code[lo:hi]))]
                cols += [pa.array(f) for f in feats]
                writer.write_table(pa.Table.from_arrays(cols, schema=schema), row_group_size=ROW_GROUP_ROWS)
    return written


def _minutes_from(first: dt.date, count: int) -> np.ndarray:
    """The first ``count`` Globex session minutes of the trade dates from ``first`` on."""
    parts, have, date = [], 0, first
    while have < count:
        if date.weekday() < 5:
            parts.append(session_minutes(date))
            have += SESSION_MINUTES
        date += dt.timedelta(days=1)
    return np.concatenate(parts)[:count] if parts else np.zeros(0, dtype=np.int64)
