"""Walk-forward folds over a cache's time range: train on a span of time, validate on the next, step forward.

A fold is plain data (times in ns since the epoch), made before a byte is read; a stream cut on a fold drops
every train window whose target lies within the embargo before the fold's validation start.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError, OptionTypeError
from ..format.cache import Cache, open_cache
from ..format.durations import format_duration, parse_duration

__all__ = ["Fold", "duration_option", "walk_forward"]


def _when(ns: int) -> str:
    """A time for a repr: to the minute, or the day where it is midnight."""
    text = str(np.datetime64(ns, "ns").astype("datetime64[m]"))
    return text.removesuffix("T00:00")


@dataclass(frozen=True, kw_only=True)
class Fold:
    """One walk-forward fold: ``train`` and ``val`` as ``(start, stop)`` times (int64 ns, stop exclusive), and
    the ``embargo`` (ns) before ``val``'s start within which no train target may lie."""

    index: int
    """The fold's place in time order, from 0."""
    train: tuple[int, int]
    """The train range: ``(start, stop)`` in ns since the epoch (UTC), stop exclusive."""
    val: tuple[int, int]
    """The validation range, as ``train``."""
    embargo: int
    """Ns before ``val``'s start within which no train window's target lies."""

    def __repr__(self) -> str:
        (a, b), (c, d) = self.train, self.val
        gap = f", embargo {format_duration(self.embargo)}" if self.embargo else ""
        return f"Fold {self.index}: train {_when(a)} .. {_when(b)}, val {_when(c)} .. {_when(d)}{gap}"


def _span(cache: Cache | str | os.PathLike[str] | tuple[int, int]) -> tuple[int, int]:
    """The first bar's time and one past the last's, of a cache (from its root index) or as given."""
    if isinstance(cache, tuple):
        return int(cache[0]), int(cache[1])
    index = open_cache(cache).shard_index()
    if not len(index.table):
        raise OptionError("cache", str(cache), "has no bars to fold")
    return int(index.column("first_ts").min()), int(index.column("last_ts").max()) + 1


def duration_option(name: str, text: object, minimum: int = 1) -> int:
    """Option ``name``'s duration (``"30D"``, ``"1h"``) in ns, at least ``minimum`` (1: longer than 0)."""
    if not isinstance(text, str) and not (isinstance(text, int) and not isinstance(text, bool) and text == 0):
        raise OptionTypeError(f"{name}={text!r}: give a duration such as '30D', '1h' or '5min'")
    try:
        ns = parse_duration(str(text))
    except ValueError as err:
        raise OptionError(name, text, str(err).removeprefix(f"bad duration {str(text)!r}: ")) from None
    if ns < minimum:
        raise OptionError(name, text, "must be longer than 0")
    return ns


def walk_forward(
    cache: Cache | str | os.PathLike[str] | tuple[int, int],
    *,
    train: str,
    val: str,
    step: str | None = None,
    embargo: str = "0",
    test: str | None = None,
    expanding: bool = False,
) -> list[Fold]:
    """Folds over ``cache``'s time range (or a ``(start, stop)`` in ns): fold ``k`` trains on ``train`` of time
    ending ``k * step`` after the first (from the first bar with ``expanding``) and validates on the ``val``
    after it; ``step`` defaults to ``val``; the last ``test`` of the range is in no fold. Only whole folds."""
    start, stop = _span(cache)
    n_train, n_val = duration_option("train", train), duration_option("val", val)
    n_step = n_val if step is None else duration_option("step", step)
    gap = duration_option("embargo", embargo, minimum=0)
    if test is not None:
        stop -= duration_option("test", test)
    if gap >= n_train:
        raise OptionError("embargo", embargo, f"is not shorter than a fold's train span ({train})")
    folds = []
    for k in itertools.count():
        cut = start + n_train + k * n_step
        if cut + n_val > stop:
            break
        folds.append(
            Fold(index=k, train=(start if expanding else cut - n_train, cut), val=(cut, cut + n_val), embargo=gap)
        )
    if not folds:
        have = format_duration(max(stop - start, 0))
        raise OptionError("train", train, f"and val {val} need more time than the range holds ({have})")
    return folds
