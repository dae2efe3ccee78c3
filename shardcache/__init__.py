"""shardcache: every sliding window of long market-data series, streamed from a sharded Zarr v3 cache."""

from __future__ import annotations

from .errors import CacheError, ShardcacheError, SourceError
from .store import Cache, open_cache

__all__ = [
    "Cache",
    "CacheError",
    "ShardcacheError",
    "SourceError",
    "open_cache",
]
__version__ = "0.1.0"
