"""Views of a cache for people: its summary (``info``), its shard table (``shards``, ``shardcache ls``) and
its symbols as xarray objects (``to_xarray``, ``open_symbol``, ``open_symbols``): what plain xarray opens,
labelled from the manifest, a dask chunk per shard. Functions, not ``Cache`` methods: the format never
imports its views.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import CacheError
from ..format.cache import Cache, open_cache
from ..format.remote import filesystem
from ..format.typed_json import dump
from ..tuning import OPEN_THREADS

if TYPE_CHECKING:
    import xarray

    from ..read.cuts import Cut

__all__ = ["ShardInfo", "info", "open_symbol", "open_symbols", "shards", "to_xarray"]


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One stored shard of one symbol's ``features``: its object, its rows and bars, its size."""

    symbol: str
    """The shard's symbol."""
    symbol_id: int
    """Its index into the cache's ``symbols``."""
    group: str
    """The symbol's group path, relative to the root."""
    shard: int
    """The shard's index among the symbol's shards."""
    key: str
    """The shard object's key, relative to the root."""
    start: int
    """First row of the shard in the symbol's arrays."""
    stop: int
    """Row after its last."""
    first_ts: int
    """Its first bar's time (ns since the epoch, UTC)."""
    last_ts: int
    """Its last bar's time (ns since the epoch, UTC)."""
    raw_bytes: int
    """Its features decoded (float32 bytes)."""
    stored_bytes: int | None
    """Its object's size (None: the object is missing)."""

    @property
    def rows(self) -> int:
        """Bars in the shard."""
        return self.stop - self.start

    @property
    def missing(self) -> bool:
        """Whether the shard's object is missing."""
        return self.stored_bytes is None

    @property
    def ratio(self) -> float | None:
        """Decoded over stored bytes (None for a missing or empty shard object)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, with the time range also as ISO 8601 UTC strings."""
        return {
            "symbol": self.symbol,
            "symbol_id": self.symbol_id,
            "group": self.group,
            "shard": self.shard,
            "key": self.key,
            "start": self.start,
            "stop": self.stop,
            "rows": self.rows,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "first_time": str(np.datetime64(self.first_ts, "ns")),
            "last_time": str(np.datetime64(self.last_ts, "ns")),
            "raw_bytes": self.raw_bytes,
            "stored_bytes": self.stored_bytes,
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "missing": self.missing,
        }


def shards(cache: Cache | str | os.PathLike[str]) -> list[ShardInfo]:
    """Every stored shard, symbol by symbol: object key, local rows, time range, stored size, ratio.

    Rows and bar times come from the root shard index (``format.index``), read once; a shard object that
    is not there shows as missing (``stored_bytes=None``).
    """
    cache = open_cache(cache)
    table = cache.root_shards
    if not len(table):
        return []
    names, groups = cache.symbols, cache.groups
    keys = [cache.shard_key(s) for s in range(len(table))]
    stored = _stored_sizes(cache, keys)
    return [
        ShardInfo(
            symbol=names[i],
            symbol_id=i,
            group=groups[i],
            shard=k,
            key=key,
            start=k * cache.shard_rows,
            stop=k * cache.shard_rows + rows,
            first_ts=t0,
            last_ts=t1,
            raw_bytes=rows * cache.n_features * 4,
            stored_bytes=stored.get(key),
        )
        for (i, k, rows, t0, t1), key in zip(table[:, :5].tolist(), keys)  # format.index.SHARD_FIELDS
    ]


def _stored_sizes(cache: Cache, keys: list[str]) -> dict[str, int]:
    """Stored bytes of the objects ``keys`` that exist: stat-ed locally, an object store listed once."""
    if "://" not in cache.url or cache.url.startswith("file://"):
        root = cache.url.removeprefix("file://")
        sizes = {}
        for key in keys:
            try:
                sizes[key] = os.stat(os.path.join(root, *key.split("/"))).st_size
            except FileNotFoundError:
                continue
        return sizes
    fs, root = filesystem(cache.url, cache.storage_options)
    root = root.rstrip("/") + "/"
    try:
        found = fs.find(root + "symbols", detail=True)
    except FileNotFoundError:
        return {}
    return {p[len(root) :]: int(d["size"]) for p, d in found.items() if p.startswith(root)}


