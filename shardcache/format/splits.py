"""Train/val/test splits: the ``split`` build option parsed, and resolved to cut timestamps.

Every split is a time range shared by all symbols, so no symbol's validation data overlaps another's
training data in time. Fractions are of all bars; dates name where each later split starts.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError

__all__ = ["SplitSpec", "parse_split"]


@dataclass(frozen=True)
class SplitSpec:
    """Split names in time order and the timestamps where each later split starts."""

    names: list[str]
    fractions: list[float] | None = None
    dates_ns: list[int] | None = None
    text: str = "none"

    def fraction_cuts(self, points: np.ndarray, weights: np.ndarray) -> list[int]:
        """Cut timestamps placing ``fractions`` of the weighted ``points`` before each later split."""
        order = np.argsort(points, kind="stable")
        cum = np.cumsum(weights[order])
        cuts = []
        for f in np.cumsum((self.fractions or [])[:-1]):
            j = min(int(np.searchsorted(cum, f * cum[-1], side="left")) + 1, len(order) - 1)
            cuts.append(int(points[order][j]))
        return cuts

    def at(self, cuts_ns: Sequence[int]) -> SplitSpec:
        """These splits cut at fixed times (one per later split): a rebuild keeps the times its cache's
        fractions were resolved to, so no bar changes split."""
        cuts = [int(c) for c in cuts_ns]
        if len(cuts) != len(self.names) - 1 or cuts != sorted(set(cuts)):
            raise OptionError(
                "split",
                self.text,
                f"{len(cuts)} cut time(s) given where its {len(self.names)} splits need {len(self.names) - 1}, increasing",
            )
        return SplitSpec(self.names, dates_ns=cuts, text=self.text)


def parse_split(text: str | None) -> SplitSpec:
    """Parse ``none``, ``train=0.8,val=0.1,test=0.1`` or ``val=2024-06-01,test=2024-09-01``."""
    if text is not None and not text.strip():
        raise OptionError("split", text, "is empty: write none, NAME=FRACTION pairs or NAME=DATE pairs")
    if text is None or text.strip() == "none":
        return SplitSpec(["all"])
    pairs = []
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise OptionError("split", text, "expected NAME=FRACTION or NAME=DATE pairs")
        pairs.append((name.strip(), value.strip()))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise OptionError("split", text, "a split name appears twice")
    try:
        fractions = [float(v) for _, v in pairs]
    except ValueError:
        fractions = None
    if fractions is not None:
        if not all(math.isfinite(f) and f > 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise OptionError("split", text, "fractions must be finite, positive and sum to 1")
        return SplitSpec(names, fractions=fractions, text=text)
    if "train" in names:
        raise OptionError(
            "split", text, "with dates, name only the later splits (train is everything before the first date)"
        )
    if any(_is_number(v) for _, v in pairs):
        raise OptionError("split", text, "values must be all fractions or all dates (YYYY-MM-DD)")
    dates = [_date_ns(text, v) for _, v in pairs]
    if dates != sorted(dates) or len(set(dates)) != len(dates):
        raise OptionError("split", text, "dates must increase")
    return SplitSpec(["train", *names], dates_ns=dates, text=text)


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _date_ns(text: str, value: str) -> int:
    """A split date or time as ns since the epoch, UTC: a zone or offset (``Z``, ``+01:00``) is converted,
    none is taken as UTC; refused naming the value when it is no date (``2023-02-30``)."""
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        when, why = None, str(exc)
    if when is not None and when.tzinfo is not None:  # numpy would warn that it has no time zones
        return int(np.datetime64(when.astimezone(dt.UTC).replace(tzinfo=None), "ns").astype(np.int64))
    try:
        return int(np.datetime64(value, "ns").astype(np.int64))
    except ValueError:
        why = f": {why}" if when is None and _looks_like_a_date(value) else ""
        raise OptionError(
            "split", text, f"{value!r} is not a date or time (YYYY-MM-DD[THH:MM[:SS]][Z|+HH:MM]){why}"
        ) from None


def _looks_like_a_date(value: str) -> bool:
    return len(value) >= 8 and value[:4].isdigit() and value[4] == "-"
