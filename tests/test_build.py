"""The builder end to end: DBN files in, a Zarr v3 store out, checked with plain zarr."""

from __future__ import annotations

import collections
import functools
import json
import os
import types
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr
from helpers import stored_rows
from helpers.cli import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcache import ShardcacheError, open_cache
from shardcache.errors import OptionError
from shardcache.format.splits import parse_split
from shardcache.format.typed_json import dump
from shardcache.ingest import compute, merge, scan
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample, write_dbn
from shardcache.inspect.verify import compare_caches
from shardcache.read.plan import n_windows, valid_ranges

OHLCV = ["open", "high", "low", "close", "volume"]
MIN = 60 * 10**9


def decode_bars(files: list[Path]) -> dict[str, list[tuple[int, list[float]]]]:
    """Independent decoding: databento_dbn's own per-record objects, symbols from metadata."""
    per_symbol: dict[str, list[tuple[int, list[float]]]] = {}
    for f in files:
        dec = dbn.DBNDecoder(upgrade_policy=dbn.VersionUpgradePolicy.UPGRADE_TO_V3)
        dec.write(f.read_bytes() if f.suffix != ".zst" else _unzstd(f))
        recs = dec.decode()
        meta = recs[0]
        ids = {int(iv["symbol"]): raw for raw, ivs in meta.mappings.items() for iv in ivs}
        for r in recs[1:]:
            row = [r.open / 1e9, r.high / 1e9, r.low / 1e9, r.close / 1e9, float(r.volume)]
            per_symbol.setdefault(ids.get(r.instrument_id, str(r.instrument_id)), []).append((r.ts_event, row))
    return per_symbol


def _unzstd(path: Path) -> bytes:
    import pyarrow as pa

    with pa.input_stream(str(path), compression="zstd") as fh:
        return fh.read()


def expected_arrays(per_symbol: dict[str, list[tuple[int, list[float]]]]) -> tuple[np.ndarray, np.ndarray]:
    ts, rows = [], []
    for sym in sorted(per_symbol):
        bars = sorted(per_symbol[sym], key=lambda b: b[0])
        ts += [b[0] for b in bars]
        rows += [b[1] for b in bars]
    return np.asarray(ts, dtype=np.int64), np.asarray(rows, dtype=np.float32)


@pytest.fixture(scope="module")
def small_sample(tmp_path_factory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("dbn"), days=21, seed=3)


def test_rows_and_timestamps_match_independent_decode(small_sample, tmp_path):
    cache = build_cache(
        small_sample,
        tmp_path / "c.zarr",
        features=",".join(OHLCV),
        normalize="none",
        shard_rows=4096,
        chunk_rows=512,
        progress=False,
    )
    ts, rows = expected_arrays(decode_bars(small_sample))
    group = zarr.open_group(str(tmp_path / "c.zarr"), mode="r")
    first = group[cache.manifest.groups[0]]["features"]
    assert first.dtype == np.float32 and first.shards == (4096, 5) and first.chunks == (512, 5)
    assert first.shape == (cache.manifest.bars_per_symbol[0], 5)  # dense: the symbol's bars only
    got_rows, got_ts, _ = stored_rows(cache)
    np.testing.assert_array_equal(got_ts, ts)
    np.testing.assert_array_equal(got_rows, rows)
    assert cache.n_bars == len(ts) and cache.symbols == sorted(decode_bars(small_sample))
    first = cache.segments[np.r_[True, np.diff(cache.segments[:, 0]) != 0]]
    np.testing.assert_array_equal(first[:, 1], cache.rows.bases[first[:, 0]])  # symbol i starts at its virtual base


def test_default_sample_every_row_and_timestamp(tmp_path):
    files = make_sample(tmp_path / "dbn")
    cache = build_cache(
        tmp_path / "dbn", tmp_path / "c.zarr", features=",".join(OHLCV), normalize="none", progress=False
    )
    ts, rows = expected_arrays(decode_bars(files))
    assert 600_000 <= len(ts) <= 730_000
    got_rows, got_ts, _ = stored_rows(cache)
    np.testing.assert_array_equal(got_ts, ts)
    np.testing.assert_array_equal(got_rows, rows)
    assert cache.manifest.counts.bars == len(ts)


