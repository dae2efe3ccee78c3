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


@pytest.mark.parametrize(
    "where, match",
    [
        ("memory", "segment index and the manifest disagree.*being written to this object store.*open the cache again"),
        (
            "local",
            "segment index and the manifest disagree on the bars of .*the manifest was edited.*shardcache verify",
        ),
    ],
)
def test_a_segment_index_ahead_of_the_manifest_is_refused(cache, where, match):
    """What a reader of an object store can meet while an append writes the index before the manifest; on a
    local cache (an append is swapped in whole) it is an edit, and said so (issue 20)."""
    import uuid

    import fsspec

    if where == "memory":
        url = f"memory://{uuid.uuid4().hex}/c.zarr"
        fsspec.filesystem("memory").put(str(cache), url, recursive=True)
    else:
        url = str(cache)
    fs, path = fsspec.core.url_to_fs(f"{url}/zarr.json")
    meta = json.loads(fs.cat_file(path))
    manifest = meta["attributes"]["shardcache"]
    manifest["bars_per_symbol"] = [int(n) - 10 for n in manifest["bars_per_symbol"]]
    fs.pipe_file(path, json.dumps(meta).encode())
    with pytest.raises(CacheError, match=match) as refused:
        open_cache(url)
    assert where == "memory" or "object store" not in str(refused.value)


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
