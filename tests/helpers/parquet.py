"""Test helpers for the user-facing format tests: bars per symbol, written to one Parquet file with
pyarrow and built by the real ``build_cache`` with raw, unnormalized features, so that what a zarr
or xarray user reads back can be compared with the source values exactly."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardcache import Cache, build_cache

__all__ = ["SourceBars", "build_raw", "make_bars", "write_parquet"]

T0 = 1_700_000_000_000_000_000  # 2023-11-14 22:13:20 UTC
MINUTE = 60_000_000_000


@dataclass
class SourceBars:
    """One symbol's bars as its source holds them: strictly increasing times, float32 values."""

    ts: np.ndarray
    values: np.ndarray


def make_bars(counts: dict[str, int], n_features: int = 3, seed: int = 0, gaps: int = 2) -> dict[str, SourceBars]:
    """Minute bars per symbol with ``gaps`` breaks of a few hours each; feature 0 is the bar number."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, (symbol, n) in enumerate(counts.items()):
        step = np.full(n, MINUTE, dtype=np.int64)
        if n > 2 and gaps:
            step[rng.integers(1, n, gaps)] = 4 * 60 * MINUTE
        ts = T0 + k * 7 * MINUTE + np.cumsum(step)
        values = rng.standard_normal((n, n_features)).astype(np.float32)
        values[:, 0] = np.arange(n, dtype=np.float32)
        out[symbol] = SourceBars(ts, values)
    return out


def write_parquet(path: str | os.PathLike[str], bars: dict[str, SourceBars], shuffle_seed: int | None = 0) -> str:
    """All symbols in one Parquet file (``symbol``, ``ts`` as timestamp[ns, UTC], ``x0..``), rows shuffled."""
    symbols = np.concatenate([np.full(len(b.ts), s, dtype=object) for s, b in bars.items()])
    ts = np.concatenate([b.ts for b in bars.values()])
    values = np.concatenate([b.values for b in bars.values()])
    order = np.random.default_rng(shuffle_seed).permutation(len(ts)) if shuffle_seed is not None else np.arange(len(ts))
    columns = {
        "symbol": pa.array(symbols[order], type=pa.string()),
        "ts": pa.array(ts[order], type=pa.timestamp("ns", tz="UTC")),
    }
    columns.update({f"x{j}": pa.array(values[order, j]) for j in range(values.shape[1])})
    pq.write_table(pa.table(columns), path, row_group_size=4096)
    return os.fspath(path)


def build_raw(parquet: str, out: str | os.PathLike[str], **options) -> Cache:
    """``build_cache`` with the source columns as features, not normalized (``--normalize none``)."""
    options = {"features": "raw", "normalize": "none", "seq_len": 1, "progress": False, **options}
    return build_cache(parquet, out, **options)
