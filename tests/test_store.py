"""The format-3 contract: per-symbol groups as plain zarr sees them, the virtual row space, old formats refused."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import zarr
from helpers import make_cache, synthetic_bars

from shardcache import CacheError, open_cache
from shardcache.format.layout import FORMAT_VERSION, TIME_ATTRS, symbol_bases

SHARD = 256


@pytest.fixture(scope="module")
def bars():
    return synthetic_bars(2000, 3, n_symbols=4, seed=5, shard_rows=SHARD)


@pytest.fixture(scope="module")
def cache(tmp_path_factory, bars):
    return make_cache(tmp_path_factory.mktemp("store") / "c.zarr", bars, shard_rows=SHARD, chunk_rows=64)


def _symbol_rows(bars, i):
    seg = bars.segments[bars.segments[:, 0] == i]
    return slice(int(seg[:, 1].min()), int(seg[:, 2].max()))


def test_each_symbol_is_a_dense_group_plain_zarr_reads(cache, bars):
    g = zarr.open_group(cache.url, mode="r")
    m = g.attrs["shardcache"]
    assert m["format_version"] == FORMAT_VERSION == 3 and m["complete"]
    assert m["groups"] == [f"symbols/{i}" for i in range(4)]
    for i, path in enumerate(m["groups"]):
        rows = _symbol_rows(bars, i)
        f, t = g[path]["features"], g[path]["time"]
        assert f.shape == (rows.stop - rows.start, 3) == (m["bars_per_symbol"][i], 3)
        assert f.metadata.dimension_names == ("time", "feature") and t.metadata.dimension_names == ("time",)
        np.testing.assert_array_equal(f[...], bars.features[rows])  # no fill rows
        np.testing.assert_array_equal(t[...], bars.ts[rows])
        assert dict(t.attrs) == TIME_ATTRS and list(g[path]["feature"][...]) == ["f0", "f1", "f2"]
        assert len(f.attrs["digests"]) == -(-f.shape[0] // SHARD)
        seg = bars.segments[bars.segments[:, 0] == i]
        np.testing.assert_array_equal(g[path]["segment_start"][...], seg[:, 1] - rows.start)
        np.testing.assert_array_equal(g[path]["segment_stop"][...], seg[:, 2] - rows.start)


def test_virtual_rows_locate_symbols_and_their_rows(cache, bars):
    bases = symbol_bases(cache.bars_per_symbol, SHARD)
    np.testing.assert_array_equal(cache.bases, bases)
    assert cache.n_rows == bases[-1] == bars.features.shape[0] and np.all(bases % SHARD == 0)
    np.testing.assert_array_equal(cache.segments, bars.segments)
    rows = np.concatenate([np.arange(bases[i], bases[i] + cache.bars_per_symbol[i]) for i in range(4)])
    sym, local = cache.locate(rows)
    assert sym.dtype == local.dtype == np.int64
    np.testing.assert_array_equal(cache.array(0, "time")[...], cache.bar_times(rows[sym == 0]))
    np.testing.assert_array_equal(cache.bar_times(rows), bars.ts[rows])
    for i in range(4):
        np.testing.assert_array_equal(local[sym == i], np.arange(cache.bars_per_symbol[i]))
        assert cache.region_stop(int(bases[i]) + 3) == bases[i] + cache.bars_per_symbol[i]
    a, b = int(bases[2]) + 10, int(bases[2] + cache.bars_per_symbol[2])
    np.testing.assert_array_equal(cache.read_rows(a, b), bars.features[a:b])
    with pytest.raises(IndexError, match="inside one symbol"):
        cache.read_rows(a, int(bases[3]) + 1)


def test_shard_keys_name_real_objects(cache):
    for shard, a, _ in cache.shard_table.tolist():
        i, local = cache.shard_symbol(shard)
        assert cache.shard_key(shard) == f"symbols/{i}/features/c/{local}/0"
        assert cache.shard_key(shard, "time") == f"symbols/{i}/time/c/{local}"
        assert cache.shard_exists(shard) and cache.shard_exists(shard, "time")
        assert a == cache.bases[i] + local * SHARD


def test_a_pickled_cache_reopens(cache, bars):
    copy = pickle.loads(pickle.dumps(cache))
    stop = copy.region_stop(0)
    np.testing.assert_array_equal(copy.read_rows(0, stop), bars.features[:stop])


@pytest.mark.parametrize("version", [1, 2])
def test_old_formats_are_refused_in_one_line(cache, tmp_path, version):
    import shutil

    out = tmp_path / "c.zarr"
    shutil.copytree(cache.url, out)
    meta = json.loads((out / "zarr.json").read_text())
    meta["attributes"]["shardcache"]["format_version"] = version
    (out / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError) as err:
        open_cache(out)
    assert str(err.value) == f"{out}: cache format {version} is no longer read; rebuild it with build-cache"


def test_opening_reads_neither_symbol_groups_nor_json_objects(cache, tmp_path, monkeypatch):
    """Open touches the root manifest and the root segment index only; per-symbol arrays open on use."""
    import shutil

    out = tmp_path / "c.zarr"
    shutil.copytree(cache.url, out)
    for i in range(1, 4):
        shutil.rmtree(out / "symbols" / str(i))
    c = open_cache(out)  # symbols 1-3 are gone, yet it opens
    assert c.n_bars == cache.n_bars and c.read_rows(0, 2).shape == (2, 3)
    with pytest.raises(CacheError, match=r"shard \d+ \(symbols/2/features/c/0/0\) is missing"):
        c.read_rows(int(c.bases[2]), int(c.bases[2]) + 5)
