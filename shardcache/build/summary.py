"""The manifest's counted parts, computed one way for a build and an append: bars per split,
the summary's window count, and stored against raw bytes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np

from ..format.windows import SegmentTable, n_windows

__all__ = ["bytes_summary", "split_bar_counts", "stored_bytes", "window_count"]


def stored_bytes(url: str, storage_options: dict | None) -> int:
    """Bytes of every symbol's ``features`` shard objects (what the compression ratio is about)."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    found = fs.find(path.rstrip("/") + "/symbols", detail=True)
    return int(sum(d["size"] for p, d in found.items() if "/features/c/" in p))


def split_bar_counts(segments: np.ndarray, segment_split: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """Bars per split name, from a segment table (the manifest's ``splits.bars``)."""
    return {name: int(np.diff(segments[segment_split == i, 1:], axis=1).sum()) for i, name in enumerate(names)}


def window_count(
    segments: np.ndarray, segment_split: np.ndarray, names: Sequence[str], seq_len: int, horizon: int
) -> int:
    """The summary's window count at ``seq_len``/``horizon``, stride 1, every split."""
    table = SegmentTable(segments=segments, segment_split=segment_split, split_names=list(names))
    return n_windows(table, seq_len, horizon=horizon)


def bytes_summary(stored: int, raw: int) -> dict[str, Any]:
    """The manifest's ``bytes``: stored against raw float32 features, and their ratio."""
    return {"stored": stored, "raw": raw, "ratio": round(raw / stored, 3) if stored else None}
