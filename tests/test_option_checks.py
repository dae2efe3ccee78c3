"""Options checked where they enter, the same in the API and the CLI (issue 30): a duration in the
CLI's forms, finite split fractions, no empty ``--split`` or ``cache_dir``, shard and chunk rows named
by their flags (one given alone fits the other to it)."""

from __future__ import annotations

import numpy as np
import pytest
from ohlcv_files import ohlcv, write_parquet

from shardcache.cli import build_cache_main
from shardcache.errors import OptionError
from shardcache.format.cache import open_cache
from shardcache.ingest.builder import build_cache
from shardcache.read.stream import WindowStream


@pytest.fixture
def es(tmp_path) -> str:
    return write_parquet(tmp_path / "ES.parquet", ohlcv(3000))


def _cli(capsys, *argv) -> tuple[int, list[str]]:
    code = build_cache_main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("gap", [300, np.int64(300)])
def test_a_bare_number_max_gap_is_refused_in_the_api_as_in_the_cli(es, tmp_path, capsys, gap):
    with pytest.raises(OptionError, match=r"max_gap=300: a bare number has no unit: write 'auto', .*'300s'"):
        build_cache([es], tmp_path / "c.zarr", max_gap=gap)
    assert not (tmp_path / "c.zarr").exists()
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--max-gap", "300")
    assert code == 2 and len(err) == 1 and "--max-gap '300'" in err[0] and not (tmp_path / "c.zarr").exists()


def test_the_api_takes_the_cli_duration_and_auto_in_any_case(es, tmp_path):
    build_cache([es], tmp_path / "a.zarr", max_gap="300s")
    assert open_cache(tmp_path / "a.zarr").manifest.build.max_gap_ns == 300 * 10**9
    assert open_cache(tmp_path / "a.zarr").manifest.build.options.max_gap == "300s"
    build_cache([es], tmp_path / "b.zarr", max_gap="AUTO")
    assert open_cache(tmp_path / "b.zarr").manifest.build.options.max_gap == "auto"


def test_a_malformed_max_gap_names_auto_among_its_forms(es, tmp_path, capsys):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--max-gap", "often")
    assert code == 2 and len(err) == 1
    assert err[0].startswith("build-cache: error: --max-gap 'often': bad duration 'often': use 'auto', a whole number")


@pytest.mark.parametrize("split", ["train=nan,val=nan", "train=inf,val=0.1", "train=0.9,val=nan"])
def test_split_fractions_must_be_finite(es, tmp_path, capsys, split):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--split", split)
    assert (code, err) == (
        2,
        [f"build-cache: error: --split '{split}': fractions must be finite, positive and sum to 1"],
    )
    with pytest.raises(OptionError, match="fractions must be finite"):
        build_cache([es], tmp_path / "c.zarr", split=split)
    assert not (tmp_path / "c.zarr").exists()


def test_an_empty_split_is_refused_not_taken_as_none(es, tmp_path, capsys):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--split", "")
    assert code == 2 and len(err) == 1 and err[0].startswith("build-cache: error: --split '': is empty: write none")
    assert not (tmp_path / "c.zarr").exists()


def test_an_empty_cache_dir_is_refused_before_anything_is_written(es, tmp_path, monkeypatch):
    build_cache([es], tmp_path / "c.zarr", split=None)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OptionError, match=r"cache_dir='': is empty: give a folder"):
        WindowStream(str(tmp_path / "c.zarr"), seq_len=8, batch_size=4, cache_dir="")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_stats_from_a_cache_of_another_bar_size_is_refused(es, tmp_path, capsys):
    one = build_cache([es], tmp_path / "1m.zarr", progress=False)
    five = write_parquet(tmp_path / "ES5.parquet", ohlcv(600, step_s=300, seed=1))
    code, err = _cli(capsys, five, "--out", tmp_path / "5m.zarr", "--stats-from", one.url)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"build-cache: error: --stats-from '{one.url}': its bars are 1m, this build's are 5m")
    assert not (tmp_path / "5m.zarr").exists()
    with pytest.raises(OptionError, match="^stats_from=.*: its bars are 1m, this build's are 5m"):
        build_cache([five], tmp_path / "r.zarr", stats_from=one, progress=False)
    assert not (tmp_path / "r.zarr").exists()
    again = write_parquet(tmp_path / "ES2.parquet", ohlcv(900, seed=2))
    same = build_cache([again], tmp_path / "s.zarr", stats_from=one, progress=False)
    assert same.manifest.build.bar_ns == 60 * 10**9


