"""Bad or unusual inputs found by trying the build as a new user would (issue 20): each is read, or
refused in one line naming the file or option, on real DBN, Parquet and CSV files."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from ohlcv_files import T0, ohlcv, write_parquet

from shardcache.cli import build_cache_main, main
from shardcache.format.cache import open_cache
from shardcache.format.manifest import Manifest
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample, write_dbn

OPTS = {"shard_rows": 1024, "chunk_rows": 128, "workers": 1, "progress": False}
DAY = 86_400
ES = 206299  # the sample's ESH3 instrument id


def _cli(capsys, *argv: object) -> tuple[int, list[str]]:
    code = build_cache_main([*map(str, argv), "-q"])
    return code, capsys.readouterr().err.strip().splitlines()


def _unchanged(out: Path, before: Manifest) -> None:
    cache = open_cache(out)
    assert cache.n_bars == before.counts.bars and cache.manifest.appends == before.appends
    assert not Path(f"{out}.staging").exists()


# -- appends refuse what a build refuses to mix ---------------------------------------------------
@pytest.fixture
def minute_parquet_cache(tmp_path) -> Path:
    out = tmp_path / "c.zarr"
    build_cache(write_parquet(tmp_path / "ES.parquet", ohlcv(600)), out, **OPTS)
    return out


@pytest.fixture(scope="module")
def minute_dbn_cache(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A 1-minute DBN cache of the sample's first day, and the sample's next days (later bars)."""
    files = make_sample(tmp_path_factory.mktemp("dbn"), days=3, symbols=["ESH3"])
    out = tmp_path_factory.mktemp("cache") / "c.zarr"
    build_cache(files[0], out, **OPTS)
    return out, files[1:]


def test_hourly_parquet_bars_are_not_appended_to_a_minute_parquet_cache(minute_parquet_cache, tmp_path, capsys):
    out = minute_parquet_cache
    before = open_cache(out).manifest
    later = write_parquet(tmp_path / "ES-hourly.parquet", ohlcv(48, step_s=3600, start_s=T0 + DAY))
    code, err = _cli(capsys, later, "--out", out, "--append")
    assert code == 2 and err == [
        (
            f"build-cache: error: {later}: 3600 s bars; the cache {out} holds 60 s bars; one cache holds one bar "
            "size (build them apart, or resample DBN bars with --bar)"
        )
    ]
    _unchanged(out, before)
    minutes = write_parquet(tmp_path / "ES-later.parquet", ohlcv(100, start_s=T0 + DAY))
    assert _cli(capsys, minutes, "--out", out, "--append") == (0, [])  # bars of its size still go in
    assert open_cache(out).n_bars == 700


def test_hourly_parquet_bars_are_not_appended_to_a_minute_dbn_cache(minute_dbn_cache, tmp_path, capsys):
    out, _ = minute_dbn_cache
    before = open_cache(out).manifest
    later = write_parquet(tmp_path / "ESH3.parquet", ohlcv(48, step_s=3600, start_s=T0 + 30 * DAY))
    code, err = _cli(capsys, later, "--out", out, "--append")
    assert code == 2 and len(err) == 1 and f"{later}: 3600 s bars; the cache {out} holds 60 s bars" in err[0]
    _unchanged(out, before)


def test_every_dbn_input_of_an_append_is_checked_for_its_bar_size(minute_dbn_cache, tmp_path, capsys):
    out, later = minute_dbn_cache
    before = open_cache(out).manifest
    hourly = tmp_path / "z.ohlcv-1h.dbn"  # sorted after the 1-minute file: not the first input
    t = (T0 + 60 * DAY + np.arange(24) * 3600) * 10**9
    prices = {k: np.full(24, 3900.0) for k in ("open", "high", "low", "close")}
    write_dbn(
        hourly, "ohlcv-1h", {"ts_event": t, **prices, "volume": np.ones(24, np.uint64), "instrument_id": [ES] * 24}
    )
    code, err = _cli(capsys, later[0], hourly, "--out", out, "--append")
    assert (
        code == 2 and len(err) == 1 and "1h bars, but" in err[0] and "1m bars; one cache holds one bar size" in err[0]
    )
    _unchanged(out, before)


