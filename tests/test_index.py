"""The window plan against loop-based oracles: valid windows, rank shares, pools, shuffles."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import brute_starts, synthetic_bars

from shardcache.read.plan import Ranges, make_plan, pool_layout, pool_layouts, reader_runs, valid_ranges

SHARD = 256


class _Table:
    """The three attributes ``valid_ranges`` reads, from ``Bars`` (no cache needed)."""

    def __init__(self, bars):
        self.segments, self.segment_split, self.names = bars.segments, bars.segment_split, bars.split_names

    def split_id(self, split):
        return None if split is None else self.names.index(split)


@pytest.fixture(scope="module")
def bars():
    return synthetic_bars(5000, 1, n_symbols=4, seed=3)


def _rank_sequence(plan, ranges):
    """The rank's window starts in served order, pool after pool."""
    parts = [plan.pool_windows(g, ranges, SHARD) for g in range(len(plan.pool_bounds) - 1)]
    return np.concatenate(parts)[: plan.n_windows] if parts else np.zeros(0, np.int64)


@pytest.mark.parametrize(
    "seq_len,horizon,stride,split",
    [(1, 0, 1, None), (10, 1, 1, None), (30, 5, 3, "train"), (7, 0, 2, "val"), (60, 1, 1, "test"), (400, 2, 5, None)],
)
def test_valid_ranges_match_brute_force(bars, seq_len, horizon, stride, split):
    r = valid_ranges(_Table(bars), seq_len, horizon, stride, split)
    ref = brute_starts(bars, seq_len, horizon, stride, split)
    assert np.array_equal(r.starts(), ref)
    assert r.total() == len(ref)
    rows = np.arange(0, 5001, 37)
    assert np.array_equal(r.count_below(rows), np.searchsorted(ref, rows, side="left"))
    for lo, hi in [(0, 5000), (100, 1300), (777, 778), (4990, 6000), (300, 200)]:
        assert np.array_equal(r.starts_between(lo, hi), ref[(ref >= lo) & (ref < hi)])
    if len(ref):
        pos = np.arange(0, len(ref), max(1, len(ref) // 50))
        assert np.array_equal(r.start_at(pos), ref[pos])


def test_valid_ranges_rejects_bad_shape(bars):
    with pytest.raises(ValueError):
        valid_ranges(_Table(bars), 0)
    with pytest.raises(ValueError):
        valid_ranges(_Table(bars), 5, horizon=-1)


@pytest.mark.parametrize(
    "world,batch,mix,drop_last", [(1, 64, 4, False), (2, 50, 2, False), (3, 33, 1, True), (4, 128, 3, False)]
)
def test_plan_shares_every_window_once(bars, world, batch, mix, drop_last):
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    total = r.total()
    plans = [
        make_plan(r, 5000, SHARD, batch_size=batch, seed=5, epoch=2, rank=k, world=world, mix=mix, drop_last=drop_last)
        for k in range(world)
    ]
    seqs = [_rank_sequence(p, r) for p in plans]
    assert len({p.n_batches for p in plans}) == 1
    assert plans[0].dropped == total % world < world
    share = total // world
    for p, s in zip(plans, seqs):
        assert p.n_windows == (share // batch * batch if drop_last else share) == len(s)
        assert p.n_batches == (share // batch if drop_last else -(-share // batch))
        assert np.all(np.diff(p.pool_bounds) <= mix) and p.pool_bounds[-1] == len(p.shards)
        assert len(set(p.shards.tolist())) == len(p.shards)  # a shard appears once per rank
        off = p.pool_offsets
        for a in range(0, p.n_windows, 17):
            b = min(a + batch, p.n_windows)
            hit = [g for g in range(len(off) - 1) if off[g] < b and off[g + 1] > a]
            assert list(p.pools_between(a, b)) == hit
    union = np.concatenate(seqs)
    assert len(np.unique(union)) == len(union)
    assert np.isin(union, r.starts()).all()
    if not drop_last:
        assert len(union) == total - plans[0].dropped


def test_plan_shuffle_depends_on_seed_and_epoch_only(bars):
    r = valid_ranges(_Table(bars), 20, 1, 1, None)

    def seq(**kw):
        return _rank_sequence(make_plan(r, 5000, SHARD, batch_size=64, **kw), r)

    base = seq(seed=1, epoch=0)
    assert np.array_equal(base, seq(seed=1, epoch=0))
    assert not np.array_equal(base, seq(seed=1, epoch=1))
    assert not np.array_equal(base, seq(seed=2, epoch=0))
    ordered = seq(shuffle=False)
    assert np.array_equal(ordered, r.starts())
    assert np.array_equal(np.sort(base), ordered)


def test_pools_mix_only_their_shards(bars):
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    plan = make_plan(r, 5000, SHARD, batch_size=64, seed=3, mix=3)
    for g in range(len(plan.pool_bounds) - 1):
        w = plan.pool_windows(g, r, SHARD)
        shards = plan.shards[plan.pool_bounds[g] : plan.pool_bounds[g + 1]]
        assert set(np.unique(w // SHARD)) == set(shards.tolist())
        assert len(w) == (plan.hi - plan.lo)[plan.pool_bounds[g] : plan.pool_bounds[g + 1]].sum()
        assert not np.all(np.diff(w) > 0)  # shuffled inside the pool


@pytest.mark.parametrize("batch,mix,workers", [(16, 1, 1), (64, 2, 2), (300, 4, 3), (1000, 2, 1)])
def test_max_open_pieces_bounds_every_readers_live_set(bars, batch, mix, workers):
    """Simulate each worker's reader: a shard is live from its first to its last batch."""
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    plan = make_plan(r, 5000, SHARD, batch_size=batch, seed=0, mix=mix)
    seq = _rank_sequence(plan, r)
    bound = plan.max_open_pieces()
    for w in range(workers):
        first, last = {}, {}
        mine = list(range(w, plan.n_batches, workers))
        for i in mine:
            for s in np.unique(seq[i * batch : (i + 1) * batch] // SHARD).tolist():
                first.setdefault(s, i)
                last[s] = i
        live = max(sum(first[s] <= i <= last[s] for s in first) for i in mine)
        assert live <= bound


@pytest.mark.parametrize(
    "batch,mix,workers,start,run",
    [(16, 1, 1, 0, 16), (64, 2, 2, 3, 500), (300, 4, 3, 1, 900), (50, 3, 1, 20, 400), (50, 1, 1, 0, 10**9)],
)
def test_reader_runs_and_pool_layouts(bars, batch, mix, workers, start, run):
    """Runs cover exactly a reader's batches, stay in their first batch's pools, free pools only
    after their last use; every window's arena row holds its bars."""
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    plan = make_plan(r, 5000, SHARD, batch_size=batch, seed=4, mix=mix)
    seq = _rank_sequence(plan, r)
    arena_of = {}
    for g in range(len(plan.pool_bounds) - 1):
        lay = arena_of[g] = pool_layout(plan, g, r, SHARD)
        assert np.array_equal(lay.starts, plan.pool_windows(g, r, SHARD))
        assert len(np.unique(lay.lo // SHARD)) == len(lay.lo)  # one block per shard
        assert lay.n_rows == (lay.hi - lay.lo).sum() and np.all(lay.hi - lay.lo <= SHARD + r.span - 1)
        block_of = {int(s): k for k, s in enumerate(lay.lo // SHARD)}
        k = np.array([block_of[int(s)] for s in lay.starts // SHARD], dtype=np.int64)  # each window's block
        assert np.all(lay.lo[k] <= lay.starts) and np.all(lay.starts + r.span <= lay.hi[k])
        arena = np.concatenate([bars.features[a:b] for a, b in zip(lay.lo, lay.hi)])
        assert len(arena) == lay.n_rows and np.array_equal(lay.at, np.cumsum(lay.hi - lay.lo) - (lay.hi - lay.lo))
        for d in (0, r.span - 1):  # a window's first row and its target row, through the arena
            assert np.array_equal(arena[lay.rows + d], bars.features[lay.starts + d])
    for w in range(workers):
        batches = range(start + w, plan.n_batches, workers)
        served, dropped = [], set()
        for run_ in reader_runs(plan, batches, run):
            ids = list(range(run_.first, run_.last + 1))
            assert all(i in batches for i in ids) and (workers == 1 or len(ids) == 1)
            assert run_.a == ids[0] * batch and run_.b == min((ids[-1] + 1) * batch, plan.n_windows)
            assert len(ids) == 1 or run_.b - run_.a <= max(run, batch)
            first = plan.pools_between(*plan.batch_span(ids[0]))
            assert list(run_.pools) == list(plan.pools_between(run_.a, run_.b)) and run_.pools[-1] <= first[-1]
            assert not dropped & set(run_.pools)  # a dropped pool is never needed again
            got = np.concatenate([arena_of[g].starts for g in run_.pools])
            off = plan.pool_offsets[run_.pools[0]]
            assert np.array_equal(got[run_.a - off : run_.b - off], seq[run_.a : run_.b])
            dropped |= set(range(run_.keep))
            served += ids
        assert served == list(batches)


@pytest.mark.parametrize("seq_len,stride,split", [(20, 1, None), (7, 3, "train"), (60, 2, "val"), (400, 5, None)])
def test_pieces_are_each_piece_of_starts_between(bars, seq_len, stride, split):
    """``Ranges.pieces`` is ``starts_between(lo, hi)[first:last]`` of every piece at once."""
    r = valid_ranges(_Table(bars), seq_len, 1, stride, split)
    rng = np.random.default_rng(seq_len)
    lo = rng.integers(-50, 5100, 60)
    hi = lo + rng.integers(0, 900, 60)
    ref = [r.starts_between(int(a), int(b)) for a, b in zip(lo, hi)]
    first = np.array([rng.integers(0, len(x) + 2) for x in ref], np.int64)
    last = np.array([rng.integers(0, len(x) + 3) for x in ref], np.int64)
    starts, counts = r.pieces(lo, hi, first, last)
    want = [x[f:t] for x, f, t in zip(ref, first, last)]
    assert counts.tolist() == [len(w) for w in want] and starts.dtype == np.int64
    assert np.array_equal(starts, np.concatenate(want))
    empty = r.pieces(lo[:0], hi[:0], first[:0], last[:0])
    assert len(empty[0]) == len(empty[1]) == 0


@pytest.mark.parametrize("batch,mix,world,history", [(16, 1, 1, ()), (50, 3, 2, ()), (64, 4, 3, [(2, 3)])])
def test_pool_layouts_lay_out_each_pool_as_alone(bars, batch, mix, world, history):
    """``pool_layouts`` of consecutive pools (a reader lays out many small pools at once) gives each pool
    the blocks of its pieces and the windows of ``pool_windows``, in served order."""
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    for rank in range(world):
        plan = make_plan(r, 5000, SHARD, batch_size=batch, seed=6, mix=mix, rank=rank, world=world, history=history)
        n = len(plan.pool_bounds) - 1
        for a in range(0, n, 3):
            pools = range(a, min(a + 3, n))
            for g, lay in zip(pools, pool_layouts(plan, pools, r, SHARD)):
                j = range(int(plan.pool_bounds[g]), int(plan.pool_bounds[g + 1]))
                parts = [p for p in (plan.piece_starts(i, r, SHARD) for i in j) if len(p)]
                assert lay.pool == g and np.array_equal(lay.lo, [p[0] for p in parts])
                assert np.array_equal(lay.hi, [p[-1] + r.span for p in parts])
                assert np.array_equal(lay.starts, plan.pool_windows(g, r, SHARD))
                arena = np.concatenate([np.arange(a, b) for a, b in zip(lay.lo, lay.hi)])
                assert np.array_equal(arena[lay.rows], lay.starts)


def test_pools_between_and_empty_plan():
    r = Ranges(start=np.zeros(0, np.int64), count=np.zeros(0, np.int64), stride=1, span=5)
    plan = make_plan(r, 1000, SHARD, batch_size=8)
    assert plan.n_batches == plan.n_windows == plan.max_open_pieces() == 0
    assert len(plan.pools_between(0, 0)) == 0
    with pytest.raises(ValueError):
        make_plan(r, 1000, SHARD, batch_size=8, rank=2, world=2)


@pytest.mark.parametrize(
    "w1,done,w2,batch,drop_last",
    [
        (2, 3, 1, 64, False),
        (1, 5, 2, 50, False),
        (4, 2, 2, 33, False),
        (1, 7, 2, 64, False),
        (3, 1, 2, 16, True),
        (2, 0, 3, 100, False),
        (2, 10**6, 2, 64, False),
    ],
)
def test_an_elastic_resume_deals_out_what_no_rank_delivered(bars, w1, done, w2, batch, drop_last):
    r = valid_ranges(_Table(bars), 20, 1, 1, None)
    kw = dict(batch_size=batch, seed=5, epoch=2, mix=2, drop_last=drop_last)
    old = [make_plan(r, 5000, SHARD, rank=k, world=w1, **kw) for k in range(w1)]
    epoch = np.concatenate([_rank_sequence(p, r) for p in old])
    delivered = np.concatenate([_rank_sequence(p, r)[: p.batch_bounds[min(done, p.n_batches)]] for p in old])
    new = [make_plan(r, 5000, SHARD, rank=k, world=w2, history=[(w1, done)], **kw) for k in range(w2)]
    rest = [_rank_sequence(p, r) for p in new]
    served = np.concatenate([delivered, *rest])
    assert len({p.n_batches for p in new}) == 1  # equal batches per rank
    assert len(np.unique(served)) == len(served)  # none twice
    if drop_last:
        assert set(served) <= set(epoch) and all(np.diff(p.batch_bounds).min() == batch for p in new if p.n_batches)
    else:
        assert np.array_equal(np.sort(served), np.sort(epoch))  # every window of the epoch
        assert np.array_equal(np.concatenate(rest), epoch[~np.isin(epoch, delivered)])  # in the original order
    if w1 == w2:  # the same world: each rank simply continues its own sequence
        for p, q in zip(old, new):
            assert np.array_equal(_rank_sequence(q, r), _rank_sequence(p, r)[p.batch_bounds[min(done, p.n_batches)] :])
