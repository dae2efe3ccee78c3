"""The window plan: which windows are valid, and who reads which of them in which order.

Plain numpy computed before a byte of features is read, so coverage, shuffling and the rank/worker
split are testable on their own. An epoch orders the shards (seeded by ``seed`` and ``epoch``), cuts
the window sequence into one equal contiguous part per rank, and shuffles each rank's windows within
pools of ``mix`` shards; batch ``i`` goes to DataLoader worker ``i % num_workers``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial

import numpy as np
from numpy.random import default_rng  # imported with the plan, not lazily at the first shuffle

from ..errors import CacheError, OptionError, OptionTypeError
from ..format.layout import spanned_shards
from ..format.windows import Ranges, WindowSpec, n_windows, valid_ranges
from .mixture import Shares, pieces_between

__all__ = [
    "EpochPlan",
    "PoolLayout",
    "Ranges",
    "Run",
    "WindowSpec",
    "make_plan",
    "n_windows",
    "pool_layout",
    "pool_layouts",
    "reader_runs",
    "valid_ranges",
]


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """One rank's epoch: shard pieces in read order, grouped into mixing pools.

    ``shards[j]`` contributes its valid windows ``lo[j]:hi[j]``; pool ``g`` is pieces
    ``pool_bounds[g]:pool_bounds[g+1]``, served in the order seeded by ``pool_key[g]`` (the rank and
    pool that first planned it), positions ``pool_from[g]:pool_to[g]`` of that order (a resume keeps
    what was not delivered). Batch ``i`` is positions ``batch_bounds[i]:batch_bounds[i + 1]``.
    ``dropped`` windows (fewer than ``world``) were left out so every rank has the same count.
    """

    shards: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pool_bounds: np.ndarray
    pool_key: np.ndarray
    pool_from: np.ndarray
    pool_to: np.ndarray
    batch_bounds: np.ndarray
    n_windows: int
    batch_size: int
    dropped: int
    shuffle: bool
    seed: int
    epoch: int
    rank: int

    @property
    def n_batches(self) -> int:
        return len(self.batch_bounds) - 1

    @cached_property
    def pool_offsets(self) -> np.ndarray:
        """Position of each pool's first served window in the rank's window sequence."""
        return np.concatenate([[0], np.cumsum(self.pool_to - self.pool_from)]).astype(np.int64)

    def batch_span(self, i: int) -> tuple[int, int]:
        """Positions ``[a, b)`` of batch ``i`` in the rank's window sequence."""
        return int(self.batch_bounds[i]), int(self.batch_bounds[i + 1])

    def pools_between(self, a: int, b: int) -> range:
        """Pools holding any of the positions ``[a, b)`` of the rank's window sequence."""
        if b <= a:
            return range(0)
        off = self.pool_offsets
        g0 = int(np.searchsorted(off, a, side="right")) - 1
        g1 = int(np.searchsorted(off, b - 1, side="right")) - 1
        return range(g0, g1 + 1)

    def max_open_pieces(self) -> int:
        """Most shard pieces whose pools overlap one batch: the blocks a reader must hold at once
        (a batch never needs blocks outside the pools it overlaps)."""
        if self.n_batches == 0:
            return 0
        off = self.pool_offsets
        a, last = self.batch_bounds[:-1], self.batch_bounds[1:] - 1
        g0 = np.searchsorted(off, a, side="right") - 1
        g1 = np.searchsorted(off, last, side="right") - 1
        return int((self.pool_bounds[g1 + 1] - self.pool_bounds[g0]).max())

    def piece_starts(self, j: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of piece ``j`` (its shard's windows ``lo[j]:hi[j]``), ascending."""
        s = int(self.shards[j])
        rows = ranges.starts_between(s * shard_rows, (s + 1) * shard_rows)
        return rows[int(self.lo[j]) : int(self.hi[j])]

    def pool_pieces(self, g: int, ranges: Ranges, shard_rows: int) -> list[np.ndarray]:
        """``piece_starts`` of every piece of pool ``g``, found in one pass."""
        j0, j1 = int(self.pool_bounds[g]), int(self.pool_bounds[g + 1])
        rows = self.shards[j0:j1] * shard_rows
        starts, counts = ranges.pieces(rows, rows + shard_rows, self.lo[j0:j1], self.hi[j0:j1])
        return np.split(starts, np.cumsum(counts)[:-1]) if j1 > j0 else []

    def pool_order(self, g: int, n: int) -> np.ndarray:
        """Pool ``g``'s served order of its ``n`` windows (shuffled or not), cut to ``pool_from:pool_to``."""
        rank, pool = (int(v) for v in self.pool_key[g])
        order = default_rng([self.seed, self.epoch, rank, pool, 1]).permutation(n) if self.shuffle else np.arange(n)
        return order[int(self.pool_from[g]) : int(self.pool_to[g])]

    def pool_windows(self, g: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of pool ``g`` in the order they are served (shuffled if asked)."""
        parts = self.pool_pieces(g, ranges, shard_rows)
        starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        served: np.ndarray = starts[self.pool_order(g, len(starts))]
        return served


def make_plan(
    ranges: Ranges,
    n_rows: int,
    shard_rows: int,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world: int = 1,
    mix: int = 4,
    drop_last: bool = False,
    history: Sequence[tuple[int, int]] = (),
    shares: Shares | None = None,
) -> EpochPlan:
    """Plan one rank's epoch: shuffled shard order, an equal contiguous share per rank, pools.

    With ``shares`` an epoch serves that many windows of each cache, else every window once. With
    ``history`` (``(world, batches delivered per rank)`` at each checkpoint, oldest first) the plan is
    this rank's equal share of the windows no rank had delivered, in their original order.
    """
    if not 0 <= rank < world:
        raise OptionError("rank", rank, f"outside world size {world}")
    fresh = partial(_fresh_plan, ranges, n_rows, shard_rows, batch_size=batch_size, shuffle=shuffle, seed=seed)
    fresh = partial(fresh, epoch=epoch, mix=mix, drop_last=drop_last, shares=shares)
    if not history:
        return fresh(rank=rank, world=world)
    w0 = int(history[0][0])
    plans = [fresh(rank=r, world=w0) for r in range(w0)]
    worlds = [int(w) for w, _ in history[1:]] + [world]
    for (_, done), nxt in zip(history, worlds):
        parts = [
            p
            for plan in plans
            for p in _parts(plan, int(plan.batch_bounds[min(int(done), plan.n_batches)]), plan.n_windows)
        ]
        plans = _deal(parts, nxt, plans[0], drop_last)
    return plans[rank]


def _rank_pieces(
    cum: np.ndarray, sizes: np.ndarray, a: int, b: int, mix: int, breaks: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``pieces_between`` positions ``[a, b)`` (one rank's), and pool bounds of ``mix`` pieces that
    never span two cycles of one source (``breaks``)."""
    js, lo, hi = pieces_between(cum, sizes, a, b)
    pool_bounds = np.arange(0, len(js), max(1, mix), dtype=np.int64)
    if breaks is not None and len(js):
        at = np.searchsorted(js, breaks)
        ok = (at > 0) & (at < len(js))
        pool_bounds = np.union1d(pool_bounds, at[ok][js[at[ok]] == breaks[ok]]).astype(np.int64)
    return js, lo, hi, np.append(pool_bounds, len(js))


def _fresh_plan(
    ranges: Ranges,
    n_rows: int,
    shard_rows: int,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    rank: int,
    world: int,
    mix: int,
    drop_last: bool,
    shares: Shares | None,
) -> EpochPlan:
    """An epoch's plan from its start (see ``make_plan``), visiting only shards that hold a window start."""
    ids = spanned_shards(ranges.start, ranges.last_starts(), shard_rows)
    if len(ids) and ids[-1] * shard_rows >= n_rows:
        raise CacheError(f"window starts reach shard {int(ids[-1])}, past the cache's {n_rows} rows; rebuild the cache")
    per_shard = ranges.count_below((ids + 1) * shard_rows) - ranges.count_below(ids * shard_rows)
    if shares is None:  # every window once: each shard with a window, whole
        order = np.flatnonzero(per_shard)
        if shuffle:
            order = order[default_rng([seed, epoch, 0]).permutation(len(order))]
        seq, begin, sizes, breaks = ids[order], np.zeros(len(order), np.int64), per_shard[order], None
    else:
        seq, begin, end, breaks = shares.sequence(ids, per_shard, shard_rows, seed=seed, epoch=epoch, shuffle=shuffle)
        sizes = end - begin
    cum = np.concatenate([[0], np.cumsum(sizes)])
    total = int(cum[-1])
    share = total // world
    js, lo, hi, pool_bounds = _rank_pieces(cum, sizes, rank * share, (rank + 1) * share, mix, breaks)
    pool_sizes = np.add.reduceat(hi - lo, pool_bounds[:-1]) if len(js) else np.zeros(0, np.int64)
    n_batches = share // batch_size if drop_last else -(-share // batch_size)
    n_win = n_batches * batch_size if drop_last else share
    n_pools = len(pool_bounds) - 1
    return EpochPlan(
        shards=seq[js].astype(np.int64),
        lo=(begin[js] + lo).astype(np.int64),
        hi=(begin[js] + hi).astype(np.int64),
        pool_bounds=pool_bounds,
        pool_key=np.stack([np.full(n_pools, rank), np.arange(n_pools)], axis=1).astype(np.int64),
        pool_from=np.zeros(n_pools, np.int64),
        pool_to=pool_sizes.astype(np.int64),
        batch_bounds=np.minimum(np.arange(n_batches + 1, dtype=np.int64) * batch_size, n_win),
        n_windows=int(n_win),
        batch_size=int(batch_size),
        dropped=total - share * world,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        rank=rank,
    )


@dataclass(frozen=True, kw_only=True)
class _Part:
    """Served positions ``frm:to`` of one pool (its pieces and order key), cut out of a plan."""

    shards: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    key: np.ndarray
    frm: int
    to: int


def _parts(plan: EpochPlan, a: int, b: int) -> list[_Part]:
    """Positions ``[a, b)`` of ``plan``'s sequence, as the pools (cut) that serve them."""
    off, out = plan.pool_offsets, []
    for g in plan.pools_between(a, b):
        j0, j1 = int(plan.pool_bounds[g]), int(plan.pool_bounds[g + 1])
        f0 = int(plan.pool_from[g])
        frm, to = f0 + max(a - int(off[g]), 0), f0 + min(b, int(off[g + 1])) - int(off[g])
        out.append(
            _Part(shards=plan.shards[j0:j1], lo=plan.lo[j0:j1], hi=plan.hi[j0:j1], key=plan.pool_key[g], frm=frm, to=to)
        )
    return out


def _deal(parts: list[_Part], world: int, like: EpochPlan, drop_last: bool) -> list[EpochPlan]:
    """Deal the windows of ``parts`` (in order) to ``world`` ranks: contiguous shares differing by at most
    one window, the same number of batches on every rank (one window short: its last batch split in two)."""
    cum = np.concatenate([[0], np.cumsum([p.to - p.frm for p in parts])]).astype(np.int64)
    q, extra = divmod(int(cum[-1]), world)
    shares = [q + (r < extra) for r in range(world)]
    bs = like.batch_size
    n = min(shares) // bs if drop_last else -(-max(shares) // bs)
    plans, pos = [], 0
    for r, share in enumerate(shares):
        sizes = [bs] * n
        if not drop_last and n:
            sizes[-1] = share - (n - 1) * bs
            if sizes[-1] <= 0 and n > 1 and bs > 1:
                sizes[-2:] = [bs - 1, 1]
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64) if n else np.zeros(1, np.int64)
        a, b = pos, pos + share
        pos = b
        mine = []
        for k in range(len(parts)):
            lo, hi = max(a, int(cum[k])), min(b, int(cum[k + 1]))
            if hi > lo:
                p = parts[k]
                mine.append(replace(p, frm=p.frm + lo - int(cum[k]), to=p.frm + hi - int(cum[k])))
        lens = [len(p.shards) for p in mine]
        plans.append(
            replace(  # the settings, dropped windows and epoch of ``like``
                like,
                shards=np.concatenate([p.shards for p in mine]) if mine else np.zeros(0, np.int64),
                lo=np.concatenate([p.lo for p in mine]) if mine else np.zeros(0, np.int64),
                hi=np.concatenate([p.hi for p in mine]) if mine else np.zeros(0, np.int64),
                pool_bounds=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                pool_key=np.stack([p.key for p in mine]).astype(np.int64) if mine else np.zeros((0, 2), np.int64),
                pool_from=np.array([p.frm for p in mine], np.int64),
                pool_to=np.array([p.to for p in mine], np.int64),
                batch_bounds=bounds,
                n_windows=int(bounds[-1]),
                rank=r,
            )
        )
    return plans


class PoolLayout:
    """Where pool ``pool``'s windows live in its arena of ``n_rows`` rows: block ``k`` is cache rows
    ``lo[k]:hi[k]`` at arena row ``at[k]``. ``starts`` (served order) and ``rows`` (their arena rows) are
    given or made on first use by ``served``: the shuffle can run while the blocks decode."""

    def __init__(
        self,
        *,
        pool: int,
        lo: np.ndarray,
        hi: np.ndarray,
        at: np.ndarray,
        starts: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        served: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        if (starts is None) != (rows is None) or (starts is None) == (served is None):
            raise OptionTypeError("PoolLayout takes starts and rows, or served to make them")
        self.pool, self.lo, self.hi, self.at = int(pool), lo, hi, at
        self._served = None if starts is None or rows is None else (starts, rows)
        self._make = served

    @property
    def n_rows(self) -> int:
        return int((self.hi - self.lo).sum())

    def served(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, rows)``, made once."""
        if self._served is None:
            assert self._make is not None
            self._served = self._make()
        return self._served

    @property
    def starts(self) -> np.ndarray:
        return self.served()[0]

    @property
    def rows(self) -> np.ndarray:
        return self.served()[1]

    def __repr__(self) -> str:
        return f"PoolLayout(pool={self.pool}, blocks={len(self.lo)}, n_rows={self.n_rows})"


def pool_layout(plan: EpochPlan, g: int, ranges: Ranges, shard_rows: int) -> PoolLayout:
    """The arena layout of pool ``g``: one block per piece, from its first window start to its last window's end."""
    return pool_layouts(plan, range(g, g + 1), ranges, shard_rows)[0]


def pool_layouts(plan: EpochPlan, pools: range, ranges: Ranges, shard_rows: int) -> list[PoolLayout]:
    """``pool_layout`` of each of ``pools`` (consecutive), found in one pass: numpy's per-call cost would
    dominate a pool of small symbols' shards."""
    bounds = plan.pool_bounds[pools.start : pools.stop + 1]
    j0, j1 = int(bounds[0]), int(bounds[-1])
    first_row = plan.shards[j0:j1] * shard_rows
    starts, counts = ranges.pieces(first_row, first_row + shard_rows, plan.lo[j0:j1], plan.hi[j0:j1])
    ends = np.cumsum(counts)
    full = counts > 0  # a piece with no window start is no block
    lo_all = starts[(ends - counts)[full]]
    hi_all = ranges.reach(starts[ends[full] - 1])
    blocks = np.concatenate([[0], np.cumsum(full)])[bounds - j0]  # each pool's first block
    begin = np.concatenate([[0], ends])[bounds - j0]  # each pool's first start
    out = []
    for k, g in enumerate(pools):
        lo, hi = lo_all[blocks[k] : blocks[k + 1]], hi_all[blocks[k] : blocks[k + 1]]
        at = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
        mine = starts[begin[k] : begin[k + 1]]
        per = counts[int(bounds[k]) - j0 : int(bounds[k + 1]) - j0]
        out.append(
            PoolLayout(pool=g, lo=lo, hi=hi, at=at, served=partial(_served, plan, g, mine, per[per > 0], lo - at))
        )
    return out


def _served(
    plan: EpochPlan, g: int, starts: np.ndarray, counts: np.ndarray, shift: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pool ``g``'s window starts and arena rows (each block's starts less its ``shift``), in served order."""
    rows = starts - np.repeat(shift, counts)
    order = plan.pool_order(g, len(starts))
    return starts[order], rows[order]


@dataclass(frozen=True, kw_only=True)
class Run:
    """Consecutive batches ``first..last`` copied together: positions ``[a, b)``, drawn from ``pools``;
    after it the pools below ``keep`` are no longer needed."""

    first: int
    last: int
    a: int
    b: int
    pools: range
    keep: int


def reader_runs(plan: EpochPlan, batches: range, max_windows: int) -> Iterator[Run]:
    """A reader's batches cut into runs (lazily): consecutive batches (``batches.step == 1``) of up to
    ``max_windows`` windows inside the first batch's pools, so a run needs no more pools than one batch;
    the first run is one batch, which waits for no other copy."""
    prev: Run | None = None
    i, stop = batches.start, batches.stop
    while i < stop:
        a, b = plan.batch_span(i)
        pools = plan.pools_between(a, b)
        last = i
        while batches.step == 1 and last + 1 < stop and prev is not None:
            na, nb = plan.batch_span(last + 1)
            if nb - a > max_windows or plan.pools_between(na, nb)[-1] > pools[-1]:
                break
            last, b = last + 1, nb
        if prev is not None:  # pools below this run's first one are done with
            yield replace(prev, keep=pools[0])
        prev = Run(first=i, last=last, a=a, b=b, pools=pools, keep=0)
        i = last + batches.step
    if prev is not None:
        yield replace(prev, keep=len(plan.pool_bounds))
