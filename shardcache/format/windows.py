"""Windows and their targets: what a window is, which windows are valid, and which rows each reads.

A window at row ``p`` is rows ``[p, p + seq_len)``; its targets are rows ``p + seq_len - 1 + h`` for each
horizon ``h`` (``WindowSpec.target_steps``, the one place that offset is computed). It is valid when that
whole span lies in one segment (one symbol, gap-free run and split); ``stride`` counts inside each segment.
A horizon may be a duration instead (``"5min"``): then each window's target is found from the bar times
(``horizons.py``), and ``Ranges.span`` is the most rows a valid window reads.
Needs numpy alone, so the build, the read side and inspect may all import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import OptionError, OptionTypeError
from .horizons import asof_rows, duration_horizon, timed_runs
from .numbers import whole_number

__all__ = [
    "Ranges",
    "SegmentSource",
    "SegmentTable",
    "WindowSpec",
    "as_spec",
    "n_windows",
    "split_segments",
    "valid_ranges",
]


@dataclass(frozen=True)
class WindowSpec:
    """What one window is, shared by ``WindowStream``, ``WindowDataset`` and ``n_windows``.

    ``seq_len`` input bars; targets ``horizon`` bars after the last input bar (an int >= 0, or
    a sequence of them for several targets per window; 0 is the last input bar itself, for a
    ``target`` column that is not an input, such as a label computed at that bar), or a duration
    after its time (``"5min"``, or a sequence of durations: the last stored bar at or before it); every
    ``stride``-th start of a segment; ``features``/``target`` name the input and target
    columns (None: all).
    """

    seq_len: int
    """Input bars per window."""
    horizon: int | str | tuple[int, ...] | tuple[str, ...] = 1
    """Target bars after the last input bar (an int >= 0), or a duration after its time (``"5min"``), or a
    tuple of either (one target each)."""
    stride: int = 1
    """Rows between consecutive window starts of a segment (1: every window)."""
    features: tuple[str, ...] | None = None
    """The input columns, by name (None: every feature)."""
    target: tuple[str, ...] | None = None
    """The target columns, by name (None: every feature)."""

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
            object.__setattr__(self, name, whole_number(name, value, 1))

    @property
    def horizons(self) -> tuple[int, ...] | tuple[str, ...]:
        """Every horizon as given, in the order of ``y``'s rows."""
        return self.horizon if isinstance(self.horizon, tuple) else (self.horizon,)  # type: ignore[return-value]

    @property
    def timed(self) -> bool:
        """Whether the horizons are durations (market time), not rows."""
        return isinstance(self.horizons[0], str)

    @property
    def horizons_ns(self) -> tuple[int, ...]:
        """Each time horizon in nanoseconds (refused for row horizons: they have none)."""
        if not self.timed:
            raise ValueError(f"horizon={self.horizon!r} counts rows, not time")
        return tuple(duration_horizon(h) for h in self.horizons)

    @property
    def row_horizons(self) -> tuple[int, ...]:
        """Each row horizon (refused for time horizons: their rows depend on the bars, ``target_rows_at``)."""
        if self.timed:
            raise ValueError(f"horizon={self.horizon!r} is a time: its target rows depend on the bars")
        return tuple(int(h) for h in self.horizons)

    @property
    def multi(self) -> bool:
        """Whether ``y`` has a horizon axis: a sequence of horizons, even of one."""
        return isinstance(self.horizon, tuple)

    @property
    def span(self) -> int:
        """Bars from a window's first input bar to its last target bar, plus one (row horizons; a time
        horizon's depends on the bars: ``Ranges.span``)."""
        return self.seq_len + max(self.row_horizons)

    @property
    def input_steps(self) -> np.ndarray:
        """Each input row's offset from its window's first row: ``0 .. seq_len - 1``."""
        return np.arange(self.seq_len, dtype=np.int64)

    @property
    def last_step(self) -> int:
        """The last input row's offset from its window's first row (the bar ``MetaBatch.time`` names)."""
        return self.seq_len - 1

    @property
    def target_steps(self) -> np.ndarray:
        """Each target row's offset from its window's first row, in ``y``'s order of horizons."""
        return np.asarray([self.last_step + h for h in self.row_horizons], dtype=np.int64)

    def input_rows(self, starts: np.ndarray) -> np.ndarray:
        """The rows of the windows starting at ``starts``: ``[n, seq_len]``."""
        rows: np.ndarray = np.asarray(starts)[:, None] + self.input_steps
        return rows

    def target_rows(self, starts: np.ndarray) -> np.ndarray:
        """The target rows of the windows starting at ``starts``, in ``y``'s layout: ``[n]``, or
        ``[n, len(horizon)]`` for a sequence of horizons (row horizons; time horizons: ``target_rows_at``)."""
        steps, first = self.target_steps, np.asarray(starts)
        rows: np.ndarray = first[:, None] + steps if self.multi else first + int(steps[0])
        return rows

    def target_rows_at(
        self, starts: np.ndarray, ranges: Ranges, times: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """``target_rows`` of valid windows of ``ranges`` for any horizon: a time horizon's found from the bar
        times of each window's rows (``times``, as ``Cache.bar_times``)."""
        if not self.timed:
            return self.target_rows(starts)
        first = np.asarray(starts, dtype=np.int64)
        rows = asof_rows(times, first + self.last_step, ranges.reach(first), self.horizons_ns)
        return rows if self.multi else rows[:, 0]

    def y_shape(self, n: int, columns: int) -> tuple[int, ...]:
        """The shape of ``n`` windows' targets of ``columns`` columns each."""
        return (n, len(self.horizons), columns) if self.multi else (n, columns)

    def block_rows(self, shard_rows: int) -> int:
        """The most rows the windows starting in one shard read: the shard and the span its last window needs."""
        return shard_rows + self.span - 1


def _horizon(value: Any) -> int | str | tuple[int, ...] | tuple[str, ...]:
    """A horizon as an int >= 0 or a duration (``"5min"``, longer than 0), or a tuple of all ints or all
    durations (the same rules)."""

    def ok(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and bool(v >= 0)

    if ok(value):
        return int(value)
    if isinstance(value, str):
        duration_horizon(value)
        return value
    many = isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))
    values = list(value) if many else []
    if values and all(isinstance(v, str) for v in values):
        for v in values:
            duration_horizon(v)
        return tuple(str(v) for v in values)
    if any(isinstance(v, str) for v in values) and all(ok(v) or isinstance(v, str) for v in values):
        raise OptionError("horizon", value, "mixes bars and durations: give all ints or all durations")
    if not values or not all(map(ok, values)):
        raise OptionError(
            "horizon", value, 'must be an int >= 0, a duration such as "5min", or a non-empty sequence of either'
        )
    return tuple(int(v) for v in values)


