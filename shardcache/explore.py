"""Views of a cache for people: the summary (``shardcache info``), the per-shard table
(``shardcache ls``) and a labelled xarray Dataset.

In format 3 (``shardcache.store``) every shard belongs to one symbol's ``features`` array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np

from .errors import CacheError

if TYPE_CHECKING:
    import xarray

    from .store import Cache

__all__ = ["ShardInfo", "info", "shard_infos", "shards", "to_xarray"]


@dataclass(frozen=True)
class ShardInfo:
    """One shard of ``features``: where it is stored, which rows and bars it holds, its size."""

    index: int
    key: str
    start: int
    stop: int
    symbols: tuple[str, ...]
    first_ts: int
    last_ts: int
    raw_bytes: int
    stored_bytes: int | None

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def missing(self) -> bool:
        return self.stored_bytes is None

    @property
    def ratio(self) -> float | None:
        """Decoded over stored bytes (None for a missing or empty shard object)."""
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, with the time range also as ISO 8601 UTC strings."""
        return {
            "index": self.index, "key": self.key, "start": self.start, "stop": self.stop,
            "rows": self.rows, "symbols": list(self.symbols),
            "first_ts": self.first_ts, "last_ts": self.last_ts,
            "first_time": str(np.datetime64(self.first_ts, "ns")),
            "last_time": str(np.datetime64(self.last_ts, "ns")),
            "raw_bytes": self.raw_bytes, "stored_bytes": self.stored_bytes,
            "ratio": None if self.ratio is None else round(self.ratio, 3), "missing": self.missing,
        }


def shards(cache: "Cache") -> list[ShardInfo]:
    """Per-shard table: object key, rows (virtual), symbol, time range and stored size.

    Sizes come from one fsspec listing of ``symbols/`` (local paths and URLs alike); a shard
    object that is not there has ``stored_bytes=None``.
    """
    table = cache.shard_table
    if not len(table):
        return []
    edges = np.stack([table[:, 1], table[:, 2] - 1], axis=1)
    ts = cache.bar_times(edges.ravel()).reshape(-1, 2)
    stored = _stored_sizes(cache)
    out = []
    for (shard, a, b), (t0, t1) in zip(table.tolist(), ts.tolist()):
        key = cache.shard_key(shard)
        out.append(ShardInfo(
            index=shard, key=key, start=a, stop=b, symbols=(cache.symbols[cache.shard_symbol(shard)[0]],),
            first_ts=int(t0), last_ts=int(t1), raw_bytes=(b - a) * cache.n_features * 4,
            stored_bytes=stored.get(key),
        ))
    return out


shard_infos = shards


def _stored_sizes(cache: "Cache") -> dict[str, int]:
    """Stored bytes of every object under ``symbols/``, keyed by path in the cache."""
    fs, root = fsspec.core.url_to_fs(cache.url, **(cache.storage_options or {}))
    root = root.rstrip("/") + "/"
    try:
        found = fs.find(root + "symbols", detail=True)
    except FileNotFoundError:
        return {}
    return {p[len(root):]: int(d["size"]) for p, d in found.items() if p.startswith(root)}


def info(cache: "Cache", seq_len: int = 60, horizon: int = 1) -> dict[str, Any]:
    """A summary for people and scripts: counts, splits, features with stats, size on disk."""
    from .index import valid_ranges

    m = cache.manifest
    per_split = {name: valid_ranges(cache, seq_len, horizon, 1, name).total() for name in cache.split_names}
    return {
        "path": cache.url,
        "format_version": m["format_version"],
        "bars": cache.n_bars,
        "symbols": cache.symbols,
        "segments": int(len(cache.segments)),
        "features": cache.feature_names,
        "stats": cache.stats,
        "normalize": m.get("normalize"),
        "splits": m["splits"],
        "seq_len": seq_len,
        "horizon": horizon,
        "windows": sum(per_split.values()),
        "windows_per_split": per_split,
        "layout": m["layout"],
        "counts": m["counts"],
        "bytes": m.get("bytes", {}),
        "created": m.get("created"),
    }


def to_xarray(cache: "Cache") -> "xarray.Dataset":
    """The cache as a labelled, lazy ``xarray.Dataset`` with one dask chunk per shard (see ``Cache.to_xarray``)."""
    try:
        import xarray as xr
    except ImportError:
        raise CacheError("to_xarray needs xarray: pip install 'shardcache[xarray]'") from None
    import dask
    import dask.array as da

    rows = cache.shard_rows
    order = np.argsort(cache.segments[:, 1], kind="stable")
    starts = cache.segments[order, 1]
    seg_symbol = np.asarray(cache.symbols)[cache.segments[order, 0]]
    seg_split = np.asarray(cache.split_names)[cache.segment_split[order]]
    table = cache.shard_table.tolist()

    def stored(read: Any, width: tuple[int, ...], dtype: Any) -> Any:
        """One dask chunk per shard of stored rows: format 2 leaves unused rows between symbols,
        so the pieces are built from the shard table, never from the whole (sparse) array."""
        parts = [da.from_delayed(dask.delayed(read)(a, b), shape=(b - a, *width), dtype=dtype) for _, a, b in table]
        return da.concatenate(parts, axis=0) if parts else da.zeros((0, *width), dtype=dtype)

    row = da.concatenate([da.arange(a, b, chunks=b - a, dtype=np.int64) for _, a, b in table]) if table else \
        da.zeros(0, dtype=np.int64)

    def per_row(values: np.ndarray) -> Any:
        return row.map_blocks(lambda r: values[np.searchsorted(starts, r, side="right") - 1], dtype=values.dtype)

    ts = stored(_Rows(cache, "ts"), (), np.int64)
    coords: dict[str, Any] = {
        "feature": cache.feature_names,
        "time": ("row", ts.map_blocks(lambda t: t.astype("datetime64[ns]"), dtype="datetime64[ns]")),
        "symbol": ("row", per_row(seg_symbol)),
        "split": ("row", per_row(seg_split)),
    }
    if cache.region_rows is not None:
        coords["cache_row"] = ("row", row)
    stats = cache.stats
    if stats:
        coords["feature_mean"] = ("feature", np.asarray([stats[n]["mean"] for n in cache.feature_names]))
        coords["feature_std"] = ("feature", np.asarray([stats[n]["std"] for n in cache.feature_names]))
    features = stored(_Rows(cache, "features"), (cache.n_features,), np.float32)
    attrs = {"url": cache.url, "normalize": str(cache.manifest.get("normalize")), "shard_rows": rows,
             "format_version": int(cache.manifest["format_version"])}
    return xr.Dataset({"features": (("row", "feature"), features)}, coords=coords, attrs=attrs)


@dataclass(frozen=True)
class _Rows:
    """Rows ``[a, b)`` of one of a cache's arrays as stored (a missing shard reads as zarr's fill value)."""

    cache: "Cache"
    array: str

    def __call__(self, a: int, b: int) -> np.ndarray:
        return np.asarray(getattr(self.cache, self.array)[a:b])
