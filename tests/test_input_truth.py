"""Input truth (issue 12, and the build side of 16): real DBN, Parquet and CSV files give a correct
cache or exit 2 with one line; a published cache always passes ``info`` and ``verify``.

DBN files are written with ``databento_dbn.Metadata.encode`` (symbol mappings with date
intervals, continuous and parent symbology); Parquet and CSV with pyarrow.
"""

from __future__ import annotations

import ast
import datetime as dt
import gzip
import json
import os
import re
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers.cli import cli
from helpers.inputs import DAY0, HOUR, MIN, T0, bars, dbn_file

from shardcache import WindowDataset, WindowStream, build_cache
from shardcache.cli import build_cache_main
from shardcache.ingest.sample import _records, write_dbn


def times(cache, rows: np.ndarray) -> np.ndarray:
    """Bar start times (ns) of virtual rows: ``Cache.bar_times`` where the format has it, else the ``ts`` array."""
    if hasattr(cache, "bar_times"):
        return np.asarray(cache.bar_times(rows))
    lo = int(rows.min())
    return np.asarray(cache.ts[lo : int(rows.max()) + 1])[rows - lo]


def refused(capsys, out: Path, *args: str) -> str:
    """Assert a build of ``args`` exits 2 with one line and leaves nothing at ``out``; return the line."""
    rc, _, err = cli(capsys, *args, "--out", str(out), "-q")
    lines = [ln for ln in err.splitlines() if ln.startswith("build-cache: error:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists() and not Path(f"{out}.staging").exists()
    return lines[0]


def published_ok(capsys, out: Path) -> dict:
    """A published cache passes ``info`` (text and --json) and ``verify``; returns the JSON summary."""
    rc, text, _ = cli(capsys, "info", str(out), prog="shardcache")
    assert rc == 0 and "bars" in text
    rc, js, _ = cli(capsys, "info", str(out), "--json", prog="shardcache")
    assert rc == 0
    rc, report, _ = cli(capsys, "verify", str(out), prog="shardcache")
    assert rc == 0, report
    return json.loads(js)


# -- DBN symbology ----------------------------------------------------------------------------
def continuous_file(tmp_path: Path) -> Path:
    """ES.c.0 over two days: instrument 100 (ESH4) on the first, 200 (ESM4) from midnight on: a real roll."""
    ts = T0 + MIN * np.arange(240)  # 22:00 .. 01:59, one minute apart: no gap anywhere
    old = ts < T0 + 2 * HOUR
    close = np.where(old, 5000.0, 5100.0) + 0.25 * (np.arange(240) % 4)
    d1, d2 = DAY0 + dt.timedelta(days=1), DAY0 + dt.timedelta(days=2)
    return dbn_file(
        tmp_path / "es.c.0.dbn",
        "ohlcv-1m",
        bars(ts, close, np.where(old, 100, 200)),
        [("ES.c.0", [(DAY0, d1, "100"), (d1, d2, "200")])],
        dbn.SType.CONTINUOUS,
    )


def test_continuous_roll_cuts_the_segment_and_no_window_crosses_it(tmp_path, capsys):
    path = continuous_file(tmp_path)
    out = tmp_path / "c.zarr"
    cache = build_cache([path], out, features="close", normalize="none", max_gap="1h", progress=False)
    roll = T0 + 2 * HOUR
    assert cache.symbols == ["ES.c.0"] and cache.n_bars == 240
    assert cache.manifest.rolls == {"ES.c.0": [[roll, 100, 200]]}
    assert cache.manifest.counts.rolls == 1
    assert len(cache.segments) == 2 and int(cache.segments[1, 1] - cache.segments[0, 1]) == 120
    info = published_ok(capsys, out)
    assert info["counts"]["rolls"] == 1
    rc, text, _ = cli(capsys, "info", str(out), prog="shardcache")
    assert rc == 0, text
    assert "rolls     1 contract roll" in text
    seq_len = 30
    # every window lies on one side of the roll: closes near 5000 or near 5100, never both
    ds = WindowDataset(cache, seq_len=seq_len, horizon=1)
    assert len(ds) == 2 * (120 - seq_len)
    for i in range(len(ds)):
        x, y = ds[i]
        span = np.concatenate([x.numpy().ravel(), y.numpy().ravel()])
        assert span.max() < 5050 or span.min() > 5050
    seen = 0
    with WindowStream(cache, seq_len=seq_len, batch_size=16, shuffle=True) as stream:
        for x, y in stream:
            lo = np.minimum(x.numpy().min(axis=(1, 2)), y.numpy().min(axis=1))
            hi = np.maximum(x.numpy().max(axis=(1, 2)), y.numpy().max(axis=1))
            assert ((hi < 5050) | (lo > 5050)).all()
            seen += len(x)
    assert seen == len(ds)


def test_default_features_reset_at_the_roll(tmp_path):
    cache = build_cache(
        [continuous_file(tmp_path)], tmp_path / "c.zarr", normalize="none", max_gap="1h", progress=False
    )
    j = cache.feature_names.index("log_return")
    first_new = int(cache.segments[1, 1])
    assert cache.read_rows(first_new, first_new + 1)[0, j] == 0.0  # not log(5100 / 5000.75)
    assert np.abs(cache.read_rows(0, 240)[:, j]).max() < 0.001


def test_parent_symbol_is_refused_with_how_to_select(tmp_path, capsys):
    ts = T0 + MIN * np.arange(10)
    recs = {k: np.concatenate([v, v]) for k, v in bars(ts, np.full(10, 5000.0), 1).items()}
    recs["instrument_id"][10:] = 2
    d1 = DAY0 + dt.timedelta(days=1)
    path = dbn_file(
        tmp_path / "es.fut.dbn", "ohlcv-1m", recs, [("ES.FUT", [(DAY0, d1, "1"), (DAY0, d1, "2")])], dbn.SType.PARENT
    )
    line = refused(capsys, tmp_path / "c.zarr", str(path))
    assert "symbol 'ES.FUT' maps 2 instruments at once" in line and "raw_symbol" in line and "ES.c.0" in line


def test_unmapped_instrument_takes_another_inputs_mapping_or_is_counted(tmp_path, capsys, caplog):
    ts = T0 + MIN * np.arange(100)
    a = write_dbn(tmp_path / "a.dbn", "ohlcv-1m", bars(ts, np.full(100, 10.0), 42), symbols={42: "ESH4"})
    later = ts + 100 * MIN
    recs = {
        k: np.concatenate([u, v])
        for (k, u), v in zip(bars(later, np.full(100, 10.0), 42).items(), bars(later, np.full(100, 20.0), 43).values())
    }
    b = write_dbn(tmp_path / "b.dbn", "ohlcv-1m", recs, symbols={})
    out = tmp_path / "c.zarr"
    cache = build_cache([a, b], out, features="close", normalize="none", progress=False)
    assert cache.symbols == ["43", "ESH4"]  # 42 named from a.dbn's mappings: one series, not "42" and "ESH4"
    unmapped = cache.manifest.counts.unmapped
    assert unmapped["instruments"] == 2 and unmapped["records"] == 200 and unmapped["named_from_other_inputs"] == 1
    assert "instrument 43 has no symbol mapping (100 records); kept as symbol '43'" in caplog.text
    assert "named ESH4 from another input" in caplog.text
    info = published_ok(capsys, out)
    assert info["counts"]["unmapped"]["records"] == 200


def test_stray_record_types_are_counted_as_dropped(tmp_path, capsys):
    ts = T0 + MIN * np.arange(100)
    recs = _records("ohlcv-1m", bars(ts, np.full(100, 10.0), 7))
    recs["rtype"][::10] = 0x22  # ten hourly bars inside a minute-bar file
    path = dbn_file(
        tmp_path / "x.dbn",
        "ohlcv-1m",
        recs,
        [("ESH4", [(DAY0, DAY0 + dt.timedelta(days=2), "7")])],
        dbn.SType.RAW_SYMBOL,
    )
    out = tmp_path / "c.zarr"
    cache = build_cache([path], out, features="close", normalize="none", progress=False)
    assert cache.n_bars == 90 and cache.manifest.counts.dropped == {"other record type (ohlcv-1h)": 10}
    rc, text, _ = cli(capsys, "info", str(out), prog="shardcache")
    assert rc == 0, text
    assert "other record type (ohlcv-1h): 10" in text


# -- bar sizes --------------------------------------------------------------------------------
def parquet(path: Path, **cols) -> Path:
    pq.write_table(pa.table(cols), path)
    return path


def test_two_bar_sizes_are_refused_naming_files_and_sizes(tmp_path, capsys):
    ts = T0 + MIN * np.arange(100)
    m = write_dbn(tmp_path / "m.dbn", "ohlcv-1m", bars(ts, np.full(100, 10.0), 7), symbols={7: "ESH4"})
    h = write_dbn(
        tmp_path / "h.dbn",
        "ohlcv-1h",
        bars(ts[:20] * 0 + T0 + HOUR * np.arange(20) + 200 * MIN, np.full(20, 10.0), 7),
        symbols={7: "ESH4"},
    )
    line = refused(capsys, tmp_path / "c.zarr", str(m), str(h))
    assert "h.dbn" in line and "m.dbn" in line and "1h bars" in line and "1m bars" in line
    hourly = parquet(
        tmp_path / "ESH4.parquet",
        ts=pa.array(T0 + HOUR * np.arange(50) + 500 * MIN, pa.int64()),
        open=np.full(50, 10.0),
        high=np.full(50, 10.0),
        low=np.full(50, 10.0),
        close=np.full(50, 10.0),
        volume=np.full(50, 1.0),
    )
    line = refused(capsys, tmp_path / "d.zarr", str(m), str(hourly))
    assert "ESH4.parquet" in line and "m.dbn" in line and "1h bars" in line and "1m bars" in line


def test_bar_on_table_inputs_is_refused_unless_it_is_their_step(tmp_path, capsys):
    path = parquet(
        tmp_path / "ES.parquet", ts=pa.array(T0 + MIN * np.arange(100), pa.int64()), close=np.linspace(10, 11, 100)
    )
    assert "1m bars and parquet bars are taken as they are" in refused(
        capsys, tmp_path / "a.zarr", str(path), "--bar", "5m"
    )
    assert "a coarser input never gives finer bars" in refused(capsys, tmp_path / "b.zarr", str(path), "--bar", "30s")
    cache = build_cache([path], tmp_path / "c.zarr", bar="1m", normalize="none", progress=False)
    assert cache.manifest.build.bar_ns == MIN


def test_dbn_bars_resampled_coarser_say_so_and_finer_is_refused(tmp_path, capsys):
    ts = T0 + MIN * np.arange(120)
    path = write_dbn(tmp_path / "m.dbn", "ohlcv-1m", bars(ts, np.full(120, 10.0), 7), symbols={7: "ESH4"})
    out = tmp_path / "c.zarr"
    cache = build_cache([path], out, bar="5m", features="close", normalize="none", progress=False)
    assert cache.n_bars == 24 and cache.manifest.build.bar_ns == 5 * MIN
    assert cache.manifest.counts.resampled == {"from": ["1m"], "to": "5m"}
    rc, text, _ = cli(capsys, "info", str(out), prog="shardcache")
    assert rc == 0, text
    assert "resampled 1m bars into 5m bars (--bar)" in text
    assert "cannot make 30s bars from ohlcv-1m" in refused(capsys, tmp_path / "d.zarr", str(path), "--bar", "30s")


# -- Parquet columns --------------------------------------------------------------------------
def two_symbols(n: int = 100) -> dict:
    ts = np.concatenate([T0 + MIN * np.arange(n)] * 2)
    close = np.concatenate([np.full(n, 10.0), np.full(n, 20.0)])
    return {"ts": pa.array(ts, pa.int64()), "close": close}


@pytest.mark.parametrize(
    "symbols, expected",
    [
        (pa.array([b"ES"] * 100 + [b"NQ"] * 100, pa.binary()), ["ES", "NQ"]),
        (pa.array([b"ES"] * 100 + [b"NQ"] * 100, pa.large_binary()), ["ES", "NQ"]),
        (pa.array([b"ES"] * 100 + [b"NQ"] * 100, pa.binary(2)), ["ES", "NQ"]),
        (pa.array([7] * 100 + [2**40] * 100, pa.uint64()), ["1099511627776", "7"]),
        (pa.array([1] * 100 + [2] * 100, pa.int32()), ["1", "2"]),
        (pa.array([1.0] * 100 + [2.0] * 100, pa.float64()), ["1", "2"]),
        (pa.array(["ES"] * 100 + ["NQ"] * 100).dictionary_encode(), ["ES", "NQ"]),
    ],
)
def test_symbol_columns_of_every_type_keep_symbols_apart(tmp_path, capsys, symbols, expected):
    path = parquet(tmp_path / "x.parquet", symbol=symbols, **two_symbols())
    out = tmp_path / "c.zarr"
    cache = build_cache([path], out, features="close", normalize="none", progress=False)
    assert cache.symbols == expected and cache.n_bars == 200
    info = published_ok(capsys, out)
    assert info["symbols"] == expected


@pytest.mark.parametrize(
    "cols, message",
    [
        (
            {"symbol": pa.array([b"\xff\xfe"] * 200, pa.binary())},
            r"symbol column 'symbol' holds bytes that are not UTF-8",
        ),
        ({"symbol": pa.array([1.5] * 200)}, r"symbol column 'symbol' holds 1.5, not a whole number"),
        ({"symbol": pa.array([None] * 200, pa.string())}, r"symbol column 'symbol' is entirely null"),
        (
            {"symbol": ["ES"] * 200, "vol": pa.array([None] * 200, pa.float64())},
            (
                r"column 'vol' is entirely null or NaN; "
                r"leave it out with --columns close"
            ),
        ),
        ({"symbol": ["ES"] * 200, "vol": np.full(200, np.nan)}, r"column 'vol' is entirely null or NaN"),
        (
            {"symbol": ["ES"] * 200, "ts_recv": pa.array(np.full(200, 2**60), pa.int64())},
            (
                r"column 'ts_recv' holds integers above 2\*\*53 .* \(the file is not corrupt\); "
                r"leave it out with --columns close"
            ),
        ),
        (
            {"symbol": ["ES"] * 200, "ts_event": pa.array(np.full(200, T0), pa.timestamp("ns"))},
            r"several timestamp columns: 'ts' \(int64\), 'ts_event' \(timestamp\[ns\]\); name the right one with --ts-column",
        ),
        (
            {"symbol": ["ES"] * 200, "ticker": pa.array(np.arange(200), pa.int64())},
            r"several symbol columns: 'symbol' \(string\), 'ticker' \(int64\); name the right one with --symbol-column",
        ),
        ({"symbol": ["ES"] * 200, "CLOSE": np.ones(200)}, r"columns 'close', 'CLOSE' differ only in case"),
    ],
)
def test_parquet_column_problems_are_one_line_naming_the_column(tmp_path, capsys, cols, message):
    table = pa.table({**two_symbols(), **cols})
    path = tmp_path / "x.parquet"
    pq.write_table(table, path)
    assert re.search(message, refused(capsys, tmp_path / "c.zarr", str(path)))


def test_duplicate_column_names_are_refused(tmp_path, capsys):
    table = pa.Table.from_arrays(
        [pa.array(T0 + MIN * np.arange(10), pa.int64()), pa.array(np.ones(10)), pa.array(np.ones(10))],
        names=["ts", "close", "close"],
    )
    path = tmp_path / "x.parquet"
    pq.write_table(table, path)
    assert "duplicate column name 'close'" in refused(capsys, tmp_path / "c.zarr", str(path))


@pytest.mark.parametrize("unit, scale", [("s", 10**9), ("ms", 10**6), ("us", 10**3), ("ns", 1)])
def test_integer_timestamp_units_are_read_from_the_values(tmp_path, unit, scale):
    ts = (T0 + MIN * np.arange(100)) // scale
    path = tmp_path / "ES.parquet"
    pq.write_table(
        pa.table({"ts": pa.array(ts, pa.int64()), "close": np.linspace(1, 2, 100)}), path, write_statistics=False
    )
    cache = build_cache([path], tmp_path / "c.zarr", features="close", normalize="none", progress=False)
    assert cache.n_bars == 100 and cache.manifest.build.bar_ns == MIN
    np.testing.assert_array_equal(times(cache, np.arange(100)), ts * scale)


def test_capitalised_ohlcv_columns_get_the_default_features(tmp_path):
    n = 100
    px = np.linspace(10, 11, n)
    path = parquet(
        tmp_path / "ES.parquet",
        Timestamp=pa.array(T0 + MIN * np.arange(n), pa.timestamp("ns")),
        Open=px,
        High=px + 0.1,
        Low=px - 0.1,
        Close=px,
        Volume=np.ones(n),
    )
    cache = build_cache([path], tmp_path / "c.zarr", progress=False)
    assert cache.feature_names[0] == "log_return" and len(cache.feature_names) == 9


# -- CSV --------------------------------------------------------------------------------------
def test_csv_gives_the_same_cache_as_parquet(tmp_path, capsys):
    n = 300
    ts = T0 + MIN * np.arange(n)
    px = 100 + np.cumsum(np.random.default_rng(0).normal(0, 0.1, n)).round(2)
    table = pa.table(
        {
            "timestamp": pa.array(ts, pa.timestamp("ns", tz="UTC")),
            "symbol": ["ESH4"] * n,
            "open": px,
            "high": px + 0.25,
            "low": px - 0.25,
            "close": px,
            "volume": np.arange(n, dtype=np.int64) + 1,
        }
    )
    pq.write_table(table, tmp_path / "bars.parquet")
    pcsv.write_csv(table, tmp_path / "bars.csv")
    a = build_cache([tmp_path / "bars.parquet"], tmp_path / "a.zarr", split="train=0.8,val=0.2", progress=False)
    b = build_cache([tmp_path / "bars.csv"], tmp_path / "b.zarr", split="train=0.8,val=0.2", progress=False)
    np.testing.assert_array_equal(a.read_rows(0, n), b.read_rows(0, n))
    assert a.manifest.stats == b.manifest.stats and b.history()["sources"][0]["kind"] == "csv"
    published_ok(capsys, tmp_path / "b.zarr")
    found = build_cache(  # a folder's CSV files are inputs too (the cache goes outside the input folder)
        [tmp_path],
        tmp_path.with_name(f"{tmp_path.name}-dir.zarr"),
        features="close",
        normalize="none",
        progress=False,
        symbol_column="symbol",
    )
    assert found.n_bars == n  # the same bars twice: duplicates keep one


def test_csv_follows_the_same_bad_input_rules(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("ts,close,vol\n" + "".join(f"{T0 + MIN * i},1.0,\n" for i in range(10)))
    assert "column 'vol' is entirely null or NaN" in refused(capsys, tmp_path / "c.zarr", str(tmp_path / "x.csv"))
    (tmp_path / "y.csv").write_text("when,close\n2024-03-04,1.0\n")
    assert "no timestamp column" in refused(capsys, tmp_path / "d.zarr", str(tmp_path / "y.csv"))


# -- options ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, flag",
    [
        (["--seq-len", "0"], "--seq-len 0"),
        (["--seq-len", "-5"], "--seq-len -5"),
        (["--horizon", "-1"], "--horizon -1"),
        (["--shard-rows", "0"], "--shard-rows 0"),
        (["--shard-rows", "-8"], "--shard-rows -8"),
        (["--chunk-rows", "0"], "--chunk-rows 0"),
        (["--workers", "-1"], "--workers -1"),
        (["--workers", "0"], "--workers 0"),
        (["--split", "train"], "--split 'train'"),
        (["--split", "train=0.5,val=0.2"], "--split 'train=0.5,val=0.2'"),
        (["--split", "val=2024-13-45"], "--split 'val=2024-13-45'"),
        (["--bar", "5 minutes"], "--bar '5 minutes'"),
        (["--bar", "0"], "--bar '0'"),
        (["--max-gap", "soon"], "--max-gap 'soon'"),
        (["--chunk-rows", "3000", "--shard-rows", "2048"], "--chunk-rows 3000"),
    ],
)
def test_bad_options_are_one_line_before_any_input_is_read(tmp_path, capsys, args, flag):
    missing = tmp_path / "not-read-yet.dbn"  # an input that would fail if it were read
    line = refused(capsys, tmp_path / "c.zarr", str(missing), *args)
    assert line.startswith(f"build-cache: error: {flag}") and "--resume" not in line


def test_append_refuses_every_build_option_named(tmp_path, capsys):
    ts = T0 + MIN * np.arange(100)
    path = write_dbn(tmp_path / "a.dbn", "ohlcv-1m", bars(ts, np.full(100, 10.0), 7), symbols={7: "ESH4"})
    out = tmp_path / "c.zarr"
    build_cache([path], out, features="close", normalize="none", progress=False)
    for args in (["--split", "none"], ["--normalize", "zscore"], ["--seq-len", "60"], ["--features", "close"]):
        rc, _, err = cli(capsys, str(path), "--out", str(out), "--append", "-q", *args)
        assert rc == 2 and f"drop {args[0]}" in err and "Traceback" not in err


def test_features_default_plus_a_column(tmp_path):
    ts = T0 + MIN * np.arange(100)
    path = write_dbn(tmp_path / "a.dbn", "ohlcv-1m", bars(ts, np.full(100, 10.0), 7), symbols={7: "ESH4"})
    cache = build_cache([path], tmp_path / "c.zarr", features="default,close", normalize="none", progress=False)
    assert cache.feature_names[-1] == "close" and len(cache.feature_names) == 10


# -- statistics and splits ----------------------------------------------------------------------
def test_zscore_needs_train_bars_and_a_train_split(tmp_path, capsys, caplog):
    ts = T0 + MIN * np.arange(100)
    path = str(write_dbn(tmp_path / "a.dbn", "ohlcv-1m", bars(ts, np.linspace(10, 11, 100), 7), symbols={7: "ESH4"}))
    assert "the train split has no bars" in refused(capsys, tmp_path / "a.zarr", path, "--split", "val=1999-01-01")
    assert "a split named train" in refused(capsys, tmp_path / "b.zarr", path, "--split", "a=0.5,b=0.5")
    rc, out, _err = cli(capsys, path, "--out", str(tmp_path / "c.zarr"), "--split", "val=2099-01-01")
    assert rc == 0 and "split val has no bars" in caplog.text
    assert "mean and std of the train split" in out
    rc, out, _ = cli(capsys, path, "--out", str(tmp_path / "d.zarr"))
    assert rc == 0 and "mean and std of all bars" in out
    rc, out, _ = cli(
        capsys, path, "--out", str(tmp_path / "e.zarr"), "-q", "--split", "a=0.5,b=0.5", "--normalize", "none"
    )
    assert rc == 0 and os.path.isdir(tmp_path / "e.zarr")


@pytest.mark.parametrize("bar", [None, "5m"])
def test_roll_between_daily_files_is_cut_too(tmp_path, bar):
    """Daily downloads of ES.c.0: each file maps the symbol to that day's instrument; bars resampled or not."""
    d1, d2 = DAY0 + dt.timedelta(days=1), DAY0 + dt.timedelta(days=2)
    first = T0 + MIN * np.arange(120)  # 22:00 .. 23:59 on DAY0
    second = T0 + 2 * HOUR + MIN * np.arange(120)  # 00:00 .. 01:59 on the next day
    a = dbn_file(
        tmp_path / "day0.dbn",
        "ohlcv-1m",
        bars(first, np.full(120, 5000.0), 100),
        [("ES.c.0", [(DAY0, d1, "100")])],
        dbn.SType.CONTINUOUS,
    )
    b = dbn_file(
        tmp_path / "day1.dbn",
        "ohlcv-1m",
        bars(second, np.full(120, 5100.0), 200),
        [("ES.c.0", [(d1, d2, "200")])],
        dbn.SType.CONTINUOUS,
    )
    cache = build_cache(
        [a, b], tmp_path / "c.zarr", bar=bar, features="close", normalize="none", max_gap="1h", progress=False
    )
    per = 1 if bar is None else 5
    assert cache.manifest.rolls == {"ES.c.0": [[T0 + 2 * HOUR, 100, 200]]}
    assert len(cache.segments) == 2 and int(cache.segments[0, 2] - cache.segments[0, 1]) == 120 // per
    ds = WindowDataset(cache, seq_len=10, horizon=1)
    assert len(ds) == 2 * (120 // per - 10)
    assert all(
        len(set(np.concatenate([ds[i][0].numpy().ravel(), ds[i][1].numpy()]).tolist())) == 1 for i in range(len(ds))
    )


def test_source_readers_never_import_their_package():
    """The readers import the shared base; only the package imports the readers (no import circle)."""
    import shardcache.ingest.sources as pkg

    folder = Path(pkg.__file__).parent
    for path in folder.glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.level == 1 and node.module is None), f"{path.name} imports its package"
                assert node.module not in ("shardcache.ingest.sources",), f"{path.name} imports its package"


@pytest.mark.parametrize("args", [["--seq-len", "abc"], ["--workers", "1.5"], ["--codec", "brotli"]])
def test_malformed_arguments_are_one_line_too(tmp_path, capsys, args):
    with pytest.raises(SystemExit) as exit_:
        build_cache_main([str(tmp_path / "x.dbn"), "--out", str(tmp_path / "c.zarr"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and args[0] in err
    assert not (tmp_path / "c.zarr").exists()


CSV_ROWS = [T0 + MIN * i for i in range(20)]


@pytest.mark.parametrize(
    "header, row, message",
    [
        ("ts,close,close", lambda t: f"{t},1.0,2.0", r"duplicate column name 'close'"),
        ("ts,Close,close", lambda t: f"{t},1.0,2.0", r"columns 'Close', 'close' differ only in case"),
        (
            "ts_event,ts,close",
            lambda t: f"{t},{t},1.0",
            r"several timestamp columns: 'ts_event' \(int64\), 'ts' \(int64\)",
        ),
        ("ts,close,ts_recv", lambda t: f"{t},1.0,{2**60}", r"column 'ts_recv' holds integers above 2\*\*53"),
        ("ts,symbol,close", lambda t: f"{t},1.5,1.0", r"symbol column 'symbol' holds 1.5, not a whole number"),
        ("ts,close", lambda t: f"{t // 10**12},1.0", r"holds integers around \d+, which are not seconds, ms, us or ns"),
    ],
)
def test_csv_refusals_match_parquet(tmp_path, capsys, header, row, message):
    path = tmp_path / "x.csv"
    path.write_text(header + "\n" + "".join(row(t) + "\n" for t in CSV_ROWS))
    assert re.search(message, refused(capsys, tmp_path / "c.zarr", str(path)))


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_csv_integer_timestamps_and_capitalised_columns(tmp_path, unit):
    scale = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[unit]
    lines = ["Time,Symbol,Open,High,Low,Close,Volume"]
    lines += [f"{t // scale},{sym},10,11,9,10.5,{i + 1}" for sym in ("ES", "NQ") for i, t in enumerate(CSV_ROWS)]
    path = tmp_path / "bars.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    cache = build_cache([path], tmp_path / "c.zarr", normalize="none", progress=False)
    assert cache.symbols == ["ES", "NQ"] and cache.n_bars == 40 and len(cache.feature_names) == 9
    np.testing.assert_array_equal(times(cache, np.arange(20)), CSV_ROWS)


def test_blank_symbols_are_trimmed_and_empty_ones_missing(tmp_path, capsys):
    ts = np.concatenate([T0 + MIN * np.arange(10)] * 3)
    path = parquet(
        tmp_path / "x.parquet",
        ts=pa.array(ts, pa.int64()),
        symbol=[""] * 10 + [" ES"] * 10 + ["  "] * 10,
        close=np.ones(30),
    )
    out = tmp_path / "c.zarr"
    cache = build_cache([path], out, features="close", normalize="none", progress=False)
    assert cache.symbols == ["ES"] and cache.manifest.counts.dropped == {"missing symbol": 20}
    published_ok(capsys, out)


def test_csv_column_of_whole_numbers_may_hold_a_fraction_later(tmp_path):
    n = 300_000  # more than one 4 MiB block of text
    ts = T0 + MIN * np.arange(n)
    volume = np.arange(n, dtype=np.float64)
    volume[-1] = 0.5
    path = tmp_path / "ES.csv"
    path.write_text("ts,close,volume\n" + "".join(f"{t},100,{v:g}\n" for t, v in zip(ts.tolist(), volume.tolist())))
    cache = build_cache([path], tmp_path / "c.zarr", features="volume", normalize="none", progress=False)
    got = np.concatenate([cache.read_rows(int(a), int(b)) for _, a, b in cache.segments])[:, 0]
    np.testing.assert_array_equal(got, volume.astype(np.float32))


@pytest.mark.parametrize(
    "texts, expected",
    [
        (["2024-03-04T14:30:00Z", "2024-03-04T14:31:00Z"], [0, MIN]),
        (["2024-03-04 14:30:00", "2024-03-04 14:31:00"], [0, MIN]),  # no zone: UTC
        (["2024-03-04T15:30:00+01:00", "2024-03-04T15:31:00+01:00"], [0, MIN]),
    ],
)
def test_iso_text_timestamps_in_parquet(tmp_path, texts, expected):
    path = parquet(tmp_path / "ES.parquet", ts=pa.array(texts * 1), close=np.ones(2))
    cache = build_cache([path], tmp_path / "c.zarr", features="close", normalize="none", progress=False)
    t0 = int(np.datetime64("2024-03-04T14:30", "ns").astype(np.int64))
    np.testing.assert_array_equal(times(cache, np.arange(2)), t0 + np.asarray(expected))


def test_text_timestamps_that_are_not_iso_are_refused(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("time,close\n03/04/2024 14:30,1.0\n03/04/2024 14:31,1.0\n")
    line = refused(capsys, tmp_path / "c.zarr", str(tmp_path / "x.csv"))
    assert "timestamp column 'time' holds '03/04/2024 14:30', not an ISO-8601 time" in line


def test_dbn_and_parquet_bars_of_one_symbol_build_together(tmp_path):
    ts = T0 + MIN * np.arange(100)
    a = write_dbn(tmp_path / "a.dbn", "ohlcv-1m", bars(ts, np.full(100, 10.0), 7), symbols={7: "ESH4"})
    later = ts + 50 * MIN  # overlaps the DBN file's last 50 bars: one cluster of both kinds
    b = parquet(
        tmp_path / "b.parquet",
        ts=pa.array(later, pa.int64()),
        symbol=["ESH4"] * 100,
        open=np.full(100, 11.0),
        high=np.full(100, 11.0),
        low=np.full(100, 11.0),
        close=np.full(100, 11.0),
        volume=np.ones(100),
    )
    cache = build_cache([a, b], tmp_path / "c.zarr", features="close", normalize="none", progress=False)
    assert cache.n_bars == 150 and cache.manifest.counts.dropped == {"duplicate timestamp": 50}
    assert cache.manifest.rolls == {}