def test_default_features_and_segments(small_sample, tmp_path):
    cache = build_cache(
        small_sample, tmp_path / "c.zarr", normalize="none", shard_rows=4096, chunk_rows=1024, progress=False
    )
    ts, raw = expected_arrays(decode_bars(small_sample))
    got, _, seg = stored_rows(cache)
    # segments tile the rows, one symbol each, cut at gaps above 1 h and nowhere else
    assert seg[0, 1] == 0 and seg[-1, 2] == cache.n_bars and np.all(seg[1:, 1] == seg[:-1, 2])
    gaps = np.diff(ts) > 3600 * 10**9
    symbol_starts = seg[1:, 1][np.diff(seg[:, 0]) != 0]
    cuts = np.union1d(np.flatnonzero(gaps) + 1, symbol_starts)
    np.testing.assert_array_equal(seg[1:, 1], cuts)
    # independent feature arithmetic in float64
    starts = np.zeros(len(ts), dtype=bool)
    starts[seg[:, 1]] = True
    _o, h, l, c, v = (raw[:, i].astype(np.float64) for i in range(5))
    prev_c = np.roll(c, 1)
    lr = np.where(starts, 0.0, np.log(c / prev_c))
    names = cache.feature_names
    np.testing.assert_allclose(got[:, names.index("log_return")], lr, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[:, names.index("log_range")], np.log(h / l), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[:, names.index("log_volume")], np.log1p(v), rtol=1e-6)
    tod = (ts % (86400 * 10**9)) / (86400 * 10**9) * 2 * np.pi
    np.testing.assert_allclose(got[:, names.index("tod_sin")], np.sin(tod), atol=1e-6)


