"""Damaged or edited metadata says what is wrong and what to do (issue 20): a truncated root
``zarr.json``, a symbol array whose shape disagrees with the manifest, read by a real ``WindowStream``,
``WindowDataset`` and the CLI. The stream reads each symbol's rows by the manifest (issue 21: no
``zarr.json`` per symbol), so an edited array shape changes nothing it serves; ``verify`` names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ohlcv_files import ohlcv, write_parquet

from shardcache.cli import main
from shardcache.errors import CacheError
from shardcache.format.cache import open_cache
from shardcache.ingest.builder import build_cache
from shardcache.read.stream import WindowDataset, WindowStream


@pytest.fixture
def cache(tmp_path) -> Path:
    out = tmp_path / "c.zarr"
    es = write_parquet(tmp_path / "ES.parquet", ohlcv(3158, seed=1))
    nq = write_parquet(tmp_path / "NQ.parquet", ohlcv(2000, seed=2))
    build_cache([es, nq], out, shard_rows=1024, chunk_rows=128, progress=False)
    return out


def test_a_truncated_root_metadata_says_the_cache_is_damaged(cache, capsys):
    meta = cache / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:100])
    match = r"c.zarr: the cache's metadata \(zarr.json\) is damaged \(JSONDecodeError: .*\); rebuild the cache"
    for opener in (open_cache, lambda p: WindowStream(p, 10), lambda p: WindowDataset(p, 10)):
        with pytest.raises(CacheError, match=match):
            opener(cache)
    for command in ("info", "ls", "verify"):
        assert main([command, str(cache)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1 and "the cache's metadata (zarr.json) is damaged" in err[0] and "no cache found" not in err[0]
        )


def _edit_shape(cache: Path, rows: int) -> None:
    path = cache / "symbols" / "0" / "features" / "zarr.json"
    meta = json.loads(path.read_text())
    meta["shape"][0] = rows
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("rows", [3000, 4000])
def test_an_array_shape_edit_changes_nothing_the_stream_serves_and_verify_names_it(cache, capsys, rows):
    with WindowStream(cache, 10, batch_size=64, shuffle=False) as stream:
        want = list(stream)
    first = WindowDataset(cache, 10)[0]
    _edit_shape(cache, rows)
    with WindowStream(cache, 10, batch_size=64, shuffle=False) as stream:  # the manifest's rows, as before
        got = list(stream)
    assert len(got) == len(want) and all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
    again = WindowDataset(cache, 10)[0]
    assert torch.equal(again.x, first.x) and torch.equal(again.y, first.y)
    assert main(["verify", str(cache)]) == 1  # verify lists it as a finding
    assert f"symbols/0/features: shape ({rows}, 9), manifest says (3158, 9)" in capsys.readouterr().out