def info(
    cache: Cache | str | os.PathLike[str], seq_len: int = 60, horizon: int | str = 1, cut: Cut | None = None
) -> dict[str, Any]:
    """A summary for people and scripts: counts, splits, windows per split at ``seq_len``/``horizon`` (bars or
    a duration such as ``"5min"``: a read-time choice, counted by ``windows.n_windows``), features with their
    statistics, size; with a ``cut`` (``split_times``, an embargo or a fold), ``"cut"``: its splits' ranges,
    bars and windows and its train range's statistics (``cut_stats.cut_info``)."""
    from ..format.windows import WindowSpec, n_windows

    spec = WindowSpec(seq_len, horizon)  # checked before the cache is read
    cache = open_cache(cache)
    m = cache.manifest
    per_split = {name: n_windows(cache, spec, split=name) for name in cache.split_names}
    extra = {}
    if cut is not None:  # the read side (and torch) loads only for a cut
        from .cut_stats import cut_info

        extra["cut"] = cut_info(cache, cut, spec)
    return {
        "path": cache.url,
        "format_version": m.format_version,
        "bars": cache.n_bars,
        "symbols": cache.symbols,
        "bars_per_symbol": [int(n) for n in cache.bars_per_symbol],
        "segments": len(cache.segments),
        "shards": cache.n_shards,
        "features": cache.feature_names,
        "stats": cache.stats,
        "normalize": m.normalize,
        "splits": dump(m.splits),
        "seq_len": seq_len,
        "horizon": horizon,
        "windows": sum(per_split.values()),
        "windows_per_split": per_split,
        "layout": dump(m.layout),
        "counts": dump(m.counts),
        "bytes": dump(m.bytes),
        "created": m.created,
        **extra,
    }


def _xarray() -> Any:
    try:
        import xarray as xr
    except ImportError:
        raise CacheError("the xarray views need xarray: pip install 'shardcache[xarray]'") from None
    return xr


def _open_kwargs(cache: Cache) -> dict[str, Any]:
    """Arguments for xarray's zarr backend: one dask chunk per shard and the cache's own store (so xarray reads
    neither root nor manifest again); ``consolidated`` only when it is (so xarray neither warns nor looks)."""
    root = cache.handles.group
    return {
        "chunks": {"time": cache.shard_rows},
        "zarr_format": 3,
        "consolidated": root.metadata.consolidated_metadata is not None,
        "store": root.store_path.store,
    }


def _labelled(ds: xarray.Dataset, cache: Cache, i: int, split: bool, names: bool = True) -> xarray.Dataset:
    """``ds`` (a symbol's group) labelled: symbol, feature statistics, with ``names`` features, ``split`` per bar."""
    coords: dict[str, Any] = {"symbol": cache.symbols[i]}
    if names:
        coords["feature"] = ("feature", np.asarray(cache.feature_names, dtype=str))
    stats = cache.stats
    if stats:
        coords["feature_mean"] = ("feature", np.asarray([stats[n]["mean"] for n in cache.feature_names]))
        coords["feature_std"] = ("feature", np.asarray([stats[n]["std"] for n in cache.feature_names]))
    if split:
        codes = np.zeros(ds.sizes["time"], dtype=np.int8)
        for _, lo, hi, code in cache.local_segments[cache.local_segments[:, 0] == i].tolist():
            codes[lo:hi] = code
        coords["split"] = ("time", np.asarray(cache.split_names)[codes])
    out = ds.assign_coords(coords)
    out.attrs.update({"cache": cache.url, "shard_rows": cache.shard_rows})
    return out


def _symbol_id(cache: Cache, symbol: str | int) -> int:
    if isinstance(symbol, (int, np.integer)) and not isinstance(symbol, bool):
        if not 0 <= symbol < len(cache.symbols):
            raise CacheError(f"{cache.url}: no symbol #{symbol}; the cache has {len(cache.symbols)} symbols")
        return int(symbol)
    if isinstance(symbol, str) and symbol in cache.symbols:
        return cache.symbols.index(symbol)
    raise CacheError(f"{cache.url}: no symbol {symbol!r}")


