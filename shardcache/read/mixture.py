"""Windows of several caches in given proportions: ``Mixture`` (``weights``, ``epoch_windows``) and
the epoch order it makes (``Shares``).

Each cache serves from an endless sequence of cycles (its shards shuffled by ``(seed, k, c)``), epoch ``e``
taking the next ``n_k`` windows of it, so no window comes twice before every window came once. The
caches' pieces are interleaved by ``(seed, epoch)``, and no pool spans two cycles of one cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.random import default_rng

from ..errors import OptionError, OptionTypeError
from ..format.numbers import whole_number
from ..format.windows import Ranges

__all__ = ["MAX_PASSES", "Mixture", "Shares", "apportion", "pieces_between"]

MAX_PASSES = 10_000  # passes over one cache in one epoch: 0.13 ms each to plan (a 2-cache mix, 2026-12-06)


@dataclass(frozen=True, kw_only=True)
class Mixture:
    """How much of each cache an epoch serves: every window once (``weights=None``), or ``epoch_windows``
    windows (None: every cache's windows together) in the proportions ``weights``, one per cache."""

    weights: tuple[float, ...] | None = None
    epoch_windows: int | None = None

    @classmethod
    def of(cls, *, weights: Any, epoch_windows: Any, n_sources: int) -> Mixture:
        """The settings as a user gives them, checked against the number of caches."""
        if weights is None:
            if epoch_windows is not None:
                raise OptionError(
                    "epoch_windows",
                    epoch_windows,
                    "applies with {weights}; without weights every epoch serves every window once",
                    {"weights": None},
                )
            return cls()
        values = _numbers(weights)
        if len(values) != n_sources:
            raise OptionError(
                "weights", weights, f"{len(values)} weight(s) for {n_sources} cache(s): give one per cache"
            )
        if any(isinstance(w, bool | np.bool_) for w in values):
            raise OptionError(
                "weights", weights, "True and False are not weights: give one number per cache, such as (1, 0)"
            )
        if not all(_is_real(w) and math.isfinite(float(w)) and float(w) >= 0 for w in values):
            raise OptionError("weights", weights, "each weight must be a finite number >= 0")
        if not sum(float(w) for w in values) > 0:
            raise OptionError("weights", weights, "at least one weight must be above 0")
        epochs = None if epoch_windows is None else whole_number("epoch_windows", epoch_windows, 1)
        return cls(weights=tuple(float(w) for w in values), epoch_windows=epochs)

    def shares(self, row_bounds: np.ndarray, ranges: Ranges) -> Shares | None:
        """Windows of each source per epoch (None without weights), the sources being the row ranges
        ``row_bounds[k]:row_bounds[k + 1]`` of ``ranges``' row space."""
        if self.weights is None:
            return None
        total = int(ranges.total()) if self.epoch_windows is None else self.epoch_windows
        return Shares(row_bounds=np.asarray(row_bounds, np.int64), windows=apportion(total, self.weights))

    def signature(self) -> dict[str, Any]:
        """What a saved position records of the mixture."""
        return {
            "weights": None if self.weights is None else list(self.weights),
            "epoch_windows": self.epoch_windows,
        }


def _numbers(weights: Any) -> list[Any]:
    """The weights as a list: from a list, a tuple, or a 1-D array or tensor (``tolist``); other types refused."""
    if isinstance(weights, str | bytes) or not (isinstance(weights, Sequence) or hasattr(weights, "tolist")):
        raise OptionTypeError(f"weights={weights!r}: give one number per cache, such as (0.75, 0.25)")
    values = weights if isinstance(weights, Sequence) else weights.tolist()
    if not isinstance(values, list | tuple):  # a 0-d array or tensor: one number, not one per cache
        raise OptionTypeError(f"weights={weights!r}: give one number per cache, such as (0.75, 0.25)")
    return list(values)


def _is_real(w: Any) -> bool:
    return isinstance(w, int | float | np.integer | np.floating) and not isinstance(w, bool | np.bool_)


def pieces_between(cum: np.ndarray, sizes: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces (``sizes`` windows each, ``cum`` their running total from 0) holding positions ``[a, b)``
    of their sequence: their indices, and the window range ``[lo, hi)`` of each that lies there."""
    first = int(np.searchsorted(cum, a, side="right")) - 1
    last = int(np.searchsorted(cum, b, side="left"))
    js = np.arange(max(first, 0), min(last, len(sizes)), dtype=np.int64)
    lo, hi = np.clip(a - cum[js], 0, None), np.minimum(sizes[js], b - cum[js])
    keep = hi > lo
    return js[keep], lo[keep], hi[keep]


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """``total`` split in proportion to ``weights`` (exact rationals), by largest remainders (the first on ties)."""
    fr = [Fraction(w) for w in weights]
    whole = sum(fr)
    exact = [total * f / whole for f in fr]
    base = [math.floor(e) for e in exact]
    rest = total - sum(base)
    for k in sorted(range(len(fr)), key=lambda k: (base[k] - exact[k], k))[:rest]:
        base[k] += 1
    return np.asarray(base, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class Shares:
    """``windows[k]`` windows per epoch from source ``k``, rows ``row_bounds[k]:row_bounds[k + 1]`` of the plan's."""

    row_bounds: np.ndarray
    windows: np.ndarray

    @property
    def total(self) -> int:
        return int(self.windows.sum())

    def sequence(
        self, ids: np.ndarray, per_shard: np.ndarray, shard_rows: int, *, seed: int, epoch: int, shuffle: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s pieces in order (shard, first and end of its windows) and the positions of those that
        begin a new cycle of their source (``breaks``), from the shards ``ids`` and their window counts."""
        src = np.searchsorted(self.row_bounds, ids * shard_rows, side="right") - 1
        self._check_passes([int(per_shard[src == k].sum()) for k in range(len(self.windows))])
        parts = [
            self._draw(
                k, n, ids[(src == k) & (per_shard > 0)], per_shard[(src == k) & (per_shard > 0)], seed, epoch, shuffle
            )
            for k, n in enumerate(self.windows.tolist())
        ]
        shards, lo, hi, new = (np.concatenate([p[i] for p in parts]) for i in range(4))
        label = np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])
        if shuffle:  # a random interleaving: slot i takes the next piece of source slots[i]
            slots = default_rng([seed, epoch, 3]).permutation(label)
            take = np.empty(len(label), np.int64)
            take[np.argsort(slots, kind="stable")] = np.arange(len(label))
        else:  # evenly: each piece at its source's fraction of the epoch served by its middle
            done = np.concatenate([np.cumsum(p[2] - p[1]) - (p[2] - p[1]) / 2 for p in parts])
            take = np.argsort(done / np.maximum(self.windows[label], 1), kind="stable")
        return shards[take], lo[take], hi[take], np.flatnonzero(new[take])

    def _check_passes(self, whole: Sequence[int]) -> None:
        """Refuse an epoch that passes over a cache more than ``MAX_PASSES`` times: its plan lists every pass's pieces."""
        passes = [-(-n // w) if w else 0 for n, w in zip(self.windows.tolist(), whole)]
        k = int(np.argmax(passes))
        if passes[k] > MAX_PASSES:
            most = MAX_PASSES * whole[k] * self.total // int(self.windows[k])
            raise OptionError(
                "epoch_windows",
                self.total,
                f"an epoch would pass over cache {k}'s {whole[k]:,} windows {passes[k]:,} times; at most "
                f"{MAX_PASSES:,} passes an epoch: give epoch_windows <= {most:,}",
            )

    @staticmethod
    def _draw(
        k: int, n: int, shards: np.ndarray, sizes: np.ndarray, seed: int, epoch: int, shuffle: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """CacheSource ``k``'s pieces of epoch ``epoch``: positions ``[epoch * n, (epoch + 1) * n)`` of its cycles."""
        whole = int(sizes.sum())
        out: list[tuple[np.ndarray, ...]] = [(np.zeros(0, np.int64),) * 3 + (np.zeros(0, bool),)]
        if not n or not whole:
            return out[0]  # type: ignore[return-value]
        a, b = epoch * n, (epoch + 1) * n  # Python ints: no overflow whatever the epoch
        for c in range(a // whole, (b - 1) // whole + 1):
            order = default_rng([seed, k, c, 2]).permutation(len(shards)) if shuffle else np.arange(len(shards))
            size = sizes[order]
            cum = np.concatenate([[0], np.cumsum(size)])
            js, lo, hi = pieces_between(cum, size, max(a - c * whole, 0), min(b - c * whole, whole))
            new = np.zeros(len(js), bool)
            new[:1] = c > a // whole  # a cycle begun inside the epoch
            out.append((shards[order[js]], lo, hi, new))
        return tuple(np.concatenate([p[i] for p in out]) for i in range(4))  # type: ignore[return-value]
