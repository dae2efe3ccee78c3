"""shardcache: every sliding window of long market-data series, streamed from a sharded Zarr v3 cache.

``build_cache`` writes DBN, Parquet or CSV bars once into a compressed, sharded Zarr v3 store with
``BuildOptions`` (``RunOptions`` say how one run goes) and ``append_cache`` adds later bars to it;
``Cache.manifest`` (a ``Manifest``) records how the cache was built and what it holds;
``WindowStream`` streams every window of it (stride 1) with bounded memory, its settings given as
objects (``Cut``, ``PlanSettings``, ``LoaderSettings``, ``LocalCopy``, ``Normalization``, one ``CacheSource`` per
cache) or their fields; ``walk_forward`` makes the folds (``Fold``) a ``Cut`` serves;
``WindowDataset`` is the map-style twin for evaluation;
``info``, ``shards``, ``open_symbol``, ``open_symbols`` and ``to_xarray`` show a cache to people
(``shardcache.inspect.views``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import CacheError, ShardcacheError, SourceError

if TYPE_CHECKING:  # what __getattr__ loads on first use, as type checkers and IDEs should see it
    from ._version import __version__
    from .format.build_options import BuildOptions
    from .format.cache import Cache, open_cache
    from .format.manifest import Manifest
    from .ingest.append import append_cache
    from .ingest.builder import build_cache
    from .ingest.run import RunOptions
    from .inspect.views import info, open_symbol, open_symbols, shards, to_xarray
    from .read.cuts import Cut
    from .read.folds import Fold, walk_forward
    from .read.normalize import Normalization
    from .read.settings import CacheSource, LoaderSettings, LocalCopy, PlanSettings
    from .read.stream import WindowDataset, WindowSpec, WindowStream

__all__ = [
    "BuildOptions",
    "Cache",
    "CacheError",
    "CacheSource",
    "Cut",
    "Fold",
    "LoaderSettings",
    "LocalCopy",
    "Manifest",
    "Normalization",
    "PlanSettings",
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
    "walk_forward",
]


_DEFINED_IN = {  # module: the names it defines
    "_version": ("__version__",),
    "format.build_options": ("BuildOptions",),
    "format.cache": ("Cache", "open_cache"),
    "format.manifest": ("Manifest",),
    "read.stream": ("WindowStream", "WindowDataset", "WindowSpec"),
    "read.settings": ("PlanSettings", "LoaderSettings", "LocalCopy", "CacheSource"),
    "read.cuts": ("Cut",),
    "read.folds": ("Fold", "walk_forward"),
    "read.normalize": ("Normalization",),
    "ingest.builder": ("build_cache",),
    "ingest.append": ("append_cache",),
    "ingest.run": ("RunOptions",),
    "inspect.views": ("info", "open_symbol", "open_symbols", "shards", "to_xarray"),
}
_LAZY = {name: module for module, names in _DEFINED_IN.items() for name in names}


def __getattr__(name: str) -> Any:
    """Load on first use: build workers never import torch (~150 MiB), training processes never
    import the builder's dask and pyarrow stack (~40 MiB), and the command line starts (and takes
    Ctrl-C) before zarr is imported."""
    if name not in _LAZY:
        raise AttributeError(f"module 'shardcache' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
