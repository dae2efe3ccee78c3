"""``WindowDataset``: the map-style twin of ``WindowStream`` for evaluation and random access.

``ds[i]`` is the ``i``-th valid window in row order, with the stream's window settings and
split rule; the last few decoded shard blocks are kept, so nearby indices cost no zarr call.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..format.cache import Cache
from .options import Batch, check_split, columns, open_for_reading, window_spec
from .plan import WindowSpec, no_windows_error, valid_ranges

__all__ = ["WindowDataset"]

_LRU_BLOCKS = 4


class WindowDataset(Dataset):
    """Map-style windows in row order: ``ds[i]`` is ``Batch(x [seq_len, F], y [T])`` of the ``i``-th
    valid window (``y [len(horizon), T]`` for a sequence of horizons).

    Takes the window settings of ``WindowStream`` (keyword-only after ``seq_len``, the same
    split rule). Keeps the last few decoded shard blocks, so nearby indices cost no zarr call.
    """

    def __init__(
        self,
        cache: Cache | str | os.PathLike[str],
        seq_len: int | WindowSpec,
        *,
        split: str | None = None,  # first: an evaluation names the split it reads
        horizon: int | Sequence[int] | None = None,
        stride: int | None = None,
        features: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
        storage_options: dict | None = None,
    ) -> None:
        self.spec = window_spec(seq_len, horizon, stride, features, target)  # options first, then the cache
        self.cache = open_for_reading(cache, storage_options)
        self.split = check_split(self.cache, split)
        self._ranges = valid_ranges(self.cache, self.spec, split=self.split)
        self._n = self._ranges.total()
        if not self._n:
            raise no_windows_error(self.cache, self.spec, self.split)
        self._xcols = columns(self.cache, self.spec.features, "features")
        self._ycols = columns(self.cache, self.spec.target, "target")
        self._ysteps = [self.spec.seq_len - 1 + h for h in self.spec.horizons]
        self._lru: OrderedDict[int, tuple[int, np.ndarray]] = OrderedDict()

    seq_len = property(lambda self: self.spec.seq_len)
    horizon = property(lambda self: self.spec.horizon)
    span = property(lambda self: self.spec.span)

    def __len__(self) -> int:
        return self._n

    def row(self, i: int) -> int:
        """Start row of window ``i`` in the cache's row space (``cache.locate`` names its symbol and row)."""
        if not -self._n <= i < self._n:
            raise IndexError(f"window {i} out of range for {self._n} windows")
        return int(self._ranges.start_at(np.asarray([i % self._n]))[0])

    def __getitem__(self, i: int) -> Batch:
        p = self.row(i)
        row0, block = self._block(p // self.cache.shard_rows)
        w = block[p - row0 : p - row0 + self.seq_len]
        t = block[[p - row0 + k for k in self._ysteps]]
        x = w if self._xcols is None else w[:, self._xcols]
        y = t if self._ycols is None else t[:, self._ycols]
        return Batch(torch.tensor(x), torch.tensor(y if isinstance(self.spec.horizon, tuple) else y[0]))

    def _block(self, shard: int) -> tuple[int, np.ndarray]:
        """Rows of ``shard`` plus the overhang its last windows need, from the LRU or one zarr call."""
        hit = self._lru.get(shard)
        if hit is not None:
            self._lru.move_to_end(shard)
            return hit
        lo = shard * self.cache.shard_rows
        hi = min(lo + self.cache.shard_rows + self.span - 1, self.cache.region_stop(lo))
        self._lru[shard] = hit = (lo, self.cache.read_rows(lo, hi))
        while len(self._lru) > _LRU_BLOCKS:
            self._lru.popitem(last=False)
        return hit

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lru"] = OrderedDict()
        return state

    def __repr__(self) -> str:
        return f"WindowDataset({self.cache.url!r}, seq_len={self.seq_len}, horizon={self.horizon}, windows={self._n})"