def as_spec(
    seq_len: int | WindowSpec,
    horizon: int | str | Sequence[int] | Sequence[str] | None = None,
    stride: int | None = None,
) -> WindowSpec:
    """``seq_len`` itself when it is a ``WindowSpec`` (then ``horizon``/``stride`` must be unset), else a spec of
    the three (None: 1)."""
    if isinstance(seq_len, WindowSpec):
        beside = [n for n, v in (("horizon", horizon), ("stride", stride)) if v is not None]
        if beside:
            raise OptionTypeError(f"{', '.join(beside)} given beside a WindowSpec: pass them inside the WindowSpec")
        return seq_len
    return WindowSpec(seq_len, 1 if horizon is None else _horizon(horizon), 1 if stride is None else stride)


@dataclass(frozen=True, kw_only=True)
class Ranges:
    """Valid window starts as arithmetic runs: ``start[i] + stride * k`` for ``k < count[i]``; each
    window reads ``span`` rows from its start, at most (time horizons: and never past ``end[i]``, its
    run's segment stop; None for row horizons, whose windows read ``span`` rows each)."""

    start: np.ndarray
    count: np.ndarray
    stride: int
    span: int
    end: np.ndarray | None = None

    def reach(self, starts: np.ndarray) -> np.ndarray:
        """One past the last row the windows starting at ``starts`` (valid ones) may read."""
        starts = np.asarray(starts, dtype=np.int64)
        if self.end is None:
            far: np.ndarray = starts + self.span
            return far
        run = np.searchsorted(self.start, starts, side="right") - 1
        near: np.ndarray = np.minimum(starts + self.span, self.end[run])
        return near

    def block_rows(self, shard_rows: int) -> int:
        """The most rows the windows starting in one shard read: the shard and the span its last window needs."""
        return shard_rows + self.span - 1

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
        starts: np.ndarray = np.repeat(s + self.stride * k0, m) + self.stride * _within(m)
        return starts

    def pieces(
        self, lo: np.ndarray, hi: np.ndarray, first: np.ndarray, last: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``starts_between(lo[i], hi[i])[first[i]:last[i]]`` of every ``i`` at once, concatenated, and the count
        of each (a pool's shard pieces in one pass over the runs)."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
        r0 = np.maximum(np.searchsorted(self.start, lo, side="right") - 1, 0)
        nr = np.maximum(np.searchsorted(self.start, hi, side="left") - r0, 0)  # runs that may overlap each piece
        piece = np.repeat(np.arange(len(lo), dtype=np.int64), nr)
        run = np.repeat(r0, nr) + _within(nr)
        s, n = self.start[run], self.count[run]
        k0 = np.clip(-((s - lo[piece]) // self.stride), 0, n)
        k1 = np.clip(-((s - hi[piece]) // self.stride), 0, n)
        m = np.maximum(k1 - k0, 0)  # starts of each (piece, run) pair inside the piece's rows
        total = np.bincount(piece, weights=m, minlength=len(lo)).astype(np.int64)
        at = np.cumsum(m) - m - np.repeat(np.cumsum(total) - total, nr)  # each pair's first position in its piece
        t0, t1 = np.clip(first[piece] - at, 0, m), np.clip(last[piece] - at, 0, m)
        keep = np.maximum(t1 - t0, 0)
        starts: np.ndarray = np.repeat(s + self.stride * (k0 + t0), keep) + self.stride * _within(keep)
        return starts, np.bincount(piece, weights=keep, minlength=len(lo)).astype(np.int64)

    def start_at(self, positions: np.ndarray) -> np.ndarray:
        """Start row of the windows at ``positions`` in row order (map-style access)."""
        pos = np.asarray(positions, dtype=np.int64)
        before = np.cumsum(self.count) - self.count
        i = np.searchsorted(before, pos, side="right") - 1
        starts: np.ndarray = self.start[i] + self.stride * (pos - before[i])
        return starts

    def last_starts(self) -> np.ndarray:
        """The last start of each run."""
        last: np.ndarray = self.start + self.stride * (self.count - 1)
        return last

    def starts(self) -> np.ndarray:
        """Every valid start (for tests and map-style access)."""
        if len(self.start) == 0:
            return np.zeros(0, dtype=np.int64)
        every: np.ndarray = np.repeat(self.start, self.count) + self.stride * _within(self.count)
        return every


def _within(counts: np.ndarray) -> np.ndarray:
    """``0..counts[i]-1`` for each ``i``, concatenated."""
    out: np.ndarray = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return out


class SegmentSource(Protocol):
    """What ``valid_ranges`` reads: a segment table. An opened ``Cache`` is one, a ``SegmentTable`` another."""

    @property
    def segments(self) -> np.ndarray:
        """``(symbol, start, stop)`` rows of every segment."""

    @property
    def segment_split(self) -> np.ndarray:
        """Each segment's split id."""

    @property
    def split_names(self) -> list[str]:
        """The split names, by split id."""

    def split_id(self, split: str | None) -> int | None:
        """The id of ``split`` (None: every split); an unknown name is refused."""

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns) of rows (what time horizons read)."""


@dataclass(frozen=True, kw_only=True)
class SegmentTable:
    """A segment table that is not in a cache yet (a build's or an append's), or a cache's cut again; its
    bar times (``times``, for time horizons) when known."""

    segments: np.ndarray
    segment_split: np.ndarray
    split_names: list[str]
    times: Callable[[np.ndarray], np.ndarray] | None = None

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times of ``rows``; a table without them refuses time horizons."""
        if self.times is None:
            raise OptionError("horizon", None, "a time horizon needs the bar times of a cache; this table has none")
        return self.times(rows)

    def split_id(self, split: str | None) -> int | None:
        if split is None:
            return None
        if split not in self.split_names:
            raise OptionError("split", split, f"no such split; the table has {', '.join(self.split_names)}")
        return self.split_names.index(split)


def split_segments(table: SegmentSource, split: str | None) -> np.ndarray:
    """The ``(symbol, start, stop)`` segments of ``split`` (every split for None, or for ``"all"``
    when no split has that name)."""
    seg = np.asarray(table.segments, dtype=np.int64).reshape(-1, 3)
    if split == "all" and "all" not in table.split_names:
        split = None
    sid = table.split_id(split)
    return seg if sid is None else seg[np.asarray(table.segment_split) == sid]


def valid_ranges(
    table: SegmentSource,
    seq_len: int | WindowSpec,
    horizon: int | str | Sequence[int] | Sequence[str] | None = None,
    stride: int | None = None,
    split: str | None = None,
) -> Ranges:
    """Valid window starts of a segment table for the read-time window shape (a ``WindowSpec`` or its first
    fields; None: 1); time horizons read the table's bar times."""
    spec = as_spec(seq_len, horizon, stride)
    seg = split_segments(table, split)
    if spec.timed:
        return _timed_ranges(table, seg, spec)
    span, stride = spec.span, spec.stride
    start, stop = seg[:, 1], seg[:, 2]
    count = np.where(stop - start >= span, (stop - span - start) // stride + 1, 0)
    nz = count > 0
    order = np.argsort(start[nz], kind="stable")
    return Ranges(start=start[nz][order], count=count[nz][order].astype(np.int64), stride=stride, span=span)


def _timed_ranges(table: SegmentSource, seg: np.ndarray, spec: WindowSpec) -> Ranges:
    """``valid_ranges`` of segments ``seg`` of ``table`` at time horizons."""
    every = np.asarray(table.segments, dtype=np.int64).reshape(-1, 3)
    every = every[np.argsort(every[:, 1], kind="stable")]
    at = np.clip(np.searchsorted(every[:, 1], seg[:, 2]), 0, max(len(every) - 1, 0))
    # the row after a segment is a bar of its symbol: a target there would cross the segment's end
    followed = (every[at, 1] == seg[:, 2]) & (every[at, 0] == seg[:, 0]) if len(every) else np.zeros(0, bool)
    order = np.argsort(seg[:, 1], kind="stable")
    start, count, end, most = timed_runs(
        seg[order], followed[order], table.bar_times, spec.seq_len, spec.stride, spec.horizons_ns
    )
    return Ranges(start=start, count=count, stride=spec.stride, span=spec.seq_len + max(most, 1), end=end)


def n_windows(
    table: SegmentSource,
    seq_len: int | WindowSpec,
    *,
    horizon: int | str | Sequence[int] | Sequence[str] | None = None,
    stride: int | None = None,
    split: str | None = None,
) -> int:
    """Number of valid windows of a cache (or another segment table) at a read-time window shape
    (``split=None``: all; an unset ``horizon``/``stride`` is 1)."""
    return valid_ranges(table, seq_len, horizon, stride, split).total()
