"""Which bars a stream serves, in time: ``Cut`` (the split, ``split_times``, a walk-forward fold, an embargo)
and the time ranges it makes (``TimeCuts``), which cut every cache's segments again, each piece in the split
its bars' times fall in. An embargo ends each split that another follows that long before the next one's
start, so no window's target lies within it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, OptionTypeError
from ..format.cache import Cache
from ..format.durations import format_duration
from ..format.splits import parse_split
from ..format.windows import SegmentTable
from .folds import Fold, duration_option

__all__ = ["Cut", "TimeCuts"]

_EARLIEST, _LATEST = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


@dataclass(frozen=True, kw_only=True)
class TimeCuts:
    """Named time ranges (ns since the epoch, UTC, stop exclusive) in time order, and the ``embargo`` (ns)
    that ends each range followed by another before that one's start; ``text`` says how they were given."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    embargo: int = 0
    text: str = ""

    @classmethod
    def of_dates(cls, names: list[str], cuts_ns: list[int], embargo: int = 0, text: str = "") -> TimeCuts:
        """Consecutive splits: the first from the first bar, each later one from its cut time on."""
        edges = [_EARLIEST, *map(int, cuts_ns), _LATEST]
        return cls(names=tuple(names), starts=tuple(edges[:-1]), stops=tuple(edges[1:]), embargo=embargo, text=text)

    @classmethod
    def of_fold(cls, fold: Fold) -> TimeCuts:
        """A fold's ``train`` and ``val`` ranges, with its embargo; bars outside both are served by neither."""
        (a, b), (c, d) = fold.train, fold.val
        return cls(names=("train", "val"), starts=(a, c), stops=(b, d), embargo=fold.embargo, text=repr(fold))

    def ends(self) -> list[int]:
        """Where each range's bars end: its stop, or the embargo before the next range's start if that is sooner."""
        nxt = [*self.starts[1:], _LATEST]
        return [min(stop, s - self.embargo) if s != _LATEST else stop for stop, s in zip(self.stops, nxt)]

    def table(self, cache: Cache) -> SegmentTable:
        """``cache``'s segments (every split) cut again at these ranges' starts and ends, each piece in the range
        its bars' times fall in; bars in no range (before a fold, in an embargo) are left out."""
        seg = np.asarray(cache.segments, dtype=np.int64).reshape(-1, 3)
        ends = self.ends()
        times = sorted({*self.starts, *ends} - {_EARLIEST, _LATEST})
        bounds = [seg[:, 1]]
        if len(seg):
            first, last = cache.bar_times(seg[:, 1]), cache.bar_times(seg[:, 2] - 1)
            for cut in times:
                row = np.where(first >= cut, seg[:, 1], seg[:, 2])
                inside = np.flatnonzero((first < cut) & (last >= cut))
                row[inside] = _first_at(cache, seg[inside, 1], seg[inside, 2] - 1, cut)
                bounds.append(row)
        bounds.append(seg[:, 2])
        edges = np.stack(bounds, axis=1)  # per segment: start, one row per time, stop (non-decreasing)
        lo, hi = edges[:, :-1], edges[:, 1:]
        spans = list(zip([_EARLIEST, *times], [*times, _LATEST]))  # the time span of each column of pieces
        owner = [
            next((k for k, (s, e) in enumerate(zip(self.starts, ends)) if s <= a and b <= e), -1) for a, b in spans
        ]
        split = np.broadcast_to(np.asarray(owner, dtype=np.int8), lo.shape)
        keep = (hi > lo) & (split >= 0)
        sym = np.broadcast_to(seg[:, :1], lo.shape)
        table = np.stack([sym[keep], lo[keep], hi[keep]], axis=1)
        order = np.argsort(table[:, 1], kind="stable")
        return SegmentTable(
            segments=table[order], segment_split=split[keep][order], split_names=list(self.names), times=cache.bar_times
        )


def _first_at(cache: Cache, lo: np.ndarray, hi: np.ndarray, cut: int) -> np.ndarray:
    """For each pair, the first row in ``(lo, hi]`` whose bar time is at least ``cut``: one binary search of them all."""
    lo, hi = lo.copy(), hi.copy()
    while len(lo) and (hi - lo > 1).any():
        mid = (lo + hi) // 2
        before = cache.bar_times(mid) < cut
        lo, hi = np.where(before, mid, lo), np.where(before, hi, mid)
    return hi


