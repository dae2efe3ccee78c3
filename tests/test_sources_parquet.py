"""The Parquet reader, and the contract shared by all sources: discovery, dispatch, cleaning, durations."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardcache.errors import SourceError
from shardcache.ingest.sample import make_sample_parquet
from shardcache.ingest.sources import clean_piece, expand_inputs, open_source, parse_duration

T0 = 1_672_660_800_000_000_000  # 2023-01-02T12:00:00Z
MIN = 60_000_000_000


def write(path: Path, **cols: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


def rows(src) -> list[dict]:
    return [r for piece in src.pieces() for r in piece.to_pylist()]


# -- Parquet --------------------------------------------------------------------------------
def test_detects_columns_and_converts_types(tmp_path: Path) -> None:
    ts = pa.array(np.array([T0, T0 + MIN, T0 + 2 * MIN], dtype="datetime64[ns]"), pa.timestamp("ns", tz="UTC"))
    path = write(
        tmp_path / "bars.parquet",
        ts_event=ts,
        symbol=["ESH3", "ESH3", "NQH3"],
        close=pa.array([1.5, 2.5, 3.5], pa.float32()),
        volume=pa.array([1, 2, 3], pa.int64()),
        venue=["X", "Y", "Z"],
        flag=[True, False, True],
    )
    src = open_source(str(path))
    assert (src.kind, src.schema, src.bar_ns) == ("parquet", "parquet", None)
    assert src.columns == ["close", "volume", "flag"]
    (piece,) = list(src.pieces())
    assert piece.schema == pa.schema(
        [
            ("symbol", pa.string()),
            ("ts", pa.int64()),
            ("close", pa.float32()),
            ("volume", pa.float64()),
            ("flag", pa.float64()),
        ]
    )
    assert piece.to_pylist()[2] == {"symbol": "NQH3", "ts": T0 + 2 * MIN, "close": 3.5, "volume": 3.0, "flag": 1.0}
    assert src.describe()["kind"] == "parquet" and src.describe()["size"] == path.stat().st_size
    assert [p.to_pylist() for p in pickle.loads(pickle.dumps(src)).pieces()] == [piece.to_pylist()]


@pytest.mark.parametrize(
    "name, array, want",
    [
        ("Timestamp", pa.array([T0 // 1000], pa.timestamp("us", tz="America/Chicago")), T0),
        ("time", pa.array([T0 // 1_000_000], pa.timestamp("ms")), T0),
        ("ts", pa.array([T0], pa.int64()), T0),
        ("datetime", pa.array([19359], pa.date32()), 19359 * 86_400 * 10**9),
    ],
)
def test_timestamp_types(tmp_path: Path, name: str, array: pa.Array, want: int) -> None:
    path = write(tmp_path / "ESH3.parquet", **{name: array, "close": [1.0]})
    assert rows(open_source(str(path))) == [{"symbol": "ESH3", "ts": want, "close": 1.0}]


def test_symbol_from_column_partition_or_file_name(tmp_path: Path) -> None:
    path = write(tmp_path / "a.parquet", ts=[T0], instrument_id=pa.array([5482], pa.uint32()), close=[1.0])
    src = open_source(str(path))
    assert rows(src)[0]["symbol"] == "5482" and src.columns == ["close"]
    path = write(tmp_path / "symbol=CLF3" / "part-0.parquet", ts=[T0], close=[1.0])
    assert rows(open_source(str(path)))[0]["symbol"] == "CLF3"
    path = write(tmp_path / "GCG3.pq", ts=[T0], close=[1.0])
    assert rows(open_source(str(path)))[0]["symbol"] == "GCG3"
    path = write(tmp_path / "b.parquet", ts=[T0], sym=pa.array(["ZNH3"]).dictionary_encode(), close=[1.0])
    assert rows(open_source(str(path), symbol_column="sym"))[0]["symbol"] == "ZNH3"


def test_named_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "x.parquet", when=[T0, T0 + MIN], name=["A", "B"], a=[1.0, 2.0], b=[3, 4], note=["p", "q"])
    src = open_source(str(path), ts_column="when", symbol_column="name", columns=["b", "a"])
    assert rows(src) == [
        {"symbol": "A", "ts": T0, "b": 3.0, "a": 1.0},
        {"symbol": "B", "ts": T0 + MIN, "b": 4.0, "a": 2.0},
    ]


@pytest.mark.parametrize(
    "kwargs, cols, message",
    [
        (
            {},
            {"when": [T0], "close": [1.0]},
            r"x\.parquet: no timestamp column \(looked for ts_event, timestamp, time, ts, datetime; columns are: when, close; use --ts-column\)$",
        ),
        ({"ts_column": "stamp"}, {"ts": [T0], "close": [1.0]}, r"no timestamp column 'stamp' \(columns are: ts, close"),
        (
            {},
            {"ts": ["last tuesday"], "close": [1.0]},
            r"timestamp column 'ts' holds 'last tuesday', not an ISO-8601 time",
        ),
        ({"symbol_column": "who"}, {"ts": [T0], "close": [1.0]}, r"no symbol column 'who'"),
        (
            {"symbol_column": "flag"},
            {"ts": [T0], "close": [1.0], "flag": [True]},
            r"symbol column 'flag' has type bool",
        ),
        ({"columns": ["close", "vwap"]}, {"ts": [T0], "close": [1.0]}, r"no column 'vwap' \(columns are: ts, close\)"),
        (
            {"columns": ["venue"]},
            {"ts": [T0], "venue": ["X"]},
            r"column 'venue' has type string; feature columns must be numeric",
        ),
        ({"columns": ["ts"]}, {"ts": [T0], "close": [1.0]}, r"column 'ts' is the timestamp or symbol column"),
        ({}, {"ts": [T0], "venue": ["X"]}, r"no numeric feature columns"),
        ({}, {"ts": [12_345], "close": [1.0]}, r"holds integers around 12345, which are not seconds, ms, us or ns"),
    ],
)
def test_refusals(tmp_path: Path, kwargs: dict, cols: dict, message: str) -> None:
    path = write(tmp_path / "x.parquet", **cols)
    with pytest.raises(SourceError, match=message) as err:
        list(open_source(str(path), **kwargs).pieces())  # refused when opened or, for values, when read
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_not_parquet_and_corrupt(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_text("ts,close\n1,2\n")
    with pytest.raises(SourceError, match=r"x\.parquet: not a Parquet file \(bad magic bytes\)$"):
        open_source(str(tmp_path / "x.parquet"))
    good = write(tmp_path / "g.parquet", ts=np.arange(1000) + T0, close=np.random.default_rng(0).random(1000) + 1)
    raw = good.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SourceError, match=r"cut\.parquet: truncated Parquet file \(no footer\)$"):
        open_source(str(tmp_path / "cut.parquet"))
    damaged = bytearray(raw)
    damaged[200:600] = b"\xff" * 400
    (tmp_path / "bad.parquet").write_bytes(bytes(damaged))
    src = open_source(str(tmp_path / "bad.parquet"))
    with pytest.raises(SourceError, match=r"bad\.parquet: corrupt Parquet data after 0 rows"):
        list(src.pieces())


def test_read_in_bounded_batches(tmp_path: Path) -> None:
    (path,) = make_sample_parquet(tmp_path / "wide", n_bars=5000, n_features=4, symbols=["A", "B"])
    src = open_source(str(path))
    sizes = [p.num_rows for p in src.pieces(max_rows=700)]
    assert max(sizes) <= 700 and sum(sizes) == 5000 and len(sizes) > 7
    assert src.columns == ["f000", "f001", "f002", "f003"]


def test_values_are_cleaned_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path / "x.parquet",
        ts=pa.array([T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4, 5, T0 + 6], pa.int64()),
        symbol=["A", "A", None, "A", "A", "A", "A"],
        close=[1.0, float("nan"), 1.0, -2.0, 1.0, 1.0, None],
        feat=[0.0, 0.0, 0.0, 0.0, float("inf"), 0.0, 0.0],
    )
    src = open_source(str(path))
    assert rows(src) == [{"symbol": "A", "ts": T0, "close": 1.0, "feat": 0.0}]
    assert dict(src.drops) == {
        "missing symbol": 1,
        "non-finite price": 2,
        "non-positive price": 1,
        "non-finite value": 1,
        "timestamp out of range": 1,
    }


# -- the shared contract ----------------------------------------------------------------------
def test_clean_piece_policy() -> None:
    table = pa.table(
        {
            "symbol": ["A"] * 7,
            "ts": [T0, 0, 400_000_000_000_000_000, 5_000_000_000_000_000_000, T0, T0, T0],
            "open": [1.0, 1.0, 1.0, 1.0, np.inf, 0.0, 1.0],
            "x": [-5.0, 1.0, 1.0, 1.0, 1.0, 1.0, np.nan],
        }
    )
    drops: Counter = Counter()
    out = clean_piece(table, drops)
    assert out.column("ts").to_pylist() == [T0, 400_000_000_000_000_000]
    assert dict(drops) == {
        "timestamp out of range": 2,
        "non-finite price": 1,
        "non-positive price": 1,
        "non-finite value": 1,
    }
    assert clean_piece(out, drops) is out


@pytest.mark.parametrize(
    "text, ns",
    [
        ("1s", 10**9),
        ("1m", 60 * 10**9),
        ("5m", 300 * 10**9),
        ("1h", 3600 * 10**9),
        ("1d", 86_400 * 10**9),
        ("0", 0),
        ("250ms", 250 * 10**6),
        ("5min", 300 * 10**9),
        ("30D", 30 * 86_400 * 10**9),
    ],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "m", "5", "-1m", "1.5h", "1 week", "1y", "5mins", "1M"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration(text)


def test_expand_inputs(tmp_path: Path) -> None:
    for name in (
        "a/x.dbn.zst",
        "a/b/y.parquet",
        "a/b/z.pq",
        "a/w.dbn",
        "a/readme.txt",
        "a/.hidden/h.dbn",
        "c/q.parquet",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    a = str(tmp_path / "a")
    got = expand_inputs(
        [a, str(tmp_path / "a" / "w.dbn"), str(tmp_path / "c" / "*.parquet"), str(tmp_path / "a" / "readme.txt")]
    )
    assert got == sorted(
        str(tmp_path / n)
        for n in ("a/x.dbn.zst", "a/b/y.parquet", "a/b/z.pq", "a/w.dbn", "a/readme.txt", "c/q.parquet")
    )
    with pytest.raises(SourceError, match="nope: no such file or directory"):
        expand_inputs([str(tmp_path / "nope")])
    with pytest.raises(SourceError, match="matches no input files"):
        expand_inputs([str(tmp_path / "c" / "*.dbn")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="matches no input files"):
        expand_inputs([str(tmp_path / "empty")])


def test_an_empty_list_of_inputs_is_refused_by_name(tmp_path: Path) -> None:
    from shardcache import build_cache
    from shardcache.errors import OptionError

    with pytest.raises(OptionError, match=r"^sources=\[\]: names no input: give at least one file"):
        build_cache([], tmp_path / "out.zarr", progress=False)  # once an IndexError from the scan
    assert not (tmp_path / "out.zarr").exists()


def test_open_source_dispatch_by_content(tmp_path: Path) -> None:
    path = write(tmp_path / "bars.dbn", ts=[T0], close=[1.0])
    assert open_source(str(path)).kind == "parquet"
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(SourceError, match=r"notes\.txt: not a DBN, Parquet or CSV file"):
        open_source(str(tmp_path / "notes.txt"))
    with pytest.raises(SourceError, match="is a directory"):
        open_source(str(tmp_path))
