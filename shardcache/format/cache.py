"""``Cache``: an opened, complete cache of the layout in ``shardcache.format.layout``.

Opening reads the root manifest and index (``shardcache.format.root``: a few objects, not one per symbol)
and lays the symbols out in one virtual row space (``rows``); rows of ``features`` are read by decoders made
from those alone (``shard_reader``). A local cache replaced by a rebuild while it is read is noticed
(``check_same``) and named, never read as damage.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import zarr

from ..errors import CacheError
from .bar_times import BarTimes
from .index import ShardIndex
from .layout import chunk_key, describe_damage, node_array, node_group
from .local_cache import LocalCache
from .manifest import Manifest
from .paths import is_url, local_path, probe
from .root import IndexAheadError, NoCacheError, load_root, shard_index
from .rows import SymbolRows
from .shard_reader import Handles, ShardReader

__all__ = ["Cache", "IndexAheadError", "NoCacheError", "folder_stamp", "open_cache"]


def folder_stamp(url: str) -> tuple[int, int, int] | None:
    """Device, inode and change time of a local cache's folder, to notice it being swapped (a rename
    changes the time, so a new folder that reuses an old inode number is noticed too); None for URLs."""
    if is_url(url):
        return None
    try:
        st = os.stat(local_path(url))
    except OSError:
        return (-1, -1, -1)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class Cache:
    """An opened, complete cache: the manifest, the virtual segment table and lazy per-symbol arrays.

    Picklable (it reopens the store in each DataLoader worker), so it can be handed to a
    ``WindowStream`` used with ``num_workers > 0``.
    """

    manifest: Manifest
    """The cache's root attributes (``attrs['shardcache']``) read into typed parts."""
    rows: SymbolRows
    """The symbols' virtual row space: ``locate``, ``region_stop``, ``shard_symbol``, ``shard_table``."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        problem = probe(self.url, storage_options)  # a URL's store answers (and the options are a mapping)
        if problem is not None:
            raise CacheError(f"{self.url}: {problem}")
        self.local: LocalCache | None = None  # a node-local copy of the shard objects read (``with_local``)
        self.reader = ShardReader(self.url, storage_options)
        self._times = BarTimes()
        self._index: ShardIndex | None = None
        for _ in range(3):  # a swap by a concurrent --overwrite build between the reads: read again
            self._stamp = folder_stamp(self.url)
            try:
                root = load_root(self.reader.open(), self.url)
            except CacheError:
                if folder_stamp(self.url) == self._stamp:
                    raise
                continue
            if folder_stamp(self.url) == self._stamp:
                self.manifest, self.rows = root.manifest, root.rows
                self.bars_per_symbol = root.rows.bars_per_symbol
                self.local_segments, self.segments, self.segment_split = (
                    root.local_segments,
                    root.segments,
                    root.segment_split,
                )
                self.root_shards, self.symbol_chunks = root.root_shards, root.symbol_chunks
                return
        raise CacheError(f"{self.url}: the cache kept being replaced while it was opened; try again")

    def check_same(self) -> None:
        """Refuse to go on reading a local cache that a rebuild replaced after it was opened."""
        if self._stamp is not None and folder_stamp(self.url) != self._stamp:
            raise CacheError(
                f"{self.url}: the cache was replaced (rebuilt or appended to) after it was opened; open it again"
            )

    @property
    def handles(self) -> Handles:
        """What this process holds open of the cache (opened again in a DataLoader worker)."""
        return self.reader.handles(self)

    def with_local(self, local: LocalCache | None) -> Cache:
        """This cache read through ``local`` (None: straight from its store): a view that shares the
        manifest, the opened store and the bar-time chunks, with decoders of its own."""
        view = copy.copy(self)
        view.local, view.reader = local, self.reader.view()
        return view

    def group(self, i: int) -> zarr.Group:
        """Symbol ``i``'s group (``symbols/<i>``)."""
        return node_group(self.handles.group, self.manifest.groups[i])

    def array(self, i: int, name: str = "features") -> zarr.Array[Any]:
        """Array ``name`` (``features``, ``time``, ...) of symbol ``i``, opened once per process (from the
        cache the manifest was read from: a local cache swapped since is refused)."""
        h = self.handles
        arr = h.arrays.get((i, name))
        if arr is None:
            try:
                node = node_array(h.group, f"{self.manifest.groups[i]}/{name}")
            except KeyError:
                self.check_same()
                raise CacheError(f"{self.url}: {self.groups[i]}/{name} is missing; rebuild the cache") from None
            except ValueError as exc:  # damaged metadata (zarr.json that is not JSON, a bad field)
                raise CacheError(
                    f"{self.url}: {self.groups[i]}/{name} cannot be opened ({describe_damage(exc)}); rebuild the cache"
                ) from None
            self.check_same()
            arr = h.arrays[(i, name)] = node
        return arr

    @property
    def feature_names(self) -> list[str]:
        """Feature names, in column order."""
        return list(self.manifest.feature_names)

    @property
    def symbols(self) -> list[str]:
        """Symbol names, in the cache's order."""
        return list(self.manifest.symbols)

    @property
    def groups(self) -> list[str]:
        """Group path of each symbol, relative to the cache root."""
        return list(self.manifest.groups)

    @property
    def split_names(self) -> list[str]:
        """Split names in time order (``['all']`` without splits)."""
        return list(self.manifest.splits.names)

    @property
    def stats(self) -> dict[str, dict[str, float]]:
        """Normalization statistics per feature (``mean``, ``std``), from the train split."""
        stats = self.manifest.stats
        if stats is None:
            return {}
        return {n: {"mean": m, "std": s} for n, m, s in zip(self.feature_names, stats.mean, stats.std)}

    @property
    def n_bars(self) -> int:
        """Bars stored, every symbol together."""
        return int(self.manifest.counts.bars)

    @property
    def n_features(self) -> int:
        """Features per bar."""
        return len(self.manifest.feature_names)

    @property
    def shard_rows(self) -> int:
        """Rows per shard."""
        return int(self.manifest.layout.shard_rows)

    @property
    def chunk_rows(self) -> int:
        """Rows per inner chunk."""
        return int(self.manifest.layout.chunk_rows)

    @property
    def n_rows(self) -> int:
        """Size of the virtual row space: every symbol's rows, each padded to whole shards."""
        return self.rows.n_rows

    @property
    def n_shards(self) -> int:
        """Shards of all symbols together (virtual shards ``0..n_shards``)."""
        return self.rows.n_shards

    def history(self) -> dict[str, Any]:
        """The inputs (``sources``) and append records (``appends``) kept in the ``history`` group."""
        try:
            return dict(self.handles.group["history"].attrs)
        except KeyError:
            return {}

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns since the epoch) of virtual rows: the shards of the symbols' ``time``
        arrays that hold them, read whole and concurrently, the last ``TIME_CHUNKS`` kept (``BarTimes``)."""
        return self._times.read(self, rows)

    def split_id(self, split: str | None) -> int | None:
        """Index of ``split`` in the manifest (None means every split)."""
        if split is None:
            return None
        names = self.split_names
        if split not in names:
            raise CacheError(f"{self.url}: no split {split!r}; the cache has {', '.join(names)}")
        return names.index(split)

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None, *, check: bool = True) -> np.ndarray:
        """Virtual rows ``[start, stop)`` (inside one symbol) of ``features``, into ``out`` (C-contiguous float32
        ``(stop - start, n_features)``) when given. ``check=False`` leaves ``check_same`` after a read that
        succeeded to the caller, who makes it once after many reads.

        Never made up: a shard object that is missing, fails its checksums or cannot be decoded, and a cache
        swapped by a rebuild during the read, raise ``CacheError`` naming the shard.
        """
        i = int(np.searchsorted(self.rows.bases, start, side="right")) - 1
        base = int(self.rows.bases[i]) if 0 <= i < len(self.bars_per_symbol) else 0
        if i < 0 or i >= len(self.bars_per_symbol) or stop > base + int(self.bars_per_symbol[i]) or stop < start:
            raise IndexError(f"rows [{start}, {stop}) are not inside one symbol's rows")
        block = self.reader.read(self, i, base, start, stop, out)
        if check:
            self.check_same()
        return block

    def read_many(self, starts: np.ndarray, stops: np.ndarray, outs: list[np.ndarray], *, check: bool = True) -> None:
        """``read_rows`` of virtual rows ``[starts[k], stops[k])`` (each inside one symbol) into ``outs[k]``, for
        many blocks at once: their symbols found in one search, one ``check_same`` after them all (with ``check``)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        sym = np.searchsorted(self.rows.bases, starts, side="right") - 1
        at = np.clip(sym, 0, max(len(self.bars_per_symbol) - 1, 0))
        base = self.rows.bases[at]
        bad = (
            (sym < 0)
            | (sym >= len(self.bars_per_symbol))
            | (stops < starts)
            | (stops > base + self.bars_per_symbol[at])
        )
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise IndexError(f"rows [{int(starts[k])}, {int(stops[k])}) are not inside one symbol's rows")
        for i, b, a, z, out in zip(sym.tolist(), base.tolist(), starts.tolist(), stops.tolist(), outs):
            self.reader.read(self, i, b, a, z, out)
        if check:
            self.check_same()

    def shard_key(self, shard: int, array: str = "features") -> str:
        """Store key of virtual shard ``shard`` of ``array``, e.g. ``symbols/3/features/c.0.0``."""
        i, local = self.rows.shard_symbol(shard)
        return chunk_key(i, array, local)

    def shard_index(self) -> ShardIndex:
        """The root shard index: every shard's row of ``shards``, its digest and its chunks' moments (see
        ``format.index``), the last two read on first use."""
        if self._index is None:
            self._index = shard_index(self.handles.group, self.url, self.root_shards, self.n_features)
        return self._index

    def __repr__(self) -> str:
        return (
            f"Cache({self.url!r}, bars={self.n_bars}, features={self.n_features}, "
            f"symbols={len(self.symbols)}, segments={len(self.segments)})"
        )


def open_cache(path: str | os.PathLike[str] | Cache, storage_options: dict[str, Any] | None = None) -> Cache:
    """Open a complete cache built by ``build-cache``; refuse incomplete, old- or newer-format caches."""
    if isinstance(path, Cache):
        return path
    return Cache(path, storage_options)
