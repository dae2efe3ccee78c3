"""The on-disk contract: a Zarr v3 group of sharded arrays plus the ``shardcache`` manifest.

Layout (readable with plain ``zarr``)::

    CACHE/                      zarr group; attributes["shardcache"] = manifest
      features   float32 (n_rows, n_features)  sharded, Blosc(lz4)+crc32c inner chunks
      ts         int64   (n_rows,)             nanoseconds since the epoch, UTC
      segments   int64   (n_segments, 3)       symbol_id, start_row, stop_row
      segment_split int8 (n_segments,)         index into manifest["splits"]["names"]

Format 2 gives each symbol its own row region: symbol ``i``'s bars are rows
``[i * R, i * R + n_i)`` with ``R = manifest["layout"]["region_rows"]`` (2**32 rounded up to
whole shards), so a symbol can grow in place (``shardcache.append``) and every shard holds
one symbol. The arrays are sparse: ``n_rows = n_symbols * R`` and shards past a symbol's
last bar are never written (zarr reads them as fill values; nothing is on disk).
``Cache.shard_table`` lists the shards that hold rows. Format 1 (still read) packs rows
``0..n_bars`` symbol after symbol.

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

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec
from zarr.core.sync import sync

from .decode import ChunkError, MissingShard, ShardDecoder
from .errors import CacheError

try:  # zarr >= 3.1.3 ships the numcodecs bridge itself
    from zarr.codecs.numcodecs import LZ4
except ImportError:  # pragma: no cover - older zarr 3.1 with numcodecs' own bridge
    from numcodecs.zarr3 import LZ4

if TYPE_CHECKING:
    import xarray

    from .explore import ShardInfo

__all__ = [
    "FORMAT_VERSION",
    "CODECS",
    "Cache",
    "CacheWriter",
    "REGION_ROWS",
    "compressors",
    "default_chunking",
    "open_cache",
    "dense_shards",
    "occupied_shards",
    "spanned_shards",
    "open_group",
    "shard_digest",
]

FORMAT_VERSION = 2
REGION_ROWS = 1 << 32  # rows per symbol region in format 2: 136 years of 1-second bars
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


def spanned_shards(first: np.ndarray, last: np.ndarray, shard_rows: int) -> np.ndarray:
    """The shards holding any row of the row intervals ``[first[i], last[i]]`` (inclusive), ascending."""
    a = np.asarray(first, dtype=np.int64) // shard_rows
    n = np.asarray(last, dtype=np.int64) // shard_rows - a + 1
    return np.unique(np.repeat(a, n) + np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))


def occupied_shards(segments: np.ndarray, shard_rows: int) -> np.ndarray:
    """The shards holding rows of ``segments``, as ``(shard, start, stop)`` int64 rows in row order.

    Shard ``s`` spans rows ``[s * shard_rows, (s + 1) * shard_rows)``; ``start``/``stop`` clip
    that span to the stored rows in it (segments tile each symbol's rows without holes).
    """
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
    seg = seg[np.argsort(seg[:, 1], kind="stable")]
    seg = seg[seg[:, 2] > seg[:, 1]]
    if not len(seg):
        return np.zeros((0, 3), dtype=np.int64)
    ids = spanned_shards(seg[:, 1], seg[:, 2] - 1, shard_rows)
    lo, hi = ids * shard_rows, (ids + 1) * shard_rows
    a = np.maximum(lo, seg[np.searchsorted(seg[:, 2], lo, side="right"), 1])
    b = np.minimum(hi, seg[np.searchsorted(seg[:, 1], hi, side="left") - 1, 2])
    return np.stack([ids, a, b], axis=1)


def dense_shards(n_rows: int, shard_rows: int) -> np.ndarray:
    """``(shard, start, stop)`` rows of format 1: rows ``0..n_rows`` packed into consecutive shards."""
    ids = np.arange(-(-n_rows // shard_rows), dtype=np.int64)
    return np.stack([ids, ids * shard_rows, np.minimum((ids + 1) * shard_rows, n_rows)], axis=1)


@dataclass
class _Handles:
    group: zarr.Group
    features: zarr.Array
    ts: zarr.Array
    decoder: ShardDecoder
    pid: int = field(default_factory=os.getpid)  # fsspec async clients (s3fs) do not survive a fork


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
        self._shard_table = None
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
        self._handles = (
            _Handles(group, group["features"], group["ts"], ShardDecoder(group["features"]))
            if "features" in group else None
        )
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
        state["_handles"] = state["_times"] = None
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
    def region_rows(self) -> int | None:
        """Rows per symbol region (format 2), None for a packed format-1 cache."""
        value = self.manifest.get("layout", {}).get("region_rows")
        return None if value is None else int(value)

    @property
    def n_rows(self) -> int:
        """Length of the ``features``/``ts`` arrays: ``n_bars`` in format 1, symbols x regions in format 2."""
        return int(self.features.shape[0])

    @property
    def shard_table(self) -> np.ndarray:
        """``(shard, start, stop)`` of every shard that holds rows, in row order (see ``occupied_shards``)."""
        if self._shard_table is None:
            self._shard_table = (dense_shards(self.n_bars, self.shard_rows) if self.region_rows is None
                                 else occupied_shards(self.segments, self.shard_rows))
        return self._shard_table

    @property
    def n_shards(self) -> int:
        """Shards that hold rows."""
        return len(self.shard_table)

    def region_stop(self, row: int) -> int:
        """End of the stored rows of the region holding ``row``: its symbol's last row + 1 in
        format 2, ``n_bars`` in format 1. Reads must stop there: later shards are not stored."""
        if self.region_rows is None:
            return self.n_bars
        mine = self.segments[self.segments[:, 0] == row // self.region_rows]
        return int(mine[:, 2].max()) if len(mine) else int(row)

    def split_id(self, split: str | None) -> int | None:
        """Index of ``split`` in the manifest (None means every split)."""
        if split is None:
            return None
        names = self.split_names
        if split not in names:
            raise CacheError(f"{self.url}: no split {split!r}; the cache has {', '.join(names)}")
        return names.index(split)

    # -- data ----------------------------------------------------------------------------
    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of ``features``, into ``out`` (C-contiguous float32
        ``(stop - start, n_features)``) when given.

        Read by ``decode.ShardDecoder`` (one request per shard, crc32c checked per inner
        chunk) and never made up: a shard object that is missing, fails its checksums or
        cannot be decoded, and a cache swapped by a rebuild during the read, raise
        ``CacheError`` naming the shard.
        """
        try:
            block = self.handles.decoder.read(start, stop, out)
        except (MissingShard, ChunkError) as exc:
            shard = exc.shard  # type: ignore[attr-defined]
            problem = "is missing" if isinstance(exc, MissingShard) else f"is corrupt: {exc}"
            raise CacheError(f"{self.url}: shard {shard} ({self.shard_key(shard)}) {problem}; "
                             "`shardcache verify` lists every damaged shard; rebuild the cache") from None
        self._check_same()
        return block

    def shard_key(self, shard: int) -> str:
        """Store key of shard ``shard`` of ``features``, e.g. ``features/c/3/0``."""
        return "features/" + self.features.metadata.encode_chunk_key((shard, 0))

    def shard_exists(self, shard: int, array: str = "features") -> bool:
        """Whether the store holds shard ``shard`` of ``array`` (``features`` or ``ts``)."""
        arr = self.handles.group[array]
        key = arr.metadata.encode_chunk_key((shard,) + (0,) * (arr.ndim - 1))
        return bool(sync(arr.store_path.store.exists(f"{arr.store_path.path}/{key}")))

    def n_windows(self, seq_len: int, horizon: int = 1, stride: int = 1, split: str | None = None) -> int:
        """Number of valid windows at read-time ``seq_len``/``horizon``/``stride``."""
        from .index import valid_ranges

        return valid_ranges(self, seq_len, horizon, stride, split).total()

    # -- batch metadata (format 2; format 3 replaces these) -----------------------------
    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Symbol (index into ``symbols``) and row in that symbol's own bars of each cache row."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.region_rows is not None:
            return np.divmod(rows, self.region_rows)
        seg = self.segments[np.argsort(self.segments[:, 1], kind="stable")]
        k = np.clip(np.searchsorted(seg[:, 1], rows, side="right") - 1, 0, None)
        symbol = seg[k, 0]
        first = np.full(int(seg[:, 0].max()) + 1 if len(seg) else 0, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, seg[:, 0], seg[:, 1])
        return symbol, rows - first[symbol]

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns since the epoch) of cache rows; the stored ``ts`` is read once and kept."""
        if getattr(self, "_times", None) is None:
            table = self.shard_table
            self._times = (np.concatenate([np.asarray(self.ts[a:b], dtype=np.int64) for _, a, b in table])
                           if len(table) else np.zeros(0, np.int64), table)
        times, table = self._times
        rows = np.asarray(rows, dtype=np.int64)
        k = np.searchsorted(table[:, 1], rows, side="right") - 1
        before = np.concatenate([[0], np.cumsum(table[:, 2] - table[:, 1])])
        return times[before[k] + rows - table[k, 1]]

    def shards(self) -> "list[ShardInfo]":
        """Per-shard table of the shards holding rows: object key, rows, symbols, time range, stored size.

        Sizes come from one fsspec listing of ``features/c`` (local paths and URLs alike);
        a shard object that is not there has ``stored_bytes=None``. The time range reads
        ``ts`` only at the first and last row of each symbol's run of rows in the shard.
        """
        from .explore import shard_infos

        return shard_infos(self)

    def to_xarray(self) -> "xarray.Dataset":
        """The cache as a labelled ``xarray.Dataset``, lazy: dask arrays with one chunk per shard.

        ``features`` has dims ``(row, feature)`` over the stored rows only; coordinates are
        ``feature`` (names), ``time`` (datetime64 from ``ts``), ``symbol`` and ``split`` per row
        (from the segment table), ``cache_row`` (format 2: the row in the sparse arrays) and,
        when normalized, ``feature_mean``/``feature_std`` (train-split statistics:
        ``ds.features * ds.feature_std + ds.feature_mean`` gives source units). Nothing is
        read until computed; a missing shard reads as NaN (zarr's fill value), so check a
        cache with ``shardcache ls`` or ``verify`` first. Needs the ``xarray`` extra.
        """
        from .explore import to_xarray

        return to_xarray(self)

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

    With ``region_rows`` it writes format 2: ``segments`` (symbol regions already applied)
    place the shards and the arrays have ``n_regions * region_rows`` rows; without, format 1:
    rows ``0..n_bars`` packed. The manifest starts with ``complete: false``; ``finish``
    writes the segment table and then the manifest with ``complete: true``, the last write
    of a build. ``create=False`` reopens the arrays (a resume, an append: grown to
    ``n_regions`` if needed). Picklable, so shard writes can run as dask tasks on any worker.
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
        region_rows: int | None = None,
        segments: np.ndarray | None = None,
        n_regions: int = 0,
    ) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        self.n_bars = int(n_bars)
        self.n_features = len(feature_names)
        self.shard_rows = int(shard_rows)
        self.chunk_rows = int(chunk_rows)
        if self.shard_rows % self.chunk_rows:
            raise CacheError(f"shard rows {shard_rows} must be a multiple of chunk rows {chunk_rows}")
        self.region_rows = None if region_rows is None else int(region_rows)
        if self.region_rows is None:
            self.n_rows, table = self.n_bars, dense_shards(self.n_bars, self.shard_rows)
        else:
            if self.region_rows % self.shard_rows:
                raise CacheError(f"region rows {region_rows} must be a multiple of shard rows {shard_rows}")
            self.n_rows = int(n_regions) * self.region_rows
            table = occupied_shards(np.zeros((0, 3)) if segments is None else segments, self.shard_rows)
        self.table = table
        self._bounds = {int(s): (int(a), int(b)) for s, a, b in table.tolist()}
        self._arrays: tuple[zarr.Array, zarr.Array] | None = None
        if not create:
            self._grow()
            return
        group = open_group(self.url, "w", storage_options)
        shape = (max(self.n_rows, 0), self.n_features)
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
            shape=(self.n_rows,),
            dtype="int64",
            chunks=(self.shard_rows,),
            compressors=compressors("zstd"),
            fill_value=0,
            dimension_names=("row",),
        )
        group.attrs[ATTR] = {"format_version": self.format_version, "complete": False}

    @property
    def format_version(self) -> int:
        return 1 if self.region_rows is None else FORMAT_VERSION

    def _grow(self) -> None:
        """Lengthen existing arrays to ``n_rows`` (an append adding symbols); a metadata write only."""
        feats, tsa = self._open_arrays()
        if feats.shape[0] < self.n_rows:
            feats.resize((self.n_rows, self.n_features))
            tsa.resize((self.n_rows,))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    @property
    def n_shards(self) -> int:
        """Shards that hold rows."""
        return len(self.table)

    def _open_arrays(self) -> tuple[zarr.Array, zarr.Array]:
        if self._arrays is None:
            group = open_group(self.url, "r+", self.storage_options)
            self._arrays = (group["features"], group["ts"])
        return self._arrays

    @property
    def shard_ids(self) -> list[int]:
        """Every shard that holds rows, in row order."""
        return [int(s) for s in self.table[:, 0]]

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` that shard ``shard`` holds."""
        return self._bounds[int(shard)]

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``[start, stop)`` as stored: features and timestamps (an append keeps them)."""
        feats, tsa = self._open_arrays()
        return np.asarray(feats[start:stop], dtype=np.float32), np.asarray(tsa[start:stop], dtype=np.int64)

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
            "format_version": self.format_version,
            "layout": {
                "shard_rows": self.shard_rows,
                "chunk_rows": self.chunk_rows,
                **({} if self.region_rows is None else {"region_rows": self.region_rows}),
                **manifest.get("layout", {}),
            },
            "complete": True,
        }
