"""Moments of any range from its blocks' moments and its edges' bars equal numpy's over the range's bars."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcache.format.moments import Moments, range_moments


@st.composite
def series(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int]:
    n = draw(st.integers(1, 400))
    f = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((n, f)) * rng.uniform(0.01, 1e3, f) + rng.uniform(-1e4, 1e4, f)).astype(np.float32)
    block = draw(st.integers(1, 64))
    starts = np.arange(0, n, block)
    lo = draw(st.integers(0, n))
    hi = draw(st.integers(lo, n))
    return x, starts, lo, hi


@settings(max_examples=200, deadline=None)
@given(series())
def test_a_range_s_moments_equal_numpy_s(case: tuple[np.ndarray, np.ndarray, int, int]) -> None:
    x, starts, lo, hi = case
    blocks = Moments.of(x, starts)
    reads: list[tuple[int, int]] = []

    def read(a: int, b: int) -> np.ndarray:
        reads.append((a, b))
        return x[a:b]

    got = range_moments(blocks, starts, lo, hi, read)
    want = x[lo:hi].astype(np.float64)
    assert int(got.count[0]) == hi - lo
    assert len(reads) <= 2  # only the edges are read
    if hi > lo:
        scale = float(np.abs(want).max()) + 1
        np.testing.assert_allclose(got.mean[0], want.mean(axis=0), rtol=1e-12, atol=1e-12 * scale)
        np.testing.assert_allclose(got.m2[0] / (hi - lo), want.var(axis=0), rtol=1e-9, atol=1e-12 * scale**2)
        np.testing.assert_allclose(got.std[0], np.where(want.std(axis=0) > 0, want.std(axis=0), 1.0), rtol=1e-9)


def test_merging_nothing_gives_zero_bars_and_unit_std() -> None:
    empty = Moments.empty(3).merged()
    assert int(empty.count[0]) == 0
    np.testing.assert_array_equal(empty.std[0], np.ones(3))


def test_a_constant_feature_is_centred_not_scaled() -> None:
    x = np.column_stack([np.full(10, 7.0), np.arange(10.0)])
    m = Moments.of(x, np.array([0, 3, 9])).merged()
    assert m.mean[0, 0] == 7.0 and m.std[0, 0] == 1.0
    assert np.isclose(m.std[0, 1], np.arange(10.0).std())


def _plain_chunk_moments(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The root's chunk moments as plain zarr reads them, and numpy's over each inner chunk of the plain bars."""
    import zarr

    root = zarr.open_group(path, mode="r")
    attrs = root.attrs["shardcache"]
    shards = np.asarray(root["shards"][...])
    counts, means, m2s = [], [], []
    for i, group in enumerate(attrs["groups"]):
        x = np.asarray(root[f"{group}/features"][...], dtype=np.float64)
        mine = shards[shards[:, 0] == i]
        start = 0
        for _sym, _shard, rows, *_, chunk in mine.tolist():
            for a in range(start, start + rows, chunk):
                part = x[a : min(a + chunk, start + rows)]
                counts.append(len(part))
                means.append(part.mean(axis=0))
                m2s.append(((part - part.mean(axis=0)) ** 2).sum(axis=0))
            start += rows
    stored = tuple(np.asarray(root[name][...]) for name in ("chunk_count", "chunk_mean", "chunk_m2"))
    return (*stored, np.asarray(counts), np.asarray(means), np.asarray(m2s))  # type: ignore[return-value]


def _assert_root_moments(path: str) -> None:
    count, mean, m2, want_count, want_mean, want_m2 = _plain_chunk_moments(path)
    np.testing.assert_array_equal(count, want_count)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(m2, want_m2, rtol=1e-9, atol=1e-6)


def test_the_root_holds_every_inner_chunk_s_moments_after_a_build_and_an_append(tmp_path, twenty_days):
    """Each inner chunk's count, mean and M2 at the root equal numpy's over that chunk's bars read with plain
    zarr; an append that rewrites a tail shard and adds shards replaces exactly those shards' moments."""
    from shardcache import append_cache, build_cache

    files = sorted(twenty_days)
    out = str(tmp_path / "c.zarr")
    build_cache(files[:-1], out, shard_rows=1024, chunk_rows=128, workers=1, progress=False)
    _assert_root_moments(out)
    before = np.asarray(__import__("zarr").open_group(out, mode="r")["chunk_count"][...])
    append_cache(files[-1:], out, progress=False)
    _assert_root_moments(out)
    after = np.asarray(__import__("zarr").open_group(out, mode="r")["chunk_count"][...])
    assert after.sum() > before.sum()  # the append's bars are counted


def test_train_statistics_come_from_the_root_moments(tmp_path, twenty_days):
    """A stream's train statistics equal numpy's over the plain-zarr train bars, and opening the stream reads
    only the bars of the chunks the train range's edges cut: with a shard inside the range deleted, the
    statistics are the same."""
    import os

    import zarr

    from shardcache import WindowStream, build_cache

    out = str(tmp_path / "c.zarr")
    build_cache(sorted(twenty_days), out, shard_rows=1024, chunk_rows=128, workers=1, progress=False, normalize="none")
    root = zarr.open_group(out, mode="r")
    attrs = root.attrs["shardcache"]
    cut = "2023-03-14"
    cut_ns = np.datetime64(cut, "ns").astype(np.int64)
    bars = []
    for group in attrs["groups"]:
        t = np.asarray(root[f"{group}/time"][...])
        bars.append(np.asarray(root[f"{group}/features"][...], dtype=np.float64)[t < cut_ns])
    x = np.concatenate(bars)
    for group in attrs["groups"]:
        os.remove(f"{out}/{group}/features/c.1.0")  # the symbol's second shard: well inside the train range
    stats = WindowStream(out, 30, split_times={"val": cut}, split="train", normalize="zscore").stats
    assert stats is not None
    np.testing.assert_allclose(stats.mean, x.mean(axis=0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(stats.std, np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0), rtol=1e-8)
