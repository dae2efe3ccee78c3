"""The format as a zarr user, an xarray user, a tensorstore user and zarr's ``zarrs`` pipeline first meet
it: one dense group per symbol, a ``time`` index, the feature names in the root's manifest, ``.sel`` by
time reading only the shards it needs, the whole cache as a DataTree, every array read alike by all of
them, and a Hypothesis round trip from Parquet through ``build_cache`` back to the source values."""

from __future__ import annotations

import os
import shutil
import string
import tempfile

import numpy as np
import pandas as pd
import pytest
import zarr
from helpers.parquet import SourceBars, build_raw, make_bars, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import LocalStore, WrapperStore

from shardcache.format.layout import CODECS

xr = pytest.importorskip("xarray")

SHARD, CHUNK = 256, 64
COUNTS = {"ES": 1000, "BRK/B": 613, "a b é": 300}  # odd symbol text: a slash, a space, unicode


@pytest.fixture(scope="module")
def source() -> dict[str, SourceBars]:
    return make_bars(COUNTS, n_features=3, seed=3)


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory, source) -> str:
    """``source`` from one shuffled Parquet file, in 256-row shards, split train/val/test by time."""
    work = tmp_path_factory.mktemp("users")
    parquet = write_parquet(work / "bars.parquet", source)
    out = str(work / "c.zarr")
    build_raw(parquet, out, shard_rows=SHARD, chunk_rows=CHUNK, split="train=0.7,val=0.15,test=0.15")
    return out


def manifest(path: str) -> dict:
    return dict(zarr.open_group(path, mode="r").attrs["shardcache"])


def test_plain_zarr_every_symbol_is_one_dense_array(cache_path, source):
    root = zarr.open_group(cache_path, mode="r")
    m = dict(root.attrs["shardcache"])
    assert m["format_version"] == 5 and m["complete"] is True
    assert sorted(m["symbols"]) == sorted(COUNTS) and len(m["groups"]) == len(m["symbols"])
    assert m["feature_names"] == ["x0", "x1", "x2"] and "feature" not in root  # names in the manifest alone
    for symbol, path in zip(m["symbols"], m["groups"]):
        group = root[path]
        features = group["features"]
        assert features.shape == (COUNTS[symbol], 3)  # every row a bar: no fill rows
        values = features[...]
        assert not np.isnan(values).any()
        np.testing.assert_array_equal(values, source[symbol].values)
        np.testing.assert_array_equal(group["time"][...], source[symbol].ts)
        assert features.metadata.dimension_names == ("time", "feature")
        assert sorted(group.keys()) == ["features", "time"]


def test_xarray_symbol_dataset_has_a_datetime_time_index(cache_path, source):
    m = manifest(cache_path)
    for symbol, path in zip(m["symbols"], m["groups"]):
        ds = xr.open_zarr(cache_path, group=path, consolidated=False)
        assert ds.features.dims == ("time", "feature")
        assert ds.time.dtype == np.dtype("datetime64[ns]")
        assert isinstance(ds.indexes["time"], pd.DatetimeIndex) and ds.indexes["time"].is_monotonic_increasing
        np.testing.assert_array_equal(ds.time.values, source[symbol].ts.astype("datetime64[ns]"))
        np.testing.assert_array_equal(ds.features.values, source[symbol].values)
        assert "feature" not in ds.coords  # the names live once, in the root's manifest: one line adds them
        names = zarr.open_group(cache_path, mode="r").attrs["shardcache"]["feature_names"]
        ds = ds.assign_coords(feature=names)
        assert list(ds.feature.values) == ["x0", "x1", "x2"]
        np.testing.assert_array_equal(ds.features.sel(feature="x1").values, source[symbol].values[:, 1])


