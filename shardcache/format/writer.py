"""Writing the format-3 layout of ``shardcache.format.layout``: symbol groups, whole shards, the manifest last."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from typing import Any, cast

import numpy as np
import zarr

from ..errors import CacheError
from .layout import (
    ATTR,
    TIME_ATTRS,
    compressors,
    gather,
    group_path,
    node_array,
    open_group,
    shard_digest,
    symbol_bases,
)
from .manifest import Layout, Manifest, incomplete
from .paths import is_url, local_path
from .zarr_adapter import async_group, sync

__all__ = ["CacheWriter"]

_SEGMENT_ARRAYS = ("segment_start", "segment_stop", "segment_split")
# temporary files a killed write leaves: zarr's LocalStore writes ``<name>.<uuid hex>.partial`` and
# renames it into place; ``CacheWriter._release`` copies to ``<name>.<pid>.unshare``
_STRAY = re.compile(r"\.([0-9a-f]{32}\.partial|\d+\.unshare)$")


def _local_file(url: str, key: str) -> str | None:
    """The file behind ``key`` of a local cache, None for object stores."""
    return None if is_url(url) else os.path.join(local_path(url), key)


class CacheWriter:
    """Creates each symbol's group, writes whole shards (one writer per shard) and the manifest.

    Shards are addressed in the virtual row space of ``bars_per_symbol`` (``symbol_bases``);
    the writer turns them into rows of the symbol's own arrays. The manifest starts with
    ``complete: false``; ``finish`` writes the segment tables and digests, then the manifest
    with ``complete: true``, the last write of a build. ``create=False`` reopens the arrays
    (a resume, an append: existing symbols grown to ``bars_per_symbol``, new ones created).
    Before rewriting any object of a local cache it gives the file its own inode (``_release``),
    so a hard-linked staging copy (``shardcache.build.append``) never changes a file it shares
    with the original, and a killed write never leaves an object missing.
    Picklable, so shard writes can run as dask tasks on any worker.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        feature_names: list[str],
        bars_per_symbol: Any,
        shard_rows: int,
        chunk_rows: int,
        codec: str = "blosc-lz4",
        storage_options: dict[str, Any] | None = None,
        create: bool = True,
    ) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        self.feature_names = list(feature_names)
        self.n_features = len(feature_names)
        self.shard_rows = int(shard_rows)
        self.chunk_rows = int(chunk_rows)
        self.codec = codec
        if self.shard_rows % self.chunk_rows:
            raise CacheError(f"shard rows {shard_rows} must be a multiple of chunk rows {chunk_rows}")
        self.bars_per_symbol = np.asarray(bars_per_symbol, dtype=np.int64).reshape(-1)
        self.bases = symbol_bases(self.bars_per_symbol, self.shard_rows)
        self.n_bars = int(self.bars_per_symbol.sum())
        self._arrays: dict[tuple[int, str], zarr.Array[Any]] = {}
        self._group: zarr.Group | None = None
        if create:
            self._group = open_group(self.url, "w", storage_options)
            self._group.attrs[ATTR] = incomplete()
        self._ensure_symbols()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"], state["_group"] = {}, None
        return state

    @property
    def root(self) -> zarr.Group:
        if self._group is None:
            self._group = open_group(self.url, "r+", self.storage_options)
        return self._group

    def _release(self, key: str) -> None:
        """Give a local object (or each file of a folder) its own inode before it is rewritten: a
        hard link into another cache must not change. The copy replaces the link by a rename, so
        the path holds its old bytes until zarr writes the new ones, even if the process is killed."""
        path = _local_file(self.url, key)
        if path is None or not os.path.exists(path):
            return
        files = [path] if not os.path.isdir(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        for file in files:
            if os.stat(file).st_nlink > 1:
                tmp = f"{file}.{os.getpid()}.unshare"
                shutil.copy2(file, tmp)
                os.replace(tmp, file)

    def sweep(self) -> int:
        """Remove the temporary files killed writes left in a local cache (none on object stores:
        a PUT is whole or absent), so they are neither counted in its bytes nor published. Returns
        how many were removed."""
        root = _local_file(self.url, "")
        if root is None:
            return 0
        strays = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if _STRAY.search(f)]
        for path in strays:
            os.unlink(path)
        return len(strays)

    def _ensure_symbols(self) -> None:
        """Create missing symbol groups and grow existing arrays to ``bars_per_symbol`` (metadata only).

        Thousands of symbols mean thousands of small metadata objects: they are written
        concurrently on zarr's event loop (``_gather``; one PUT each on an object store).
        """
        symbols = self.root.require_group("symbols")
        have = set(symbols.group_keys())
        sizes = list(enumerate(self.bars_per_symbol.tolist()))
        grow = [(i, n) for i, n in sizes if str(i) in have]
        gather(
            [self._acreate_symbol(async_group(symbols), str(i), n) for i, n in sizes if str(i) not in have]
            + [self._agrow(async_group(symbols), i, n) for i, n in grow]
        )

    async def _acreate_symbol(self, symbols: Any, name: str, n: int) -> None:
        g = await symbols.require_group(name)
        f = max(self.n_features, 1)
        await asyncio.gather(
            g.create_array(
                "features",
                shape=(n, self.n_features),
                dtype="float32",
                chunks=(self.chunk_rows, f),
                shards=(self.shard_rows, f),
                compressors=compressors(self.codec),
                fill_value=np.nan,
                dimension_names=("time", "feature"),
            ),
            g.create_array(
                "time",
                shape=(n,),
                dtype="int64",
                chunks=(self.shard_rows,),
                compressors=compressors("zstd"),
                fill_value=0,
                dimension_names=("time",),
                attributes=dict(TIME_ATTRS),
            ),
            self._anames(g, f),
        )

    async def _anames(self, g: Any, f: int) -> None:
        names = await g.create_array(
            "feature", shape=(self.n_features,), dtype=str, chunks=(f,), dimension_names=("feature",)
        )
        if self.n_features:
            await names.setitem(..., np.asarray(self.feature_names, dtype=str))

    async def _agrow(self, symbols: Any, i: int, n: int) -> None:
        for array, shape in (("features", (n, self.n_features)), ("time", (n,))):
            arr = await symbols.getitem(f"{i}/{array}")
            if arr.shape[0] < n:
                self._release(f"{group_path(i)}/{array}/zarr.json")  # rewritten from the copy in memory
                await arr.resize(shape)

    def _array(self, i: int, name: str) -> zarr.Array[Any]:
        arr = self._arrays.get((i, name))
        if arr is None:
            arr = self._arrays[(i, name)] = node_array(self.root, f"{group_path(i)}/{name}")
        return arr

    @property
    def n_shards(self) -> int:
        """Shards of all symbols (virtual shards ``0..n_shards``)."""
        return int(self.bases[-1]) // self.shard_rows

    @property
    def layout(self) -> Layout:
        """The manifest's ``layout`` of what this writer writes."""
        return Layout(shard_rows=self.shard_rows, chunk_rows=self.chunk_rows, codec=self.codec, shards=self.n_shards)

    @property
    def groups(self) -> list[str]:
        """The manifest's ``groups``: each symbol's group path."""
        return [group_path(i) for i in range(len(self.bars_per_symbol))]

    @property
    def shard_ids(self) -> list[int]:
        """Every shard, in row order."""
        return list(range(self.n_shards))

    def shard_symbol(self, shard: int) -> tuple[int, int, int]:
        """Symbol and the symbol's local rows ``[a, b)`` of virtual shard ``shard``."""
        start = int(shard) * self.shard_rows
        i = int(np.searchsorted(self.bases, start, side="right")) - 1
        a = start - int(self.bases[i])
        return i, a, min(a + self.shard_rows, int(self.bars_per_symbol[i]))

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        """Virtual rows ``[start, stop)`` that shard ``shard`` holds."""
        i, a, b = self.shard_symbol(shard)
        return int(self.bases[i]) + a, int(self.bases[i]) + b

    def _local(self, start: int, stop: int) -> tuple[int, int, int]:
        i = int(np.searchsorted(self.bases, start, side="right")) - 1
        return i, start - int(self.bases[i]), stop - int(self.bases[i])

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Virtual rows ``[start, stop)`` (one symbol) as stored: features and timestamps (an append keeps them)."""
        i, a, b = self._local(start, stop)
        return (
            np.asarray(self._array(i, "features")[a:b], dtype=np.float32),
            np.asarray(self._array(i, "time")[a:b], dtype=np.int64),
        )

    def write_shard(self, shard: int, features: np.ndarray, ts: np.ndarray) -> str:
        """Write shard ``shard`` whole (rows and timestamps) and return its digest."""
        i, a, b = self.shard_symbol(shard)
        block = np.ascontiguousarray(features, dtype=np.float32)
        if block.shape != (b - a, self.n_features) or len(ts) != b - a:
            raise CacheError(f"shard {shard}: expected {(b - a, self.n_features)} rows, got {block.shape}")
        feats, times = self._array(i, "features"), self._array(i, "time")
        local = a // self.shard_rows
        path = group_path(i)
        self._release(f"{path}/features/" + feats.metadata.encode_chunk_key((local, 0)))
        self._release(f"{path}/time/" + times.metadata.encode_chunk_key((local,)))
        feats[a:b] = block
        times[a:b] = np.asarray(ts, dtype=np.int64)
        return shard_digest(block)

    async def _asmall(self, g: Any, name: str, data: np.ndarray, dims: tuple[str, ...]) -> None:
        """(Re)create a small one-chunk array (its old objects already released)."""
        arr = await g.create_array(
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
            await arr.setitem(..., data)

    def write_history(self, history: dict[str, Any]) -> None:
        """Store the inputs and append records (``{"sources": [...], "appends": [...]}``) as the
        attributes of the ``history`` group: out of the manifest, and not read to open the cache."""
        self._release("history/zarr.json")
        self.root.require_group("history").attrs.update(history)

    def finish(
        self,
        segments: np.ndarray,
        segment_split: np.ndarray,
        manifest: Manifest,
        digests: dict[int, str],
        symbols: Any = None,
    ) -> None:
        """Write the symbols' segment tables and shard digests, the root segment index, then the
        manifest marked complete (the last write).

        ``segments`` are virtual rows; ``digests`` maps the shards written to their digests
        (the other shards keep the ones stored); ``symbols`` limits the per-symbol writes to
        those (an append), all by default. ``manifest`` must describe this writer's symbols and layout.
        """
        if manifest.bars_per_symbol != self.bars_per_symbol.tolist() or manifest.layout != self.layout:
            raise CacheError(f"{self.url}: the manifest to write does not describe the cache written")
        seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        split = np.asarray(segment_split, dtype=np.int8).reshape(-1)
        order = np.lexsort((seg[:, 1], seg[:, 0]))
        seg, split = seg[order], split[order]
        sym = seg[:, 0]
        local = np.stack([sym, seg[:, 1] - self.bases[sym], seg[:, 2] - self.bases[sym], split], axis=1)
        bounds = np.searchsorted(sym, np.arange(len(self.bars_per_symbol) + 1))
        root = self.root
        todo = range(len(self.bars_per_symbol)) if symbols is None else sorted({int(s) for s in symbols})
        for i in todo:
            for name in _SEGMENT_ARRAYS:
                self._release(f"{group_path(i)}/{name}")
        self._release("segments")
        groups = async_group(root.require_group("symbols"))

        async def one(i: int) -> None:
            g = await groups.getitem(str(i))
            if not isinstance(g, zarr.AsyncGroup):
                raise CacheError(f"{self.url}: {group_path(i)} is an array, not a symbol's group")
            mine = local[bounds[i] : bounds[i + 1]]
            for name, col, dtype in zip(_SEGMENT_ARRAYS, (1, 2, 3), ("int64", "int64", "int8")):
                await self._asmall(g, name, mine[:, col].astype(dtype), ("segment",))
            feats = await g.getitem("features")
            if not isinstance(feats, zarr.AsyncArray):
                raise CacheError(f"{self.url}: {group_path(i)}/features is a group, not an array")
            self._release(f"{group_path(i)}/features/zarr.json")  # rewritten from the copy in memory
            first = int(self.bases[i]) // self.shard_rows
            n_local = -(-int(self.bars_per_symbol[i]) // self.shard_rows)
            old = list(cast("list[str | None]", feats.attrs.get("digests") or []))  # as this writer stores them
            old += [None] * (n_local - len(old))
            await feats.update_attributes({"digests": [digests.get(first + k, old[k]) for k in range(n_local)]})

        gather([one(i) for i in todo])
        sync(self._asmall(async_group(root), "segments", local.astype(np.int64), ("all_segments", "field")))
        self._release("zarr.json")
        root.attrs[ATTR] = manifest.to_json()
