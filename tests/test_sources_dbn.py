"""The DBN reader against databento_dbn's own per-record decoding, on real and crafted files."""

from __future__ import annotations

import datetime as dt
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import numpy as np
import pyarrow as pa
import pytest

from shardcache.errors import SourceError
from shardcache.ingest.sample import make_sample, write_dbn
from shardcache.ingest.sources import open_source
from shardcache.ingest.sources.dbn import LATE_NS, SCHEMAS, UNDEF_PRICE, record_dtype

SAMPLE_DIR = Path(
    os.environ.get("SHARDCACHE_SAMPLE_DBN") or Path(__file__).resolve().parents[2] / "shared" / "data" / "dbn"
)
SAMPLE_FILES = sorted(p for p in SAMPLE_DIR.glob("*") if p.is_file()) if SAMPLE_DIR.is_dir() else []
MIN = 60_000_000_000
T0 = 1_672_660_800_000_000_000  # 2023-01-02T12:00:00Z
LEVEL_FIELDS = {"bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"}


# -- a plain reference: databento_dbn records folded into bars by dict and loop ---------
def decode(path: Path) -> tuple[dbn.Metadata, list]:
    raw = Path(path).read_bytes()
    compression = dbn.Compression.ZSTD if raw[:4] == b"\x28\xb5\x2f\xfd" else dbn.Compression.NONE
    decoder = dbn.DBNDecoder(compression=compression, upgrade_policy=dbn.VersionUpgradePolicy.UPGRADE_TO_V3)
    items = decoder.write_and_decode(raw)
    return items[0], items[1:]


