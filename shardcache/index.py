"""The window plan: which windows are valid, and who reads which of them in which order.

Everything here is plain numpy data computed before a byte of features is read (after
xbatcher's ``BatchSchema``), so coverage, shuffling and the rank/worker split are testable
on their own.

* A window at row ``p`` is rows ``[p, p + seq_len)``; its target is row
  ``p + seq_len - 1 + horizon``. It is valid when that whole span lies in one segment (and
  so in one symbol, one gap-free run and one split). ``stride`` counts inside each segment.
* An epoch orders the shards (shuffled by ``seed`` and ``epoch``), cuts the resulting
  window sequence into equal contiguous parts, one per rank, and mixes each rank's windows
  within pools of ``mix`` consecutive shards. Batch ``i`` of a rank goes to DataLoader
  worker ``i % num_workers``, so the order does not depend on ``num_workers``.
* A reader decodes each pool's shard blocks into one arena (``pool_layout``: which rows,
  where, and each window's arena row) and copies its batches in runs of consecutive batches
  (``reader_runs``), saying after which run each pool is no longer needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from .store import spanned_shards

__all__ = ["EpochPlan", "PoolLayout", "Ranges", "Run", "SegmentTable", "make_plan", "pool_layout", "reader_runs",
           "valid_ranges"]


@dataclass(frozen=True)
class Ranges:
    """Valid window starts as arithmetic runs: ``start[i] + stride * k`` for ``k < count[i]``."""

    start: np.ndarray
    count: np.ndarray
    stride: int
    span: int

    def total(self) -> int:
        return int(self.count.sum())

    def count_below(self, rows: np.ndarray) -> np.ndarray:
        """How many valid starts lie strictly below each of ``rows`` (vectorised)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.start) == 0:
            return np.zeros(rows.shape, dtype=np.int64)
        before = np.concatenate([[0], np.cumsum(self.count)])
        i = np.searchsorted(self.start, rows, side="right") - 1
        ic = np.clip(i, 0, None)
        partial = np.clip(-((self.start[ic] - rows) // self.stride), 0, self.count[ic])
        return np.where(i < 0, 0, before[ic] + partial)

    def starts_between(self, lo: int, hi: int) -> np.ndarray:
        """All valid starts in rows ``[lo, hi)``, ascending (vectorised over the runs)."""
        a = max(int(np.searchsorted(self.start, lo, side="right")) - 1, 0)
        b = int(np.searchsorted(self.start, hi, side="left"))
        s, n = self.start[a:b], self.count[a:b]
        k0 = np.clip(-((s - lo) // self.stride), 0, n)
        k1 = np.clip(-((s - hi) // self.stride), 0, n)
        m = np.maximum(k1 - k0, 0)
        if not m.sum():
            return np.zeros(0, dtype=np.int64)
        first = s + self.stride * k0
        offset = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
        return np.repeat(first, m) + self.stride * offset

    def start_at(self, positions: np.ndarray) -> np.ndarray:
        """Start row of the windows at ``positions`` in row order (map-style access)."""
        pos = np.asarray(positions, dtype=np.int64)
        before = np.cumsum(self.count) - self.count
        i = np.searchsorted(before, pos, side="right") - 1
        return self.start[i] + self.stride * (pos - before[i])

    def starts(self) -> np.ndarray:
        """Every valid start (for tests and map-style access)."""
        if len(self.start) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(
            [s + self.stride * np.arange(n, dtype=np.int64) for s, n in zip(self.start, self.count)]
        )


@dataclass(frozen=True)
class SegmentTable:
    """A segment table that is not in a cache yet (a build's or an append's), as ``valid_ranges`` reads it."""

    segments: np.ndarray
    segment_split: np.ndarray
    split_names: list[str]

    def split_id(self, split: str | None) -> int | None:
        return None if split is None else self.split_names.index(split)


def valid_ranges(
    cache: Any, seq_len: int, horizon: int = 1, stride: int = 1, split: str | None = None
) -> Ranges:
    """Valid window starts of ``cache`` (anything with ``segments``, ``segment_split`` and
    ``split_id``) for the read-time window shape."""
    if seq_len < 1 or horizon < 0 or stride < 1:
        raise ValueError("need seq_len >= 1, horizon >= 0 and stride >= 1")
    seg = np.asarray(cache.segments, dtype=np.int64).reshape(-1, 3)
    keep = np.ones(len(seg), dtype=bool)
    sid = cache.split_id(split)
    if sid is not None:
        keep &= np.asarray(cache.segment_split) == sid
    span = seq_len + horizon
    start, stop = seg[keep, 1], seg[keep, 2]
    count = np.where(stop - start >= span, (stop - span - start) // stride + 1, 0)
    nz = count > 0
    order = np.argsort(start[nz], kind="stable")
    return Ranges(start[nz][order], count[nz][order].astype(np.int64), stride, span)


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: shard pieces in read order, grouped into mixing pools.

    ``shards[j]`` contributes its valid windows ``lo[j]:hi[j]`` (in row order); pools are
    ``pool_bounds[g]:pool_bounds[g+1]`` of those pieces. ``dropped`` windows (fewer than
    ``world``) were left out of this epoch so that every rank has the same count; with
    ``drop_last`` the rank's last partial batch is left out as well (``n_windows`` is then a
    multiple of ``batch_size``).
    """

    shards: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pool_bounds: np.ndarray
    n_windows: int
    n_batches: int
    batch_size: int
    dropped: int
    shuffle: bool
    seed: int
    epoch: int
    rank: int

    @cached_property
    def pool_offsets(self) -> np.ndarray:
        """Position of each pool's first window in the rank's window sequence."""
        sizes = self.hi - self.lo
        cum = np.concatenate([[0], np.cumsum(sizes)])
        return cum[self.pool_bounds]

    def batch_span(self, i: int) -> tuple[int, int]:
        """Positions ``[a, b)`` of batch ``i`` in the rank's window sequence."""
        a = i * self.batch_size
        return a, min(a + self.batch_size, self.n_windows)

    def pools_between(self, a: int, b: int) -> range:
        """Pools holding any of the positions ``[a, b)`` of the rank's window sequence."""
        if b <= a:
            return range(0)
        off = self.pool_offsets
        g0 = int(np.searchsorted(off, a, side="right")) - 1
        g1 = int(np.searchsorted(off, b - 1, side="right")) - 1
        return range(g0, g1 + 1)

    def max_open_pieces(self) -> int:
        """Most shard pieces whose pools overlap one batch: the blocks a reader must hold at once.

        A block is needed from its first to its last batch, and every batch in between lies
        inside the block's pool, so a batch never needs blocks outside the pools it overlaps.
        """
        if self.n_batches == 0:
            return 0
        off = self.pool_offsets
        a = np.arange(self.n_batches, dtype=np.int64) * self.batch_size
        last = np.minimum(a + self.batch_size, self.n_windows) - 1
        g0 = np.searchsorted(off, a, side="right") - 1
        g1 = np.searchsorted(off, last, side="right") - 1
        return int((self.pool_bounds[g1 + 1] - self.pool_bounds[g0]).max())

    def piece_starts(self, j: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of piece ``j`` (its shard's windows ``lo[j]:hi[j]``), ascending."""
        s = int(self.shards[j])
        rows = ranges.starts_between(s * shard_rows, (s + 1) * shard_rows)
        return rows[int(self.lo[j]) : int(self.hi[j])]

    def pool_pieces(self, g: int, ranges: Ranges, shard_rows: int) -> list[np.ndarray]:
        """Window starts of each piece of pool ``g``, in piece order (each ascending)."""
        return [
            self.piece_starts(j, ranges, shard_rows)
            for j in range(int(self.pool_bounds[g]), int(self.pool_bounds[g + 1]))
        ]

    def pool_order(self, g: int, n: int) -> np.ndarray | None:
        """The served order of pool ``g``'s ``n`` windows (a permutation), None when not shuffled."""
        if not self.shuffle:
            return None
        return np.random.default_rng([self.seed, self.epoch, self.rank, g, 1]).permutation(n)

    def pool_windows(self, g: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of pool ``g`` in the order they are served (shuffled if asked)."""
        parts = self.pool_pieces(g, ranges, shard_rows)
        starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        order = self.pool_order(g, len(starts))
        return starts if order is None else starts[order]


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
) -> EpochPlan:
    """Plan one rank's epoch: shuffled shard order, an equal contiguous share per rank, pools.

    Only shards holding a window start are visited, so rows may be sparse (a format-2 cache
    leaves unused rows between symbols); every start must lie below ``n_rows``.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world size {world}")
    ids = _start_shards(ranges, shard_rows)
    if len(ids) and ids[-1] * shard_rows >= n_rows:
        raise ValueError(f"window starts reach shard {int(ids[-1])}, past {n_rows} rows")
    per_shard = ranges.count_below((ids + 1) * shard_rows) - ranges.count_below(ids * shard_rows)
    order = np.flatnonzero(per_shard)
    if shuffle:
        order = order[np.random.default_rng([seed, epoch, 0]).permutation(len(order))]
    sizes = per_shard[order]
    cum = np.concatenate([[0], np.cumsum(sizes)])
    total = int(cum[-1])
    share = total // world
    a, b = rank * share, (rank + 1) * share
    # pieces of shards overlapping positions [a, b)
    first = int(np.searchsorted(cum, a, side="right")) - 1
    last = int(np.searchsorted(cum, b, side="left"))
    js = np.arange(max(first, 0), min(last, len(order)), dtype=np.int64)
    lo = np.clip(a - cum[js], 0, None)
    hi = np.minimum(sizes[js], b - cum[js])
    keep = hi > lo
    js, lo, hi = js[keep], lo[keep], hi[keep]
    pool_bounds = np.unique(np.concatenate([np.arange(0, len(js), max(1, mix)), [len(js)]]))
    n_batches = share // batch_size if drop_last else -(-share // batch_size)
    return EpochPlan(
        shards=ids[order[js]].astype(np.int64),
        lo=lo.astype(np.int64),
        hi=hi.astype(np.int64),
        pool_bounds=pool_bounds.astype(np.int64),
        n_windows=int(n_batches * batch_size if drop_last else share),
        n_batches=int(n_batches),
        batch_size=int(batch_size),
        dropped=total - share * world,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        rank=rank,
    )


def _start_shards(ranges: Ranges, shard_rows: int) -> np.ndarray:
    """Shards spanned by the runs of valid starts, ascending (a few may hold none when stride > shard)."""
    return spanned_shards(ranges.start, ranges.start + ranges.stride * (ranges.count - 1), shard_rows)


@dataclass(frozen=True)
class PoolLayout:
    """Where pool ``pool``'s windows live once its blocks are decoded, one after another, into
    one *arena* of ``n_rows`` rows.

    Block ``k`` is cache rows ``lo[k]:hi[k]`` (one shard's windows plus the span their last
    window needs) at arena row ``at[k]``. ``starts`` are the pool's window start rows in
    served order and ``rows`` the same windows' arena rows.
    """

    pool: int
    lo: np.ndarray
    hi: np.ndarray
    at: np.ndarray
    starts: np.ndarray
    rows: np.ndarray

    @property
    def n_rows(self) -> int:
        return int((self.hi - self.lo).sum())


def pool_layout(plan: EpochPlan, g: int, ranges: Ranges, shard_rows: int) -> PoolLayout:
    """The arena layout of pool ``g``: one block per piece (so per shard), in piece order,
    each from its first window start to its last window's end."""
    parts = [p for p in plan.pool_pieces(g, ranges, shard_rows) if len(p)]
    lo = np.array([p[0] for p in parts], dtype=np.int64)
    hi = np.array([p[-1] + ranges.span for p in parts], dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
    starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    rows = np.concatenate([p - (a - t) for p, a, t in zip(parts, lo, at)]) if parts else starts
    order = plan.pool_order(g, len(starts))
    if order is not None:
        starts, rows = starts[order], rows[order]
    return PoolLayout(int(g), lo, hi, at, starts, rows)


class Run(NamedTuple):
    """Consecutive batches ``first..last`` of a reader, copied together: window positions
    ``[a, b)`` of the rank's sequence, drawn from pools ``pools``; after it the reader no
    longer needs the pools below ``keep``."""

    first: int
    last: int
    a: int
    b: int
    pools: range
    keep: int


def reader_runs(plan: EpochPlan, batches: range, max_windows: int) -> Iterator[Run]:
    """A reader's batches cut into runs: consecutive batches (``batches.step == 1``) of up to
    ``max_windows`` windows whose pools are all among the first batch's, else single batches.

    Keeping a run inside its first batch's pools means a run never needs more resident
    pools than one batch does (``EpochPlan.max_open_pieces``). Lazy: an epoch's runs are
    found as they are read.
    """
    prev: Run | None = None
    i, stop = batches.start, batches.stop
    while i < stop:
        a, b = plan.batch_span(i)
        pools = plan.pools_between(a, b)
        last = i
        while batches.step == 1 and last + 1 < stop:
            na, nb = plan.batch_span(last + 1)
            if nb - a > max_windows or plan.pools_between(na, nb)[-1] > pools[-1]:
                break
            last, b = last + 1, nb
        if prev is not None:  # pools below this run's first one are done with
            yield prev._replace(keep=pools[0])
        prev = Run(i, last, a, b, pools, 0)
        i = last + batches.step
    if prev is not None:
        yield prev._replace(keep=len(plan.pool_bounds))
