"""Horizons in market time (``horizon="5min"``): a window's target is the last stored bar at or before its
last input bar's time plus the duration (as-of), which must lie after that bar and inside its segment.

A minute without trades has no bar, so a horizon of rows can be minutes or hours ahead; a duration cannot.
The valid windows are found once from each segment's bar times (``timed_runs``); a batch's target rows are
found again from the bar times of its own windows (``asof_rows``), so no per-window array outlives a batch.
Needs numpy alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import OptionError
from .durations import parse_duration

__all__ = ["Times", "asof_rows", "duration_horizon", "timed_runs"]

Times = Callable[[np.ndarray], np.ndarray]
"""Bar start times (int64 ns) of rows of a segment table's row space (``Cache.bar_times``)."""

_BATCH_ROWS = 1 << 22  # bar times read per call while the valid windows are found: bounded memory


def duration_horizon(value: Any) -> int:
    """``value`` (a duration string such as ``"5min"``) in nanoseconds; a malformed or zero one is refused."""
    try:
        ns = parse_duration(value)
    except ValueError as exc:
        raise OptionError("horizon", value, f"not a duration: {exc}") from None
    if ns <= 0:
        raise OptionError(
            "horizon", value, "a time horizon must be longer than 0 (use horizon=0 for the last input bar)"
        )
    return ns


def timed_runs(
    seg: np.ndarray, followed: np.ndarray, times: Times, seq_len: int, stride: int, horizons_ns: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Valid windows of the ``(symbol, start, stop)`` segments ``seg`` at time horizons: ``(start, count, end,
    most)``, runs of starts ``stride`` apart, each run's segment stop, and the most rows any valid target lies
    after its window's last input bar. ``followed[i]``: row ``seg[i, 2]`` is a stored bar of the same symbol
    (a target at or before it would cross the segment's end)."""
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    most, i, cum = 0, 0, np.cumsum(seg[:, 2] - seg[:, 1] + followed)
    while i < len(seg):
        j = max(i + 1, int(np.searchsorted(cum, (cum[i - 1] if i else 0) + _BATCH_ROWS, side="right")))
        part, nxt = seg[i:j], followed[i:j]
        rows = np.concatenate([np.arange(a, b + int(f)) for (_, a, b), f in zip(part.tolist(), nxt.tolist())])
        ts, at = times(rows), 0
        for (_, a, b), f in zip(part.tolist(), nxt.tolist()):
            t = ts[at : at + b - a + int(f)]
            at += len(t)
            start, count, off = _segment_runs(t, b - a, seq_len, stride, horizons_ns)
            out.append((start + a, count, np.full(len(start), b, np.int64)))
            most = max(most, off)
        i = j
    if not out:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    start, count, end = (np.concatenate(parts).astype(np.int64) for parts in zip(*out))
    return start, count, end, most


def _segment_runs(
    t: np.ndarray, n: int, seq_len: int, stride: int, horizons_ns: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, int]:
    """Runs ``(start, count)`` (segment-local) of one segment's valid windows from its ``n`` bar times ``t``
    (and the next bar's, when ``len(t) > n``), and the most rows a valid target lies after its last input.
    Where no stored bar follows, a target's time must be at or before the segment's last bar: an append
    never changes a served target."""
    last = np.arange(seq_len - 1, n, stride, dtype=np.int64)
    ok, off = np.ones(len(last), bool), np.zeros(len(last), np.int64)
    for h in horizons_ns:
        target = np.searchsorted(t, t[last] + h, side="right") - 1
        ok &= (target > last) & (target < n)
        if len(t) == n:  # the symbol's last stored bar ends the segment: a later bar, appended, might be the as-of one
            ok &= t[last] + h <= t[n - 1]
        off = np.maximum(off, target - last)
    if not ok.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
    first, stop = edges[::2], edges[1::2]
    return last[first] - (seq_len - 1), (stop - first).astype(np.int64), int(off[ok].max())


def asof_rows(times: Times, last: np.ndarray, limit: np.ndarray, horizons_ns: tuple[int, ...]) -> np.ndarray:
    """The target rows ``[n, len(horizons_ns)]`` of windows whose last input bars are rows ``last``: for each
    horizon the last row below ``limit`` (the window's segment end, or nearer) whose bar time is at most the
    last input bar's plus the horizon. A binary search over bar times: one read of them per halving."""
    last, limit = np.asarray(last, np.int64), np.asarray(limit, np.int64)
    goal = (times(last)[:, None] + np.asarray(horizons_ns, np.int64)).reshape(-1)
    lo = np.repeat(last, len(horizons_ns))  # at most the goal: the last input bar itself
    hi = np.repeat(limit, len(horizons_ns))  # past the search
    live = np.flatnonzero(hi - lo > 1)
    while len(live):
        mid = (lo[live] + hi[live]) // 2
        before = times(mid) <= goal[live]
        lo[live], hi[live] = np.where(before, mid, lo[live]), np.where(before, hi[live], mid)
        live = live[hi[live] - lo[live] > 1]
    rows: np.ndarray = lo.reshape(len(last), len(horizons_ns))
    return rows
