"""Integrity: ``shardcache verify`` names every damaged shard, and readers raise instead of returning garbage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardcache import CacheError, WindowDataset, WindowStream, open_cache
from shardcache.cli import main
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.inspect.verify import compare_caches, verify_cache

SHARD = 512  # symbol 0 (rows 0..~6,500) spans shards 0-12, so shard numbers below are its rows


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    files = make_sample(tmp_path_factory.mktemp("dbn"), days=14, seed=5)
    out = tmp_path_factory.mktemp("built") / "c.zarr"
    build_cache(files, out, split="train=0.8,val=0.1,test=0.1", shard_rows=SHARD, chunk_rows=128, progress=False)
    return out


@pytest.fixture
def cache(built, tmp_path) -> Path:
    """A private copy of the built cache, free to damage."""
    return Path(shutil.copytree(built, tmp_path / "c.zarr"))


def flip(path: Path, where: float = 0.5) -> None:
    """Flip one bit of the byte at fraction ``where`` of the file."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x10
    path.write_bytes(bytes(data))


def run_verify(capsys, path: Path, *flags: str) -> tuple[int, str]:
    code = main(["verify", str(path), *flags])
    return code, capsys.readouterr().out


def test_a_sound_cache_verifies(cache, capsys):
    code, out = run_verify(capsys, cache)
    n = open_cache(cache).n_shards
    assert code == 0 and out.strip() == out.strip().splitlines()[-1]
    assert f"OK ({n} shards" in out and f"{n} digests checked" in out
    report = json.loads(run_verify(capsys, cache, "--json")[1])
    assert report["ok"] and report["bad_shards"] == [] and report["digests_checked"] == n


def test_flipped_bytes_are_named_by_verify_and_raised_by_readers(cache, capsys):
    flip(cache / "symbols" / "0" / "features" / "c.3.0", 0.5)
    flip(cache / "symbols" / "0" / "features" / "c.1.0", 0.999)  # in the shard index
    flip(cache / "symbols" / "0" / "time" / "c.2", 0.5)
    code, out = run_verify(capsys, cache)
    lines = out.strip().splitlines()
    assert code == 1
    assert lines[0].startswith("symbols/0/features/c.1.0: corrupt (crc32c checksum mismatch")
    assert lines[1].startswith("symbols/0/time/c.2: corrupt") and lines[2].startswith(
        "symbols/0/features/c.3.0: corrupt"
    )
    assert "3 bad shard(s)" in lines[-1]
    assert verify_cache(cache).bad_shards == [
        "symbols/0/features/c.1.0",
        "symbols/0/features/c.3.0",
        "symbols/0/time/c.2",
    ]

    c = open_cache(cache)
    with pytest.raises(CacheError, match=r"shard 1 \(symbols/0/features/c.1.0\) is corrupt: crc32c checksum mismatch"):
        c.read_rows(0, c.rows.region_stop(0))  # one read over all of symbol 0's shards names the first that fails
    with pytest.raises(CacheError, match=r"shard 3 \(symbols/0/features/c.3.0\) is corrupt"):
        c.read_rows(3 * SHARD - 10, 4 * SHARD)
    assert np.isfinite(c.read_rows(0, SHARD)).all()  # sound shards still read
    with pytest.raises(CacheError, match=r"symbols/0/features/c.[13].0\) is corrupt"):
        for _ in WindowStream(c, seq_len=30, split="all", batch_size=512, shuffle=False):
            pass
    ds = WindowDataset(c, seq_len=30, split="all")
    with pytest.raises(CacheError, match=r"symbols/0/features/c.3.0"):
        ds[int(np.searchsorted([ds.row(i) for i in range(0, len(ds), 10)], 3 * SHARD + 100)) * 10]


def test_missing_and_truncated_shards(cache, capsys):
    (cache / "symbols" / "0" / "features" / "c.2.0").unlink()
    (cache / "symbols" / "0" / "time" / "c.4").unlink()
    shard5 = cache / "symbols" / "0" / "features" / "c.5.0"
    shard5.write_bytes(shard5.read_bytes()[:1000])
    code, out = run_verify(capsys, cache)
    assert code == 1
    assert (
        "symbols/0/features/c.2.0: missing" in out
        and "symbols/0/time/c.4: missing" in out
        and "symbols/0/features/c.5.0: corrupt" in out
    )
    c = open_cache(cache)
    with pytest.raises(CacheError, match=r"shard 2 \(symbols/0/features/c.2.0\) is missing"):
        c.read_rows(2 * SHARD + 5, 2 * SHARD + 50)  # zarr alone would return NaN here
    with pytest.raises(CacheError, match="symbols/0/features/c.2.0"):
        WindowDataset(c, seq_len=30, split="all")[int(2.2 * SHARD)]


def test_rewritten_rows_fail_their_digest(cache, capsys):
    group = zarr.open_group(str(cache), mode="r+")
    rows = group["symbols/0/features"][6 * SHARD : 7 * SHARD]
    rows[17, 2] += 1e-3  # valid bytes and checksums, wrong data
    group["symbols/0/features"][6 * SHARD : 7 * SHARD] = rows
    code, out = run_verify(capsys, cache)
    assert code == 1 and out.startswith("symbols/0/features/c.6.0: rows differ from the digest recorded at build time")


