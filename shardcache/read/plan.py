"""The window plan: which windows are valid, and who reads which of them in which order.

Everything here is plain numpy data computed before a byte of features is read (after
xbatcher's ``BatchSchema``), so coverage, shuffling and the rank/worker split are testable
on their own.

* ``WindowSpec`` says what a window is. A window at row ``p`` is rows ``[p, p + seq_len)``;
  its target rows are ``p + seq_len - 1 + h`` for each horizon ``h``. It is valid when that
  whole span (to its largest horizon) lies in one segment (and so in one symbol, one
  gap-free run and one split). ``stride`` counts inside each segment.
* An epoch orders the shards (shuffled by ``seed`` and ``epoch``), cuts the resulting
  window sequence into equal contiguous parts, one per rank, and mixes each rank's windows
  within pools of ``mix`` consecutive shards. Batch ``i`` of a rank goes to DataLoader
  worker ``i % num_workers``, so the order does not depend on ``num_workers``.
* A reader decodes each pool's shard blocks into one arena (``pool_layout``: which rows,
  where, and each window's arena row) and copies its batches in runs of consecutive batches
  (``reader_runs``), saying after which run each pool is no longer needed.
* An elastic resume (``make_plan(history=...)``) takes what the ranks of a checkpoint had not
  delivered yet and deals it out again, in the same order, to the ranks of another world size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any, NamedTuple

import numpy as np
from numpy.random import default_rng  # imported with the plan, not lazily at the first shuffle

from ..errors import CacheError, OptionError, OptionTypeError
from ..format.layout import spanned_shards

__all__ = [
    "EpochPlan",
    "PoolLayout",
    "Ranges",
    "Run",
    "SegmentTable",
    "WindowSpec",
    "as_spec",
    "make_plan",
    "n_windows",
    "pool_layout",
    "reader_runs",
    "split_segments",
    "valid_ranges",
]


@dataclass(frozen=True)
class WindowSpec:
    """What one window is, shared by ``WindowStream``, ``WindowDataset`` and ``n_windows``.

    ``seq_len`` input bars; targets ``horizon`` bars after the last input bar (an int >= 0, or
    a sequence of them for several targets per window; 0 is the last input bar itself, for a
    ``target`` column that is not an input, such as a label computed at that bar); every
    ``stride``-th start of a segment; ``features``/``target`` name the input and target
    columns (None: all).
    """

    seq_len: int
    horizon: int | tuple[int, ...] = 1
    stride: int = 1
    features: tuple[str, ...] | None = None
    target: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("features", "target"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise OptionTypeError(f"{name} must be a list of feature names, not a string")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "horizon", _horizon(self.horizon))
        for name in ("seq_len", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise OptionError(name, value, "must be an int >= 1")
            object.__setattr__(self, name, int(value))

    @property
    def horizons(self) -> tuple[int, ...]:
        """Every horizon, in the order of ``y``'s rows."""
        return self.horizon if isinstance(self.horizon, tuple) else (self.horizon,)

    @property
    def span(self) -> int:
        """Bars from a window's first input bar to its last target bar, plus one."""
        return self.seq_len + max(self.horizons)


def _horizon(value: Any) -> int | tuple[int, ...]:
    """A horizon as an int or a tuple of ints, each >= 0 (the same rule for both)."""

    def ok(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 0

    if ok(value):
        return int(value)
    many = isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))
    values = list(value) if many else []
    if not values or not all(map(ok, values)):
        raise OptionError("horizon", value, "must be an int >= 0 or a non-empty sequence of them")
    return tuple(int(v) for v in values)


def as_spec(
    seq_len: int | WindowSpec, horizon: int | Sequence[int] | None = None, stride: int | None = None
) -> WindowSpec:
    """``seq_len`` itself when it is a ``WindowSpec`` (then ``horizon``/``stride`` must be left
    unset), else a spec of the three (None: 1)."""
    if isinstance(seq_len, WindowSpec):
        beside = [n for n, v in (("horizon", horizon), ("stride", stride)) if v is not None]
        if beside:
            raise OptionTypeError(f"{', '.join(beside)} given beside a WindowSpec: pass them inside the WindowSpec")
        return seq_len
    return WindowSpec(seq_len, 1 if horizon is None else horizon, 1 if stride is None else stride)


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
        return np.concatenate([s + self.stride * np.arange(n, dtype=np.int64) for s, n in zip(self.start, self.count)])


@dataclass(frozen=True)
class SegmentTable:
    """A segment table that is not in a cache yet (a build's or an append's), as ``valid_ranges`` reads it."""

    segments: np.ndarray
    segment_split: np.ndarray
    split_names: list[str]

    def split_id(self, split: str | None) -> int | None:
        return None if split is None else self.split_names.index(split)


def split_segments(cache: Any, split: str | None) -> np.ndarray:
    """The ``(symbol, start, stop)`` segments of ``split`` (every split for None or ``"all"``
    when no split has that name)."""
    seg = np.asarray(cache.segments, dtype=np.int64).reshape(-1, 3)
    names = getattr(cache, "split_names", None)
    if split == "all" and (names is None or "all" not in names):
        split = None
    sid = cache.split_id(split)
    return seg if sid is None else seg[np.asarray(cache.segment_split) == sid]


