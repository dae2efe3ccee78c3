"""Helpers of the stream tests: window start rows from a batch's metadata, whatever the format."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["window_rows", "rows_of"]


def _first_rows(cache) -> np.ndarray:
    """Each symbol's first row in the cache's row space (its first segment's start)."""
    seg = np.asarray(cache.segments, dtype=np.int64)
    first = np.full(int(seg[:, 0].max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, seg[:, 0], seg[:, 1])
    return first


def window_rows(cache, index: torch.Tensor) -> np.ndarray:
    """Cache rows of the windows of a ``MetaBatch.index`` ([B, 2]: symbol, row in that symbol's bars)."""
    idx = index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    return _first_rows(cache)[idx[:, 0]] + idx[:, 1]


def rows_of(cache, batches) -> list[torch.Tensor]:
    """Per batch, the windows' cache rows as an int64 tensor (comparable across runs)."""
    first = _first_rows(cache)
    return [torch.from_numpy(first[b.index[:, 0].numpy()] + b.index[:, 1].numpy()) for b in batches]