class CountingStore(WrapperStore):
    """A store that records every key read, whole or in part."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.keys: list[str] = []

    async def get(self, key, prototype, byte_range=None):
        self.keys.append(key)
        return await self._store.get(key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        self.keys.extend(k for k, _ in key_ranges)
        return await self._store.get_partial_values(prototype, key_ranges)


def test_sel_by_time_selects_and_reads_only_the_covering_shards(cache_path, source):
    m = manifest(cache_path)
    i = m["symbols"].index("ES")
    path, ts = m["groups"][i], source["ES"].ts
    store = CountingStore(LocalStore(cache_path, read_only=True))
    ds = xr.open_zarr(store, group=path, consolidated=False)
    a, b = 300, 700  # rows 300..700: shards 1 and 2 of the symbol's 4
    store.keys.clear()
    picked = ds.features.sel(time=slice(pd.Timestamp(ts[a]), pd.Timestamp(ts[b])))
    np.testing.assert_array_equal(picked.values, source["ES"].values[a : b + 1])
    np.testing.assert_array_equal(picked.time.values, ts[a : b + 1].astype("datetime64[ns]"))
    shards_read = {k for k in store.keys if "/features/c." in k}
    assert shards_read == {f"{path}/features/c.1.0", f"{path}/features/c.2.0"}
    day = pd.Timestamp(ts[0]).strftime("%Y-%m-%d")  # a partial date string selects that day
    one_day = ds.features.sel(time=day)
    assert len(one_day) == int(np.sum(ts.astype("datetime64[ns]").astype("datetime64[D]") == np.datetime64(day)))


def test_sel_outside_a_deleted_shard_still_loads(cache_path, source, tmp_path):
    broken = str(tmp_path / "broken.zarr")
    shutil.copytree(cache_path, broken)
    m = manifest(broken)
    path, ts = m["groups"][m["symbols"].index("ES")], source["ES"].ts
    os.remove(os.path.join(broken, *path.split("/"), "features", "c.0.0"))
    ds = xr.open_zarr(broken, group=path, consolidated=False)
    later = ds.features.sel(time=slice(pd.Timestamp(ts[SHARD]), None)).values
    np.testing.assert_array_equal(later, source["ES"].values[SHARD:])
    assert np.isnan(ds.features.isel(time=slice(0, SHARD)).values).all()  # zarr's fill value: check with ls


def test_open_datatree_opens_the_whole_cache(cache_path, source):
    tree = xr.open_datatree(cache_path, engine="zarr", consolidated=False)
    m = dict(tree.attrs["shardcache"])
    assert m["format_version"] == 5
    for symbol, path in zip(m["symbols"], m["groups"]):
        node = tree[path]
        assert node.features.shape == (COUNTS[symbol], 3)
        assert "feature" not in node.coords  # no string array (tensorstore opens none): the manifest names them
        node = node.to_dataset().assign_coords(feature=m["feature_names"])
        np.testing.assert_array_equal(node.features.sel(feature="x2").values, source[symbol].values[:, 2])
        np.testing.assert_array_equal(node.time.values, source[symbol].ts.astype("datetime64[ns]"))
        np.testing.assert_array_equal(node.features.values, source[symbol].values)
    assert sorted(tree["symbols"].children) == sorted(p.split("/")[1] for p in m["groups"])


# -- a Hypothesis round trip -------------------------------------------------------------------

SYMBOL_TEXT = st.one_of(
    st.sampled_from(["BRK/B", "a b", "ÉTÉ", "株式", "x/y/z", "ES.c.0"]),
    st.text(alphabet=string.ascii_letters + string.digits + " /._-éü", min_size=1, max_size=6),
).filter(lambda s: s.strip() == s and s != "")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.dictionaries(SYMBOL_TEXT, st.integers(2, 150), min_size=1, max_size=4),
    n_features=st.integers(1, 4),
    shard_rows=st.sampled_from([8, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_build_then_read_back_symbol_by_symbol_with_plain_zarr(counts, n_features, shard_rows, seed):
    bars = make_bars(counts, n_features=n_features, seed=seed)
    with tempfile.TemporaryDirectory() as work:
        parquet = write_parquet(os.path.join(work, "bars.parquet"), bars, shuffle_seed=seed)
        out = os.path.join(work, "c.zarr")
        build_raw(parquet, out, shard_rows=shard_rows, chunk_rows=shard_rows // 2, max_gap="0")
        root = zarr.open_group(out, mode="r")
        m = dict(root.attrs["shardcache"])
        assert sorted(m["symbols"]) == sorted(counts)
        assert m["bars_per_symbol"] == [counts[s] for s in m["symbols"]]
        for symbol, path in zip(m["symbols"], m["groups"]):
            group = root[path]
            np.testing.assert_array_equal(group["features"][...], bars[symbol].values)
            np.testing.assert_array_equal(group["time"][...], bars[symbol].ts)


def test_plain_xarray_opens_the_cache_without_warnings(cache_path):
    """No zarr warning about unknown objects in the hierarchy or unspecified data types."""
    import warnings

    m = manifest(cache_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = xr.open_zarr(cache_path, group=m["groups"][0], consolidated=False).features.values  # the data read
        xr.open_datatree(cache_path, engine="zarr", consolidated=False)
        list(zarr.open_group(cache_path, mode="r").members(max_depth=None))


# -- other implementations ---------------------------------------------------------------------


def _arrays(group: zarr.Group, prefix: str = ""):
    for name, node in group.members():
        if isinstance(node, zarr.Array):
            yield f"{prefix}{name}"
        else:
            yield from _arrays(node, f"{prefix}{name}/")


@pytest.mark.parametrize("codec", CODECS)
def test_tensorstore_and_zarrs_read_every_array_as_zarr_does(tmp_path, codec):
    """Every array of a cache, read by tensorstore's zarr3 driver and by zarr with the ``zarrs`` codec pipeline
    in strict mode (no fallback to zarr's own), equals zarr's read byte for byte; ``features`` equal
    ``Cache.read_rows`` (the package's own decoder) too."""
    import tensorstore as ts
    from helpers import make_cache, synthetic_bars

    bars = synthetic_bars(1500, 4, n_symbols=2, shard_rows=512)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=512, chunk_rows=64, codec=codec)
    strict = {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True}
    paths = sorted(_arrays(zarr.open_group(cache.url, mode="r")))
    assert {"segments", "symbols/0/features", "symbols/1/time"} <= set(paths)
    for path in paths:
        want = zarr.open_array(cache.url, path=path, mode="r")[...]
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{cache.url}/{path}/"}}
        for got in (
            ts.open(spec, read=True).result().read().result(),
            _with_zarrs(strict, cache.url, path),
        ):
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), path
    for i, n in enumerate(cache.bars_per_symbol.tolist()):
        base = int(cache.rows.bases[i])
        got = _with_zarrs(strict, cache.url, f"{cache.manifest.groups[i]}/features")
        assert got.tobytes() == cache.read_rows(base, base + n).tobytes()


def _with_zarrs(config: dict, url: str, path: str) -> np.ndarray:
    with zarr.config.set(config):
        return zarr.open_array(url, path=path, mode="r")[...]