def test_edited_chunk_moments_are_named_by_verify(cache, capsys):
    """The root's chunk moments give read-time statistics: an edited mean (valid bytes, wrong value) is found."""
    group = zarr.open_group(str(cache), mode="r+")
    mean = group["chunk_mean"][...]
    first = open_cache(cache).shard_index().first_chunks
    mean[first[6], 1] += 0.5  # the first chunk of shard 6 (symbol 0's seventh shard)
    group["chunk_mean"][...] = mean
    code, out = run_verify(capsys, cache)
    assert code == 1
    assert out.startswith(
        "symbols/0/features/c.6.0: the root's chunk moments (chunk_count, chunk_mean, chunk_m2) differ"
    )


def test_timestamps_and_segment_table(cache, capsys):
    group = zarr.open_group(str(cache), mode="r+")
    c = open_cache(cache)
    seg = c.segments.copy()
    inside = int(seg[np.argmax(seg[:, 2] - seg[:, 1]), 1]) + 5  # a row in the middle of a long segment
    times = group["symbols/0/time"]  # symbol 0's virtual rows are its own rows
    ts = times[inside - 1 : inside + 1]
    times[inside - 1 : inside + 1] = ts[::-1]
    index = group["segments"][...]  # the root segment index: symbol, start, stop, split
    index[3, 2] -= 1  # a one-row gap between segments 3 and 4
    index[0, 3] = 7
    one, two = np.flatnonzero(index[:, 0] == 1), np.flatnonzero(index[:, 0] == 2)
    index[one[0], 1] = 3  # symbol 1's rows 0-2 in no segment
    k = two[len(two) // 2]
    index[k, 2] = index[k, 1]  # an empty segment of symbol 2 (and a gap after it)
    group["segments"][...] = index
    shards = group["shards"][...]  # the root shard index: symbol, shard, rows, first and last bar, bytes
    shards[2, 4] -= 60
    group["shards"][...] = shards
    report = verify_cache(cache)
    text = [str(p) for p in report.problems]
    shard = (inside - 1) // SHARD
    assert any(
        t.startswith(f"symbols/0/time/c.{shard}: timestamps not strictly increasing") and f"row {inside}" in t
        for t in text
    ), text
    assert any(t.startswith(f"segments: 1 gap(s) or overlap(s) in {c.symbols[0]}'s rows") for t in text), text
    assert "segments: split ids outside 0-2" in text
    assert f"segments: {c.symbols[1]}'s segments do not cover its rows 0-{c.bars_per_symbol[1]}" in text
    assert f"segments: 1 empty or reversed segment(s) of {c.symbols[2]}, first at row {index[k, 1]}" in text
    assert any(t.startswith("shards: row 2 (symbols/0/time/c.2): first and last bar times") for t in text), text
    assert run_verify(capsys, cache)[0] == 1


def test_each_zarr_json_and_shard_size_is_checked_against_the_layout_and_the_root_index(cache):
    c = open_cache(cache)
    first = int(c.rows.bases[1]) // SHARD  # symbol 1's first shard
    group = zarr.open_group(str(cache), mode="r+")
    shards = group["shards"][...]
    shards[first, 5] += 1  # its stored bytes, one more than the object holds
    group["shards"][...] = shards
    features = cache / "symbols" / "1" / "features" / "zarr.json"
    meta = json.loads(features.read_text())
    meta["dimension_names"] = ["t", "f"]
    features.write_text(json.dumps(meta))
    (cache / "symbols" / "1" / "time" / "zarr.json").unlink()
    (cache / "symbols" / "zarr.json").write_text("{")
    text = [str(p) for p in verify_cache(cache).problems]
    size = (cache / "symbols" / "1" / "features" / "c.0.0").stat().st_size
    assert text[0].startswith("symbols/zarr.json: unreadable (JSONDecodeError")
    assert (
        "symbols/1/features/zarr.json: differs from the zarr.json build-cache writes for this layout (dimension_names)"
        in text
    )
    assert "symbols/1/time/zarr.json: missing" in text
    assert f"symbols/1/features/c.0.0: {size:,} bytes, the root index (shards) says {size + 1:,}" in text
    assert len(text) == 4, text


def test_damaged_segment_table_cannot_be_opened(cache, capsys):
    flip(cache / "segments" / "c.0.0", 0.5)
    with pytest.raises(CacheError, match=r"segment table .* damaged: crc32c checksum mismatch"):
        open_cache(cache)
    assert run_verify(capsys, cache)[0] == 2


def test_compare_caches(built, cache):
    assert compare_caches(built, cache) == []
    group = zarr.open_group(str(cache), mode="r+")
    group["symbols/0/features"][5, 0] = 0.0
    assert compare_caches(built, cache) == ["symbols/0/features/c.0.0 differs"]