@dataclass(frozen=True, kw_only=True)
class Cut:
    """Which bars a stream or a dataset serves, in time, checked when made.

    ``split`` names the split served (``"all"``: every split); ``split_times`` re-cuts every cache's splits
    at shared times (``"val=2023-05-15,test=2023-06-01"`` or a dict); ``fold`` (a ``walk_forward`` fold)
    serves its ``split="train"`` or ``"val"`` range, with the fold's embargo; ``embargo`` (a duration such
    as ``"1h"``) drops every window whose target lies within it before the next split's start.
    """

    split: str | None = None
    """The split served: a name of the cache's splits (or of ``split_times``' or the fold's), or ``"all"``."""
    split_times: str | Mapping[str, str] | None = None
    """The dates each later split starts at, for every cache (None: each cache's own splits)."""
    fold: Fold | None = None
    """A walk-forward fold (``shardcache.walk_forward``): its ``train`` and ``val`` ranges are the splits."""
    embargo: str | None = None
    """A duration: no window's target lies within it before the next split's start (None: none)."""

    def __post_init__(self) -> None:
        if self.split is not None and not isinstance(self.split, str):
            raise OptionTypeError(f"split={self.split!r}: must be a split name (a str) or 'all'")
        if self.fold is not None and not isinstance(self.fold, Fold):
            raise OptionTypeError(f"fold={self.fold!r}: give one of the folds shardcache.walk_forward returns")
        if self.fold is not None and self.split_times is not None:
            raise OptionTypeError("fold= and split_times= both cut the splits: pass one")
        if self.fold is not None and self.embargo is not None:
            raise OptionTypeError("fold= carries its own embargo (walk_forward(embargo=...)): drop embargo=")
        if self.fold is not None and self.split is None:
            raise OptionError("split", None, f"{self.fold!r}: pass split='train' or split='val'")
        if self.embargo is not None:
            duration_option("embargo", self.embargo, minimum=0)

    @property
    def embargo_ns(self) -> int:
        """The embargo in ns (0 without one)."""
        return 0 if self.embargo is None else duration_option("embargo", self.embargo, minimum=0)

    def times(self, first: Cache) -> TimeCuts | None:
        """The time ranges that cut every cache: the fold's, ``split_times``', or with an embargo alone the
        splits of ``first`` (every cache's, checked the same); None when each cache's own segments serve."""
        if self.fold is not None:
            return TimeCuts.of_fold(self.fold)
        if self.split_times is not None:
            names, cuts, text = _split_times(self.split_times)
            return TimeCuts.of_dates(names, cuts, self.embargo_ns, text)
        if self.embargo is None:
            return None
        splits = first.manifest.splits
        if len(splits.names) < 2:
            raise OptionError(
                "embargo", self.embargo, f"{first.url} has no splits to keep apart: pass split_times= or a fold"
            )
        return TimeCuts.of_dates(list(splits.names), list(splits.cuts_ns), self.embargo_ns)

    def signature(self) -> dict[str, Any]:
        """What a saved position records of the cut, each only when set (so older states stay as they were)."""
        text = None if self.split_times is None else _split_times(self.split_times)[2]
        mine = {"split_times": text, "fold": None if self.fold is None else repr(self.fold), "embargo": self.embargo}
        return {k: v for k, v in mine.items() if v is not None}

    def describe(self) -> str:
        """The cut in a few words for messages (empty without split_times, a fold or an embargo)."""
        if self.fold is not None:
            return repr(self.fold)
        said = [] if self.split_times is None else [f"split_times {_split_times(self.split_times)[2]}"]
        return ", ".join(said + ([] if self.embargo is None else [f"embargo {format_duration(self.embargo_ns)}"]))


def _split_times(value: Any) -> tuple[list[str], list[int], str]:
    """``split_times`` as split names, the cut times of the later ones (ns) and its text."""
    if isinstance(value, Mapping):
        text = ",".join(f"{k}={v}" for k, v in value.items())
    elif isinstance(value, str):
        text = value
    else:
        raise OptionTypeError(
            f"split_times={value!r}: give 'val=YYYY-MM-DD,test=YYYY-MM-DD' or a dict such as {{'val': '2023-05-15'}}"
        )
    try:
        spec = parse_split(text)
    except OptionError as exc:
        raise OptionError("split_times", value, exc.problem) from None
    if spec.dates_ns is None:
        raise OptionError("split_times", value, "takes the dates each later split starts at, not fractions")
    return list(spec.names), list(spec.dates_ns), text
