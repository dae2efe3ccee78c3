"""shardcache: every sliding window of long market-data series, streamed from a sharded Zarr v3 cache.

``build_cache`` writes DBN, Parquet or CSV bars once into a compressed, sharded Zarr v3 store with
``BuildOptions`` (``RunOptions`` say how one run goes) and ``append_cache`` adds later bars to it;
``Cache.manifest`` (a ``Manifest``) records how the cache was built and what it holds;
``WindowStream`` streams every window of it (stride 1) with bounded memory;
``WindowDataset`` is the map-style twin for evaluation;
``info``, ``shards``, ``open_symbol``, ``open_symbols`` and ``to_xarray`` show a cache to people
(``shardcache.inspect.views``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CacheError, ShardcacheError, SourceError
from .format.build_options import BuildOptions
from .format.cache import Cache, open_cache
from .format.manifest import Manifest

if TYPE_CHECKING:  # what __getattr__ loads on first use, as type checkers and IDEs should see it
    from .build.append import append_cache
    from .build.builder import build_cache
    from .build.run import RunOptions
    from .inspect.views import info, open_symbol, shards, to_xarray
    from .read.stream import WindowDataset, WindowSpec, WindowStream

__all__ = [
    "BuildOptions",
    "Cache",
    "CacheError",
    "Manifest",
    "RunOptions",
    "ShardcacheError",
    "SourceError",
    "WindowDataset",
    "WindowSpec",
    "WindowStream",
    "__version__",
    "append_cache",
    "build_cache",
    "info",
    "open_cache",
    "open_symbol",
    "open_symbols",
    "shards",
    "to_xarray",
]


def __getattr__(name: str) -> Any:
    """Load on first use: build workers never import torch (~150 MiB), training processes
    never import the builder's dask and pyarrow stack (~40 MiB)."""
    if name in ("WindowStream", "WindowDataset", "WindowSpec"):
        from .read import stream

        return getattr(stream, name)
    if name == "build_cache":
        from .build.builder import build_cache

        return build_cache
    if name in ("info", "open_symbol", "open_symbols", "shards", "to_xarray"):
        from .inspect import views

        return getattr(views, name)
    if name == "RunOptions":
        from .build.run import RunOptions

        return RunOptions
    if name == "append_cache":
        from .build.append import append_cache

        return append_cache
    raise AttributeError(f"module 'shardcache' has no attribute {name!r}")
