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