def symbol_of(meta: dbn.Metadata, iid: int, ts: int) -> str:
    """The mapping holding the record's UTC date, else the latest one before it, else the first after it."""
    day = dt.date(1970, 1, 1) + dt.timedelta(days=ts // 86_400_000_000_000)
    spans = sorted(
        (iv["start_date"], iv["end_date"], raw_symbol)
        for raw_symbol, intervals in meta.mappings.items()
        for iv in intervals
        if int(iv["symbol"]) == iid
    )
    for start, end, raw_symbol in spans:
        if start <= day < end:
            return raw_symbol
    before = [s for s in spans if s[0] <= day]
    return (before[-1] if before else spans[0])[2] if spans else str(iid)


def good(px: int) -> bool:
    return px != dbn.UNDEF_PRICE and px > 0


def reference_bars(path: Path, bar_ns: int | None = None) -> dict[tuple[str, int], dict[str, float]]:
    meta, recs = decode(path)
    schema = str(meta.schema)
    layout, interval, _ = SCHEMAS[schema]
    bar_ns = bar_ns or (interval if layout == "ohlcv" else MIN)
    groups: dict[tuple[str, int], list] = {}
    for r in recs:
        t = r.ts_recv - 1 if layout == "bbo" else r.ts_event
        key = (symbol_of(meta, r.instrument_id, r.ts_recv if layout == "bbo" else r.ts_event), t - t % bar_ns)
        groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        if layout == "ohlcv" and bar_ns == interval:
            (r,) = rs
            out[key] = {
                "open": r.open / 1e9,
                "high": r.high / 1e9,
                "low": r.low / 1e9,
                "close": r.close / 1e9,
                "volume": float(r.volume),
            }
            continue
        if layout == "bbo":
            rs = [r for r in rs if good(r.bid_px_00) and good(r.ask_px_00)]
            mids = [(r.bid_px_00 / 1e9 + r.ask_px_00 / 1e9) / 2 for r in rs]
            traded = [r for r in rs if r.ts_recv - interval < r.ts_event <= r.ts_recv and r.price != dbn.UNDEF_PRICE]
            out[key] = {
                "open": mids[0],
                "high": max(mids),
                "low": min(mids),
                "close": mids[-1],
                "volume": float(sum(r.size for r in traded)),
                "count": float(len(traded)),
                "bid": rs[-1].bid_px_00 / 1e9,
                "ask": rs[-1].ask_px_00 / 1e9,
            }
            continue
        rs = sorted(rs, key=lambda r: r.ts_event)
        if layout == "ohlcv":
            out[key] = {
                "open": rs[0].open / 1e9,
                "high": max(r.high for r in rs) / 1e9,
                "low": min(r.low for r in rs) / 1e9,
                "close": rs[-1].close / 1e9,
                "volume": float(sum(r.volume for r in rs)),
            }
            continue
        trades = [r for r in rs if (layout == "trade" or str(r.action) == "T") and good(r.price)]
        if not trades:
            continue
        px = [r.price / 1e9 for r in trades]
        bar = {
            "open": px[0],
            "high": max(px),
            "low": min(px),
            "close": px[-1],
            "volume": float(sum(r.size for r in trades)),
            "count": float(len(trades)),
        }
        if layout == "mbp1":
            quoted = [r for r in rs if good(r.bid_px_00) and good(r.ask_px_00)]
            if not quoted:
                continue
            bar["bid"], bar["ask"] = quoted[-1].bid_px_00 / 1e9, quoted[-1].ask_px_00 / 1e9
        out[key] = bar
    for bar in out.values():
        if "bid" in bar:
            bar["spread"] = bar["ask"] - bar["bid"]
    return out


def read_bars(path: Path, max_rows: int = 1 << 20, **kw) -> tuple[dict[tuple[str, int], dict[str, float]], object]:
    src = open_source(str(path), **kw)
    out = {}
    for piece in src.pieces(max_rows):
        assert piece.num_rows <= max_rows
        assert piece.schema.field("symbol").type == pa.string()
        assert piece.schema.field("ts").type == pa.int64()
        assert piece.column_names == ["symbol", "ts", *src.columns, "instrument"]
        for row in piece.to_pylist():
            key = (row.pop("symbol"), row.pop("ts"))
            assert isinstance(row.pop("instrument"), int)
            assert key not in out, f"bar {key} came out twice"
            out[key] = row
    return out, src


# -- every shared sample file -----------------------------------------------------------
@pytest.mark.skipif(not SAMPLE_FILES, reason=f"no sample DBN files at {SAMPLE_DIR} (set SHARDCACHE_SAMPLE_DBN)")
@pytest.mark.parametrize("path", SAMPLE_FILES or [None], ids=lambda p: p.name if p else "none")
def test_every_shared_sample_file(path: Path) -> None:
    if path.stat().st_size == 0:
        with pytest.raises(SourceError, match="empty file"):
            open_source(str(path))
        return
    try:
        meta, recs = decode(path)
    except dbn.DBNError:
        with pytest.raises(SourceError, match=r"not a DBN file \(bad magic bytes\)"):
            open_source(str(path))
        return
    schema = str(meta.schema)
    if schema not in SCHEMAS:
        with pytest.raises(SourceError, match=f"schema '{schema}' is not bars or ticks") as err:
            open_source(str(path))
        assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)
        return
    got, src = read_bars(path)
    assert src.schema == schema and src.kind == "dbn"
    assert got == reference_bars(path)
    assert not src.drops
    if recs and SCHEMAS[schema][0] == "ohlcv":
        assert len(got) == len(recs)


@pytest.mark.skipif(not SAMPLE_FILES, reason=f"no sample DBN files at {SAMPLE_DIR}")
def test_record_dtypes_match_databento_decoding() -> None:
    checked = set()
    for path in SAMPLE_FILES:
        try:
            meta, recs = decode(path)
        except dbn.DBNError:
            continue
        schema = str(meta.schema)
        if schema not in SCHEMAS or not recs:
            continue
        dtype = record_dtype(schema)
        ours = np.frombuffer(b"".join(bytes(r) for r in recs), dtype=dtype)
        for rec, r in zip(ours, recs):
            for name in dtype.names:
                if name == "length":
                    assert rec[name] * 4 == dtype.itemsize
                    continue
                want = getattr(r, f"{name}_00" if name in LEVEL_FIELDS else name)
                got = rec[name].decode() if dtype[name].kind == "S" else int(rec[name])
                assert got == (str(want) if dtype[name].kind == "S" else int(want)), (schema, name)
        checked.add(SCHEMAS[schema][0])
    assert checked == {"ohlcv", "trade", "mbp1", "bbo"}


