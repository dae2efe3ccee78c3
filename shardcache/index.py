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
* A reader's schedule (``reader_batches``) groups each of its batches by shard and says
  which rows each shard's block needs and after which batch it is no longer needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["Ranges", "EpochPlan", "BatchGroups", "valid_ranges", "make_plan", "reader_batches"]


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

    def pool_windows(self, g: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of pool ``g`` in the order they are served (shuffled if asked)."""
        parts = [
            self.piece_starts(j, ranges, shard_rows)
            for j in range(int(self.pool_bounds[g]), int(self.pool_bounds[g + 1]))
        ]
        starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, g, 1])
            starts = starts[rng.permutation(len(starts))]
        return starts


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
    """Plan one rank's epoch: shuffled shard order, an equal contiguous share per rank, pools."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world size {world}")
    n_shards = max(1, -(-n_rows // shard_rows))
    bounds = np.arange(n_shards + 1, dtype=np.int64) * shard_rows
    per_shard = np.diff(ranges.count_below(bounds))
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
        shards=order[js].astype(np.int64),
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


@dataclass(frozen=True)
class BatchGroups:
    """One batch of a reader, grouped by shard: group ``k`` is ``starts[bounds[k]:bounds[k+1]]``.

    ``rows[k]`` are the rows the reader decodes for shard ``shards[k]`` (its first to last
    window start in that shard, plus the span) and ``last[k]`` says this batch is the
    reader's last use of that shard. Inside a group the served order is kept.
    """

    batch: int
    starts: np.ndarray
    bounds: np.ndarray
    shards: np.ndarray
    rows: list[tuple[int, int]]
    last: list[bool]


def reader_batches(plan: EpochPlan, ranges: Ranges, shard_rows: int, batches: range) -> Iterator[BatchGroups]:
    """A reader's schedule: batches ``batches`` of ``plan`` in order, each grouped by shard.

    Pools are opened when a batch first reaches them and dropped once passed, so the
    memory is a few pools of indices whatever the epoch's size.
    """
    pools: dict[int, np.ndarray] = {}
    rows: dict[int, tuple[int, int]] = {}
    last_use: dict[int, int] = {}
    offsets = plan.pool_offsets
    for i in batches:
        a, b = plan.batch_span(i)
        parts = []
        for g in plan.pools_between(a, b):
            if g not in pools:
                pools[g] = _open_pool(plan, g, ranges, shard_rows, batches, rows, last_use)
            off = int(offsets[g])
            parts.append(pools[g][max(a - off, 0) : b - off])
        for g in [g for g in pools if offsets[g + 1] <= a]:
            del pools[g]
        starts = np.concatenate(parts)
        shard = starts // shard_rows
        order = np.argsort(shard, kind="stable")
        starts, shard = starts[order], shard[order]
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(shard)) + 1, [len(shard)]]).astype(np.int64)
        sids = shard[bounds[:-1]]
        yield BatchGroups(
            i, starts, bounds, sids, [rows[s] for s in sids.tolist()], [last_use[s] == i for s in sids.tolist()]
        )


def _open_pool(
    plan: EpochPlan,
    g: int,
    ranges: Ranges,
    shard_rows: int,
    batches: range,
    rows: dict[int, tuple[int, int]],
    last_use: dict[int, int],
) -> np.ndarray:
    """Windows of pool ``g``; records the block rows and last batch of each of its shards in ``batches``."""
    windows = plan.pool_windows(g, ranges, shard_rows)
    pos = int(plan.pool_offsets[g]) + np.arange(len(windows), dtype=np.int64)
    batch = pos // plan.batch_size
    mine = (pos < plan.n_windows) & (batch >= batches.start) & ((batch - batches.start) % batches.step == 0)
    shard = windows // shard_rows
    for j in range(int(plan.pool_bounds[g]), int(plan.pool_bounds[g + 1])):
        sid = int(plan.shards[j])
        m = mine & (shard == sid)
        if m.any():
            w = windows[m]
            rows[sid] = (int(w.min()), int(w.max()) + ranges.span)
            last_use[sid] = int(batch[m].max())
    return windows
