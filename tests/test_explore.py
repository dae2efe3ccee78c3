"""Exploring a cache: ``Cache.shards`` and ``shardcache ls``, ``Cache.to_xarray`` and ``xr.open_zarr``."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
import zarr

from helpers import Bars, make_cache, synthetic_bars
from shardcache import CacheError, open_cache
from shardcache.cli import main

SHARD, CHUNK = 512, 128


@pytest.fixture(scope="module")
def bars() -> Bars:
    """3000 bars of 3 symbols (feature 0 is the row number), gaps and train/val/test splits."""
    return synthetic_bars(3000, 4, n_symbols=3, seed=11)


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory, bars) -> str:
    """``bars`` in 6 shards of 512 rows (the last one partial), with normalization statistics."""
    path = str(tmp_path_factory.mktemp("explore") / "c.zarr")
    make_cache(path, bars, shard_rows=SHARD, chunk_rows=CHUNK)
    group = zarr.open_group(path, mode="r+")
    manifest = dict(group.attrs["shardcache"])
    manifest["stats"] = {"mean": [0.5, 1.0, 2.0, 3.0], "std": [2.0, 3.0, 4.0, 5.0]}
    group.attrs["shardcache"] = manifest
    return path


def expected_symbols(bars: Bars) -> np.ndarray:
    """Symbol name of every row, by walking the segment table."""
    out = np.empty(len(bars.ts), dtype=object)
    for sym, a, b in bars.segments:
        out[a:b] = bars.symbols[sym]
    return out


def test_shards_table_matches_rows_times_symbols_and_files(cache_path, bars):
    shards = open_cache(cache_path).shards()
    symbols = expected_symbols(bars)
    assert len(shards) == 6 and [s.index for s in shards] == list(range(6))
    for s in shards:
        a, b = s.index * SHARD, min((s.index + 1) * SHARD, 3000)
        assert (s.key, s.start, s.stop, s.rows) == (f"features/c/{s.index}/0", a, b, b - a)
        assert s.symbols == tuple(dict.fromkeys(symbols[a:b]))
        assert (s.first_ts, s.last_ts) == (bars.ts[a:b].min(), bars.ts[a:b].max())
        assert s.stored_bytes == os.path.getsize(os.path.join(cache_path, *s.key.split("/")))
        assert s.raw_bytes == (b - a) * 4 * 4 and s.ratio == pytest.approx(s.raw_bytes / s.stored_bytes)
    features_dir = os.path.join(cache_path, "features")
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(features_dir) for f in fs)
    metadata = os.path.getsize(os.path.join(features_dir, "zarr.json"))
    assert sum(s.stored_bytes for s in shards) == on_disk - metadata


def test_shards_through_an_fsspec_url(bars):
    url = "memory://shardcache-explore/c.zarr"
    try:
        make_cache(url, bars, shard_rows=1024, chunk_rows=256)
        shards = open_cache(url).shards()
        assert [s.rows for s in shards] == [1024, 1024, 952]
        assert all(s.stored_bytes and s.stored_bytes > 0 for s in shards)
    finally:
        import fsspec

        fsspec.filesystem("memory").rm("/shardcache-explore", recursive=True)


def test_ls_prints_one_line_per_shard(cache_path, capsys):
    assert main(["ls", cache_path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{cache_path}: 6 shards"
    assert out[1].split()[:3] == ["shard", "key", "first"]
    rows = out[2:8]
    assert [r.split()[:2] for r in rows] == [[str(i), f"features/c/{i}/0"] for i in range(6)]
    assert rows[-1].split()[2:5] == ["2,560", "2,999", "440"]
    assert out[8].startswith("total: 3,000 rows") and len(out) == 9


def test_ls_json_matches_shards(cache_path, capsys):
    assert main(["ls", cache_path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shard_rows"] == SHARD and doc["n_features"] == 4
    assert doc["shards"] == [s.to_dict() for s in open_cache(cache_path).shards()]
    first = doc["shards"][0]
    assert first["first_time"].startswith(str(np.datetime64(first["first_ts"], "ns"))[:16])
    assert sum(s["rows"] for s in doc["shards"]) == 3000 and not any(s["missing"] for s in doc["shards"])


def test_ls_shows_a_deleted_shard_as_missing(cache_path, tmp_path, capsys):
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(cache_path, broken)
    os.remove(os.path.join(broken, "features", "c", "2", "0"))
    shards = open_cache(broken).shards()
    assert [s.missing for s in shards] == [False, False, True, False, False, False]
    assert shards[2].stored_bytes is None and shards[2].ratio is None
    assert main(["ls", broken]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "features/c/2/0" in line and not line.startswith("MISSING"))
    assert "missing" in row and "MISSING: 1 shard object(s): features/c/2/0" in out
    assert main(["ls", broken, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["shards"][2]["missing"] is True and doc["shards"][2]["stored_bytes"] is None


def test_to_xarray_is_lazy_labelled_and_exact(cache_path, bars):
    xr = pytest.importorskip("xarray")
    cache = open_cache(cache_path)
    ds = cache.to_xarray()
    assert isinstance(ds, xr.Dataset) and ds.features.dims == ("row", "feature")
    assert ds.features.chunks == ((SHARD,) * 5 + (3000 - 5 * SHARD,), (4,))
    assert list(ds.feature.values) == ["f0", "f1", "f2", "f3"]
    np.testing.assert_array_equal(ds.features.values, cache.features[...])
    np.testing.assert_array_equal(ds.time.values, bars.ts.astype("datetime64[ns]"))
    assert list(ds.symbol.values) == list(expected_symbols(bars))
    split = np.empty(3000, dtype=object)
    for (_, a, b), sp in zip(bars.segments, bars.segment_split):
        split[a:b] = bars.split_names[sp]
    assert list(ds.split.values) == list(split)
    raw = (ds.features * ds.feature_std + ds.feature_mean).sel(feature="f1").values
    np.testing.assert_allclose(raw, bars.features[:, 1].astype(np.float64) * 3.0 + 1.0, rtol=1e-6)
    picked = ds.features.isel(row=slice(1000, 1010)).sel(feature="f0").values  # the row number
    np.testing.assert_array_equal(picked, np.arange(1000, 1010))


def test_to_xarray_without_xarray_says_what_to_install(cache_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(CacheError, match=r"shardcache\[xarray\]"):
        open_cache(cache_path).to_xarray()


def test_plain_xarray_open_zarr_reads_the_arrays(cache_path, bars):
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(cache_path, consolidated=False, chunks={"row": SHARD})
    assert ds.features.dims == ("row", "feature") and ds.ts.dims == ("row",)
    assert ds.segments.dims == ("segment", "field") and ds.segment_split.dims == ("segment",)
    np.testing.assert_array_equal(ds.features.values, bars.features)
    np.testing.assert_array_equal(ds.ts.values, bars.ts)
    np.testing.assert_array_equal(ds.segments.values, bars.segments)
    assert ds.attrs["shardcache"]["complete"] is True
