"""Shared pytest fixtures. Each section belongs to one part of the project; add new sections below."""

from __future__ import annotations

import pytest

from helpers import Bars, make_cache, synthetic_bars

# ---- window index and stream (shardcache/index.py, shardcache/stream.py) -------------------


@pytest.fixture(scope="session")
def stream_bars() -> Bars:
    """6000 bars, 5 features, 3 symbols with gaps, tiny segments and train/val/test splits."""
    return synthetic_bars(6000, 5, n_symbols=3, seed=7)


@pytest.fixture(scope="session")
def stream_cache(tmp_path_factory, stream_bars):
    """``stream_bars`` written with 512-row shards (12 shards, several pools per epoch)."""
    path = tmp_path_factory.mktemp("stream") / "bars.zarr"
    return make_cache(path, stream_bars, shard_rows=512, chunk_rows=128)
