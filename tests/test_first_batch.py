"""The first batch waits for nothing it does not need: the first run is one batch, and the reader
hands it over before it decodes any later pool (timings: `tools/bench.py first`)."""

from __future__ import annotations

import numpy as np
import pytest

from shardcache.read.plan import PoolLayout, make_plan, pool_layout, reader_runs, valid_ranges
from shardcache.read.stream import WindowStream


def test_the_first_run_is_one_batch_and_the_rest_are_runs(stream_cache):
    r = valid_ranges(stream_cache, 10, split="all")
    plan = make_plan(r, stream_cache.n_rows, stream_cache.shard_rows, batch_size=16, seed=1, mix=2)
    runs = list(reader_runs(plan, range(plan.n_batches), 10**6))
    assert runs[0].first == runs[0].last == 0
    assert any(run.last > run.first for run in runs[1:])  # later runs still copy batches together
    assert [i for run in runs for i in range(run.first, run.last + 1)] == list(range(plan.n_batches))


def test_a_pool_layout_shuffles_only_when_its_order_is_asked_for(stream_cache, monkeypatch):
    r = valid_ranges(stream_cache, 10, split="all")
    plan = make_plan(r, stream_cache.n_rows, stream_cache.shard_rows, batch_size=16, seed=1, mix=2)
    want = plan.pool_windows(0, r, stream_cache.shard_rows)

    def no_shuffle_yet(self, g, n):
        raise AssertionError("the pool was shuffled before its order was asked for")

    shuffle = type(plan).pool_order
    monkeypatch.setattr(type(plan), "pool_order", no_shuffle_yet)
    lay = pool_layout(plan, 0, r, stream_cache.shard_rows)  # the blocks alone: what decoding needs
    assert lay.n_rows == int((lay.hi - lay.lo).sum()) > 0
    monkeypatch.setattr(type(plan), "pool_order", shuffle)
    assert np.array_equal(lay.starts, want)
    given = PoolLayout(pool=0, lo=lay.lo, hi=lay.hi, at=lay.at, starts=lay.starts, rows=lay.rows)  # a known order
    assert given.rows is lay.rows and given.n_rows == lay.n_rows
    with pytest.raises(TypeError):
        PoolLayout(pool=0, lo=lay.lo, hi=lay.hi, at=lay.at, starts=lay.starts)


def test_no_later_pool_is_decoded_before_the_first_batch_is_taken(stream_cache):
    with WindowStream(stream_cache, 10, split="all", batch_size=16, mix=1, prefetch=4) as s:
        it = iter(s)
        first = next(it)
        (reader,) = list(s.resources.readers)
        assert len(s.plan().pool_bounds) > 3 and set(reader.pools) == {0}  # the next pools wait for
        # the consumer's second request
        rest = list(it)
    assert len(first.x) + sum(len(b.x) for b in rest) == s.read_spec.ranges.total()
