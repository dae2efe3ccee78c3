"""CSV dialects (``shardcache.ingest.sources.csv``, issue 20): delimiters sniffed or given, thousands
separators and decimal commas, gzip by its magic bytes, header-only files and late timestamp switches,
on real CSV files read by ``pyarrow.csv`` and built by ``build-cache``."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from ohlcv_files import T0

from shardcache.cli import build_cache_main
from shardcache.format.cache import open_cache
from shardcache.ingest.builder import build_cache

N = 40
OPTS = {"normalize": "none", "features": "raw", "seq_len": 2, "progress": False}


def _rows() -> list[tuple]:
    """Minute bars from 2023-01-02 12:00 UTC, with fractions and values above 1000 (where separators show)."""
    return [
        (f"2023-01-02T12:{i:02d}:00Z", 1100.25 + i, 1101.5 + i, 1099 + i, 1100.75 + i, 1000 + 10 * i) for i in range(N)
    ]


def _write(path: Path, rows: list[tuple], delimiter: str = ",", number=str, gz: bool = False) -> Path:
    lines = [delimiter.join(["ts", "open", "high", "low", "close", "volume"])]
    lines += [delimiter.join([r[0], *(number(v) for v in r[1:])]) for r in rows]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def _values(out: Path) -> np.ndarray:
    cache = open_cache(out)
    assert cache.feature_names == ["open", "high", "low", "close", "volume"]
    return cache.read_rows(0, cache.n_bars)


@pytest.fixture
def expected(tmp_path) -> np.ndarray:
    out = tmp_path / "plain.zarr"
    build_cache(_write(tmp_path / "plain.csv", _rows()), out, **OPTS)
    return _values(out)


def _cli(capsys, *argv: object) -> tuple[int, list[str]]:
    code = build_cache_main([*map(str, argv), "-q"])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
def test_the_delimiter_is_sniffed_from_the_header(tmp_path, expected, delimiter):
    out = tmp_path / "c.zarr"
    build_cache(_write(tmp_path / "x.csv", _rows(), delimiter), out, **OPTS)
    np.testing.assert_array_equal(_values(out), expected)


def test_a_given_delimiter_is_used_recorded_and_kept_by_appends(tmp_path, capsys):
    def odd(path: Path, start: int) -> Path:  # a column name with commas: more commas than semicolons in the header
        rows = [f"{(start + 60 * i) * 10**9};{100 + i}" for i in range(N)]
        path.write_text("ts;close, adjusted, usd\n" + "\n".join(rows) + "\n")
        return path

    out = tmp_path / "c.zarr"
    first, later = odd(tmp_path / "a.csv", T0), odd(tmp_path / "b.csv", T0 + 86_400)
    code, err = _cli(capsys, first, "--out", out, "--csv-delimiter", ";", "--normalize", "none", "--seq-len", "2")
    assert (code, err) == (0, [])
    cache = open_cache(out)
    assert cache.feature_names == ["close, adjusted, usd"] and cache.manifest.build.options.csv_delimiter == ";"
    assert _cli(capsys, later, "--out", out, "--append") == (0, [])
    assert open_cache(out).n_bars == 2 * N
    code, err = _cli(capsys, later, "--out", tmp_path / "d.zarr", "--csv-delimiter", "ab")
    assert code == 2 and err == [
        "build-cache: error: --csv-delimiter 'ab': must be one character such as ';', or comma, semicolon, tab, pipe"
    ]


@pytest.mark.parametrize(
    "name, delimiter, number",
    [
        ("thousands separators", ",", lambda v: f'"{v:,.2f}"'),
        ("decimal comma", ";", lambda v: f"{v:.2f}".replace(".", ",")),
        ("decimal comma and thousands dots", ";", lambda v: f"{v:,.2f}".translate(str.maketrans(",.", ".,"))),
        ("decimal comma, no thousands", "\t", lambda v: f"{v:g}".replace(".", ",")),
    ],
)
def test_numbers_with_separators_are_read(tmp_path, expected, name, delimiter, number):
    out = tmp_path / "c.zarr"
    build_cache(_write(tmp_path / "x.csv", _rows(), delimiter, number), out, **OPTS)
    np.testing.assert_array_equal(_values(out), expected)


def test_a_column_whose_separator_could_be_read_two_ways_is_refused(tmp_path, capsys):
    rows = [(r[0], 1100, 1101, 1099, 1100, 1000) for r in _rows()]  # "1,100": 1100, or 1.1 with a decimal comma?
    path = _write(tmp_path / "x.csv", rows, ",", lambda v: f'"{v:,}"')
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        (
            f"build-cache: error: {path}: column 'open' holds '1,100': a thousands separator or a decimal comma? the "
            "first rows do not tell; write the numbers without thousands separators, or leave the column out with "
            "--columns"
        )
    ]
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.parametrize(
    "close, message",
    [
        (
            "1,100.5",
            "column 'open' writes '1,5' with a decimal comma and column 'close' writes '1,100.5' with a decimal point",
        ),
        (
            "1.5",
            "column 'close' holds '1.5', not a number written as the file's others are (decimal comma, '.' between thousands)",
        ),
    ],
)
def test_decimal_commas_beside_decimal_points_are_refused(tmp_path, capsys, close, message):
    path = tmp_path / "x.csv"
    path.write_text("ts;open;close\n" + "".join(f"{(T0 + 60 * i) * 10**9};1,5;{close}\n" for i in range(N)))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and len(err) == 1 and message in err[0]


@pytest.mark.parametrize("name", ["bars.csv", "bars.csv.gz"])
def test_gzip_is_told_by_its_bytes_not_its_name(tmp_path, expected, name):
    out = tmp_path / "c.zarr"
    build_cache(_write(tmp_path / name, _rows(), gz=name == "bars.csv"), out, **OPTS)  # .csv.gz: plain text
    np.testing.assert_array_equal(_values(out), expected)


def test_a_header_only_file_says_it_has_no_rows(tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text("ts,open,high,low,close,volume\n")
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        f"build-cache: error: {path}: has a header (ts, open, high, low, close, volume) and no rows: nothing to build"
    ]


def test_a_late_switch_of_timestamp_kind_quotes_the_text_that_switched(tmp_path, capsys):
    rows = _rows()
    rows[25] = ("2023-01-02 12:25:00", *rows[25][1:])  # no zone, after 25 times with one
    path = _write(tmp_path / "x.csv", rows)
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        (
            f"build-cache: error: {path}: timestamp column 'ts' holds '2023-01-02 12:25:00' (without a zone or "
            "offset) after '2023-01-02T12:00:00Z' (with one); write its ISO-8601 times of one kind throughout"
        )
    ]


def test_a_float32_parquet_beside_a_float64_csv_of_one_symbol_merges(tmp_path, expected):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = _rows()
    first, rest = rows[0::2], rows[1::2]  # interleaved in time: one run of the merge
    cols = {"ts": [r[0] for r in first], "symbol": ["S"] * len(first)}
    for k, name in enumerate(["open", "high", "low", "close", "volume"]):
        cols[name] = pa.array([r[k + 1] for r in first], pa.float32())  # the bars' values are exact in float32
    pq.write_table(pa.table(cols), tmp_path / "first.parquet")
    csv = tmp_path / "rest.csv"
    csv.write_text(
        "ts,symbol,open,high,low,close,volume\n" + "".join(f"{r[0]},S,{','.join(map(str, r[1:]))}\n" for r in rest)
    )
    out = tmp_path / "mixed.zarr"
    build_cache([tmp_path / "first.parquet", csv], out, **OPTS)
    np.testing.assert_array_equal(_values(out), expected)
