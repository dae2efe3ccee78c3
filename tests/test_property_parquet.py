"""A property over generated Parquet schemas and values (column types, names and their case, nulls,
timestamp types and units, ISO text included, symbol column types): every build either gives a cache whose values and
timestamps equal the source's rows (less those the value policy drops), or exits 2 with one line,
no traceback and nothing at ``--out``."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardcache import open_cache
from shardcache.cli import build_cache_main, format_info
from shardcache.ingest.sources import PRICE_COLUMNS
from shardcache.inspect import views as explore
from shardcache.inspect.verify import verify_cache

MIN = 60 * 10**9
T0 = int(np.datetime64("2024-03-04T14:30", "ns").astype(np.int64))
UNITS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
VALUE_NAMES = ["close", "Close", "open", "volume", "vwap", "x1", "ts", "symbol", "ticker", "Time", "ts_recv"]

# a value column of each kind from floats v (one per row), null where mask
_COLUMN = {
    "float64": lambda v, mask: pa.array(v, pa.float64(), mask=mask),
    "float32": lambda v, mask: pa.array(v.astype(np.float32), pa.float32(), mask=mask),
    "int64": lambda v, mask: pa.array(v.astype(np.int64), pa.int64(), mask=mask),
    "int32": lambda v, mask: pa.array(v.astype(np.int32), pa.int32(), mask=mask),
    "bool": lambda v, mask: pa.array(v > 1000, pa.bool_(), mask=mask),
    "null": lambda v, mask: pa.nulls(len(v)),
    "big": lambda v, mask: pa.array(v.astype(np.int64) + 2**60, pa.int64(), mask=mask),
}


def _case(draw, name: str) -> str:
    return draw(st.sampled_from([name, name.upper(), name.capitalize()]))


@st.composite
def tables(draw) -> tuple[pa.Table, dict]:
    """A table of bars and what the oracle needs: per-row symbol, ts (ns), and each column's values."""
    sym_kind = draw(
        st.sampled_from(["none", "string", "large_string", "binary", "dictionary", "int64", "int32", "float64"])
    )
    n_sym = 1 if sym_kind == "none" else draw(st.integers(1, 3))
    n = draw(st.integers(2, 25))
    rows_sym = np.repeat(np.arange(n_sym), n)
    ts_ns = np.concatenate([T0 + MIN * (np.arange(n) + draw(st.integers(0, 5))) for _ in range(n_sym)])
    cols: dict[str, pa.Array] = {}
    ts_kind = draw(st.sampled_from(["timestamp", "timestamp_tz", "int", "text"]))
    unit = draw(st.sampled_from(list(UNITS)))
    ts_name = _case(draw, draw(st.sampled_from(["ts_event", "timestamp", "time", "ts", "datetime"])))
    if ts_kind == "int":
        cols[ts_name] = pa.array(ts_ns // UNITS[unit], pa.int64())
    elif ts_kind == "text":  # ISO-8601, with or without a zone
        text = np.datetime_as_string(ts_ns.astype("datetime64[ns]"), unit="s")
        cols[ts_name] = pa.array([t + "Z" for t in text] if draw(st.booleans()) else text.tolist())
    else:
        tz = "UTC" if ts_kind == "timestamp_tz" else None
        cols[ts_name] = pa.array(ts_ns // UNITS[unit], pa.timestamp(unit, tz=tz))
    names = [f"S{i}" if sym_kind not in ("int64", "int32", "float64") else str(10 + i) for i in range(n_sym)]
    if sym_kind == "none":
        names = ["x"]  # the file's name: x.parquet
    else:
        sym_name = _case(draw, draw(st.sampled_from(["symbol", "instrument_id", "ticker"])))
        raw = [names[i] for i in rows_sym]
        cols[sym_name] = {
            "string": lambda: pa.array(raw, pa.string()),
            "large_string": lambda: pa.array(raw, pa.large_string()),
            "binary": lambda: pa.array([r.encode() for r in raw], pa.binary()),
            "dictionary": lambda: pa.array(raw).dictionary_encode(),
            "int64": lambda: pa.array([int(r) for r in raw], pa.int64()),
            "int32": lambda: pa.array([int(r) for r in raw], pa.int32()),
            "float64": lambda: pa.array([float(r) for r in raw], pa.float64()),
        }[sym_kind]()
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(VALUE_NAMES))
        kind = draw(st.sampled_from(["float64", "float32", "int64", "int32", "bool", "null", "big"]))
        values = draw(st.lists(st.floats(0.5, 1e6, allow_nan=False), min_size=len(ts_ns), max_size=len(ts_ns)))
        nulls = draw(st.sampled_from(["none", "none", "some", "all"]))
        mask = (
            np.zeros(len(ts_ns), bool)
            if nulls == "none"
            else np.ones(len(ts_ns), bool)
            if nulls == "all"
            else np.arange(len(ts_ns)) % 7 == 3
        )
        arr = _COLUMN[kind](np.asarray(values), mask)
        if draw(st.integers(0, 9)) == 0:  # now and then a column name twice
            dup = pa.Table.from_arrays([*cols.values(), arr], names=[*cols, name])
            return dup, {"sym": rows_sym, "names": names, "ts": ts_ns, "stats": True}
        cols[name if name not in cols else name + "_"] = arr
    table = pa.table(cols)
    return table, {"sym": rows_sym, "names": names, "ts": ts_ns, "stats": draw(st.booleans())}


def _canonical(name: str) -> str:
    known = ("open", "high", "low", "close", "volume", "count", "price", "bid", "ask", "spread", "vwap")
    return name.lower() if name.lower() in known else name


def _check_equal(cache, table: pa.Table, truth: dict) -> None:
    """The cache holds exactly the source rows the value policy keeps, with their timestamps."""
    by_name = {_canonical(n): table.column(n) for n in table.column_names}
    values = {}
    for f in cache.feature_names:
        col = by_name[f]
        col = col.cast(pa.float64())
        values[f] = col.fill_null(np.nan).to_numpy(zero_copy_only=False)
    keep = np.ones(len(truth["ts"]), bool)
    for f, v in values.items():
        keep &= np.isfinite(v) & ((v > 0) if f in PRICE_COLUMNS else True)
    for i, symbol in enumerate(truth["names"]):
        mine = keep & (truth["sym"] == i)
        if not mine.any():
            assert symbol not in cache.symbols
            continue
        j = cache.symbols.index(symbol)
        segs = cache.segments[cache.segments[:, 0] == j]
        rows = np.concatenate([np.arange(a, b) for _, a, b in segs])
        got = np.concatenate([cache.read_rows(int(a), int(b)) for _, a, b in segs])
        want = np.stack([values[f][mine] for f in cache.feature_names], axis=1).astype(np.float32)
        np.testing.assert_array_equal(got, want)
        if hasattr(cache, "bar_times"):
            ts = np.asarray(cache.bar_times(rows))
        else:
            ts = np.asarray(cache.ts[int(rows.min()) : int(rows.max()) + 1])[rows - rows.min()]
        np.testing.assert_array_equal(ts, truth["ts"][mine])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_generated_parquet_builds_equal_or_refuse_in_one_line(case):
    table, truth = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.parquet"
        pq.write_table(table, path, write_statistics=truth["stats"])
        out = Path(tmp) / "c.zarr"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = build_cache_main([str(path), "--out", str(out), "--features", "raw", "--normalize", "none", "-q"])
        if rc != 0:
            lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("build-cache: error:")]
            assert rc == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
            assert not out.exists() and not Path(f"{out}.staging").exists()
            event(f"refused: {lines[0].split(': ', 3)[-1][:60]}")
            return
        event("built")
        cache = open_cache(out)
        assert verify_cache(out).ok
        assert format_info(explore.info(cache)) and json.dumps(
            explore.info(cache), default=str
        )  # info works on every cache
        _check_equal(cache, table, truth)
