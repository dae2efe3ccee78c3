"""Weighted epochs as plain data (``shardcache/read/mixture.py`` through ``make_plan``): exact shares,
cycles (each window once before any twice, no window again before every window was served),
a new subset each epoch, the same plan for the same ``(seed, epoch)``, ranks and elastic resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardcache.errors import OptionError, OptionTypeError
from shardcache.format.windows import Ranges
from shardcache.read.mixture import Mixture, Shares, apportion
from shardcache.read.plan import make_plan

SHARD = 256
ROWS = np.array([0, 4096, 6144], np.int64)  # two sources: rows [0, 4096) and [4096, 6144)
RANGES = Ranges(  # source 0: 3000 windows in two runs; source 1: 500 windows
    start=np.array([0, 2000, 4096 + 100], np.int64),
    count=np.array([1500, 1500, 500], np.int64),
    stride=1,
    span=20,
)
W = (3000, 500)


def sequence(plan) -> np.ndarray:
    """The rank's windows (start rows) in served order."""
    parts = [plan.pool_windows(g, RANGES, SHARD) for g in range(len(plan.pool_bounds) - 1)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def epoch_of(shares, epoch=0, seed=0, world=1, **kw):
    plans = [
        make_plan(RANGES, 6144, SHARD, batch_size=64, seed=seed, epoch=epoch, rank=r, world=world, shares=shares, **kw)
        for r in range(world)
    ]
    return plans, np.concatenate([sequence(p) for p in plans])


def source(rows):
    return (np.asarray(rows) >= ROWS[1]).astype(int)


def test_apportion_is_exact_and_proportional():
    assert apportion(3706, (0.75, 0.25)).tolist() == [2780, 926]
    assert apportion(10, (1, 1, 1)).tolist() == [4, 3, 3]  # the remainder to the first on ties
    assert apportion(7, (0.0, 2.0)).tolist() == [0, 7]
    for total in (1, 99, 1000, 123457):
        got = apportion(total, (0.1, 0.2, 0.7))
        assert got.sum() == total and np.abs(got - total * np.array([0.1, 0.2, 0.7])).max() < 1


@pytest.mark.parametrize("weights,total", [((0.75, 0.25), None), ((0.2, 0.8), 4000), ((0.5, 0.5), 700)])
def test_an_epoch_serves_each_source_its_share(weights, total):
    shares = Mixture.of(weights=weights, epoch_windows=total, n_sources=2).shares(ROWS, RANGES)
    _, seq = epoch_of(shares)
    n = total or sum(W)
    assert shares.windows.tolist() == apportion(n, weights).tolist() and len(seq) == n
    assert np.bincount(source(seq), minlength=2).tolist() == shares.windows.tolist()
    assert abs(np.mean(source(seq) == 0) - weights[0] / sum(weights)) < 0.01  # within 1 %
    assert set(seq) <= set(RANGES.starts())


def test_a_repeated_source_serves_every_window_once_before_any_twice():
    shares = Mixture.of(weights=(0.2, 0.8), epoch_windows=4000, n_sources=2).shares(ROWS, RANGES)
    n1 = int(shares.windows[1])
    assert n1 == 3200 > W[1]
    every = RANGES.starts()[RANGES.starts() >= ROWS[1]]
    for epoch in (0, 1, 2):
        _, seq = epoch_of(shares, epoch)
        mine = seq[source(seq) == 1]  # in the epoch's order
        counts = np.unique(mine, return_counts=True)[1]
        assert len(counts) == W[1] and counts.max() - counts.min() <= 1  # each window 6 or 7 times
        skip = -(epoch * n1) % W[1]  # the rest of the cycle begun in the epoch before, then whole cycles
        assert len(set(mine[:skip])) == skip  # the end of the cycle begun in the epoch before
        whole = mine[skip : skip + W[1] * ((n1 - skip) // W[1])].reshape(-1, W[1])
        assert all(np.array_equal(np.sort(c), every) for c in whole)  # each cycle: every window once


def test_a_subsampled_source_serves_a_new_subset_each_epoch_until_every_window_was_served():
    shares = Mixture.of(weights=(1, 1), epoch_windows=1400, n_sources=2).shares(ROWS, RANGES)
    assert shares.windows.tolist() == [700, 700]
    served = [epoch_of(shares, e)[1] for e in range(5)]
    firsts = [s[source(s) == 0] for s in served]
    seen = np.concatenate(firsts[:4])
    assert len(set(seen)) == len(seen) == 2800  # four epochs: no window of source 0 twice
    assert not set(firsts[0]) & set(firsts[1])  # the next epoch: another subset
    assert len(set(np.concatenate(firsts))) == W[0]  # the fifth ends the first cycle: every window seen
    rest = set(RANGES.starts()[: W[0]].tolist()) - set(seen.tolist())
    assert set(firsts[4][: W[0] - 2800].tolist()) == rest  # served first; only then the second cycle


def test_the_same_seed_and_epoch_give_the_same_plan():
    shares = Mixture.of(weights=(0.75, 0.25), epoch_windows=None, n_sources=2).shares(ROWS, RANGES)
    a, b = epoch_of(shares, 3, seed=9)[1], epoch_of(shares, 3, seed=9)[1]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, epoch_of(shares, 4, seed=9)[1])
    assert not np.array_equal(a, epoch_of(shares, 3, seed=10)[1])


def test_sources_are_interleaved_not_served_one_after_the_other():
    shares = Mixture.of(weights=(0.5, 0.5), epoch_windows=1000, n_sources=2).shares(ROWS, RANGES)
    seq = epoch_of(shares)[1]
    batches = source(seq)[: len(seq) // 64 * 64].reshape(-1, 64)
    assert (batches.min(1) != batches.max(1)).sum() >= 3  # batches of both sources
    switches = np.count_nonzero(np.diff(source(seq)))
    assert switches > 10
    unshuffled = epoch_of(shares, shuffle=False)[1]
    for k in (0, 1):  # without shuffle: row order within each source, evenly interleaved
        mine = unshuffled[source(unshuffled) == k]
        assert np.array_equal(mine, np.sort(mine))
    assert np.abs(np.cumsum(source(unshuffled) == 1) - np.arange(1, 1001) / 2).max() < 260  # a shard at a time


@pytest.mark.parametrize("w1,done,w2", [(2, 3, 3), (3, 2, 1), (1, 4, 2)])
def test_ranks_split_a_weighted_epoch_and_an_elastic_resume_keeps_its_order(w1, done, w2):
    shares = Mixture.of(weights=(0.3, 0.7), epoch_windows=2500, n_sources=2).shares(ROWS, RANGES)
    kw = {"batch_size": 32, "seed": 4, "epoch": 1, "mix": 2, "shares": shares}
    old = [make_plan(RANGES, 6144, SHARD, rank=r, world=w1, **kw) for r in range(w1)]
    assert len({p.n_batches for p in old}) == 1
    whole = np.concatenate([sequence(p) for p in old])
    _, single = epoch_of(shares, 1, seed=4, mix=2)
    assert np.array_equal(np.sort(whole), np.sort(single[: len(whole)]) if w1 == 1 else np.sort(whole))
    assert len(whole) == 2500 - 2500 % w1  # the same multiset, fewer than world windows dropped
    cut = [int(p.batch_bounds[done]) for p in old]
    rest = np.concatenate([sequence(p)[c:] for p, c in zip(old, cut)])
    new = [make_plan(RANGES, 6144, SHARD, rank=r, world=w2, history=[(w1, done)], **kw) for r in range(w2)]
    assert len({p.n_batches for p in new}) == 1
    assert np.array_equal(np.concatenate([sequence(p) for p in new]), rest)  # the rest, once, in its order


def test_no_pool_spans_two_cycles_of_a_source():
    shares = Mixture.of(weights=(0.05, 0.95), epoch_windows=1200, n_sources=2).shares(ROWS, RANGES)
    (plan,), _ = epoch_of(shares, mix=8)
    off = plan.pool_offsets
    seen: set[int] = set()
    cycle = 0
    for g in range(len(plan.pool_bounds) - 1):
        mine = [w for w in sequence(plan)[off[g] : off[g + 1]] if w >= ROWS[1]]
        if set(mine) & seen or len(seen) + len(set(mine)) > W[1]:
            seen, cycle = set(), cycle + 1  # a new cycle starts with a whole pool
        assert len(set(mine)) == len(mine) and not set(mine) & seen
        seen |= set(mine)
    assert cycle == math.ceil(int(shares.windows[1]) / W[1]) - 1


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({"weights": (1,)}, OptionError, "1 weight"),
        ({"weights": (1, -1)}, OptionError, ">= 0"),
        ({"weights": (1, float("nan"))}, OptionError, "finite"),
        ({"weights": (True, 1)}, OptionError, "True and False are not weights"),
        ({"weights": (0, 0)}, OptionError, "above 0"),
        ({"weights": "0.5,0.5"}, OptionTypeError, "one number per cache"),
        ({"epoch_windows": 10}, OptionError, "epoch_windows=10: applies with weights;"),
        ({"weights": (1, 1), "epoch_windows": 0}, OptionError, "epoch_windows=0"),
        ({"weights": (1, 1), "epoch_windows": 2.5}, OptionTypeError, "epoch_windows=2.5: expected a whole number"),
    ],
)
def test_mixture_settings_are_refused_in_one_line_naming_them(kw, error, match):
    with pytest.raises(error, match=match) as info:
        Mixture.of(**{"weights": None, "epoch_windows": None, **kw}, n_sources=2)
    assert "\n" not in str(info.value)


def test_shares_are_none_without_weights():
    assert Mixture.of(weights=None, epoch_windows=None, n_sources=3).shares(ROWS, RANGES) is None
    assert isinstance(Mixture.of(weights=(1, 2), epoch_windows=None, n_sources=2).shares(ROWS, RANGES), Shares)


def test_an_epoch_of_more_than_max_passes_over_a_source_is_refused_fast_naming_the_most_it_takes():
    """``epoch_windows=10**12`` once made a constructor that did not return: the plan would list every pass."""
    import time

    from shardcache.read.mixture import MAX_PASSES

    most = MAX_PASSES * W[1] * 2  # the smaller source bounds it: (1, 1) gives it half the epoch
    ok = Mixture.of(weights=(1, 1), epoch_windows=most, n_sources=2).shares(ROWS, RANGES)
    _, served = epoch_of(ok)
    assert len(served) == most
    t0 = time.perf_counter()
    for total in (most + 2, 10**12, 2**62 - 1):
        huge = Mixture.of(weights=(1, 1), epoch_windows=total, n_sources=2).shares(ROWS, RANGES)
        with pytest.raises(
            OptionError, match=rf"pass over cache 1's 500 windows [\d,]+ times; at most 10,000 .* <= {most:,}"
        ):
            epoch_of(huge)
    assert time.perf_counter() - t0 < 5
