"""The format-4 contract: per-symbol groups and the root index as plain zarr sees them, the virtual row space,
old formats refused."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import make_cache, synthetic_bars

from shardcache import CacheError, open_cache
from shardcache.format.layout import FORMAT_VERSION, TIME_ATTRS, shard_digest, symbol_bases, symbol_chunk_rows

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
    assert m["format_version"] == FORMAT_VERSION == 5 and m["complete"]
    assert m["groups"] == [f"symbols/{i}" for i in range(4)]
    assert m["feature_names"] == ["f0", "f1", "f2"] and "feature" not in g  # the names in the manifest alone
    for i, path in enumerate(m["groups"]):
        rows = _symbol_rows(bars, i)
        f, t = g[path]["features"], g[path]["time"]
        assert f.shape == (rows.stop - rows.start, 3) == (m["bars_per_symbol"][i], 3)
        assert f.metadata.dimension_names == ("time", "feature") and t.metadata.dimension_names == ("time",)
        np.testing.assert_array_equal(f[...], bars.features[rows])  # no fill rows
        np.testing.assert_array_equal(t[...], bars.ts[rows])
        assert dict(t.attrs) == TIME_ATTRS and dict(f.attrs) == {}
        assert sorted(g[path].array_keys()) == ["features", "time"]  # nothing else per symbol


def test_a_symbol_is_its_documents_and_chunks_only(cache):
    """Per symbol: its group's, features' and time's zarr.json plus one shard and one time chunk per
    shard; everything else is at the root, whatever the number of symbols."""
    root = Path(cache.url)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    for i in range(4):
        n_shards = -(-int(cache.bars_per_symbol[i]) // SHARD)
        mine = [f for f in files if f.startswith(f"symbols/{i}/")]
        assert sorted(mine) == sorted(
            [f"symbols/{i}/zarr.json", f"symbols/{i}/features/zarr.json", f"symbols/{i}/time/zarr.json"]
            + [f"symbols/{i}/features/c.{k}.0" for k in range(n_shards)]
            + [f"symbols/{i}/time/c.{k}" for k in range(n_shards)]
        )
    assert [f for f in files if f.count("/") < 2 or not f.startswith("symbols/")] == [
        "chunk_count/c.0",
        "chunk_count/zarr.json",
        "chunk_m2/c.0.0",
        "chunk_m2/zarr.json",
        "chunk_mean/c.0.0",
        "chunk_mean/zarr.json",
        "segments/c.0.0",
        "segments/zarr.json",
        "shard_digests/c.0.0",
        "shard_digests/zarr.json",
        "shards/c.0.0",
        "shards/zarr.json",
        "symbols/zarr.json",
        "zarr.json",
    ]  # a build adds history/zarr.json


def test_documents_of_equal_bytes_share_a_file_and_are_replaced_alone(tmp_path):
    """Locally, the documents of equal bytes (every group's; ``features``' and ``time``'s of symbols of one
    length) are hard links to one file: a name each, no inode each (most of a file's cost on a journaling
    file system). A write through zarr or the writer replaces one name by a rename and leaves the rest."""
    from shardcache.format.writer import CacheWriter

    writer = CacheWriter(tmp_path / "c.zarr", feature_names=["a", "b"], bars_per_symbol=[300, 300, 300, 500],
                         shard_rows=SHARD * 4, chunk_rows=SHARD)  # fmt: skip
    root = tmp_path / "c.zarr" / "symbols"

    def inode(i: int, doc: str) -> int:
        return (root / str(i) / doc).stat().st_ino

    for doc in ("zarr.json", "features/zarr.json", "time/zarr.json"):
        assert inode(0, doc) == inode(1, doc) == inode(2, doc)
    assert inode(3, "zarr.json") == inode(0, "zarr.json")
    assert inode(3, "features/zarr.json") != inode(0, "features/zarr.json")  # another length
    assert zarr.open_array(root / "3" / "features", mode="r").shape == (500, 2)
    before = (root / "0" / "zarr.json").read_bytes()
    zarr.open_group(root / "1", mode="r+").attrs["note"] = "mine"
    assert (root / "0" / "zarr.json").read_bytes() == before and "note" not in zarr.open_group(root / "2").attrs
    writer.bars_per_symbol[2] = 400  # an append grows symbol 2: its documents are rewritten
    writer.write_symbols([2])
    assert zarr.open_array(root / "2" / "features", mode="r").shape == (400, 2)
    assert zarr.open_array(root / "0" / "features", mode="r").shape == (300, 2)


def test_the_root_index_describes_every_shard(cache, bars):
    g = zarr.open_group(cache.url, mode="r")
    table, digests = g["shards"][...], g["shard_digests"][...]
    fields = ["symbol", "shard", "rows", "first_ts", "last_ts", "stored_bytes", "chunk_rows"]
    assert g["shards"].attrs["fields"] == fields
    assert table.shape == (cache.n_shards, 7) and digests.shape == (cache.n_shards, 2) and digests.dtype == np.uint64
    for s, (i, k, rows, first, last, stored, chunk_rows) in enumerate(table.tolist()):
        assert cache.rows.shard_symbol(s) == (i, k)
        a, b = cache.rows.shard_table[s, 1:].tolist()
        assert rows == b - a and (first, last) == (bars.ts[a], bars.ts[b - 1])
        assert stored == (Path(cache.url) / cache.shard_key(s)).stat().st_size
        assert digests[s].astype("<u8").tobytes().hex() == shard_digest(bars.features[a:b])
        assert chunk_rows == g[f"symbols/{i}/features"].metadata.codecs[0].chunk_shape[0] == 64
    np.testing.assert_array_equal(cache.root_shards, table)
    local = g["segments"][...]
    for i in range(4):
        rows = _symbol_rows(bars, i)
        seg = bars.segments[bars.segments[:, 0] == i]
        np.testing.assert_array_equal(local[local[:, 0] == i, 1:3], seg[:, 1:] - rows.start)


def test_a_short_symbols_inner_chunks_are_halved_while_they_hold_it():
    assert symbol_chunk_rows([1, 300, 600, 5000, 8192, 10**6], 8192).tolist() == [512, 512, 1024, 8192, 8192, 8192]
    assert symbol_chunk_rows([10, 100, 200], 250).tolist() == [125, 125, 250]  # 125 is odd: it divides no further
    assert symbol_chunk_rows([3], 1).tolist() == [1]


def test_virtual_rows_locate_symbols_and_their_rows(cache, bars):
    bases = symbol_bases(cache.bars_per_symbol, SHARD)
    np.testing.assert_array_equal(cache.rows.bases, bases)
    assert cache.n_rows == bases[-1] == bars.features.shape[0] and np.all(bases % SHARD == 0)
    np.testing.assert_array_equal(cache.segments, bars.segments)
    rows = np.concatenate([np.arange(bases[i], bases[i] + cache.bars_per_symbol[i]) for i in range(4)])
    sym, local = cache.rows.locate(rows)
    assert sym.dtype == local.dtype == np.int64
    np.testing.assert_array_equal(cache.array(0, "time")[...], cache.bar_times(rows[sym == 0]))
    np.testing.assert_array_equal(cache.bar_times(rows), bars.ts[rows])
    for i in range(4):
        np.testing.assert_array_equal(local[sym == i], np.arange(cache.bars_per_symbol[i]))
        assert cache.rows.region_stop(int(bases[i]) + 3) == bases[i] + cache.bars_per_symbol[i]
    a, b = int(bases[2]) + 10, int(bases[2] + cache.bars_per_symbol[2])
    np.testing.assert_array_equal(cache.read_rows(a, b), bars.features[a:b])
    with pytest.raises(IndexError, match="inside one symbol"):
        cache.read_rows(a, int(bases[3]) + 1)


def test_read_many_reads_what_read_rows_reads_and_checks_once(cache, bars, monkeypatch):
    """``read_many`` (a reader's group of small blocks) fills each block as ``read_rows`` does, refuses a block
    outside one symbol before reading any, and checks that the cache was not replaced once after them all."""
    bases = cache.rows.bases
    starts = np.array([int(bases[i]) + k for i in range(4) for k in (0, 7)], dtype=np.int64)
    stops = np.minimum(starts + 40, np.repeat(bases[:4] + cache.bars_per_symbol, 2))
    outs = [np.full((int(b - a), 3), np.nan, np.float32) for a, b in zip(starts, stops)]
    checks = []
    real = type(cache).check_same
    monkeypatch.setattr(type(cache), "check_same", lambda self: checks.append(1) or real(self))
    cache.read_many(starts, stops, outs)
    for a, b, out in zip(starts.tolist(), stops.tolist(), outs):
        np.testing.assert_array_equal(out, bars.features[a:b])
    assert len(checks) == 1
    cache.read_many(starts, stops, outs, check=False)
    assert len(checks) == 1
    far = [np.empty((int(bases[3]) + 1 - int(bases[2]) - 10, 3), np.float32)]
    with pytest.raises(IndexError, match="inside one symbol"):
        cache.read_many(np.array([int(bases[2]) + 10]), np.array([int(bases[3]) + 1]), far)


def test_read_many_names_a_missing_shard(cache, tmp_path):
    import shutil

    out = tmp_path / "c.zarr"
    shutil.copytree(cache.url, out)
    shutil.rmtree(out / "symbols" / "2")
    c = open_cache(out)
    a = np.array([0, int(c.rows.bases[2])], dtype=np.int64)
    with pytest.raises(CacheError, match=r"shard \d+ \(symbols/2/features/c.0.0\) is missing"):
        c.read_many(a, a + 2, [np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)])


def test_shards_written_together_are_the_shards_written_one_at_a_time(tmp_path):
    """``CacheWriter.write_shards`` (a build task's shards, each step for all of them in turn) writes the same
    objects, byte for byte, and the same root index as ``write_shard`` called for each shard."""
    bars = synthetic_bars(3000, 3, n_symbols=25, seed=9, shard_rows=64)
    one = make_cache(tmp_path / "one.zarr", bars, shard_rows=64, chunk_rows=16)
    both = make_cache(tmp_path / "both.zarr", bars, shard_rows=64, chunk_rows=16, together=True)
    files = sorted(p.relative_to(tmp_path / "one.zarr") for p in (tmp_path / "one.zarr").rglob("*") if p.is_file())
    assert len(files) > 4 * 25 and files == sorted(
        p.relative_to(tmp_path / "both.zarr") for p in (tmp_path / "both.zarr").rglob("*") if p.is_file()
    )
    for f in files:
        assert (tmp_path / "one.zarr" / f).read_bytes() == (tmp_path / "both.zarr" / f).read_bytes(), f
    np.testing.assert_array_equal(one.shard_index().table, both.shard_index().table)


def test_shard_keys_name_real_objects(cache):
    for shard, a, _ in cache.rows.shard_table.tolist():
        i, local = cache.rows.shard_symbol(shard)
        assert cache.shard_key(shard) == f"symbols/{i}/features/c.{local}.0"
        assert cache.shard_key(shard, "time") == f"symbols/{i}/time/c.{local}"
        assert (Path(cache.url) / cache.shard_key(shard)).is_file() and (
            Path(cache.url) / cache.shard_key(shard, "time")
        ).is_file()
        assert a == cache.rows.bases[i] + local * SHARD


def test_a_pickled_cache_reopens(cache, bars):
    copy = pickle.loads(pickle.dumps(cache))
    stop = copy.rows.region_stop(0)
    np.testing.assert_array_equal(copy.read_rows(0, stop), bars.features[:stop])


@pytest.mark.parametrize("version", [1, 2, 3, 4])
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
    with pytest.raises(CacheError, match=r"shard \d+ \(symbols/2/features/c.0.0\) is missing"):
        c.read_rows(int(c.rows.bases[2]), int(c.rows.bases[2]) + 5)