@pytest.mark.parametrize(
    "flag,value,problem",
    [
        ("--columns", "", "names no column: give names such as open,close, or leave it out"),
        ("--columns", " , ,", "names no column: give names such as open,close, or leave it out"),
        ("--stats-from", "", "is empty: the path or URL of a cache"),
        ("--out", "", "is empty: a directory or an fsspec URL such as s3://bucket/cache.zarr"),
    ],
)
def test_an_empty_option_value_is_refused_not_taken_as_every_column_or_here(
    es, tmp_path, capsys, monkeypatch, flag, value, problem
):
    """``--columns ''`` is not every column, ``--stats-from ''`` and ``--out ''`` are not the working folder."""
    monkeypatch.chdir(tmp_path)
    argv = [es, "--out", tmp_path / "c.zarr", flag, value]
    code, err = _cli(capsys, *argv)
    assert (code, err) == (2, [f"build-cache: error: {flag} {value!r}: {problem}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ES.parquet"]  # nothing written, here or at c.zarr
    with pytest.raises(OptionError, match="names no column|is empty"):
        build_cache(
            [es],
            "" if flag == "--out" else tmp_path / "c.zarr",
            **({} if flag == "--out" else {flag[2:].replace("-", "_"): value}),
        )


def test_an_empty_out_is_refused_by_an_append_too(es, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _cli(capsys, es, "--append", "--out", "")
    assert code == 2 and err == [
        "build-cache: error: --out '': is empty: a directory or an fsspec URL such as s3://bucket/cache.zarr"
    ]


@pytest.mark.parametrize(
    "flag,value,problem",
    [
        ("--csv-delimiter", ";", "applies to CSV files; {path} is a DBN file"),
        ("--ts-column", "when", "names a Parquet or CSV column; {path} is a DBN file"),
        ("--symbol-column", "ticker", "names a Parquet or CSV column; {path} is a DBN file"),
    ],
)
def test_a_tabular_option_on_dbn_files_is_refused_not_ignored(tmp_path, capsys, flag, value, problem):
    from shardcache.ingest.sample import make_sample

    files = make_sample(tmp_path / "dbn", days=1, symbols=["ESH3"])
    code, err = _cli(capsys, files[0], "--out", tmp_path / "c.zarr", flag, value)
    assert (code, err) == (2, [f"build-cache: error: {flag} {value!r}: {problem.format(path=files[0])}"])
    assert not (tmp_path / "c.zarr").exists()


def test_a_delimiter_on_parquet_files_is_refused(es, tmp_path, capsys):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "--csv-delimiter", "tab")
    assert (code, err) == (
        2,
        [f"build-cache: error: --csv-delimiter 'tab': applies to CSV files; {es} is a Parquet file"],
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--shard-rows", 10**12],
            "--shard-rows 1000000000000: at most 16,777,216 rows (a reader decodes whole shards",
        ),
        (["--chunk-rows", 2**25], "--chunk-rows 33554432: at most 16,777,216 rows (a reader decodes whole shards"),
        (["--shard-rows", 2**20, "--chunk-rows", 8], "--chunk-rows 8: gives 131,072 chunks a shard; at most 65,536"),
        (
            ["--shard-rows", 16777213],
            "--shard-rows 16777213: has no divisor near the default chunk rows (8192): give --chunk-rows too",
        ),
    ],
)
def test_shard_and_chunk_rows_are_refused_naming_their_flags(es, tmp_path, capsys, flags, message):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", *flags)
    assert code == 2 and not (tmp_path / "c.zarr").exists()
    assert len(err) == 1 and err[0].startswith(f"build-cache: error: {message}"), err


@pytest.mark.parametrize(
    "flags, shard, chunk", [(["--chunk-rows", 100000], 100000, 100000), (["--shard-rows", 10000], 10000, 5000)]
)
def test_one_of_shard_and_chunk_rows_fits_the_other_to_it(es, tmp_path, capsys, flags, shard, chunk):
    code, err = _cli(capsys, es, "--out", tmp_path / "c.zarr", "-q", *flags)
    assert code == 0, err  # it said "shard rows 65536 must be a multiple of chunk rows 100000", naming no flag
    layout = open_cache(tmp_path / "c.zarr").manifest.layout
    assert (layout.shard_rows, layout.chunk_rows) == (shard, chunk)
