"""Test helpers: small OHLCV bar files (Parquet, CSV) as a user's exports look, written with pyarrow."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

__all__ = ["T0", "ohlcv", "write_csv", "write_parquet"]

T0 = 1_672_660_800  # 2023-01-02 12:00:00 UTC, in seconds


def ohlcv(n: int, *, step_s: int = 60, start_s: int = T0, seed: int = 0, symbol: str | None = None) -> pa.Table:
    """``n`` bars ``step_s`` apart from ``start_s``: ``[symbol,] ts, open, high, low, close, volume``."""
    rng = np.random.default_rng(seed)
    close = 100 + np.cumsum(rng.standard_normal(n) * 0.1)
    open_ = close + rng.standard_normal(n) * 0.05
    cols = {
        "ts": pa.array((start_s + np.arange(n, dtype=np.int64) * step_s) * 10**9, pa.timestamp("ns", tz="UTC")),
        "open": open_,
        "high": np.maximum(open_, close) + 0.1,
        "low": np.minimum(open_, close) - 0.1,
        "close": close,
        "volume": rng.integers(1, 100, n).astype(np.float64),
    }
    if symbol is not None:
        cols = {"symbol": pa.array([symbol] * n), **cols}
    return pa.table(cols)


def write_parquet(path: str | os.PathLike[str], table: pa.Table) -> str:
    pq.write_table(table, path)
    return os.fspath(path)


def write_csv(path: str | os.PathLike[str], table: pa.Table) -> str:
    pcsv.write_csv(table, path)
    return os.fspath(path)
