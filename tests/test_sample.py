"""The synthetic sample: realistic structure, valid DBN, the expected size, determinism."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pyarrow.parquet as pq
import pytest

from shardcache.ingest.sample import CONTRACTS, make_sample, make_sample_parquet, session_minutes, write_dbn
from shardcache.ingest.sources import open_source

MIN = 60_000_000_000
HOUR = 60 * MIN
DEFAULT_BARS = 665_000
DEFAULT_TRADE_DATES = 360  # one file per weekday, as the team's 360 daily files


def decode(path: Path) -> tuple[dbn.Metadata, list]:
    decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
    items = decoder.write_and_decode(path.read_bytes())
    return items[0], items[1:]


def bars(paths: list[Path]) -> dict[str, np.ndarray]:
    """All bars of ``paths`` read by the DBN source, as columns."""
    pieces = [p for path in paths for p in open_source(str(path)).pieces()]
    return {
        name: np.concatenate([p.column(name).to_numpy(zero_copy_only=False) for p in pieces])
        for name in pieces[0].column_names
    }


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("week"), days=10, start="2023-01-02")


def test_one_file_per_weekday(week: list[Path]) -> None:
    names = [p.name for p in week]
    assert len(names) == 10 and names[0] == "glbx-mdp3-20230102.ohlcv-1m.dbn.zst"
    dates = [dt.datetime.strptime(n[10:18], "%Y%m%d").date() for n in names]
    assert all(d.weekday() < 5 for d in dates) and dt.date(2023, 1, 7) not in dates


def test_files_decode_with_databento_and_agree_with_the_reader(week: list[Path]) -> None:
    meta, recs = decode(week[0])
    assert meta.version == 3 and str(meta.schema) == "ohlcv-1m" and meta.dataset == "GLBX.MDP3"
    ids = {c.symbol: c.instrument_id for c in CONTRACTS}
    assert {k: int(v[0]["symbol"]) for k, v in meta.mappings.items()} == ids
    got = bars(week[:1])
    assert len(got["ts"]) == len(recs)
    names = {c.instrument_id: c.symbol for c in CONTRACTS}
    assert list(got["symbol"]) == [names[r.instrument_id] for r in recs]
    assert list(got["ts"]) == [r.ts_event for r in recs]
    assert list(got["close"]) == [r.close / 1e9 for r in recs]
    assert [r.ts_event for r in recs] == sorted(r.ts_event for r in recs)


def test_sessions_weekends_and_maintenance_break(week: list[Path]) -> None:
    for path in week:
        date = dt.date(int(path.name[10:14]), int(path.name[14:16]), int(path.name[16:18]))
        ts = bars([path])["ts"]
        minutes = session_minutes(date)
        assert minutes[0] <= ts.min() and ts.max() <= minutes[-1]
        local = (ts - 6 * HOUR) % (24 * HOUR)  # January: US/Central is UTC-6
        assert not ((local >= 16 * HOUR) & (local < 17 * HOUR)).any()
    ts = np.sort(bars(week)["ts"])
    gaps = np.diff(ts)
    assert (gaps >= HOUR).sum() >= len(week) - 1
    friday_close = 1_673_042_400_000_000_000  # 2023-01-06 16:00 CST
    sunday_open = 1_673_218_800_000_000_000  # 2023-01-08 17:00 CST
    assert not ((ts >= friday_close) & (ts < sunday_open)).any()
    assert ts[ts >= sunday_open].min() < sunday_open + 30 * MIN


def test_daylight_saving_moves_the_session_in_utc() -> None:
    winter, summer = session_minutes(dt.date(2023, 3, 10)), session_minutes(dt.date(2023, 3, 13))
    assert winter[0] % (24 * HOUR) == 23 * HOUR and summer[0] % (24 * HOUR) == 22 * HOUR
    assert len(summer) == 23 * 60 and summer[-1] - summer[0] == (23 * 60 - 1) * MIN


def test_bars_look_like_futures(week: list[Path]) -> None:
    got = bars(week)
    assert set(got["symbol"]) == {c.symbol for c in CONTRACTS}
    o, h, low, c, v = (got[k] for k in ("open", "high", "low", "close", "volume"))
    assert (low <= np.minimum(o, c)).all() and (h >= np.maximum(o, c)).all() and (v >= 1).all()
    es = got["symbol"] == "ESH3"
    assert np.allclose(np.round(c[es] * 4), c[es] * 4)
    assert 3000 < np.median(c[es]) < 4700
    returns = np.diff(np.log(c[es]))
    assert 1e-4 < returns.std() < 5e-3
    local = (got["ts"] - 6 * HOUR) % (24 * HOUR)
    regular = (local >= 8 * HOUR + 30 * MIN) & (local < 15 * HOUR)
    overnight = (local >= 18 * HOUR) | (local < 2 * HOUR)
    assert regular.sum() / 390 > 2.5 * overnight.sum() / 480
    assert np.median(v[regular]) > 3 * np.median(v[overnight])


def test_size_of_a_short_sample_scales_to_the_default(week: list[Path]) -> None:
    n = len(bars(week)["ts"])
    expected = DEFAULT_BARS * len(week) / DEFAULT_TRADE_DATES
    assert abs(n - expected) < 0.03 * expected


def test_deterministic_by_seed_and_a_prefix_of_longer_samples(tmp_path: Path, week: list[Path]) -> None:
    short = make_sample(tmp_path / "a", days=3)
    assert [p.read_bytes() for p in short] == [p.read_bytes() for p in week[:3]]
    other = make_sample(tmp_path / "b", days=1, seed=1)
    assert other[0].read_bytes() != week[0].read_bytes()
    calls = []
    make_sample(tmp_path / "c", days=2, symbols=["ESH3", "ZZZ9"], progress=lambda i, n: calls.append((i, n)))
    assert calls == [(1, 2), (2, 2)]
    assert set(bars(sorted((tmp_path / "c").iterdir()))["symbol"]) == {"ESH3", "ZZZ9"}


def test_default_sample_size(tmp_path: Path) -> None:
    paths = make_sample(tmp_path)
    assert len(paths) == DEFAULT_TRADE_DATES
    n = sum(len(decode(p)[1]) for p in paths)
    assert abs(n - DEFAULT_BARS) < 0.02 * DEFAULT_BARS


def test_write_dbn_round_trips_through_databento(tmp_path: Path) -> None:
    ts = np.array([3, 1, 2], dtype=np.uint64) * MIN + 1_672_660_800_000_000_000
    fields = {
        "ts_event": ts,
        "instrument_id": [5, 5, 6],
        "price": [1.25, np.nan, 0.0],
        "size": [1, 2, 3],
        "side": np.array([b"A", b"B", b"N"]),
    }
    for name in ("t.trades.dbn", "t.trades.dbn.zst"):
        path = write_dbn(tmp_path / name, "trades", fields, symbols={5: "AAA", 6: "BBB"})
        assert (path.read_bytes()[:4] == b"\x28\xb5\x2f\xfd") == name.endswith(".zst")
        compression = dbn.Compression.ZSTD if name.endswith(".zst") else dbn.Compression.NONE
        items = dbn.DBNDecoder(compression=compression).write_and_decode(path.read_bytes())
        meta, recs = items[0], items[1:]
        assert str(meta.schema) == "trades" and sorted(meta.mappings) == ["AAA", "BBB"]
        assert [r.ts_event for r in recs] == list(ts)
        assert [r.price for r in recs] == [1_250_000_000, dbn.UNDEF_PRICE, 0]
        assert [str(r.side) for r in recs] == ["A", "B", "N"] and [str(r.action) for r in recs] == ["T"] * 3
        assert [r.ts_recv for r in recs] == list(ts)
    with pytest.raises(ValueError, match="no field"):
        write_dbn(tmp_path / "x.dbn", "ohlcv-1m", {"ts_event": [1], "vwap": [1.0]})


def test_make_sample_parquet(tmp_path: Path) -> None:
    paths = make_sample_parquet(
        tmp_path / "wide", n_bars=10_001, n_features=16, symbols=["A", "B", "C"], rows_per_file=3000
    )
    assert [p.name for p in paths] == [f"bars-{i:05d}.parquet" for i in range(4)]
    tables = [pq.read_table(p) for p in paths]
    assert [t.num_rows for t in tables] == [3000, 3000, 3000, 1001]
    assert tables[0].column_names == ["ts", "symbol", *[f"f{i:03d}" for i in range(16)]]
    assert str(tables[0].schema.field("f015").type) == "float"
    assert all(pq.ParquetFile(p).metadata.row_group(0).num_rows <= 65_536 for p in paths)
    symbols = np.concatenate([t.column("symbol").to_numpy(zero_copy_only=False) for t in tables])
    assert [int((symbols == s).sum()) for s in "ABC"] == [3334, 3334, 3333]
    src = open_source(str(paths[0]))
    assert src.columns == [f"f{i:03d}" for i in range(16)] and sum(p.num_rows for p in src.pieces()) == 3000
    again = make_sample_parquet(
        tmp_path / "again", n_bars=10_001, n_features=16, symbols=["A", "B", "C"], rows_per_file=3000
    )
    assert pq.read_table(again[3]).equals(tables[3])


def _demo(work: Path, days: int) -> str:
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "shardcache"
    r = subprocess.run(
        [str(exe), "demo", "--dir", str(work), "--days", str(days), "--seq-len", "10"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_demo_days_always_gives_that_many_days(tmp_path):
    from shardcache import open_cache
    from shardcache.ingest.sample import sample_files

    def bars_of(days: int) -> int:
        return len(next(iter(bars(sample_files(tmp_path / "dbn", days=days)).values())))

    assert "1. generated 3 daily DBN files" in _demo(tmp_path, 3)
    assert open_cache(tmp_path / "cache.zarr").n_bars == bars_of(3)
    later = _demo(tmp_path, 2)  # after a longer sample: its first 2 days, not all 3
    assert "1. using the sample's first 2 days of the 3 daily DBN files already in" in later
    assert open_cache(tmp_path / "cache.zarr").n_bars == bars_of(2) < bars_of(3)
    assert "1. generated 4 daily DBN files" in _demo(tmp_path, 4)  # more days than are there: made
    assert open_cache(tmp_path / "cache.zarr").n_bars == bars_of(4)
    assert sorted((tmp_path / "dbn").iterdir()) == sample_files(tmp_path / "dbn", days=4)
