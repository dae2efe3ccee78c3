"""Fuzzing the builder: random, truncated and damaged DBN bytes and random Parquet tables end in a
correct cache or a clean ``ShardcacheError``, never another exception and never a complete-looking
cache after an error."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import stored_rows
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardcache import ShardcacheError, open_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import write_dbn
from shardcache.inspect.verify import verify_cache

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MIN = 60 * 10**9
T0 = int(np.datetime64("2024-03-04T14:30", "ns").astype(np.int64))


@pytest.fixture(scope="module")
def dbn(tmp_path_factory) -> dict[str, bytes]:
    """A small valid DBN file (two symbols, 300 bars), plain and zstd-compressed."""
    tmp = tmp_path_factory.mktemp("fuzz")
    n = 300
    px = 100 + np.cumsum(np.random.default_rng(0).standard_normal(n)) * 0.1
    recs = {
        "ts_event": T0 + MIN * (np.arange(n) // 2),
        "instrument_id": np.tile([1, 2], n // 2),
        "open": px,
        "high": px + 0.5,
        "low": px - 0.5,
        "close": px,
        "volume": np.arange(n) + 1,
    }
    plain = write_dbn(tmp / "x.ohlcv-1m.dbn", "ohlcv-1m", recs, symbols={1: "AAA", 2: "BBB"})
    packed = write_dbn(tmp / "x.ohlcv-1m.dbn.zst", "ohlcv-1m", recs, symbols={1: "AAA", 2: "BBB"})
    return {"plain": plain.read_bytes(), "zst": packed.read_bytes()}


def check_build(tmp_path: Path, name: str, write) -> None:
    """Build one input; a cache must verify and hold finite rows, an error must be a ShardcacheError."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / name
    write(path)
    out = folder / "c.zarr"
    try:
        cache = build_cache([path], out, seq_len=2, horizon=1, workers=1, progress=False)
    except ShardcacheError as exc:
        assert "\n" not in str(exc)
        event(f"refused: {str(exc).split(': ', 1)[-1][:90]}")
        try:
            open_cache(out)
        except ShardcacheError:
            return
        raise AssertionError("a complete-looking cache after a failed build") from exc
    event("built a cache")
    assert verify_cache(out).ok
    assert cache.n_bars > 0 and np.isfinite(stored_rows(cache)[0]).all()


@FUZZ
@given(
    body=st.binary(max_size=600),
    head=st.sampled_from([b"", b"DBN\x01", b"DBN\x02", b"DBN\x03", b"\x28\xb5\x2f\xfd", b"PAR1"]),
)
def test_random_bytes(tmp_path, body, head):
    check_build(tmp_path, "x.dbn", lambda p: p.write_bytes(head + body))


@FUZZ
@given(data=st.data())
def test_truncated_dbn(tmp_path, dbn, data):
    kind = data.draw(st.sampled_from(["plain", "zst"]))
    raw = dbn[kind]
    cut = data.draw(st.integers(1, len(raw)))
    check_build(tmp_path, f"x.dbn{'.zst' if kind == 'zst' else ''}", lambda p: p.write_bytes(raw[:cut]))


@FUZZ
@given(data=st.data())
def test_damaged_dbn(tmp_path, dbn, data):
    raw = bytearray(dbn["plain"])
    for _ in range(data.draw(st.integers(1, 8))):
        # mostly in the metadata header and the first records, where a change is most disruptive
        pos = data.draw(st.one_of(st.integers(0, 400), st.integers(0, len(raw) - 1)))
        raw[pos] = data.draw(st.integers(0, 255))
    check_build(tmp_path, "x.dbn", lambda p: p.write_bytes(bytes(raw)))


FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def tables(draw) -> pa.Table:
    """Parquet-able tables with plausible and implausible timestamp, symbol and value columns."""
    n = draw(st.integers(0, 40))
    cols: dict[str, pa.Array] = {}
    ts_kind = draw(st.sampled_from(["minutes"] * 4 + ["timestamp"] * 2 + ["ns", "seconds", "string", "float", "none"]))
    if ts_kind == "ns":
        cols["ts"] = pa.array(draw(st.lists(st.integers(-(2**62), 2**62), min_size=n, max_size=n)), pa.int64())
    elif ts_kind == "minutes":
        steps = draw(st.lists(st.integers(-2, 5), min_size=n, max_size=n))
        cols["ts"] = pa.array(T0 + MIN * np.cumsum(np.asarray(steps, dtype=np.int64)), pa.int64())
    elif ts_kind == "timestamp":
        unit = draw(st.sampled_from(["s", "ms", "us", "ns"]))
        cols["timestamp"] = pa.array(
            T0 // {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[unit]
            + np.arange(n) * 60 * {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit],
            pa.timestamp(unit, tz=draw(st.sampled_from([None, "UTC"]))),
        )
    elif ts_kind == "seconds":
        cols["ts"] = pa.array(T0 // 10**9 + 60 * np.arange(n), pa.int64())
    elif ts_kind == "string":
        cols["ts"] = pa.array([str(i) for i in range(n)])
    elif ts_kind == "float":
        cols["ts"] = pa.array(draw(st.lists(FLOATS, min_size=n, max_size=n)), pa.float64())
    if draw(st.booleans()):
        symbols = st.one_of(st.none(), st.sampled_from(["A", "B", ""]))
        cols["symbol"] = pa.array(draw(st.lists(symbols, min_size=n, max_size=n)), pa.string())
    names = draw(
        st.lists(
            st.sampled_from(["open", "high", "low", "close", "volume", "x", "price"]),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    for name in names:
        kind = draw(st.sampled_from(["float"] * 4 + ["float32", "int", "bool", "string", "nulls"]))
        if kind in ("float", "float32"):
            values = draw(st.lists(st.one_of(st.floats(0.5, 200), FLOATS), min_size=n, max_size=n))
            cols[name] = pa.array(values, pa.float64() if kind == "float" else pa.float32())
        elif kind == "int":
            cols[name] = pa.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)), pa.int64())
        elif kind == "bool":
            cols[name] = pa.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), pa.bool_())
        elif kind == "string":
            cols[name] = pa.array(["1.5"] * n)
        else:
            cols[name] = pa.array([None] * n, pa.float64())
    return pa.table(cols) if cols else pa.table({"empty": pa.array([], pa.int64())})


@FUZZ
@given(table=tables())
def test_random_parquet_tables(tmp_path, table):
    check_build(tmp_path, "x.parquet", lambda p: pq.write_table(table, p))
