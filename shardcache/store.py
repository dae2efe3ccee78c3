"""The on-disk contract: a Zarr v3 group of sharded arrays plus the ``shardcache`` manifest.

Layout (readable with plain ``zarr``)::

    CACHE/                      zarr group; attributes["shardcache"] = manifest
      features   float32 (n_bars, n_features)  sharded, Blosc(lz4)+crc32c inner chunks
      ts         int64   (n_bars,)             nanoseconds since the epoch, UTC
      segments   int64   (n_segments, 3)       symbol_id, start_row, stop_row
      segment_split int8 (n_segments,)         index into manifest["splits"]["names"]

Every array names its dimensions (``row``, ``feature``, ``segment``, ``field``), so
``xarray.open_zarr(CACHE, consolidated=False)`` opens the raw arrays too;
``Cache.to_xarray`` adds the labels (time, symbol and split per row, feature names).

Rows are grouped by symbol and in time order. A segment is a maximal run of one symbol's
bars with no gap above ``max_gap`` and inside one split, so a window never crosses a
symbol, a gap or a split. The manifest's ``complete`` flag is written last.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec
from zarr.core.sync import sync

from .errors import CacheError

try:  # zarr >= 3.1.3 ships the numcodecs bridge itself
    from zarr.codecs.numcodecs import LZ4
except ImportError:  # pragma: no cover - older zarr 3.1 with numcodecs' own bridge
    from numcodecs.zarr3 import LZ4

if TYPE_CHECKING:
    import xarray

__all__ = [
    "FORMAT_VERSION",
    "CODECS",
    "Cache",
    "CacheWriter",
    "ShardInfo",
    "compressors",
    "default_chunking",
    "open_cache",
    "open_group",
    "shard_digest",
]

FORMAT_VERSION = 1
ATTR = "shardcache"
CODECS = ("blosc-lz4", "zstd", "lz4", "none")


def compressors(codec: str) -> list[Any]:
    """Inner-chunk codecs for ``codec``, always ending in a crc32c checksum per chunk."""
    if codec == "blosc-lz4":
        first = [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=4)]
    elif codec == "zstd":
        first = [ZstdCodec(level=3)]
    elif codec == "lz4":
        first = [LZ4(acceleration=1)]
    elif codec == "none":
        first = []
    else:
        raise CacheError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return [*first, Crc32cCodec()]


def default_chunking(n_features: int) -> tuple[int, int]:
    """Shard and inner-chunk rows: shards of ~8 MiB decoded, 8 inner chunks each.

    Measured on the 2-core machine (``tools/bench.py``): whole-shard decodes of 4-16 MiB
    keep the decode thread well ahead of the gather, and the prefetch memory stays small.
    """
    target = 8 << 20
    rows = 1 << int(np.log2(max(1, target // (4 * max(1, n_features)))))
    shard_rows = int(min(max(rows, 4096), 65536))
    return shard_rows, shard_rows // 8


def open_group(url: str | os.PathLike[str], mode: str = "r", storage_options: dict | None = None) -> zarr.Group:
    """Open the cache group at a local path or any fsspec URL (``s3://``, ``memory://``, ``file://``)."""
    url = os.fspath(url)
    kwargs: dict[str, Any] = {"mode": mode, "zarr_format": 3}
    if storage_options and "://" in url:
        kwargs["storage_options"] = storage_options
    return zarr.open_group(url, **kwargs)


def _one_line(exc: BaseException) -> str:
    """An exception as one short line for an error message."""
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    if "checksum" in text.lower():
        return f"crc32c checksum mismatch ({text})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def shard_digest(block: np.ndarray) -> str:
    """Digest of one shard's decoded rows, recorded at build time and checked by ``verify``."""
    return hashlib.blake2b(np.ascontiguousarray(block).tobytes(), digest_size=16).hexdigest()


@dataclass
class _Handles:
    group: zarr.Group
    features: zarr.Array
    ts: zarr.Array
    pid: int = field(default_factory=os.getpid)  # fsspec async clients (s3fs) do not survive a fork


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


class Cache:
    """An opened, complete cache: the manifest, the segment table and lazy array handles.

    Picklable (it reopens the store in each DataLoader worker), so it can be handed to a
    ``WindowStream`` used with ``num_workers > 0``.
    """

    def __init__(self, url: str | os.PathLike[str], storage_options: dict | None = None) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        self._handles: _Handles | None = None
        for _ in range(3):  # a swap by a concurrent --overwrite build between the reads: read again
            self._ident = self._identity()
            try:
                self._load()
            except CacheError:
                if self._identity() == self._ident:
                    raise
                continue
            if self._identity() == self._ident:
                return
        raise CacheError(f"{self.url}: the cache kept being replaced while it was opened; try again")

    def _load(self) -> None:
        """Read and check the manifest, then the segment table."""
        group = self._open()
        manifest = dict(group.attrs.get(ATTR) or {})
        if not manifest:
            raise CacheError(f"{self.url}: not a shardcache cache (no 'shardcache' attributes)")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CacheError(
                f"{self.url}: cache format version {version} is newer than this shardcache "
                f"(reads up to {FORMAT_VERSION}); upgrade shardcache"
            )
        if not manifest.get("complete"):
            raise CacheError(
                f"{self.url}: cache is incomplete (its build did not finish); rerun build-cache "
                "with --resume to finish it or --overwrite to start again"
            )
        self.manifest = manifest
        try:
            self.segments = np.asarray(group["segments"][...], dtype=np.int64).reshape(-1, 3)
            self.segment_split = np.asarray(group["segment_split"][...], dtype=np.int8).reshape(-1)
        except Exception as exc:  # codecs raise ValueError/RuntimeError on damaged bytes
            raise CacheError(f"{self.url}: the segment table (segments, segment_split) is damaged: "
                             f"{_one_line(exc)}; rebuild the cache") from None

    def _identity(self) -> tuple[int, int] | None:
        """Device and inode of a local cache's folder, to notice it being swapped; None for URLs."""
        if "://" in self.url and not self.url.startswith("file://"):
            return None
        try:
            st = os.stat(self.url[len("file://"):] if self.url.startswith("file://") else self.url)
        except OSError:
            return (-1, -1)
        return (st.st_dev, st.st_ino)

    def _check_same(self) -> None:
        """Refuse to go on reading a local cache that a rebuild replaced after it was opened."""
        if self._ident is not None and self._identity() != self._ident:
            raise CacheError(f"{self.url}: the cache was replaced (rebuilt) after it was opened; open it again")

    # -- handles -------------------------------------------------------------------------
    def _open(self) -> zarr.Group:
        try:
            group = open_group(self.url, "r", self.storage_options)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError, ValueError) as exc:
            raise CacheError(f"{self.url}: no cache found ({exc.__class__.__name__})") from None
        self._handles = _Handles(group, group["features"], group["ts"]) if "features" in group else None
        return group

    @property
    def handles(self) -> _Handles:
        if self._handles is None or self._handles.pid != os.getpid():  # a forked DataLoader worker reopens
            self._open()
            self._check_same()
            if self._handles is None:
                raise CacheError(f"{self.url}: cache has no 'features' array")
        return self._handles

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"] = None
        return state

    # -- manifest views ------------------------------------------------------------------
    @property
    def features(self) -> zarr.Array:
        return self.handles.features

    @property
    def ts(self) -> zarr.Array:
        return self.handles.ts

    @property
    def feature_names(self) -> list[str]:
        return list(self.manifest["feature_names"])

    @property
    def symbols(self) -> list[str]:
        return list(self.manifest["symbols"])

    @property
    def split_names(self) -> list[str]:
        return list(self.manifest["splits"]["names"])

    @property
    def stats(self) -> dict[str, dict[str, float]]:
        """Normalization statistics per feature (``mean``, ``std``), from the train split."""
        stats = self.manifest.get("stats") or {}
        means, stds = stats.get("mean") or [], stats.get("std") or []
        return {n: {"mean": m, "std": s} for n, m, s in zip(self.feature_names, means, stds)}

    @property
    def n_bars(self) -> int:
        return int(self.manifest["counts"]["bars"])

    @property
    def n_features(self) -> int:
        return len(self.manifest["feature_names"])

    @property
    def shard_rows(self) -> int:
        return int(self.manifest["layout"]["shard_rows"])

    @property
    def chunk_rows(self) -> int:
        return int(self.manifest["layout"]["chunk_rows"])

    @property
    def n_shards(self) -> int:
        return -(-self.n_bars // self.shard_rows)

    def split_id(self, split: str | None) -> int | None:
        """Index of ``split`` in the manifest (None means every split)."""
        if split is None:
            return None
        names = self.split_names
        if split not in names:
            raise CacheError(f"{self.url}: no split {split!r}; the cache has {', '.join(names)}")
        return names.index(split)

    # -- data ----------------------------------------------------------------------------
    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of ``features`` in one zarr call (decodes whole inner chunks).

        Never returns made-up rows: a shard that fails its crc32c checks or cannot be decoded,
        a shard object that is missing (zarr would fill it with NaN) and a cache swapped by a
        rebuild during the read all raise ``CacheError`` naming the shard.
        """
        try:
            block = np.asarray(self.features[start:stop], dtype=np.float32)
        except (CacheError, MemoryError):
            raise
        except Exception as exc:  # checksum mismatch (ValueError), codec errors (RuntimeError, ...)
            raise self._corrupt(start, stop, exc) from None
        self._check_same()
        first = max(0, start // self.shard_rows)
        for shard in range(first, -(-stop // self.shard_rows) if stop > start else first):
            row = max(start, shard * self.shard_rows) - start
            if row < len(block) and np.isnan(block[row]).all() and not self.shard_exists(shard):
                raise CacheError(f"{self.url}: shard {shard} ({self.shard_key(shard)}) is missing; "
                                 "`shardcache verify` lists every damaged shard; rebuild the cache")
        return block

    def shard_key(self, shard: int) -> str:
        """Store key of shard ``shard`` of ``features``, e.g. ``features/c/3/0``."""
        return "features/" + self.features.metadata.encode_chunk_key((shard, 0))

    def shard_exists(self, shard: int, array: str = "features") -> bool:
        """Whether the store holds shard ``shard`` of ``array`` (``features`` or ``ts``)."""
        arr = self.handles.group[array]
        key = arr.metadata.encode_chunk_key((shard,) + (0,) * (arr.ndim - 1))
        return bool(sync(arr.store_path.store.exists(f"{arr.store_path.path}/{key}")))

    def _corrupt(self, start: int, stop: int, exc: BaseException) -> CacheError:
        """The error for a failed read of rows ``[start, stop)``, naming the first shard that fails."""
        for shard in range(start // self.shard_rows, -(-stop // self.shard_rows)):
            a, b = max(start, shard * self.shard_rows), min(stop, (shard + 1) * self.shard_rows)
            try:
                self.features[a:b]
            except Exception as first:
                return CacheError(f"{self.url}: shard {shard} ({self.shard_key(shard)}) is corrupt: "
                                  f"{_one_line(first)}; `shardcache verify` lists every damaged shard; "
                                  "rebuild the cache")
        return CacheError(f"{self.url}: rows {start}-{stop} could not be read: {_one_line(exc)}")

    def n_windows(self, seq_len: int, horizon: int = 1, stride: int = 1, split: str | None = None) -> int:
        """Number of valid windows at read-time ``seq_len``/``horizon``/``stride``."""
        from .index import valid_ranges

        return valid_ranges(self, seq_len, horizon, stride, split).total()

    def _segment_order(self) -> np.ndarray:
        """Indices that put the segment table in row order (rows are grouped by symbol, then time)."""
        return np.argsort(self.segments[:, 1], kind="stable")

    def shards(self) -> list[ShardInfo]:
        """Per-shard table: object key, rows, symbols, time range and stored size.

        Sizes come from one fsspec listing of ``features/c`` (local paths and URLs alike);
        a shard object that is not there has ``stored_bytes=None``. The time range reads
        ``ts`` only at the first and last row of each symbol's run of rows in the shard.
        """
        seg = self.segments[self._segment_order()]
        names = np.asarray(self.symbols, dtype=object)
        bounds = [(a, min(a + self.shard_rows, self.n_bars)) for a in range(0, self.n_bars, self.shard_rows)]
        runs = []  # per shard: symbol ids of its runs and each run's first and last row
        for a, b in bounds:
            lo = int(np.searchsorted(seg[:, 2], a, side="right"))
            hi = int(np.searchsorted(seg[:, 1], b, side="left"))
            part = seg[lo:hi]
            head = np.r_[0, np.flatnonzero(np.diff(part[:, 0])) + 1]
            tail = np.r_[head[1:] - 1, len(part) - 1]
            runs.append((part[head, 0], np.maximum(part[head, 1], a), np.minimum(part[tail, 2], b) - 1))
        edges = np.concatenate([np.stack([f, l], axis=1) for _, f, l in runs]).astype(np.int64)
        ts = np.asarray(self.ts.get_coordinate_selection(edges.ravel()), dtype=np.int64).reshape(-1, 2)
        offsets = np.cumsum([0] + [len(r[0]) for r in runs])
        stored = self._stored_sizes()
        out = []
        for i, ((a, b), (sym, _, _)) in enumerate(zip(bounds, runs)):
            key = self.shard_key(i)
            t = ts[offsets[i] : offsets[i + 1]]
            out.append(ShardInfo(
                index=i, key=key, start=a, stop=b, symbols=tuple(names[sym]),
                first_ts=int(t[:, 0].min()), last_ts=int(t[:, 1].max()),
                raw_bytes=(b - a) * self.n_features * 4, stored_bytes=stored.get(key),
            ))
        return out

    def _stored_sizes(self) -> dict[str, int]:
        """Stored bytes of every object under ``features/c``, keyed by path in the cache."""
        fs, root = fsspec.core.url_to_fs(self.url, **(self.storage_options or {}))
        root = root.rstrip("/") + "/"
        try:
            found = fs.find(root + "features/c", detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(root):]: int(d["size"]) for p, d in found.items() if p.startswith(root)}

    def to_xarray(self) -> "xarray.Dataset":
        """The cache as a labelled ``xarray.Dataset``, lazy: dask arrays with one chunk per shard.

        ``features`` has dims ``(row, feature)``; coordinates are ``feature`` (names),
        ``time`` (datetime64 from ``ts``), ``symbol`` and ``split`` per row (from the segment
        table) and, when normalized, ``feature_mean``/``feature_std`` (train-split statistics:
        ``ds.features * ds.feature_std + ds.feature_mean`` gives source units). Nothing is
        read until computed; a missing shard reads as NaN (zarr's fill value), so check a
        cache with ``shardcache ls`` or ``verify`` first. Needs the ``xarray`` extra.
        """
        try:
            import xarray as xr
        except ImportError:
            raise CacheError("to_xarray needs xarray: pip install 'shardcache[xarray]'") from None
        import dask.array as da

        rows = self.shard_rows
        order = self._segment_order()
        starts = self.segments[order, 1]
        seg_symbol = np.asarray(self.symbols)[self.segments[order, 0]]
        seg_split = np.asarray(self.split_names)[self.segment_split[order]]
        row = da.arange(self.n_bars, chunks=rows, dtype=np.int64)

        def per_row(values: np.ndarray) -> Any:
            return row.map_blocks(lambda r: values[np.searchsorted(starts, r, side="right") - 1], dtype=values.dtype)

        ts = da.from_zarr(self.ts, chunks=(rows,))
        coords: dict[str, Any] = {
            "feature": self.feature_names,
            "time": ("row", ts.map_blocks(lambda t: t.astype("datetime64[ns]"), dtype="datetime64[ns]")),
            "symbol": ("row", per_row(seg_symbol)),
            "split": ("row", per_row(seg_split)),
        }
        stats = self.stats
        if stats:
            coords["feature_mean"] = ("feature", np.asarray([stats[n]["mean"] for n in self.feature_names]))
            coords["feature_std"] = ("feature", np.asarray([stats[n]["std"] for n in self.feature_names]))
        features = da.from_zarr(self.features, chunks=(rows, self.n_features))
        attrs = {"url": self.url, "normalize": str(self.manifest.get("normalize")), "shard_rows": rows,
                 "format_version": int(self.manifest["format_version"])}
        return xr.Dataset({"features": (("row", "feature"), features)}, coords=coords, attrs=attrs)

    def info(self, seq_len: int = 60, horizon: int = 1) -> dict[str, Any]:
        """A summary for people and scripts: counts, splits, features with stats, size on disk."""
        m = self.manifest
        per_split = {
            name: self.n_windows(seq_len, horizon, 1, name) for name in self.split_names
        }
        return {
            "path": self.url,
            "format_version": m["format_version"],
            "bars": self.n_bars,
            "symbols": self.symbols,
            "segments": int(len(self.segments)),
            "features": self.feature_names,
            "stats": self.stats,
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

    def __repr__(self) -> str:
        return (
            f"Cache({self.url!r}, bars={self.n_bars}, features={self.n_features}, "
            f"symbols={len(self.symbols)}, segments={len(self.segments)})"
        )


def open_cache(path: "str | os.PathLike[str] | Cache", storage_options: dict | None = None) -> Cache:
    """Open a complete cache built by ``build-cache``; refuse incomplete or newer-format caches."""
    if isinstance(path, Cache):
        return path
    return Cache(path, storage_options)


class CacheWriter:
    """Creates the cache's arrays, writes whole shards (one writer per shard) and the manifest.

    The manifest starts with ``complete: false``; ``finish`` writes the segment table and
    then the manifest with ``complete: true``, the last write of a build. Picklable, so shard
    writes can run as dask tasks on any worker.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        n_bars: int,
        feature_names: list[str],
        shard_rows: int,
        chunk_rows: int,
        codec: str = "blosc-lz4",
        storage_options: dict | None = None,
        create: bool = True,
    ) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        self.n_bars = int(n_bars)
        self.n_features = len(feature_names)
        self.shard_rows = int(shard_rows)
        self.chunk_rows = int(chunk_rows)
        if self.shard_rows % self.chunk_rows:
            raise CacheError(f"shard rows {shard_rows} must be a multiple of chunk rows {chunk_rows}")
        self._arrays: tuple[zarr.Array, zarr.Array] | None = None
        if not create:
            return
        group = open_group(self.url, "w", storage_options)
        shape = (max(self.n_bars, 0), self.n_features)
        group.create_array(
            "features",
            shape=shape,
            dtype="float32",
            chunks=(self.chunk_rows, max(self.n_features, 1)),
            shards=(self.shard_rows, max(self.n_features, 1)),
            compressors=compressors(codec),
            fill_value=np.nan,
            dimension_names=("row", "feature"),
        )
        group.create_array(
            "ts",
            shape=(self.n_bars,),
            dtype="int64",
            chunks=(self.shard_rows,),
            compressors=compressors("zstd"),
            fill_value=0,
            dimension_names=("row",),
        )
        group.attrs[ATTR] = {"format_version": FORMAT_VERSION, "complete": False}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    @property
    def n_shards(self) -> int:
        return -(-self.n_bars // self.shard_rows)

    def _open_arrays(self) -> tuple[zarr.Array, zarr.Array]:
        if self._arrays is None:
            group = open_group(self.url, "r+", self.storage_options)
            self._arrays = (group["features"], group["ts"])
        return self._arrays

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_rows
        return start, min(start + self.shard_rows, self.n_bars)

    def write_shard(self, shard: int, features: np.ndarray, ts: np.ndarray) -> str:
        """Write shard ``shard`` whole (rows and timestamps) and return its digest."""
        start, stop = self.shard_bounds(shard)
        block = np.ascontiguousarray(features, dtype=np.float32)
        if block.shape != (stop - start, self.n_features) or len(ts) != stop - start:
            raise CacheError(
                f"shard {shard}: expected {(stop - start, self.n_features)} rows, got {block.shape}"
            )
        feats, tsa = self._open_arrays()
        feats[start:stop] = block
        tsa[start:stop] = np.asarray(ts, dtype=np.int64)
        return shard_digest(block)

    def finish(self, segments: np.ndarray, segment_split: np.ndarray, manifest: dict) -> None:
        """Write the segment table, then the manifest marked complete (the last write)."""
        group = open_group(self.url, "r+", self.storage_options)
        seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        tables = (("segments", seg, ("segment", "field")),
                  ("segment_split", np.asarray(segment_split, dtype=np.int8), ("segment",)))
        for name, data, dims in tables:
            arr = group.create_array(
                name,
                shape=data.shape,
                dtype=data.dtype,
                chunks=tuple(max(1, n) for n in data.shape),
                compressors=compressors("zstd"),
                fill_value=0,
                overwrite=True,
                dimension_names=dims,
            )
            if data.size:
                arr[...] = data
        group.attrs[ATTR] = {
            **manifest,
            "format_version": FORMAT_VERSION,
            "layout": {
                "shard_rows": self.shard_rows,
                "chunk_rows": self.chunk_rows,
                **manifest.get("layout", {}),
            },
            "complete": True,
        }
