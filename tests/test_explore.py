"""Exploring a cache: ``explore.shards`` and ``shardcache ls``, ``explore.info`` and ``shardcache info``,
``explore.open_symbol``, ``open_symbols`` and ``explore.to_xarray`` (one symbol's Dataset, a chosen few,
the whole cache's DataTree)."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
from helpers.parquet import build_raw, make_bars, write_parquet

from shardcache import CacheError, open_cache
from shardcache.cli import main
from shardcache.inspect.views import info, open_symbol, open_symbols, shards, to_xarray

SHARD, CHUNK = 256, 64
COUNTS = {"ESZ3": 700, "BRK/B": 256, "NQ Z3": 300}  # 3 + 1 + 2 shards


@pytest.fixture(scope="module")
def source():
    return make_bars(COUNTS, n_features=2, seed=5)


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory, source) -> str:
    work = tmp_path_factory.mktemp("explore")
    parquet = write_parquet(work / "bars.parquet", source)
    out = str(work / "c.zarr")
    build_raw(parquet, out, shard_rows=SHARD, chunk_rows=CHUNK, split="train=0.8,val=0.1,test=0.1")
    return out


def file_size(cache_path: str, key: str) -> int:
    return os.path.getsize(os.path.join(cache_path, *key.split("/")))


def test_shards_lists_every_shard_of_every_symbol(cache_path, source):
    cache = open_cache(cache_path)
    table = shards(cache)
    assert len(table) == 6
    for s in table:
        assert s.symbol == cache.symbols[s.symbol_id] and s.group == cache.manifest.groups[s.symbol_id]
        n, ts = COUNTS[s.symbol], source[s.symbol].ts
        a, b = s.shard * SHARD, min((s.shard + 1) * SHARD, n)
        assert (s.key, s.start, s.stop, s.rows) == (f"{s.group}/features/c.{s.shard}.0", a, b, b - a)
        assert (s.first_ts, s.last_ts) == (ts[a], ts[b - 1])
        assert s.stored_bytes == file_size(cache_path, s.key)
        assert s.raw_bytes == (b - a) * 2 * 4 and s.ratio == pytest.approx(s.raw_bytes / s.stored_bytes)
    per_symbol = {sym: [s.shard for s in table if s.symbol == sym] for sym in COUNTS}
    assert per_symbol == {"ESZ3": [0, 1, 2], "BRK/B": [0], "NQ Z3": [0, 1]}
    on_disk = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(cache_path)
        for f in fs
        if f"{os.sep}features{os.sep}c." in os.path.join(d, f)
    )
    assert sum(s.stored_bytes for s in table) == on_disk
    assert shards(cache_path) == table  # a path works too


def test_ls_prints_one_line_per_shard(cache_path, capsys):
    assert main(["ls", cache_path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{cache_path}: 6 shards of 3 symbols"
    assert out[1].split()[:4] == ["symbol", "shard", "key", "rows"]
    table = shards(cache_path)
    for line, s in zip(out[2:8], table):
        assert line.startswith(s.symbol) and s.key in line and f" {s.rows:,} " in line
    assert out[8].startswith("total: 1,256 rows") and len(out) == 9


def test_ls_json_matches_shards(cache_path, capsys):
    assert main(["ls", cache_path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shard_rows"] == SHARD and doc["n_features"] == 2 and doc["symbols"] == 3
    assert doc["shards"] == [s.to_dict() for s in shards(cache_path)]
    first = doc["shards"][0]
    assert first["first_time"] == str(np.datetime64(first["first_ts"], "ns"))
    assert not any(s["missing"] for s in doc["shards"])


def test_ls_shows_a_deleted_shard_as_missing(cache_path, tmp_path, capsys):
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(cache_path, broken)
    gone = shards(broken)[1]
    os.remove(os.path.join(broken, *gone.key.split("/")))
    table = shards(broken)
    assert [s.missing for s in table] == [s.key == gone.key for s in table]
    assert table[1].stored_bytes is None and table[1].ratio is None
    assert main(["ls", broken]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if gone.key in line and not line.startswith("MISSING"))
    assert "missing" in row and f"MISSING: 1 shard object(s): {gone.key}" in out
    assert main(["ls", broken, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["shards"][1]["missing"] is True and doc["shards"][1]["stored_bytes"] is None


def brute_windows(cache, seq_len: int, horizon: int) -> dict[str, int]:
    """Windows per split by walking the segment table: a segment of n bars holds n - seq_len - horizon + 1."""
    out = dict.fromkeys(cache.split_names, 0)
    for (_, a, b), split in zip(cache.segments.tolist(), cache.segment_split.tolist()):
        out[cache.split_names[split]] += max(0, b - a - seq_len - horizon + 1)
    return out


@pytest.mark.parametrize("seq_len,horizon", [(60, 1), (5, 3), (400, 1)])
def test_info_counts_windows_per_split_at_read_time(cache_path, seq_len, horizon):
    cache = open_cache(cache_path)
    summary = info(cache, seq_len, horizon)
    assert summary["windows_per_split"] == brute_windows(cache, seq_len, horizon)
    assert summary["windows"] == sum(summary["windows_per_split"].values())
    assert summary["format_version"] == 5 and summary["shards"] == 6 and summary["bars"] == 1256
    assert dict(zip(summary["symbols"], summary["bars_per_symbol"])) == COUNTS


def test_info_command_prints_the_summary(cache_path, capsys):
    assert main(["info", cache_path, "--seq-len", "5"]) == 0
    out = capsys.readouterr().out
    windows = info(cache_path, 5)["windows"]
    assert f"windows   {windows:,} at seq_len 5" in out and "6 shards of 256 rows" in out
    assert "1,256 in 3 symbols" in out
    assert main(["info", cache_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["windows_per_split"] == info(cache_path)["windows_per_split"]


def test_open_symbol_is_a_labelled_lazy_dataset(cache_path, source):
    pytest.importorskip("xarray")
    cache = open_cache(cache_path)
    ds = open_symbol(cache, "NQ Z3")
    assert ds.features.dims == ("time", "feature") and ds.features.chunks == ((256, 44), (2,))
    np.testing.assert_array_equal(ds.features.values, source["NQ Z3"].values)
    np.testing.assert_array_equal(ds.time.values, source["NQ Z3"].ts.astype("datetime64[ns]"))
    assert ds.symbol.item() == "NQ Z3" and list(ds.feature.values) == ["x0", "x1"]
    i = cache.symbols.index("NQ Z3")
    expected = np.empty(COUNTS["NQ Z3"], dtype=object)
    for (sym, a, b), split in zip(cache.segments.tolist(), cache.segment_split.tolist()):
        if sym == i:
            base = int(cache.segments[cache.segments[:, 0] == i, 1].min())
            expected[a - base : b - base] = cache.split_names[split]
    assert list(ds.split.values) == list(expected) and len(set(expected)) > 1
    assert open_symbol(cache, i).symbol.item() == "NQ Z3"
    with pytest.raises(CacheError, match="no symbol 'CLZ3'"):
        open_symbol(cache, "CLZ3")


def test_open_symbols_opens_the_ones_asked_for_and_reads_no_other_group(cache_path, source, tmp_path):
    pytest.importorskip("xarray")
    want = {name: open_symbol(cache_path, name) for name in COUNTS}
    copy = tmp_path / "two.zarr"
    shutil.copytree(cache_path, copy)
    gone = open_cache(cache_path).symbols.index("ESZ3")
    shutil.rmtree(copy / "symbols" / str(gone))  # a group open_symbols must not read
    got = open_symbols(copy, ["NQ Z3", open_cache(copy).symbols.index("BRK/B"), "NQ Z3"])
    assert list(got) == ["NQ Z3", "BRK/B"]  # in the order asked, once each
    for name, ds in got.items():
        np.testing.assert_array_equal(ds.features.values, source[name].values)
        assert ds.symbol.item() == name and list(ds.split.values) == list(want[name].split.values)
        assert ds.features.chunks == want[name].features.chunks
    with pytest.raises(KeyError, match=f"symbols/{gone}"):  # the tree has every group, the removed one too
        to_xarray(copy)
    with pytest.raises(CacheError, match="no symbol 'CLZ3'"):
        open_symbols(copy, ["NQ Z3", "CLZ3"])
    with pytest.raises(CacheError, match="a list of symbols"):
        open_symbols(copy, "NQ Z3")


def test_to_xarray_is_the_datatree_with_labels(cache_path, source):
    xr = pytest.importorskip("xarray")
    cache = open_cache(cache_path)
    tree = to_xarray(cache)
    assert isinstance(tree, xr.DataTree) and tree.attrs["shardcache"]["format_version"] == 5
    for i, (symbol, path) in enumerate(zip(cache.symbols, cache.manifest.groups)):
        node = tree[path]
        assert node.symbol.item() == symbol
        np.testing.assert_array_equal(node.features.values, source[symbol].values)


def test_normalized_features_come_back_in_source_units(tmp_path):
    pytest.importorskip("xarray")
    bars = make_bars({"ES": 500, "NQ": 400}, n_features=3, seed=9)
    out = build_raw(
        write_parquet(tmp_path / "b.parquet", bars),
        tmp_path / "z.zarr",
        normalize="zscore",
        shard_rows=128,
        chunk_rows=32,
        split="train=0.8,val=0.1,test=0.1",
    )
    ds = open_symbol(out, "NQ")
    assert list(ds.feature_mean.dims) == ["feature"] and (ds.feature_std > 0).all()
    raw = (ds.features * ds.feature_std + ds.feature_mean).values
    np.testing.assert_allclose(raw, bars["NQ"].values, rtol=1e-5, atol=1e-4)


def test_xarray_views_without_xarray_say_what_to_install(cache_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(CacheError, match=r"shardcache\[xarray\]"):
        open_symbol(cache_path, 0)
    with pytest.raises(CacheError, match=r"shardcache\[xarray\]"):
        to_xarray(cache_path)


def test_shards_and_info_of_a_cache_on_s3(s3_bucket, cache_path, source, tmp_path, capsys):
    import s3fs

    bucket, options = s3_bucket
    url = f"{bucket}/c.zarr"
    s3fs.S3FileSystem(**options).put(cache_path.rstrip("/") + "/", url + "/", recursive=True)
    remote, local = shards(open_cache(url, options)), shards(cache_path)
    assert [(s.key, s.rows, s.first_ts, s.last_ts, s.stored_bytes) for s in remote] == [
        (s.key, s.rows, s.first_ts, s.last_ts, s.stored_bytes) for s in local
    ]
    flags = [f"--storage-option={k}={v}" for k, v in options.items()]
    assert main(["ls", url, *flags]) == 0 and "6 shards of 3 symbols" in capsys.readouterr().out
    assert info(open_cache(url, options))["windows_per_split"] == info(cache_path)["windows_per_split"]
    ds = open_symbol(open_cache(url, options), "BRK/B")
    np.testing.assert_array_equal(ds.features.values, source["BRK/B"].values)


def test_ls_reads_the_root_index_and_names_its_damage_in_one_line(cache_path, tmp_path, capsys):
    """``ls`` reads bar times from the root shard index, not from each symbol's ``time`` array: a damaged
    time chunk is ``verify``'s finding, a damaged root index ``ls``'s one-line refusal."""
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(cache_path, broken)
    group = open_cache(broken).manifest.groups[1]
    with open(os.path.join(broken, *group.split("/"), "time", "c.0"), "wb") as fh:
        fh.write(b"not zstd")
    assert shards(broken) == shards(cache_path)
    assert main(["verify", broken]) == 1
    assert (
        f"{group}/time/c.0: corrupt (ChunkError: the shard is 8 bytes, shorter than its index)"
        in capsys.readouterr().out
    )
    index = os.path.join(broken, "shards", "c.0.0")
    with open(index, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\xff\xff")
    assert main(["ls", broken]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shardcache: error: {broken}: the shard index (shards) is damaged: ")
    assert err[0].endswith("; rebuild the cache")


def test_to_xarray_lists_symbols_in_the_caches_order(tmp_path):
    pytest.importorskip("xarray")
    bars = make_bars({f"S{i}": 150 for i in range(12)}, n_features=2, seed=3)
    cache = build_raw(write_parquet(tmp_path / "b.parquet", bars), tmp_path / "c.zarr", shard_rows=128, chunk_rows=64)
    tree = to_xarray(cache)
    names = [g.split("/")[1] for g in cache.manifest.groups]
    assert list(tree["symbols"].children) == names  # not the store's listing, not text order ('10' < '2')
    assert [tree["symbols"][k].symbol.item() for k in tree["symbols"].children] == cache.symbols
    for path in cache.manifest.groups:
        np.testing.assert_array_equal(
            tree[path].features.values, open_symbol(cache, tree[path].symbol.item()).features.values
        )