def test_zscore_uses_train_split_only(small_sample, tmp_path):
    raw = build_cache(
        small_sample, tmp_path / "raw.zarr", normalize="none", split="train=0.6,val=0.2,test=0.2", progress=False
    )
    norm = build_cache(small_sample, tmp_path / "norm.zarr", split="train=0.6,val=0.2,test=0.2", progress=False)
    x, _, seg = stored_rows(raw)
    x = x.astype(np.float64)
    train = np.zeros(raw.n_bars, dtype=bool)
    for (sym, a, b), s in zip(seg, raw.segment_split[np.argsort(raw.segments[:, 1], kind="stable")]):
        train[a:b] = s == raw.split_names.index("train")
    mean, std = x[train].mean(0), x[train].std(0)
    got = [norm.stats[n] for n in norm.feature_names]
    np.testing.assert_allclose([g["mean"] for g in got], mean, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose([g["std"] for g in got], std, rtol=1e-6)
    assert not np.allclose(x.mean(0), mean)  # all-data stats differ: the test can fail
    np.testing.assert_allclose(norm.read_rows(0, 1000), ((x[:1000] - mean) / std), rtol=1e-4, atol=1e-4)


def test_fraction_and_date_splits_cut_segments(small_sample, tmp_path):
    cache = build_cache(small_sample, tmp_path / "c.zarr", split="train=0.8,val=0.1,test=0.1", progress=False)
    bars = cache.manifest.splits.bars
    assert abs(bars["train"] / cache.n_bars - 0.8) < 0.02
    cuts = cache.manifest.splits.cuts_ns
    for (sym, a, b), s in zip(cache.segments, cache.segment_split):
        expected = np.searchsorted(cuts, cache.bar_times(np.arange(a, b)), side="right")
        assert np.all(expected == s), "a segment crosses a split boundary"
    d = build_cache(small_sample, tmp_path / "d.zarr", split="val=2023-01-20,test=2023-01-26", progress=False)
    assert d.split_names == ["train", "val", "test"]
    first_val = d.bar_times(d.segments[d.segment_split == 1][:1, 1])[0]
    assert first_val >= np.datetime64("2023-01-20", "ns").astype(np.int64)


@pytest.mark.parametrize(
    "text", ["train=0.5", "a=0.5,b=0.6", "val=2024-02-01,test=2024-01-01", "x", "train=2024-01-01"]
)
def test_bad_split_specs(text):
    with pytest.raises(OptionError, match=f"^split={text!r}: "):
        parse_split(text)


def test_duplicates_and_unsorted_records(tmp_path):
    t0 = np.datetime64("2024-03-04T14:30", "ns").astype(np.int64)
    ts = t0 + MIN * np.array([0, 2, 1, 3, 3, 4] + list(range(5, 100)))
    close = np.arange(len(ts), dtype=np.float64) + 100
    recs = {
        "ts_event": ts,
        "instrument_id": np.full(len(ts), 7),
        "open": close,
        "high": close + 1,
        "low": close - 1,
        "close": close,
        "volume": np.ones(len(ts)),
    }
    path = write_dbn(tmp_path / "x.ohlcv-1m.dbn", "ohlcv-1m", recs, symbols={7: "ESM4"})
    cache = build_cache([path], tmp_path / "c.zarr", features="close", normalize="none", progress=False)
    counts = cache.manifest.counts
    assert counts.dropped == {"duplicate timestamp": 1} and counts.reordered == 1
    got_ts = cache.array(0, "time")[...]  # one symbol
    assert np.all(np.diff(got_ts) > 0) and len(got_ts) == len(ts) - 1
    # the later record of the two at minute 3 wins
    assert cache.read_rows(3, 4)[0, 0] == 104.0


def test_short_symbol_is_kept_and_gives_no_windows_at_a_longer_seq_len(tmp_path):
    t0 = np.datetime64("2024-03-04T14:30", "ns").astype(np.int64)
    ids = np.array([1] * 200 + [2] * 10)
    ts = t0 + MIN * np.concatenate([np.arange(200), np.arange(10)])
    px = np.full(len(ts), 50.0)
    recs = {
        "ts_event": ts,
        "instrument_id": ids,
        "open": px,
        "high": px,
        "low": px,
        "close": px,
        "volume": np.ones(len(ts)),
    }
    path = write_dbn(tmp_path / "x.dbn", "ohlcv-1m", recs, symbols={1: "LONG", 2: "TINY"})
    cache = build_cache([path], tmp_path / "c.zarr", features="close", normalize="none", progress=False)
    assert cache.symbols == ["LONG", "TINY"] and cache.n_bars == 210
    assert "skipped_symbols" not in dump(cache.manifest.counts)
    assert n_windows(cache, 60, horizon=1) == 200 - 60  # TINY's 10 bars hold no 61-bar span
    assert n_windows(cache, 5, horizon=1) == (200 - 5) + (10 - 5)  # at a shorter read-time window they count
    r = run_cli(str(path), "--out", str(tmp_path / "d.zarr"), "--features", "close", "--seq-len", "100")
    assert r.returncode == 0 and "LONG, TINY" in r.stdout and "skipped" not in r.stdout


def test_workers_and_codecs_give_identical_arrays(small_sample, tmp_path):
    a = build_cache(
        small_sample, tmp_path / "a.zarr", workers=1, codec="zstd", progress=False, shard_rows=2048, chunk_rows=256
    )
    b = build_cache(small_sample, tmp_path / "b.zarr", workers=2, codec="lz4", progress=False)
    np.testing.assert_array_equal(stored_rows(a)[0], stored_rows(b)[0])
    np.testing.assert_array_equal(stored_rows(a)[2], stored_rows(b)[2])  # segments in each symbol's rows


def _ohlcv_parquet(path: Path, lengths: dict[str, int], dtype: type, start: int, seed: int) -> Path:
    """OHLCV bars of ``lengths`` symbols (a gap of 3 h in each), ``dtype`` values, from bar ``start`` on."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("symbol", "ts", "open", "high", "low", "close", "volume")}
    for k, (symbol, n) in enumerate(lengths.items()):
        step = np.full(n, MIN)
        step[n // 2] = 180 * MIN
        close = 100 * np.exp(np.cumsum(rng.standard_normal(n) * 1e-3))
        open_ = close * (1 + rng.standard_normal(n) * 1e-4)
        cols["symbol"] += [symbol] * n
        cols["ts"] += list(1_700_000_000 * 10**9 + (start * 2 * n + 7 * k) * MIN + np.cumsum(step))
        for name, values in (("open", open_), ("close", close), ("volume", rng.integers(1, 999, n))):
            cols[name] += list(values)
        cols["high"] += list(np.maximum(open_, close) * 1.001)
        cols["low"] += list(np.minimum(open_, close) * 0.999)
    table = {"symbol": pa.array(cols["symbol"]), "ts": pa.array(np.asarray(cols["ts"])).cast(pa.timestamp("ns"))}
    table.update({k: pa.array(np.asarray(cols[k]).astype(dtype)) for k in ("open", "high", "low", "close", "volume")})
    pq.write_table(pa.table(table), path)
    return path


def _files(root: Path) -> dict[str, bytes]:
    """Every object of a local cache but its root metadata (the manifest holds the build's times)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.parent != root}


def _mixed_files(tmp_path: Path) -> list[Path]:
    """Four Parquet files of twelve symbols, long and short, float64 beside float32, two pairs overlapping."""
    big = {"A0": 5_000, "A1": 100, "A2": 200, "A3": 3_000, "A4": 50, "A5": 70}
    small = {"B0": 30, "B1": 10, "B2": 20, "B3": 30, "B4": 4_100, "B5": 90}
    return [
        _ohlcv_parquet(tmp_path / f"{name}.parquet", lengths, dtype, start, seed)
        for name, lengths, dtype, start, seed in (
            ("a", big, np.float64, 0, 1),
            ("b", small, np.float32, 0, 2),
            ("c", big, np.float64, 1, 3),
            ("d", small, np.float32, 1, 4),
        )
    ]


def test_tasks_of_many_symbols_change_no_stored_byte(tmp_path, monkeypatch):
    """Symbols and shards batched into tasks (consecutive ones up to a shard's rows; a batch of float64
    symbols beside float32 ones, a big symbol's last shard beside small symbols' shards, which reads a
    leading bar) store the same bytes as one task per symbol and per shard, with the default features,
    z-scored over a train split."""
    files = _mixed_files(tmp_path)
    opts = {"shard_rows": 2048, "chunk_rows": 256, "split": "train=0.8,val=0.1,test=0.1", "progress": False}
    batched = build_cache(files, tmp_path / "batched.zarr", **opts)
    alone = lambda sizes, limit: [(i, i + 1) for i in range(len(sizes))]
    monkeypatch.setattr(merge, "pack", alone)
    monkeypatch.setattr(compute, "pack", alone)
    one_each = build_cache(files, tmp_path / "one-each.zarr", **opts)
    assert compare_caches(batched, one_each) == []
    assert _files(tmp_path / "batched.zarr") == _files(tmp_path / "one-each.zarr")


def test_plain_symbols_merged_together_equal_symbols_merged_one_by_one(tmp_path, monkeypatch):
    """The merge's one pass over a stretch of plain symbols (``merge._plain``: runs that overlap nowhere
    and carry no instrument ids) gives each symbol what merging it alone gives: rows, duplicates dropped
    (the last in input order wins), segments cut at gaps and splits, cluster files, tail and counts;
    with symbols whose runs overlap (merged alone) between them, float64 beside float32 ones."""
    files = _mixed_files(tmp_path)
    dups = pq.read_table(_ohlcv_parquet(tmp_path / "e.parquet", {"C0": 400, "C1": 40}, np.float32, 5, 5))
    again = dups.slice(10, 30)  # the same bars later in the file, other values: these win
    again = again.set_column(5, "close", pa.compute.multiply(again["close"], pa.scalar(2.0, pa.float32())))
    pq.write_table(pa.concat_tables([dups, again]), tmp_path / "e.parquet")
    files.append(tmp_path / "e.parquet")
    opts = {"shard_rows": 2048, "chunk_rows": 256, "split": "train=0.8,val=0.1,test=0.1", "progress": False}
    calls = {"_merge_plain": 0, "_merge_one": 0}
    for name in calls:
        real = getattr(merge, name)
        monkeypatch.setattr(
            merge, name, lambda *a, _real=real, _name=name: calls.__setitem__(_name, calls[_name] + 1) or _real(*a)
        )
    together = build_cache(files, tmp_path / "together.zarr", **opts)
    assert calls["_merge_plain"] and calls["_merge_one"]  # both kinds are in the build
    assert together.manifest.counts.dropped["duplicate timestamp"] > 30  # e's 30, and a/c's shared bars
    real_plain = merge._plain
    monkeypatch.setattr(
        merge,
        "_plain",
        lambda job, spills: (
            np.arange(len(job.runs)),
            np.full(len(job.symbols), -1),
            np.zeros(len(job.runs), np.int64),
            np.zeros(len(job.runs), np.int64),
        ),
    )
    calls["_merge_plain"] = 0
    alone = build_cache(files, tmp_path / "alone.zarr", **opts)
    assert calls["_merge_plain"] == 0
    assert compare_caches(together, alone) == []
    assert _files(tmp_path / "together.zarr") == _files(tmp_path / "alone.zarr")
    same = {"created": "", "elapsed_s": 0.0}
    assert together.manifest.replace(**same) == alone.manifest.replace(**same)

    # a stretch holds at most PLAIN_BYTES of rows: a longer symbol merges alone, one run at a time
    monkeypatch.setattr(merge, "_plain", real_plain)
    monkeypatch.setattr(merge, "PLAIN_BYTES", 4_000)
    held: list[int] = []
    plain = merge._merge_plain

    def spy(job, lo, hi, *rest):
        held.append(int(job.runs["n"][int(job.bounds[lo]) : int(job.bounds[hi])].sum()))
        return plain(job, lo, hi, *rest)

    monkeypatch.setattr(merge, "_merge_plain", spy)
    bounded = build_cache(files, tmp_path / "bounded.zarr", **opts)
    assert held and max(held) <= 4_000 // 28  # rows of 28 bytes at the least (ts and 5 float32 columns)
    assert compare_caches(bounded, alone) == []
    assert _files(tmp_path / "bounded.zarr") == _files(tmp_path / "alone.zarr")


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(
        st.lists(st.sampled_from([0, 7, 60, 60, 60, 120, 180, 3_600]) | st.integers(0, 400), min_size=1, max_size=90),
        min_size=1,
        max_size=25,
    )
)
def test_a_pieces_runs_at_once_give_what_each_run_gives_alone(runs):
    """The scan's statistics of a piece's runs, found for all of them at once (``scan._runs``), are those of
    the run-by-run calls: ``np.median`` of each run's steps, ``np.unique`` of its positive ones (tallied
    as the scan tallies them, ties to the first) and ``np.linspace`` rows of its timestamp sketch."""
    parts = [10**9 * k + np.cumsum(np.asarray(steps, dtype=np.int64)) for k, steps in enumerate(runs)]
    ts = np.concatenate(parts)
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
    got = scan._runs(ts, starts, sketch=True, tally=True)
    dts, tally, tally_got = [], collections.Counter(), collections.Counter()
    for p in parts:
        if len(p) > 1:
            steps = np.diff(p)
            dts.append(int(np.median(steps)))
            values, counts = np.unique(steps[steps > 0], return_counts=True)
            top = np.argsort(counts)[-8:]
            tally.update(dict(zip(values[top].tolist(), counts[top].tolist())))
    for values, counts in got.tallies:
        top = np.argsort(counts)[-8:]
        tally_got.update(dict(zip(values[top].tolist(), counts[top].tolist())))
    assert got.dts == dts and list(tally_got.items()) == list(tally.items())
    sketch = [p[np.linspace(0, len(p) - 1, scan.SKETCH).round().astype(np.int64)] for p in parts]
    np.testing.assert_array_equal(got.sketch, np.stack(sketch))
    np.testing.assert_array_equal(got.runs["offset"], starts)
    assert got.runs["n"].tolist() == [len(p) for p in parts]
    assert got.runs["ts_min"].tolist() == [int(p[0]) for p in parts]
    assert got.runs["ts_max"].tolist() == [int(p[-1]) for p in parts]


# -- the CLI and bad input ---------------------------------------------------------------------
SHARED = Path(os.environ.get("SHARDCACHE_SAMPLE_DBN", Path(__file__).resolve().parents[2] / "shared" / "data" / "dbn"))


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared DBN samples not present")
@pytest.mark.parametrize("name", sorted(p.name for p in SHARED.glob("*")) if SHARED.is_dir() else [])
def test_every_shared_dbn_file_builds_or_is_refused_cleanly(name, tmp_path):
    out = tmp_path / "c.zarr"
    r = run_cli(str(SHARED / name), "--out", str(out), "--seq-len", "1", "--horizon", "0", "-q", "--json")
    if r.returncode == 0:
        info = json.loads(r.stdout)
        cache = open_cache(out)
        assert info["bars"] == cache.n_bars > 0
        rows = stored_rows(cache)[0]
        assert np.isfinite(rows).all()
        assert all(s and not s.isdigit() for s in cache.symbols) or name.startswith("test_data")
    else:
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr and name in lines[0], r.stderr
        assert not out.exists() or _incomplete(out)


def _incomplete(out: Path) -> bool:
    try:
        open_cache(out)
    except ShardcacheError:
        return True
    return False


def _bad_inputs(tmp: Path, sample: list[Path]) -> dict[str, tuple[list[str], str]]:
    (tmp / "empty.dbn").write_bytes(b"")
    (tmp / "junk.dbn").write_bytes(b"this is not a DBN file at all" * 10)
    data = _unzstd(sample[0])
    (tmp / "cut.dbn").write_bytes(data[: len(data) // 2 + 7])
    return {
        "missing": ([str(tmp / "nope.dbn")], "nope.dbn"),
        "empty": ([str(tmp / "empty.dbn")], "empty.dbn"),
        "junk": ([str(tmp / "junk.dbn")], "junk.dbn"),
        "truncated": ([str(tmp / "cut.dbn")], "cut.dbn"),
        "unsupported": ([str(SHARED / "test_data.definition.v3.dbn.zst")], "definition"),
        "mixed": ([str(sample[0]), str(SHARED / "test_data.trades.dbn")], "mixed schemas"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "junk", "truncated", "unsupported", "mixed"])
def test_bad_input_one_line_error(case, small_sample, tmp_path):
    if case in ("unsupported", "mixed") and not SHARED.is_dir():
        pytest.skip("shared DBN samples not present")
    inputs, needle = _bad_inputs(tmp_path, small_sample)[case]
    out = tmp_path / "c.zarr"
    r = run_cli(*inputs, "--out", str(out), "-q")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and needle in lines[0] and lines[0].startswith("build-cache: error: ")
    assert not out.exists() or _incomplete(out)


def test_existing_output_needs_overwrite(small_sample, tmp_path):
    out = tmp_path / "c.zarr"
    quiet = run_cli(str(small_sample[0]), "--out", str(out), "-q")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")  # -q: nothing printed on success
    r = run_cli(str(small_sample[0]), "--out", str(out), "-q")
    assert r.returncode == 2 and "--overwrite" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    one_day = open_cache(out).n_bars
    assert run_cli(*map(str, small_sample[:2]), "--out", str(out), "-q", "--overwrite").returncode == 0
    ts, _ = expected_arrays(decode_bars(small_sample[:2]))
    assert open_cache(out).n_bars == len(ts) > one_day  # the new build replaced the old cache


def test_info_command_prints_summary(small_sample, tmp_path):
    build_cache(small_sample, tmp_path / "c.zarr", split="train=0.8,val=0.1,test=0.1", progress=False)
    r = run_cli("info", str(tmp_path / "c.zarr"), "--seq-len", "30", prog="shardcache")
    assert r.returncode == 0 and "windows" in r.stdout and "seq_len 30" in r.stdout and "log_return" in r.stdout
    j = json.loads(run_cli("info", str(tmp_path / "c.zarr"), "--json", prog="shardcache").stdout)
    assert j["windows"] == valid_ranges(open_cache(tmp_path / "c.zarr"), 60).total()


def test_spills_count_the_batches_a_kept_file_paged_in(tmp_path, monkeypatch):
    """A spill file read a batch at a time stays open while the batches it has paged in (they count in the
    process's RSS as long as it is mapped) fit ``keep_bytes``, then is let go: reading one file through
    holds at most ``keep_bytes`` of it, not the whole file (a 665K x 256 Parquet build: 567 MiB, 463 before)."""
    path = str(tmp_path / "runs.arrow")
    table = pa.table({"ts": np.arange(10_000, dtype=np.int64), "x": np.arange(10_000, dtype=np.float64)})
    with (
        pa.OSFile(path, "wb") as sink,
        pa.ipc.new_file(sink, table.schema.with_metadata({compute.BATCH_ROWS: b"1000"})) as w,
    ):
        for lo in range(0, 10_000, 1000):
            w.write_table(table.slice(lo, 1000).combine_chunks())
    opened, init = [0], compute._Spill.__init__

    def counting(self, spill):
        opened[0] += 1
        init(self, spill)

    monkeypatch.setattr(compute._Spill, "__init__", counting)
    spills = compute.Spills(keep_bytes=40_000)  # two and a half batches of 16,000 bytes
    held = []
    for lo in range(0, 10_000, 100):
        got = spills.rows(path, lo, 100)
        assert got["ts"].to_numpy().tolist() == list(range(lo, lo + 100))
        held.append(spills._bytes)
    assert max(held) <= 40_000 and 3 <= opened[0] <= 5  # let go every two batches, not kept whole nor per slice


def test_a_merge_task_opens_each_run_file_once_and_reads_its_batches(tmp_path, monkeypatch):
    """The scan's run files are record batches of equal rows (``BATCH_ROWS``): a merge task reading a
    few rows of each of its many symbols keeps each file open once and pages in only their batches, where a
    file read whole and too big to keep was opened again for every symbol (1,566 openings at 2,000
    symbols). Any batch size stores the same bytes."""
    path = _ohlcv_parquet(tmp_path / "in.parquet", {f"S{i:03d}": 40 for i in range(120)}, np.float64, 0, 1)
    opts = {"shard_rows": 1024, "chunk_rows": 128, "progress": False}
    whole = build_cache([path], tmp_path / "whole.zarr", **opts)
    opened: collections.Counter[str] = collections.Counter()
    batches: list[tuple[int, int]] = []
    init = compute._Spill.__init__

    def counting(self, spill):
        init(self, spill)
        if os.path.basename(os.path.dirname(spill)) == "runs":
            opened[spill] += 1
            batches[:] = [(self.per, self.reader.get_batch(k).num_rows) for k in range(self.reader.num_record_batches)]

    tasks, merge_one = [0], merge._merge

    def counted(job):
        tasks[0] += 1
        return merge_one(job)

    monkeypatch.setattr(compute._Spill, "__init__", counting)
    monkeypatch.setattr(merge, "_merge", counted)
    monkeypatch.setattr(scan, "SPILL_ROWS", 1000)
    # a task keeps what it paged in up to 150 KB: more than the batches it reads (1,000 rows of 48 bytes each,
    # one or two a task), less than a run file read whole (4,800 rows)
    monkeypatch.setattr(merge, "Spills", functools.partial(compute.Spills, keep_bytes=150_000))
    small = build_cache([path], tmp_path / "small.zarr", **opts)
    assert tasks[0] > 1 and list(opened.values()) == [tasks[0]]  # the one run file, once a task (24 symbols each)
    assert batches[:-1] == [(1000, 1000)] * 4 and batches[-1] == (1000, 800)  # 4,800 rows
    assert compare_caches(whole, small) == []
    assert _files(tmp_path / "whole.zarr") == _files(tmp_path / "small.zarr")


def test_cluster_files_are_written_in_equal_batches_and_change_no_stored_byte(tmp_path, monkeypatch):
    """A symbol spread over many input files (more than ``PLAIN_FILES``) merges one cluster at a time, and
    its small clusters are written in record batches of equal rows (``BATCH_ROWS``), not one a cluster:
    a later task reads only the batches holding its shard's rows. Any batch size stores the same bytes."""
    files = [
        _ohlcv_parquet(tmp_path / f"day{s:02d}.parquet", {"X": 200, "Y": 200}, np.float32, s, s) for s in range(40)
    ]
    opts = {"shard_rows": 2048, "chunk_rows": 256, "progress": False}
    adds, batches = [0], []
    add, new_file = merge._ClusterFiles.add, merge.ipc.new_file

    def counted_add(self, table):
        adds[0] += 1
        return add(self, table)

    class Counted:
        def __init__(self, writer, per):
            self.writer, self.per, self.mine = writer, per, []
            batches.append(self.mine)

        def write_table(self, table):
            self.mine.append((table.num_rows, self.per))
            self.writer.write_table(table)

        def close(self):
            self.writer.close()

    def counted(sink, schema):  # the merge's cluster files (the only Arrow files merge.py writes)
        return Counted(new_file(sink, schema), int(schema.metadata[merge.BATCH_ROWS]))

    monkeypatch.setattr(merge._ClusterFiles, "add", counted_add)
    monkeypatch.setattr(merge, "ipc", types.SimpleNamespace(new_file=counted))
    monkeypatch.setattr(merge, "BATCH_BYTES", 28 * 1000)  # rows of 28 bytes (ts and 5 float32 columns)
    together = build_cache(files, tmp_path / "together.zarr", **opts)
    assert adds[0] == 80  # 40 clusters a symbol: each symbol's runs are more than PLAIN_FILES
    assert batches and sum(map(len, batches)) <= 16 + len(batches)  # 16,000 rows in 1,000-row batches
    assert all(n == per == 1000 for f in batches for n, per in f[:-1])
    monkeypatch.setattr(merge, "BATCH_BYTES", 28 * 7)  # batch ends inside most shards and clusters
    seven = build_cache(files, tmp_path / "seven.zarr", **opts)
    assert compare_caches(together, seven) == []
    assert _files(tmp_path / "together.zarr") == _files(tmp_path / "seven.zarr")