def test_a_tick_schema_is_not_appended_to_a_cache_of_bars(minute_dbn_cache, tmp_path, capsys):
    out, _ = minute_dbn_cache
    before = open_cache(out).manifest
    trades = tmp_path / "later.trades.dbn"
    t = (T0 + 60 * DAY + np.arange(100) * 10) * 10**9
    write_dbn(
        trades,
        "trades",
        {"ts_event": t, "price": np.full(100, 3900.0), "size": np.ones(100), "instrument_id": [ES] * 100},
    )
    code, err = _cli(capsys, trades, "--out", out, "--append")
    assert code == 2 and err == [
        (
            f"build-cache: error: {trades}: trades data with columns open, high, low, close, volume, count; the "
            f"cache {out} was built from ohlcv-1m data with columns open, high, low, close, volume; one cache holds "
            "one kind of bars (build them apart)"
        )
    ]
    _unchanged(out, before)


def test_other_source_columns_are_not_appended(minute_parquet_cache, tmp_path, capsys):
    out = minute_parquet_cache
    before = open_cache(out).manifest
    wider = ohlcv(100, start_s=T0 + DAY)
    wider = wider.append_column("vwap", wider["close"])
    later = write_parquet(tmp_path / "ES-later.parquet", wider)
    code, err = _cli(capsys, later, "--out", out, "--append")
    assert code == 2 and len(err) == 1 and "columns open, high, low, close, volume, vwap; the cache" in err[0]
    _unchanged(out, before)


# -- counts ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "schema, bar, extra",
    [("trades", "7s", {}), ("tbbo", "1s", {"bid_px": [99.0, 99.5], "ask_px": [100.5, 101.5]})],
)
def test_records_read_counts_the_records_not_the_bars(tmp_path, capsys, schema, bar, extra):
    path = tmp_path / f"two.{schema}.dbn"
    t = T0 * 10**9 + np.array([0, 200_000_000])  # two trades in one bar
    write_dbn(
        path, schema, {"ts_event": t, "price": [100.0, 101.0], "size": [1, 2], "instrument_id": [ES] * 2, **extra}
    )
    out = tmp_path / "c.zarr"
    code = build_cache_main([str(path), "--out", str(out), "--bar", bar, "--normalize", "none", "--seq-len", "1"])
    assert code == 0
    text = capsys.readouterr().out
    assert "records   2 read; dropped none" in text
    assert open_cache(out).manifest.counts.records_read == 2 and open_cache(out).n_bars == 1


# -- no silent skips ----------------------------------------------------------------------------------
LOOKED_FOR = "looked for *.dbn, *.dbn.zst, *.parquet, *.parq, *.pq, *.csv, *.csv.gz, *.csv.zst in any letter case"


def _warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shardcache" and r.levelno == logging.WARNING]


def test_a_folder_reads_every_input_suffix_in_any_case_and_names_what_it_skips(tmp_path, capsys, caplog):
    folder = tmp_path / "in"
    folder.mkdir()
    write_parquet(folder / "ES.PARQUET", ohlcv(300, seed=1))
    write_parquet(folder / "NQ.parq", ohlcv(300, seed=2))
    write_parquet(folder / ".RTY.parquet", ohlcv(300, seed=3))  # hidden: skipped, and said
    (folder / "notes.txt").write_text("bought on the dip\n")
    (folder / ".DS_Store").write_bytes(b"\0")  # neither an input's name nor visible: not worth a line
    out = tmp_path / "c.zarr"
    assert _cli(capsys, folder, "--out", out) == (0, [])
    assert open_cache(out).symbols == ["ES", "NQ"]
    assert _warned(caplog) == [
        f"{folder}: skipped 1 file(s), not inputs by their suffix ({LOOKED_FOR}): notes.txt",
        f"{folder}: skipped 1 file(s), hidden files: .RTY.parquet",
    ]


