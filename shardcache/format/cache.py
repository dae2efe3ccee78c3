"""``Cache``: an opened, complete cache of the layout in ``shardcache.format.layout``.

In memory ``Cache`` lays the symbols out in one *virtual* row space for the window plan:
symbol ``i``'s bars are rows ``[base[i], base[i] + n_i)`` with ``base`` aligned to whole
shards (``symbol_bases``), so virtual shard ``s`` lies inside one symbol and is its local
shard ``s - base[i] / shard_rows``. ``locate`` maps virtual rows back to (symbol, row).
Opening reads the root manifest and the root index (``segments`` and ``shards``: a few objects, not
one per symbol); per-symbol arrays are opened on first use, and the rows of ``features`` are read
by decoders made from the manifest and the root index alone (``decode.ShardDecoder.from_layout``):
no request per symbol. A URL's store is read with ``paths.read_options`` (s3fs: one request per
whole object), and ``with_local`` gives a view of the cache that keeps its shard objects in a
node-local ``LocalCache``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from ..errors import CacheError
from .decode import ChunkError, MissingShard, ShardDecoder, decode_shard
from .index import DIGEST_ARRAY, SHARD_ARRAY, SHARD_FIELDS, ShardIndex
from .layout import (
    ATTR,
    chunk_codec,
    chunk_key,
    describe_damage,
    gather,
    node_array,
    node_group,
    open_group,
    symbol_bases,
)
from .local_cache import LocalCache
from .manifest import Manifest
from .objects import get_whole
from .paths import is_url, local_path, probe, read_options
from .remote import reported
from .zarr_adapter import async_group, sync

__all__ = ["TIME_CHUNKS", "Cache", "IndexAheadError", "NoCacheError", "open_cache"]

TIME_CHUNKS = 16  # shards of ``time`` arrays a Cache keeps (LRU): twice the 2 x mix = 8 shards a batch draws from


class NoCacheError(CacheError):
    """Nothing at the path is a cache: nothing there, or something that is not a shardcache cache."""


class IndexAheadError(CacheError):
    """An object-store cache whose root index is newer than its manifest: an append is writing it
    (or was killed in its last writes)."""


@dataclass
class _Handles:
    group: zarr.Group
    arrays: dict[tuple[int, str], zarr.Array[Any]] = field(default_factory=dict)
    decoders: dict[int, ShardDecoder] = field(default_factory=dict)
    templates: dict[int, ShardDecoder] = field(default_factory=dict)  # by inner-chunk rows: what others copy
    pid: int = field(default_factory=os.getpid)  # fsspec async clients (s3fs) do not survive a fork


class Cache:
    """An opened, complete cache: the manifest, the virtual segment table and lazy per-symbol arrays.

    Picklable (it reopens the store in each DataLoader worker), so it can be handed to a
    ``WindowStream`` used with ``num_workers > 0``.
    """

    manifest: Manifest
    """The cache's root attributes (``attrs['shardcache']``) read into typed parts."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        self.storage_options = storage_options
        problem = probe(self.url, storage_options)  # a URL's store answers (and the options are a mapping)
        if problem is not None:
            raise CacheError(f"{self.url}: {problem}")
        self._handles: _Handles | None = None
        self._root: zarr.Group | None = None  # the root group as opened: remade in another process without a read
        self.local: LocalCache | None = None  # a node-local copy of the shard objects read (``with_local``)
        self._times: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()  # (symbol, chunk): bar times
        self._times_lock = threading.Lock()  # several readers' gather threads may ask at once
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
        """Read and check the manifest, then the root index (``segments``, ``shards``); lay out the virtual rows."""
        group = self._open()
        attrs = group.attrs.get(ATTR)
        if not attrs:
            raise NoCacheError(f"{self.url}: not a shardcache cache (no 'shardcache' attributes)")
        self.manifest = Manifest.from_json(attrs, url=self.url)
        self.bars_per_symbol = np.asarray(self.manifest.bars_per_symbol, dtype=np.int64)
        self.bases = symbol_bases(self.bars_per_symbol, self.shard_rows)
        local, table = self._root_arrays(group, "segments", SHARD_ARRAY)
        self._digests: np.ndarray | None = None
        self.local_segments = local = local.reshape(-1, 4)
        sym = local[:, 0]
        if len(sym) and (sym.min() < 0 or sym.max() >= len(self.bars_per_symbol)):
            raise CacheError(
                f"{self.url}: the segment index names symbols the manifest does not have; rebuild the cache"
            )
        ahead = bool(len(sym)) and bool((local[:, 2] > self.bars_per_symbol[sym]).any())
        self.root_shards = table = table.reshape(-1, len(SHARD_FIELDS))
        # each symbol's inner-chunk rows (``layout.symbol_chunk_rows``), found once: a decoder is made per symbol
        self.symbol_chunks = ShardIndex(table=table, digests=np.zeros((0, 2), np.uint64)).symbol_chunk_rows(
            len(self.bars_per_symbol)
        )
        counts = -(-self.bars_per_symbol // self.shard_rows)
        want = np.repeat(np.arange(len(counts)), counts)
        if table.shape != (len(want), len(SHARD_FIELDS)) or not np.array_equal(table[:, 0], want):
            ahead |= len(table) > len(want)
            bad = "has other shards than"
        else:
            rows = np.minimum(self.bars_per_symbol[want] - table[:, 1] * self.shard_rows, self.shard_rows)
            ahead |= bool((table[:, 2] > rows).any())
            bad = "" if np.array_equal(table[:, 2], rows) else "counts other rows than"
        if ahead and is_url(self.url):
            raise IndexAheadError(  # an append's index, an older manifest: what an object store shows during one
                f"{self.url}: the segment index and the manifest disagree (an append is being "
                "written to this object store); open the cache again"
            )
        ends = np.zeros(len(self.bars_per_symbol), dtype=np.int64)
        np.maximum.at(ends, sym, local[:, 2])
        if not np.array_equal(ends, self.bars_per_symbol) and not is_url(self.url):
            raise CacheError(  # locally an append is swapped in whole: this is an edit or damage
                f"{self.url}: the segment index and the manifest disagree on the bars of "
                f"{self.symbols[int(np.flatnonzero(ends != self.bars_per_symbol)[0])]} (the manifest was edited, or "
                f"the cache is damaged); `shardcache verify {self.url}` lists what is wrong; rebuild the cache"
            )
        if bad and not is_url(self.url):
            raise CacheError(
                f"{self.url}: the shard index (shards) {bad} the manifest (the manifest was edited, or the cache is "
                f"damaged); `shardcache verify {self.url}` lists what is wrong; rebuild the cache"
            )
        virtual = np.stack([sym, local[:, 1] + self.bases[sym], local[:, 2] + self.bases[sym]], axis=1)
        order = np.argsort(virtual[:, 1], kind="stable")
        self.segments = virtual[order]
        self.segment_split = local[order, 3].astype(np.int8)

    def _root_arrays(self, group: zarr.Group, *names: str) -> list[np.ndarray]:
        """Root index arrays ``names``, read concurrently; a ``CacheError`` naming the one that is damaged."""
        found: dict[str, Any] = {}
        root = async_group(group)

        async def read(name: str) -> None:
            try:
                arr = await root.getitem(name)
                if not isinstance(arr, zarr.AsyncArray):
                    raise KeyError(name)
                found[name] = await arr.getitem(...)
            except Exception as exc:  # noqa: BLE001 - missing, or codecs raising ValueError/RuntimeError on damage
                found[name] = exc

        gather([read(name) for name in names])
        out = []
        for name in names:
            if isinstance(found[name], BaseException):
                what = {"segments": "segment table"}.get(name, "shard index")
                raise CacheError(
                    f"{self.url}: the {what} ({name}) is damaged: {describe_damage(found[name])}; rebuild the cache"
                ) from None
            out.append(np.asarray(found[name]))
        return out

    def _identity(self) -> tuple[int, int, int] | None:
        """Device, inode and change time of a local cache's folder, to notice it being swapped (a rename
        changes the time, so a new folder that reuses an old inode number is noticed too); None for URLs."""
        if is_url(self.url):
            return None
        try:
            st = os.stat(local_path(self.url))
        except OSError:
            return (-1, -1, -1)
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def check_same(self) -> None:
        """Refuse to go on reading a local cache that a rebuild replaced after it was opened."""
        if self._ident is not None and self._identity() != self._ident:
            raise CacheError(
                f"{self.url}: the cache was replaced (rebuilt or appended to) after it was opened; open it again"
            )

    # -- handles -------------------------------------------------------------------------
    def _open(self) -> zarr.Group:
        try:
            group = open_group(self.url, "r", read_options(self.url, self.storage_options))
        except json.JSONDecodeError as exc:
            raise CacheError(
                f"{self.url}: the cache's metadata (zarr.json) is damaged ({describe_damage(exc)}); rebuild the "
                "cache (build-cache --overwrite replaces it)"
            ) from None
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError, ValueError) as exc:
            raise NoCacheError(f"{self.url}: no cache found ({exc.__class__.__name__})") from None
        except Exception as exc:  # an object store's client raises its own kinds
            if not is_url(self.url):
                raise
            raise CacheError(f"{self.url}: cannot read the cache ({describe_damage(exc)})") from None
        self._handles, self._root = _Handles(group), group
        return group

    @property
    def handles(self) -> _Handles:
        if self._handles is None or self._handles.pid != os.getpid():  # a DataLoader worker, forked or spawned
            if self._root is None:
                self._open()
            else:  # the root group from the metadata read at opening, over a store (and fsspec client) of its own
                self._handles = _Handles(pickle.loads(pickle.dumps(self._root)))
            self.check_same()
        assert self._handles is not None
        return self._handles

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"], state["_times"], state["_times_lock"] = None, OrderedDict(), None
        return state  # times are read again where needed

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._times_lock = threading.Lock()

    def with_local(self, local: LocalCache | None) -> Cache:
        """This cache read through ``local`` (None: straight from its store): a view that shares the
        manifest, the opened store and the bar-time chunks, with decoders of its own."""
        view = copy.copy(self)
        view.local = local
        h = self._handles
        view._handles = None if h is None else _Handles(h.group, h.arrays, pid=h.pid)
        return view

    @property
    def local_space(self) -> str:
        """This cache's folder in a ``LocalCache``: a digest of its URL and build (its fingerprint and
        creation time), so the copies of a rebuilt cache are never taken for this one's."""
        m = self.manifest
        ident = json.dumps([self.url, m.build.fingerprint, m.created])
        return hashlib.blake2b(ident.encode(), digest_size=10).hexdigest()

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

    def _decoder(self, i: int) -> ShardDecoder:
        """Symbol ``i``'s shard decoder, made from the manifest (its layout and the symbol's rows) and the root
        index (its inner chunks' rows): no read. The first of each inner-chunk size is made from the layout,
        the others copy it (``ShardDecoder.like``): a first epoch of 2,000 symbols makes 2,000."""
        h = self.handles
        dec = h.decoders.get(i)
        if dec is None:
            root = h.group.store_path
            group = self.manifest.groups[i]  # not ``groups``: a copy of every symbol's
            path = f"{root.path}/{group}/features" if root.path else f"{group}/features"
            chunk_rows = int(self.symbol_chunks[i])  # a short symbol's inner chunks are smaller
            template = h.templates.get(chunk_rows)
            if template is None:
                layout = self.manifest.layout
                try:
                    template = h.templates[chunk_rows] = ShardDecoder.from_layout(
                        root.store,
                        path,
                        n_rows=int(self.bars_per_symbol[i]),
                        n_features=self.n_features,
                        shard_rows=int(layout.shard_rows),
                        chunk_rows=chunk_rows,
                        codec=layout.codec,
                        local=self.local,
                        space=self.local_space if self.local is not None else "",
                    )
                except (ValueError, TypeError) as exc:  # an edited manifest's layout
                    raise CacheError(
                        f"{self.url}: the manifest's layout cannot be read ({describe_damage(exc)}); rebuild the cache"
                    ) from None
            dec = h.decoders[i] = template.like(path, int(self.bars_per_symbol[i]))
        return dec

    # -- manifest views ------------------------------------------------------------------
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
        return int(self.bases[-1])

    @property
    def n_shards(self) -> int:
        """Shards of all symbols together (virtual shards ``0..n_shards``)."""
        return self.n_rows // self.shard_rows

    @property
    def shard_table(self) -> np.ndarray:
        """``(shard, start, stop)`` in virtual rows of every shard, in row order."""
        s = np.arange(self.n_shards, dtype=np.int64)
        start = s * self.shard_rows
        sym = np.searchsorted(self.bases, start, side="right") - 1
        stop = np.minimum(start + self.shard_rows, self.bases[sym] + self.bars_per_symbol[sym])
        return np.stack([s, start, stop], axis=1)

    def history(self) -> dict[str, Any]:
        """The inputs (``sources``) and append records (``appends``) kept in the ``history`` group."""
        try:
            return dict(self.handles.group["history"].attrs)
        except KeyError:
            return {}

    # -- virtual rows ---------------------------------------------------------------------
    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Symbol index and row in that symbol's own arrays of each virtual row (int64 both)."""
        rows = np.asarray(rows, dtype=np.int64)
        sym = np.searchsorted(self.bases, rows, side="right") - 1
        return sym.astype(np.int64), rows - self.bases[np.clip(sym, 0, len(self.bases) - 1)]

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns since the epoch) of virtual rows.

        Reads only the shards of the symbols' ``time`` arrays that hold ``rows`` (concurrently, each whole:
        no ``zarr.json``), and keeps the last ``TIME_CHUNKS`` of them: a stream with ``meta=True`` reads each
        about once an epoch, and memory stays bounded whatever the cache's length.
        """
        sym, local = self.locate(rows)
        out = np.empty(sym.shape, dtype=np.int64)
        if not out.size:
            return out
        size = int(self.manifest.layout.shard_rows)  # a symbol's time is sharded as its features: a shard's
        chunk = local // size  # bar times are one object, read whole (one request, and one file read: an
        # append's swap of the cache between two ranged reads of one object cannot mix old and new bytes)
        key = sym * (int(chunk.max()) + 1) + chunk  # one number per (symbol, chunk)
        order = np.argsort(key, kind="stable")
        first = np.flatnonzero(np.diff(key[order], prepend=-1))  # each group's first place in ``order``
        groups = [
            (int(sym[order[a]]), int(chunk[order[a]]), order[a:b])
            for a, b in zip(first.tolist(), [*first[1:].tolist(), len(order)])
        ]
        with self._times_lock:
            have = {(i, c): self._times[(i, c)] for i, c, _ in groups if (i, c) in self._times}

        root, codec = self.handles.group.store_path, chunk_codec("zstd")
        keys = {(i, c): chunk_key(i, "time", c) for i, c, _ in groups if (i, c) not in have}
        prefix = f"{root.path}/" if root.path else ""
        with reported(self.url, self.storage_options):  # a failed fetch is no swap: outside the check below
            got = get_whole(root.store, [prefix + key for key in keys.values()])
        try:
            for (i, c), key in keys.items():
                raw = got[prefix + key]
                if raw is None:
                    raise CacheError(f"{self.url}: {key} is missing; rebuild the cache")
                try:
                    ts = decode_shard(raw, size, int(self.symbol_chunks[i]), codec, np.int64, 0)
                except ChunkError as exc:
                    raise CacheError(
                        f"{self.url}: {key} is corrupt ({describe_damage(exc)}); rebuild the cache"
                    ) from None
                have[(i, c)] = ts[: min(size, int(self.bars_per_symbol[i]) - c * size)]
        except CacheError:
            self.check_same()  # a cache swapped during the reads: "replaced", not damaged
            raise
        for i, c, where in groups:
            out[where] = have[(i, c)][local[where] - c * size]
        with self._times_lock:
            for i, c, _ in groups:
                self._times[(i, c)] = have[(i, c)]
                self._times.move_to_end((i, c))
            while len(self._times) > TIME_CHUNKS:
                self._times.popitem(last=False)
        self.check_same()
        return out

    def region_stop(self, row: int) -> int:
        """End (virtual) of the rows of the symbol holding ``row``: reads must stop there."""
        i = int(np.searchsorted(self.bases, row, side="right")) - 1
        return int(self.bases[i] + self.bars_per_symbol[i])

    def split_id(self, split: str | None) -> int | None:
        """Index of ``split`` in the manifest (None means every split)."""
        if split is None:
            return None
        names = self.split_names
        if split not in names:
            raise CacheError(f"{self.url}: no split {split!r}; the cache has {', '.join(names)}")
        return names.index(split)

    # -- data ----------------------------------------------------------------------------
    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None, *, check: bool = True) -> np.ndarray:
        """Virtual rows ``[start, stop)`` (inside one symbol) of ``features``, into ``out``
        (C-contiguous float32 ``(stop - start, n_features)``) when given. ``check=False`` leaves
        ``check_same`` after a read that succeeded to the caller, who makes it once after many reads
        (the stream's reader: once per pool, not once per small shard).

        Read by ``decode.ShardDecoder`` (one request per shard, crc32c checked per inner
        chunk; through ``local`` when set) and never made up: a shard object that is missing, fails its checksums or
        cannot be decoded, and a cache swapped by a rebuild during the read, raise
        ``CacheError`` naming the shard.
        """
        i = int(np.searchsorted(self.bases, start, side="right")) - 1
        base = int(self.bases[i]) if 0 <= i < len(self.bars_per_symbol) else 0
        if i < 0 or i >= len(self.bars_per_symbol) or stop > base + int(self.bars_per_symbol[i]) or stop < start:
            raise IndexError(f"rows [{start}, {stop}) are not inside one symbol's rows")
        block = self._read_symbol(i, base, start, stop, out)
        if check:
            self.check_same()
        return block

    def read_many(self, starts: np.ndarray, stops: np.ndarray, outs: list[np.ndarray], *, check: bool = True) -> None:
        """``read_rows`` of virtual rows ``[starts[k], stops[k])`` (each inside one symbol) into ``outs[k]``, for
        many blocks at once: their symbols found in one search, and one ``check_same`` after them all (with
        ``check``). What a reader of thousands of small symbols' shards calls: per block, only its
        read is left."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        sym = np.searchsorted(self.bases, starts, side="right") - 1
        at = np.clip(sym, 0, max(len(self.bars_per_symbol) - 1, 0))
        base = self.bases[at]
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
            self._read_symbol(i, b, a, z, out)
        if check:
            self.check_same()

    def _read_symbol(self, i: int, base: int, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        """Virtual rows ``[start, stop)`` of symbol ``i`` (its first row ``base``), checked as ``read_rows`` says."""
        with reported(self.url, self.storage_options):
            try:
                return self._decoder(i).read(start - base, stop - base, out)
            except (MissingShard, ChunkError) as exc:
                assert exc.shard is not None  # ShardDecoder.read names the shard it was reading
                self.check_same()  # a swap between an index and its chunks' reads: "replaced", not damaged
                shard = base // self.shard_rows + exc.shard
                problem = "is missing" if isinstance(exc, MissingShard) else f"is corrupt: {exc}"
                raise CacheError(
                    f"{self.url}: shard {shard} ({self.shard_key(shard)}) {problem}; "
                    "`shardcache verify` lists every damaged shard; rebuild the cache"
                ) from None

    def shard_symbol(self, shard: int) -> tuple[int, int]:
        """Symbol index and local shard number of virtual shard ``shard``."""
        i = int(np.searchsorted(self.bases, shard * self.shard_rows, side="right")) - 1
        return i, int(shard) - int(self.bases[i]) // self.shard_rows

    def shard_key(self, shard: int, array: str = "features") -> str:
        """Store key of virtual shard ``shard`` of ``array``, e.g. ``symbols/3/features/c.0.0``."""
        i, local = self.shard_symbol(shard)
        return chunk_key(i, array, local)

    def shard_exists(self, shard: int, array: str = "features") -> bool:
        """Whether the store holds virtual shard ``shard`` of ``array`` (``features`` or ``time``)."""
        root = self.handles.group.store_path
        key = self.shard_key(shard, array)
        return bool(sync(root.store.exists(f"{root.path}/{key}" if root.path else key)))

    def shard_digests(self) -> np.ndarray:
        """Each shard's digest words (``shard_digests``, uint64 ``(n_shards, 2)``), read on first use."""
        if self._digests is None:
            (digests,) = self._root_arrays(self.handles.group, DIGEST_ARRAY)
            if digests.shape != (self.n_shards, 2):
                raise CacheError(
                    f"{self.url}: {DIGEST_ARRAY} holds {digests.shape[0]} digests for {self.n_shards} shards; "
                    "rebuild the cache"
                )
            self._digests = digests.astype(np.uint64, copy=False)
        return self._digests

    def shard_index(self) -> ShardIndex:
        """The root shard index: every shard's row of ``shards`` and its digest (see ``format.index``)."""
        return ShardIndex(table=self.root_shards, digests=self.shard_digests())

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