def open_symbol(cache: Cache | str | os.PathLike[str], symbol: str | int) -> xarray.Dataset:
    """One symbol as a lazy ``xarray.Dataset``: ``xr.open_zarr(CACHE, group=path)`` plus labels.

    ``features (time, feature)`` over a datetime64 ``time`` index, one dask chunk per shard, so
    ``.sel(time=slice(a, b))`` reads only the shards covering that range; coordinates ``feature``,
    ``split`` (per bar), ``symbol`` and, when normalized, ``feature_mean``/``feature_std``
    (``ds.features * ds.feature_std + ds.feature_mean`` gives source units). ``symbol`` is its
    name or its index in ``cache.symbols``. A missing shard reads as NaN: check with ``shardcache ls``.
    """
    return next(iter(open_symbols(cache, [symbol]).values()))


def open_symbols(cache: Cache | str | os.PathLike[str], symbols: Sequence[str | int]) -> dict[str, xarray.Dataset]:
    """Several symbols as lazy ``xarray.Dataset`` objects (each as ``open_symbol`` makes it), by name, in
    the order asked: the cache and its store are opened once, then only these symbols' groups are read
    (their metadata and ``time`` index; from an object store several at once), so the time is
    proportional to the symbols asked for, not to the cache's. ``symbols`` are names or indices in
    ``cache.symbols``; an unknown one is refused before anything is read."""
    xr = _xarray()
    cache = open_cache(cache)
    if isinstance(symbols, str | bytes):
        raise CacheError(f"open_symbols takes a list of symbols, not the string {symbols!r} (see open_symbol)")
    ids = list(dict.fromkeys(_symbol_id(cache, s) for s in symbols))
    kwargs = _open_kwargs(cache)

    def one(i: int) -> xarray.Dataset:
        prefix = cache.handles.group.store_path.path
        group = f"{prefix}/{cache.groups[i]}" if prefix else cache.groups[i]
        return _labelled(xr.open_zarr(group=group, **kwargs), cache, i, split=True)

    if "://" in cache.url and len(ids) > 1:
        with ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="shardcache-open") as pool:
            opened = list(pool.map(one, ids))
    else:
        opened = [one(i) for i in ids]
    return {cache.symbols[i]: ds for i, ds in zip(ids, opened)}


def to_xarray(cache: Cache | str | os.PathLike[str]) -> xarray.DataTree:
    """The whole cache as a lazy ``xarray.DataTree``: ``xr.open_datatree(CACHE, engine="zarr")`` with
    one node per symbol (``tree[cache.groups[i]]``), each labelled with its ``symbol``
    and the feature statistics (``open_symbol`` adds the split per bar); every node inherits the
    root's ``feature`` names. The root's attributes hold the manifest. Opening reads every symbol's
    metadata and ``time`` index, and xarray builds the tree in time quadratic in the symbols: with
    thousands, ``open_symbols`` opens the ones wanted."""
    xr = _xarray()
    cache = open_cache(cache)
    kwargs = _open_kwargs(cache)
    prefix = cache.handles.group.store_path.path
    tree: xarray.DataTree = xr.open_datatree(kwargs.pop("store"), engine="zarr", group=prefix or None, **kwargs)
    for i, path in enumerate(cache.groups):
        node = cast("xarray.DataTree", tree[path])  # a symbol's path names a node, never a variable
        tree[path] = _labelled(node.to_dataset(inherit=False), cache, i, split=False, names=False)
    _in_symbol_order(tree, cache.groups)
    return tree


def _in_symbol_order(tree: xarray.DataTree, groups: Sequence[str]) -> None:
    """Put each symbol's node in symbol order among its siblings (stored in no order; ``10`` sorts before ``2``)."""
    names: dict[str, list[str]] = {}
    for g in groups:
        parent, _, name = g.rpartition("/")
        names.setdefault(parent, []).append(name)
    for parent, order in names.items():
        node = cast("xarray.DataTree", tree[parent]) if parent else tree
        kids = dict(node.children)
        ordered = [*(k for k in order if k in kids), *(k for k in kids if k not in set(order))]
        node.children = {k: kids[k].copy() for k in ordered}