def valid_ranges(
    cache: Any,
    seq_len: int | WindowSpec,
    horizon: int | Sequence[int] | None = None,
    stride: int | None = None,
    split: str | None = None,
) -> Ranges:
    """Valid window starts of ``cache`` (anything with ``segments``, ``segment_split`` and
    ``split_id``) for the read-time window shape (a ``WindowSpec`` or its first fields; None: 1)."""
    spec = as_spec(seq_len, horizon, stride)
    seg = split_segments(cache, split)
    span, stride = spec.span, spec.stride
    start, stop = seg[:, 1], seg[:, 2]
    count = np.where(stop - start >= span, (stop - span - start) // stride + 1, 0)
    nz = count > 0
    order = np.argsort(start[nz], kind="stable")
    return Ranges(start[nz][order], count[nz][order].astype(np.int64), stride, span)


def n_windows(
    cache: Any,
    seq_len: int | WindowSpec,
    *,
    horizon: int | Sequence[int] | None = None,
    stride: int | None = None,
    split: str | None = None,
) -> int:
    """Number of valid windows of ``cache`` at a read-time window shape (``split=None``: all; an unset
    ``horizon``/``stride`` is 1)."""
    return valid_ranges(cache, seq_len, horizon, stride, split).total()


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: shard pieces in read order, grouped into mixing pools.

    ``shards[j]`` contributes its valid windows ``lo[j]:hi[j]`` (in row order); pools are
    ``pool_bounds[g]:pool_bounds[g+1]`` of those pieces. Pool ``g`` serves its windows in
    the order seeded by ``pool_key[g]`` (the rank and pool that first planned it), from
    ``pool_from[g]`` to ``pool_to[g]`` of that order (a resumed epoch keeps only what was
    not delivered). Batch ``i`` is positions ``batch_bounds[i]:batch_bounds[i + 1]`` of the
    rank's sequence. ``dropped`` windows (fewer than ``world``) were left out of this epoch
    so that every rank has the same count; with ``drop_last`` the rank's last partial batch
    is left out as well.
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
        """Most shard pieces whose pools overlap one batch: the blocks a reader must hold at once.

        A block is needed from its first to its last batch, and every batch in between lies
        inside the block's pool, so a batch never needs blocks outside the pools it overlaps.
        """
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
        """Window starts of each piece of pool ``g``, in piece order (each ascending)."""
        return [
            self.piece_starts(j, ranges, shard_rows)
            for j in range(int(self.pool_bounds[g]), int(self.pool_bounds[g + 1]))
        ]

    def pool_order(self, g: int, n: int) -> np.ndarray:
        """Pool ``g``'s served order of its ``n`` windows: a permutation (shuffled) or ``arange``,
        cut to ``pool_from:pool_to``."""
        rank, pool = (int(v) for v in self.pool_key[g])
        order = default_rng([self.seed, self.epoch, rank, pool, 1]).permutation(n) if self.shuffle else np.arange(n)
        return order[int(self.pool_from[g]) : int(self.pool_to[g])]

    def pool_windows(self, g: int, ranges: Ranges, shard_rows: int) -> np.ndarray:
        """Window starts of pool ``g`` in the order they are served (shuffled if asked)."""
        parts = self.pool_pieces(g, ranges, shard_rows)
        starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return starts[self.pool_order(g, len(starts))]


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
) -> EpochPlan:
    """Plan one rank's epoch: shuffled shard order, an equal contiguous share per rank, pools.

    With ``history`` (``(world, batches delivered per rank)`` at each checkpoint of this
    epoch, oldest first), the epoch began at ``history[0][0]`` ranks and was resumed at each
    later world size, now ``world``: the plan holds this rank's equal share of the windows no
    rank had delivered, in their original order.
    """
    if not 0 <= rank < world:
        raise OptionError("rank", rank, f"outside world size {world}")
    fresh = partial(_fresh_plan, ranges, n_rows, shard_rows, batch_size=batch_size, shuffle=shuffle, seed=seed)
    fresh = partial(fresh, epoch=epoch, mix=mix, drop_last=drop_last)
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
) -> EpochPlan:
    """An epoch's plan from its start (see ``make_plan``).

    Only shards holding a window start are visited, so rows may be sparse (a format-2 cache
    leaves unused rows between symbols); every start must lie below ``n_rows``.
    """
    ids = _start_shards(ranges, shard_rows)
    if len(ids) and ids[-1] * shard_rows >= n_rows:
        raise CacheError(f"window starts reach shard {int(ids[-1])}, past the cache's {n_rows} rows; rebuild the cache")
    per_shard = ranges.count_below((ids + 1) * shard_rows) - ranges.count_below(ids * shard_rows)
    order = np.flatnonzero(per_shard)
    if shuffle:
        order = order[default_rng([seed, epoch, 0]).permutation(len(order))]
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
    pool_bounds = np.append(np.arange(0, len(js), max(1, mix), dtype=np.int64), len(js))
    pool_sizes = np.add.reduceat(hi - lo, pool_bounds[:-1]) if len(js) else np.zeros(0, np.int64)
    n_batches = share // batch_size if drop_last else -(-share // batch_size)
    n_win = n_batches * batch_size if drop_last else share
    n_pools = len(pool_bounds) - 1
    return EpochPlan(
        shards=ids[order[js]].astype(np.int64),
        lo=lo.astype(np.int64),
        hi=hi.astype(np.int64),
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


class _Part(NamedTuple):
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
        out.append(_Part(plan.shards[j0:j1], plan.lo[j0:j1], plan.hi[j0:j1], plan.pool_key[g], frm, to))
    return out


def _deal(parts: list[_Part], world: int, like: EpochPlan, drop_last: bool) -> list[EpochPlan]:
    """Deal the windows of ``parts`` (in order) to ``world`` ranks: contiguous shares differing by
    at most one window, cut into the same number of batches on every rank (a rank one window
    short splits its last full batch in two rather than lose a window or a batch)."""
    total = sum(p.to - p.frm for p in parts)
    q, extra = divmod(total, world)
    shares = [q + (r < extra) for r in range(world)]
    bs = like.batch_size
    n = min(shares) // bs if drop_last else -(-max(shares) // bs)
    plans, pos = [], 0
    cum = np.concatenate([[0], np.cumsum([p.to - p.frm for p in parts])]).astype(np.int64)
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
                mine.append(p._replace(frm=p.frm + lo - int(cum[k]), to=p.frm + hi - int(cum[k])))
        lens = [len(p.shards) for p in mine]
        plans.append(
            EpochPlan(
                shards=np.concatenate([p.shards for p in mine]) if mine else np.zeros(0, np.int64),
                lo=np.concatenate([p.lo for p in mine]) if mine else np.zeros(0, np.int64),
                hi=np.concatenate([p.hi for p in mine]) if mine else np.zeros(0, np.int64),
                pool_bounds=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                pool_key=np.stack([p.key for p in mine]).astype(np.int64) if mine else np.zeros((0, 2), np.int64),
                pool_from=np.array([p.frm for p in mine], np.int64),
                pool_to=np.array([p.to for p in mine], np.int64),
                batch_bounds=bounds,
                n_windows=int(bounds[-1]),
                batch_size=bs,
                dropped=like.dropped,
                shuffle=like.shuffle,
                seed=like.seed,
                epoch=like.epoch,
                rank=r,
            )
        )
    return plans


def _start_shards(ranges: Ranges, shard_rows: int) -> np.ndarray:
    """Shards spanned by the runs of valid starts, ascending (a few may hold none when stride > shard)."""
    return spanned_shards(ranges.start, ranges.start + ranges.stride * (ranges.count - 1), shard_rows)


class PoolLayout:
    """Where pool ``pool``'s windows live once its blocks are decoded, one after another, into
    one *arena* of ``n_rows`` rows.

    Block ``k`` is cache rows ``lo[k]:hi[k]`` (one shard's windows plus the span their last
    window needs) at arena row ``at[k]``. ``starts`` are the pool's window start rows in served
    order and ``rows`` the same windows' arena rows: given, or made on first use by ``served``
    (the pool's shuffle, its costliest part), so a reader can start decoding the blocks first
    and shuffle while they decode.
    """

    def __init__(
        self,
        pool: int,
        lo: np.ndarray,
        hi: np.ndarray,
        at: np.ndarray,
        starts: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        *,
        served: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        if (starts is None) != (rows is None) or (starts is None) == (served is None):
            raise OptionTypeError("PoolLayout takes starts and rows, or served to make them")
        self.pool, self.lo, self.hi, self.at = int(pool), lo, hi, at
        self._served = None if starts is None else (starts, rows)
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
    """The arena layout of pool ``g``: one block per piece (so per shard), in piece order,
    each from its first window start to its last window's end (its served order is lazy)."""
    parts = [p for p in plan.pool_pieces(g, ranges, shard_rows) if len(p)]
    lo = np.array([p[0] for p in parts], dtype=np.int64)
    hi = np.array([p[-1] + ranges.span for p in parts], dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)

    def served() -> tuple[np.ndarray, np.ndarray]:
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        starts = np.concatenate(parts)
        rows = np.concatenate([p - (a - t) for p, a, t in zip(parts, lo, at)])
        order = plan.pool_order(g, len(starts))
        return starts[order], rows[order]

    return PoolLayout(int(g), lo, hi, at, served=served)


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
    pools than one batch does (``EpochPlan.max_open_pieces``). The first run is one batch, so
    the first batch waits for no other batch's copy. Lazy: an epoch's runs are found as they
    are read.
    """
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
            yield prev._replace(keep=pools[0])
        prev = Run(i, last, a, b, pools, 0)
        i = last + batches.step
    if prev is not None:
        yield prev._replace(keep=len(plan.pool_bounds))