def test_a_glob_names_what_it_matches_and_skips(tmp_path, capsys, caplog):
    write_parquet(tmp_path / "ES.parquet", ohlcv(300, seed=1))
    (tmp_path / "ES.parquet.bak").write_bytes(b"old")
    assert _cli(capsys, tmp_path / "ES.*", "--out", tmp_path / "c.zarr") == (0, [])
    assert _warned(caplog) == [
        f"{tmp_path / 'ES.*'}: skipped 1 file(s), not inputs by their suffix ({LOOKED_FOR}): {tmp_path}/ES.parquet.bak"
    ]


def test_default_features_without_the_ohlcv_columns_are_refused(tmp_path, capsys, caplog):
    path = write_parquet(tmp_path / "ES.parquet", ohlcv(300).drop_columns(["close"]))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr", "--features", "default")
    assert code == 2 and err == [
        (
            "build-cache: error: --features 'default': the default features need the source columns open, high, low, "
            "close, volume; the inputs have no close (their columns: open, high, low, volume); name the features, "
            "or pass --features raw"
        )
    ]
    assert _cli(capsys, path, "--out", tmp_path / "d.zarr") == (0, [])  # no --features: its columns, with a word
    assert _warned(caplog) == [
        (
            "the inputs have open, high, low, volume but no close: not the default OHLCV features; their columns "
            "(open, high, low, volume) are the features (pass --features to choose)"
        )
    ]
    assert open_cache(tmp_path / "d.zarr").feature_names == ["open", "high", "low", "volume"]


# -- option messages ---------------------------------------------------------------------------------
@pytest.fixture
def es(tmp_path) -> str:
    return write_parquet(tmp_path / "ES.parquet", ohlcv(3000))


@pytest.mark.parametrize(
    "value, why",
    [
        (
            "val=2023-02-30",
            "'2023-02-30' is not a date or time (YYYY-MM-DD[THH:MM[:SS]][Z|+HH:MM]): day is out of range",
        ),
        (
            "val=2023-13-01",
            "'2023-13-01' is not a date or time (YYYY-MM-DD[THH:MM[:SS]][Z|+HH:MM]): month must be in 1..12",
        ),
        ("val=2023-01-03,test=soon", "'soon' is not a date or time"),
    ],
)
def test_an_impossible_split_date_is_named(es, tmp_path, capsys, value, why):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--split", value)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"build-cache: error: --split '{value}': {why}")


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--max-gap", "-5m", "must be 0 (never cut) or more"),
        ("--bar", "-1m", "must be a positive duration such as 1s, 1m or 5m"),
    ],
)
def test_a_negative_duration_is_refused_by_its_option(es, tmp_path, capsys, flag, value, why):
    for argv in ([flag, value], [f"{flag}={value}"]):  # argparse alone takes "-5m" for a flag
        assert _cli(capsys, es, "--out", tmp_path / "c.zarr", *argv) == (
            2,
            [f"build-cache: error: {flag} '{value}': {why}"],
        )
    assert main(["build", es, "--out", str(tmp_path / "c.zarr"), flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"shardcache: error: {flag} '{value}': {why}"
    assert not (tmp_path / "c.zarr").exists()


def test_a_split_time_with_a_zone_is_converted_to_utc_without_a_warning(es, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "no explicit representation of timezones" would fail here
        assert _cli(capsys, es, "--out", out, "--split", "val=2023-01-03T12:00+01:00") == (0, [])
    cut = open_cache(out).manifest.splits.cuts_ns[0]
    assert cut == int(np.datetime64("2023-01-03T11:00", "ns").astype(np.int64))