@pytest.mark.skipif(not SAMPLE_FILES, reason=f"no sample DBN files at {SAMPLE_DIR}")
def test_versions_one_to_three_read_alike() -> None:
    files = {v: SAMPLE_DIR / f"test_data.ohlcv-1m.v{v}.dbn.zst" for v in (1, 2, 3)}
    if not all(p.exists() for p in files.values()):
        pytest.skip("versioned ohlcv-1m samples missing")
    results = [read_bars(p)[0] for p in files.values()]
    assert results[0] == results[1] == results[2] and results[0]
    assert [open_source(str(p)).version for p in files.values()] == [1, 2, 3]


# -- refusals -----------------------------------------------------------------------------
def test_missing_empty_and_not_dbn(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or directory"):
        open_source(str(tmp_path / "nope.dbn"))
    (tmp_path / "empty.dbn.zst").write_bytes(b"")
    with pytest.raises(SourceError, match="empty file"):
        open_source(str(tmp_path / "empty.dbn.zst"))
    (tmp_path / "x.dbn").write_bytes(b"hello, this is not market data")
    with pytest.raises(SourceError, match=r"x\.dbn: not a DBN file \(bad magic bytes\)$"):
        open_source(str(tmp_path / "x.dbn"))
    with pa.CompressedOutputStream(str(tmp_path / "y.dbn.zst"), "zstd") as fh:
        fh.write(b"zstd, but not DBN inside" * 10)
    with pytest.raises(SourceError, match="not a DBN file"):
        open_source(str(tmp_path / "y.dbn.zst"))
    (tmp_path / "short.dbn").write_bytes(b"DBN\x03\x01")
    with pytest.raises(SourceError, match="truncated DBN header"):
        open_source(str(tmp_path / "short.dbn"))
    (tmp_path / "meta.dbn").write_bytes(b"DBN\x03\xff\x00\x00\x00GLBX")
    with pytest.raises(SourceError, match="truncated DBN metadata"):
        open_source(str(tmp_path / "meta.dbn"))
    (tmp_path / "v9.dbn").write_bytes(b"DBN\x09\x10\x00\x00\x00" + bytes(16))
    with pytest.raises(SourceError, match="DBN version 9 is not supported"):
        open_source(str(tmp_path / "v9.dbn"))


def _one_day(tmp_path: Path) -> Path:
    (path,) = make_sample(tmp_path / "day", days=1, symbols=["ESH3"])
    return path


def test_truncated_files_fail_while_reading(tmp_path: Path) -> None:
    path = _one_day(tmp_path)
    with pa.CompressedInputStream(pa.OSFile(str(path)), "zstd") as fh:
        plain = fh.read()
    header = 8 + int.from_bytes(plain[4:8], "little")
    cut = tmp_path / "cut.dbn"
    cut.write_bytes(plain[: header + 56 * 10 + 20])
    src = open_source(str(cut))
    with pytest.raises(SourceError, match=r"cut\.dbn: truncated DBN data after 10 records$"):
        list(src.pieces())

    rng = np.random.default_rng(0)
    n = 200_000
    fields = {"ts_event": T0 + np.arange(n) * MIN, "instrument_id": np.full(n, 3), "volume": rng.integers(1, 99, n)}
    for name in ("open", "high", "low", "close"):
        fields[name] = rng.integers(1, 10**12, n)
    big = write_dbn(tmp_path / "big.dbn.zst", "ohlcv-1m", fields, symbols={3: "ESH3"})
    raw = big.read_bytes()
    half = tmp_path / "half.dbn.zst"
    half.write_bytes(raw[: len(raw) // 2])
    src = open_source(str(half))
    with pytest.raises(SourceError, match=r"half\.dbn\.zst: truncated DBN data after \d+ records") as err:
        list(src.pieces(max_rows=1000))
    assert "\n" not in str(err.value)
    tiny = tmp_path / "tiny.dbn.zst"
    tiny.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SourceError, match=r"tiny\.dbn\.zst: truncated"):
        list(open_source(str(tiny)).pieces())


def test_unsupported_bar_and_columns(tmp_path: Path) -> None:
    path = _one_day(tmp_path)
    with pytest.raises(SourceError, match=r"cannot make 30s bars from ohlcv-1m"):
        open_source(str(path), bar="30s")
    with pytest.raises(SourceError, match=r"no column 'vwap' in ohlcv-1m data"):
        open_source(str(path), columns=["close", "vwap"])
    with pytest.raises(ValueError, match="bad duration"):
        open_source(str(path), bar="5 minutes")
    src = open_source(str(path), columns=["close", "volume"])
    assert next(iter(src.pieces())).column_names == ["symbol", "ts", "close", "volume", "instrument"]
    assert src.bar_ns == MIN and open_source(str(path), bar="1m").bar_ns == MIN


# -- values ---------------------------------------------------------------------------------
def test_undefined_and_zero_prices_are_dropped_and_counted(tmp_path: Path) -> None:
    n = 6
    fields = {
        "ts_event": (T0 + np.arange(n) * MIN).astype(np.uint64),
        "instrument_id": np.full(n, 42),
        "open": np.array([100.0, np.nan, 100.0, 100.0, 100.0, 100.0]),
        "high": np.full(n, 101.0),
        "low": np.array([99.0, 99.0, 0.0, 99.0, 99.0, 99.0]),
        "close": np.full(n, 100.5),
        "volume": np.arange(n) + 1,
    }
    fields["ts_event"][3] = dbn.UNDEF_TIMESTAMP
    fields["high"][4] = -5.0
    path = write_dbn(tmp_path / "bad.dbn", "ohlcv-1m", fields, symbols={42: "CLF3"})
    got, src = read_bars(path)
    assert sorted(got) == [("CLF3", T0), ("CLF3", T0 + 5 * MIN)]
    assert got[("CLF3", T0)] == {"open": 100.0, "high": 101.0, "low": 99.0, "close": 100.5, "volume": 1.0}
    assert dict(src.drops) == {"non-finite price": 1, "non-positive price": 2, "timestamp out of range": 1}
    _header, recs = decode(path)
    assert recs[1].open == dbn.UNDEF_PRICE

    trades = {
        "ts_event": T0 + np.arange(5) * 1_000_000_000,
        "instrument_id": np.full(5, 42),
        "price": np.array([10.0, np.nan, 0.0, 11.0, 9.5]),
        "size": np.array([1, 2, 3, 4, 5]),
    }
    path = write_dbn(tmp_path / "bad.trades.dbn.zst", "trades", trades, symbols={42: "CLF3"})
    got, src = read_bars(path)
    assert got == {("CLF3", T0): {"open": 10.0, "high": 11.0, "low": 9.5, "close": 9.5, "volume": 10.0, "count": 3.0}}
    assert dict(src.drops) == {"non-finite price": 1, "non-positive price": 1}


def _ticks(schema: str, seed: int, n: int = 400) -> dict[str, np.ndarray]:
    """Random ticks for two instruments over ~5 minutes, in ts_recv order, ts_event a little earlier."""
    rng = np.random.default_rng(seed)
    recv = T0 + np.sort(rng.integers(0, 5 * MIN, n))
    fields: dict[str, np.ndarray] = {
        "ts_recv": recv,
        "ts_event": recv - rng.integers(0, 2_000_000, n),
        "instrument_id": rng.choice([11, 12], n),
        "price": np.round(rng.normal(4000, 3, n) * 4) / 4,
        "size": rng.integers(1, 20, n),
    }
    if schema != "trades":
        bid = np.round(rng.normal(4000, 3, n) * 4) / 4
        fields["bid_px"], fields["ask_px"] = bid, bid + 0.25 * rng.integers(1, 3, n)
        fields["bid_px"][rng.random(n) < 0.05] = np.nan
    if schema == "mbp-1":
        fields["action"] = rng.choice([b"A", b"C", b"M", b"T"], n).astype("S1")
    if schema.startswith("bbo"):
        step = SCHEMAS[schema][1]
        fields["ts_recv"] = T0 + (np.arange(n) + 1) * step
        fields["ts_event"] = fields["ts_recv"] - rng.integers(0, 3 * step, n)
        fields["instrument_id"] = np.full(n, 11)
    fields["price"][rng.random(n) < 0.03] = np.nan
    return fields


@pytest.mark.parametrize("schema", ["trades", "tbbo", "mbp-1", "bbo-1s"])
def test_ticks_fold_into_bars_across_read_blocks(tmp_path: Path, schema: str) -> None:
    path = write_dbn(
        tmp_path / f"x.{schema}.dbn", schema, _ticks(schema, seed=len(schema)), symbols={11: "ESH3", 12: "NQH3"}
    )
    want = reference_bars(path)
    assert len(want) >= 5
    whole, src = read_bars(path)
    assert whole == want
    for max_rows in (1, 3, 64):
        blocks, small = read_bars(path, max_rows=max_rows)
        assert blocks == want, max_rows
        assert small.drops == src.drops


def test_ohlcv_resampled_to_a_multiple_of_the_interval(tmp_path: Path) -> None:
    path = make_sample(tmp_path / "s", days=1, symbols=["ESH3", "NQH3"])[0]
    want = reference_bars(path, bar_ns=5 * MIN)
    for max_rows in (7, 1 << 20):
        got, src = read_bars(path, max_rows=max_rows, bar="5m")
        assert got == want and src.bar_ns == 5 * MIN
    assert all(ts % (5 * MIN) == 0 for _, ts in want)


def test_a_record_for_a_bar_already_emitted_is_counted_late(tmp_path: Path) -> None:
    ts = np.array([T0 + 1, T0 + 2, T0 + 10 * MIN, T0 + 10 * MIN + 1, T0 + 3])
    trades = {
        "ts_event": ts,
        "instrument_id": np.full(5, 1),
        "price": np.array([1.0, 2.0, 3.0, 4.0, 5.0]),
        "size": np.ones(5),
    }
    path = write_dbn(tmp_path / "late.dbn", "trades", trades, symbols={1: "A"})
    got, src = read_bars(path)
    assert got[("A", T0)]["count"] == 3 and got[("A", T0)]["close"] == 5.0 and not src.drops
    got, src = read_bars(path, max_rows=2)
    assert got[("A", T0)]["count"] == 2 and dict(src.drops) == {"late record": 1}
    assert LATE_NS < 10 * MIN


# -- layout details -------------------------------------------------------------------------
def _raw_file(path: Path, meta: dbn.Metadata, body: bytes) -> Path:
    path.write_bytes(meta.encode() + body)
    return path


def _meta(mappings: list, ts_out: bool = False) -> dbn.Metadata:
    return dbn.Metadata(
        dataset="GLBX.MDP3",
        start=T0,
        stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.OHLCV_1M,
        mappings=mappings,
        ts_out=ts_out,
        version=3,
    )


def _ohlcv(n: int, iid: np.ndarray | int = 7, ts_out: bool = False, day_step: bool = False) -> np.ndarray:
    recs = np.zeros(n, dtype=record_dtype("ohlcv-1m", ts_out))
    recs["length"], recs["rtype"], recs["instrument_id"] = recs.dtype.itemsize // 4, 0x21, iid
    recs["ts_event"] = T0 + np.arange(n) * (86_400_000_000_000 if day_step else MIN)
    for i, name in enumerate(("open", "high", "low", "close")):
        recs[name] = (100 + np.arange(n) + i) * 1_000_000_000
    recs["volume"] = 5
    if ts_out:
        recs["ts_out"] = recs["ts_event"] + 17
    return recs


def test_ts_out_records_and_foreign_records_are_handled(tmp_path: Path) -> None:
    recs = _ohlcv(9, ts_out=True)
    path = _raw_file(tmp_path / "ts_out.dbn", _meta([], ts_out=True), recs.tobytes())
    _header, decoded = decode(path)
    assert [r.ts_out for r in decoded] == list(recs["ts_out"])
    got, _ = read_bars(path, max_rows=4)
    assert got == reference_bars(path) and len(got) == 9

    plain = _ohlcv(6)
    foreign = np.zeros(32, dtype=np.uint8)
    foreign[0], foreign[1] = 8, 0x17  # a 32-byte record of another type (a system message)
    body = plain[:2].tobytes() + foreign.tobytes() + plain[2:].tobytes()
    path = _raw_file(tmp_path / "mixed.dbn", _meta([]), body)
    for max_rows in (1, 4, 100):
        got, _ = read_bars(path, max_rows=max_rows)
        assert sorted(got) == [("7", int(t)) for t in plain["ts_event"]]


def test_symbols_follow_mapping_dates(tmp_path: Path) -> None:
    d = dt.date(2023, 1, 2)

    def interval(start: int, end: int, iid: int) -> SimpleNamespace:
        return SimpleNamespace(start_date=d + dt.timedelta(start), end_date=d + dt.timedelta(end), symbol=str(iid))

    mappings = [
        SimpleNamespace(raw_symbol="AAA", intervals=[interval(0, 1, 7)]),
        SimpleNamespace(raw_symbol="BBB", intervals=[interval(1, 2, 7)]),
        SimpleNamespace(raw_symbol="CCC", intervals=[interval(0, 1, 8)]),
    ]
    recs = np.concatenate([_ohlcv(4, 7, day_step=True), _ohlcv(4, 8, day_step=True), _ohlcv(1, 9)])
    path = _raw_file(tmp_path / "dates.dbn", _meta(mappings), recs.tobytes())
    day = 86_400_000_000_000
    want = {
        ("AAA", T0),
        ("BBB", T0 + day),
        ("BBB", T0 + 2 * day),
        ("BBB", T0 + 3 * day),
        ("CCC", T0),
        ("CCC", T0 + day),
        ("CCC", T0 + 2 * day),
        ("CCC", T0 + 3 * day),
        ("9", T0),
    }
    for max_rows in (1, 1 << 20):
        got, _ = read_bars(path, max_rows=max_rows)
        assert set(got) == want
    assert set(reference_bars(path)) == want


def test_describe_and_pickle(tmp_path: Path) -> None:
    path = _one_day(tmp_path)
    src = open_source(str(path))
    info = src.describe()
    assert info == {
        "path": str(path),
        "size": path.stat().st_size,
        "mtime": path.stat().st_mtime,
        "kind": "dbn",
        "schema": "ohlcv-1m",
        "columns": ["open", "high", "low", "close", "volume"],
    }
    copy = pickle.loads(pickle.dumps(src))
    assert [p.to_pylist() for p in copy.pieces()] == [p.to_pylist() for p in src.pieces()]


def test_undefined_price_never_becomes_a_huge_number(tmp_path: Path) -> None:
    recs = _ohlcv(3)
    recs["close"][1] = UNDEF_PRICE
    path = _raw_file(tmp_path / "u.dbn", _meta([]), recs.tobytes())
    src = open_source(str(path))
    closes = np.concatenate([p.column("close").to_numpy() for p in src.pieces()])
    assert closes.max() < 1e6 and len(closes) == 2 and src.drops["non-finite price"] == 1


def test_ohlcv_rows_pass_through_unsorted_and_duplicated(tmp_path: Path) -> None:
    ts = T0 + np.array([2, 0, 1, 1]) * MIN
    fields = {
        "ts_event": ts,
        "instrument_id": [4, 4, 4, 4],
        "open": [1.0, 2.0, 3.0, 4.0],
        "high": [5.0] * 4,
        "low": [0.5] * 4,
        "close": [1.0] * 4,
        "volume": [1, 2, 3, 4],
    }
    path = write_dbn(tmp_path / "dup.dbn.zst", "ohlcv-1m", fields, symbols={4: "ZNH3"})
    src = open_source(str(path))
    table = pa.concat_tables(list(src.pieces()))
    assert table.column("ts").to_pylist() == list(ts) and table.column("open").to_pylist() == [1.0, 2.0, 3.0, 4.0]
    assert not src.drops
