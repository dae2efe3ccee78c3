"""CSV and Parquet inputs that were unclear (issue 30): padded headers, comment lines, UTF-16, trailing
commas, nameless and text columns, zstd and bz2 bytes, dictionary-encoded timestamps; each is built or
refused in one line, on real files built by ``build-cache``."""

from __future__ import annotations

import bz2
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_csv_dialects import OPTS, _cli, _rows, _values, _write

from shardcache.ingest.builder import build_cache

HEADER = ["ts", "open", "high", "low", "close", "volume"]


def _text(rows: list[tuple], header: list[str] | None = None, end: str = "") -> str:
    lines = [",".join(header or HEADER) + end] + [",".join(map(str, r)) + end for r in rows]
    return "\n".join(lines) + "\n"


@pytest.fixture
def expected(tmp_path) -> np.ndarray:
    out = tmp_path / "plain.zarr"
    build_cache(_write(tmp_path / "plain.csv", _rows()), out, **OPTS)
    return _values(out)


def _built(path: Path, expected: np.ndarray) -> None:
    out = path.parent / "c.zarr"
    build_cache(path, out, **OPTS)
    np.testing.assert_array_equal(_values(out), expected)


def test_a_padded_header_is_read_by_its_names(tmp_path, expected):
    path = tmp_path / "x.csv"
    path.write_text(_text(_rows(), [f" {n} " for n in HEADER]))
    _built(path, expected)


def test_no_timestamp_column_lists_the_columns_found(tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text(_text(_rows(), ["when", *HEADER[1:]]))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        (
            f"build-cache: error: {path}: no timestamp column (looked for ts_event, timestamp, time, ts, datetime; "
            "columns are: when, open, high, low, close, volume; use --ts-column)"
        )
    ]


def test_leading_comment_lines_are_skipped(tmp_path, expected):
    path = tmp_path / "x.csv"
    path.write_text("# exported by a vendor\n# 2023-01-02, minute bars\n" + _text(_rows()))
    _built(path, expected)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_refused_as_such(tmp_path, capsys, encoding):
    path = tmp_path / "x.csv"
    data = _text(_rows()).encode(encoding)
    path.write_bytes(data if encoding == "utf-16" else b"\xfe\xff" + data)
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        f"build-cache: error: {path}: UTF-16 text; write it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)"
    ]


def test_a_comma_ending_every_line_is_no_column(tmp_path, expected):
    path = tmp_path / "x.csv"
    path.write_text(_text(_rows(), end=","))
    _built(path, expected)


@pytest.mark.parametrize("header, where", [(["ts", "open", "", "low", "close", "volume"], 3), (HEADER + [""], 7)])
def test_a_nameless_column_with_values_is_refused_by_position(tmp_path, capsys, header, where):
    rows = [(*r, 1.0) for r in _rows()] if len(header) == 7 else _rows()
    path = tmp_path / "x.csv"
    path.write_text(_text(rows, header))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        (
            f"build-cache: error: {path}: column {where} of {len(header)} has no name; name it in the header, "
            "or leave it out of the file"
        )
    ]


def test_a_text_close_is_named_as_text(tmp_path, capsys):
    rows = [(*r[:4], "bad" if i == 3 else r[4], r[5]) for i, r in enumerate(_rows())]
    path = tmp_path / "x.csv"
    path.write_text(_text(rows))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [
        (
            f"build-cache: error: {path}: column 'close' holds text (string), not numbers; fix its values, "
            "or pick the other columns with --columns"
        )
    ]


@pytest.mark.parametrize("name", ["bars.csv.zst", "bars.csv"])
def test_zstd_csv_is_read_whatever_its_name(tmp_path, expected, name):
    path = tmp_path / name
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        out.write(_text(_rows()).encode())
    _built(path, expected)


def test_plain_text_named_csv_zst_is_read(tmp_path, expected):
    path = tmp_path / "bars.csv.zst"
    path.write_text(_text(_rows()))
    _built(path, expected)


def test_bz2_bytes_named_csv_are_read(tmp_path, expected):
    path = tmp_path / "bars.csv"
    path.write_bytes(bz2.compress(_text(_rows()).encode()))
    _built(path, expected)


def test_a_folder_reads_csv_zst(tmp_path, expected):
    folder = tmp_path / "in"
    folder.mkdir()
    with pa.CompressedOutputStream(str(folder / "x.csv.zst"), "zstd") as out:
        out.write(_text(_rows()).encode())
    out_path = tmp_path / "c.zarr"
    build_cache(folder, out_path, **OPTS)
    np.testing.assert_array_equal(_values(out_path), expected)


def test_dictionary_encoded_iso_timestamps_in_parquet_are_read(tmp_path, expected):
    rows = _rows()
    cols = {n: [r[i] for r in rows] for i, n in enumerate(HEADER)}
    table = pa.table(
        {"ts": pa.array(cols.pop("ts")).dictionary_encode(), **{n: pa.array(v, pa.float64()) for n, v in cols.items()}}
    )
    path = tmp_path / "x.parquet"
    pq.write_table(table, path)
    assert pa.types.is_dictionary(pq.read_schema(path).field("ts").type)
    _built(path, expected)


def test_zstd_dbn_named_csv_is_named_as_dbn(tmp_path, capsys):
    path = tmp_path / "bars.csv"
    with pa.CompressedOutputStream(str(path), "zstd") as out:
        out.write(b"DBN\x02" + bytes(60))
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and err == [f"build-cache: error: {path}: DBN data, not CSV text; name it .dbn or .dbn.zst"]


def test_a_comment_line_further_down_is_named(tmp_path, capsys):
    lines = _text(_rows()).splitlines()
    path = tmp_path / "x.csv"
    path.write_text("\n".join([*lines[:11], "# a note", *lines[11:]]) + "\n")
    code, err = _cli(capsys, path, "--out", tmp_path / "c.zarr")
    assert code == 2 and len(err) == 1
    assert err[0] == (
        f"build-cache: error: {path}: not a readable CSV file (CSV parse error: Expected 6 columns, got 1: "
        "# a note; a '#' comment line past the header: remove it)"
    )
