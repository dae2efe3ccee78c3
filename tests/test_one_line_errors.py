"""Damage and bad counts found in review: each ends in one line naming the problem, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import make_cache, synthetic_bars

from shardcache.cli import main
from shardcache.errors import CacheError
from shardcache.format.cache import open_cache


@pytest.fixture
def cache(tmp_path) -> Path:
    make_cache(
        tmp_path / "c.zarr",
        synthetic_bars(3000, 3, n_symbols=2, seed=2, shard_rows=512),
        shard_rows=512,
        chunk_rows=128,
    )
    return tmp_path / "c.zarr"


def test_damaged_array_metadata_is_one_line(cache, capsys):
    (cache / "symbols" / "0" / "time" / "zarr.json").write_text("{ not json")
    with pytest.raises(CacheError, match=r"symbols/0/time cannot be opened .*; rebuild the cache"):
        open_cache(cache).array(0, "time")
    assert main(["verify", str(cache)]) in (1, 2)
    err = capsys.readouterr()
    assert "Traceback" not in err.err + err.out and "symbols/0/time" in err.err + err.out


def test_a_segment_index_ahead_of_the_manifest_is_refused(cache):
    """What a reader of an object store can meet while an append writes the index before the manifest."""
    zarr_json = cache / "zarr.json"
    meta = json.loads(zarr_json.read_text())
    manifest = meta["attributes"]["shardcache"]
    manifest["bars_per_symbol"] = [int(n) - 10 for n in manifest["bars_per_symbol"]]
    zarr_json.write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="segment index and the manifest disagree.*open the cache again"):
        open_cache(cache)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["sample", "OUT", "--days", "0"], "--days 0"),
        (["demo", "--dir", "OUT", "--seq-len", "0"], "--seq-len 0"),
        (["demo", "--dir", "OUT", "--days", "-1"], "--days -1"),
    ],
)
def test_counts_below_one_are_refused_before_anything_is_written(tmp_path, capsys, argv, flag):
    out = tmp_path / "out"
    assert main([str(out) if a == "OUT" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "must be at least 1" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("kwargs, match", [({"seq_len": 0}, "seq_len"), ({"memory_budget": "lots"}, "memory_budget")])
def test_stream_options_are_checked_before_the_cache_is_opened(tmp_path, kwargs, match):
    from shardcache.read.stream import WindowDataset, WindowStream

    seq_len = kwargs.pop("seq_len", 10)
    with pytest.raises(ValueError, match=match):
        WindowStream(tmp_path / "missing.zarr", seq_len, **kwargs)
    if not kwargs:
        with pytest.raises(ValueError, match=match):
            WindowDataset(tmp_path / "missing.zarr", seq_len)
