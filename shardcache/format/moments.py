"""Moments of feature columns over runs of bars: the count, mean and sum of squared deviations (M2) per feature.

Chan, Golub and LeVeque's pairwise merge combines two runs' moments exactly, so the statistics of any range of
bars are its whole blocks' stored moments merged with those of the partial blocks at its two edges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Moments", "range_moments"]


@dataclass(frozen=True)
class Moments:
    """The moments of ``len(count)`` runs of bars: ``count`` (B,) bars, ``mean`` and ``m2`` (B, F) in float64."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, features: int) -> Moments:
        """No runs at all."""
        return cls(np.zeros(0, np.int64), np.zeros((0, features)), np.zeros((0, features)))

    @classmethod
    def of(cls, x: np.ndarray, starts: np.ndarray | None = None) -> Moments:
        """The moments of the runs of rows of ``x`` that begin at ``starts`` (ascending; one run: all of ``x``)."""
        x = np.asarray(x, dtype=np.float64)
        starts = np.zeros(1, np.int64) if starts is None else np.asarray(starts, np.int64)
        count = np.diff(np.append(starts, len(x)))
        mean, m2 = np.zeros((len(starts), x.shape[1])), np.zeros((len(starts), x.shape[1]))
        some = count > 0
        if some.any():
            mean[some] = np.add.reduceat(x, starts[some], axis=0) / count[some, None]
            m2[some] = np.add.reduceat((x - np.repeat(mean, count, axis=0)) ** 2, starts[some], axis=0)
        return cls(count, mean, m2)

    def __len__(self) -> int:
        return len(self.count)

    def __add__(self, other: Moments) -> Moments:
        """Both runs' moments side by side (not merged)."""
        return Moments.concat([self, other])

    @classmethod
    def concat(cls, parts: list[Moments], features: int = 0) -> Moments:
        """``parts``' runs side by side, in order (not merged); ``features`` sizes an empty result."""
        if not parts:
            return cls.empty(features)
        return cls(
            np.concatenate([p.count for p in parts]),
            np.concatenate([p.mean for p in parts]),
            np.concatenate([p.m2 for p in parts]),
        )

    def select(self, keep: np.ndarray) -> Moments:
        """The runs ``keep`` picks (a mask or indices)."""
        return Moments(self.count[keep], self.mean[keep], self.m2[keep])

    def merged(self) -> Moments:
        """All runs as one, merged pairwise as a tree: exact, and its rounding grows with log(B), not B."""
        n, mean, m2 = self.count.astype(np.float64), self.mean, self.m2
        if len(n) == 0:
            return Moments(np.zeros(1, np.int64), np.zeros((1, mean.shape[1])), np.zeros((1, mean.shape[1])))
        while len(n) > 1:
            if len(n) % 2:
                n, mean, m2 = np.append(n, 0.0), np.vstack([mean, mean[-1:] * 0]), np.vstack([m2, m2[-1:] * 0])
            na, nb = n[0::2, None], n[1::2, None]
            tot = na + nb
            with np.errstate(invalid="ignore", divide="ignore"):
                delta = mean[1::2] - mean[0::2]
                share = np.where(tot > 0, nb / tot, 0.0)
                mean = mean[0::2] + delta * share
                m2 = m2[0::2] + m2[1::2] + delta**2 * na * share
            n = tot[:, 0]
        return Moments(n.astype(np.int64), mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Each run's population standard deviation; 1 where it is 0 (a constant feature is centred, not scaled)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.sqrt(np.where(self.count[:, None] > 0, self.m2 / self.count[:, None], 0.0))
        return np.where(std > 0, std, 1.0)


def range_moments(
    blocks: Moments, starts: np.ndarray, lo: int, hi: int, read: Callable[[int, int], np.ndarray]
) -> Moments:
    """The moments of rows ``[lo, hi)`` of a series stored in blocks beginning at rows ``starts`` (the first at 0):
    the whole blocks' ``blocks`` moments and, for the partial blocks at the two edges, their rows, ``read(a, b)``."""
    starts = np.asarray(starts, np.int64)
    stops = np.append(starts[1:], starts[-1] + blocks.count[-1]) if len(starts) else starts
    whole = (starts >= lo) & (stops <= hi)
    parts = blocks.select(whole)
    for a, b in zip(starts[~whole], stops[~whole], strict=True):
        a, b = max(int(a), lo), min(int(b), hi)
        if a < b:
            parts = parts + Moments.of(read(a, b))
    return parts.merged()
