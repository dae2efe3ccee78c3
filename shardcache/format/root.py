"""A cache's opened metadata as plain data: the manifest and the root index, checked against each other.

``load_root`` reads the root attributes (the ``Manifest``) and the root index (``segments``, ``shards``: a
few objects, not one per symbol) and checks that they describe the same bars; ``shard_digests`` and the chunk
moments are read only when asked for (``shard_index``: ``verify``, appends, read-time statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..errors import CacheError
from .index import DIGEST_ARRAY, MOMENT_ARRAYS, SHARD_ARRAY, SHARD_FIELDS, ShardIndex
from .layout import ATTR, describe_damage, gather
from .manifest import Manifest
from .moments import Moments
from .paths import is_url
from .rows import SymbolRows
from .zarr_adapter import async_group

__all__ = ["IndexAheadError", "NoCacheError", "Root", "load_root", "root_arrays", "shard_index"]


class NoCacheError(CacheError):
    """Nothing at the path is a cache: nothing there, or something that is not a shardcache cache."""


class IndexAheadError(CacheError):
    """An object-store cache whose root index is newer than its manifest: an append is writing it
    (or was killed in its last writes)."""


@dataclass(frozen=True, eq=False)
class Root:
    """What opening a cache reads, checked: the manifest, its symbols' row space, the segment table (per
    symbol, and in virtual rows sorted by start), the root shard index and each symbol's inner-chunk rows."""

    manifest: Manifest
    rows: SymbolRows
    local_segments: np.ndarray  # (symbol, start, stop, split) in each symbol's rows
    segments: np.ndarray  # (symbol, start, stop) in virtual rows, by start
    segment_split: np.ndarray  # each of ``segments``' split (int8)
    root_shards: np.ndarray  # the root index's ``shards`` table (``SHARD_FIELDS``)
    symbol_chunks: np.ndarray  # each symbol's inner-chunk rows (``layout.symbol_chunk_rows``)


def load_root(group: zarr.Group, url: str) -> Root:
    """Read and check the manifest of ``group``, then the root index; lay out the virtual rows. A local
    cache whose index and manifest disagree is damaged; on an object store, an append is writing it
    (``IndexAheadError``)."""
    attrs = group.attrs.get(ATTR)
    if not attrs:
        raise NoCacheError(f"{url}: not a shardcache cache (no 'shardcache' attributes)")
    manifest = Manifest.from_json(attrs, url=url)
    rows = SymbolRows.of(manifest.bars_per_symbol, int(manifest.layout.shard_rows))
    bars = rows.bars_per_symbol
    local, table = root_arrays(group, url, "segments", SHARD_ARRAY)
    local = local.reshape(-1, 4)
    sym = local[:, 0]
    if len(sym) and (sym.min() < 0 or sym.max() >= len(bars)):
        raise CacheError(f"{url}: the segment index names symbols the manifest does not have; rebuild the cache")
    table = table.reshape(-1, len(SHARD_FIELDS))
    ahead, bad = _check_shards(rows, table)
    ahead |= bool(len(sym)) and bool((local[:, 2] > bars[sym]).any())
    if ahead and is_url(url):
        raise IndexAheadError(  # an append's index, an older manifest: what an object store shows during one
            f"{url}: the segment index and the manifest disagree (an append is being "
            "written to this object store); open the cache again"
        )
    ends = np.zeros(len(bars), dtype=np.int64)
    np.maximum.at(ends, sym, local[:, 2])
    if not np.array_equal(ends, bars) and not is_url(url):
        raise CacheError(  # locally an append is swapped in whole: this is an edit or damage
            f"{url}: the segment index and the manifest disagree on the bars of "
            f"{manifest.symbols[int(np.flatnonzero(ends != bars)[0])]} (the manifest was edited, or "
            f"the cache is damaged); `shardcache verify {url}` lists what is wrong; rebuild the cache"
        )
    if bad and not is_url(url):
        raise CacheError(
            f"{url}: the shard index (shards) {bad} the manifest (the manifest was edited, or the cache is "
            f"damaged); `shardcache verify {url}` lists what is wrong; rebuild the cache"
        )
    virtual = np.stack([sym, local[:, 1] + rows.bases[sym], local[:, 2] + rows.bases[sym]], axis=1)
    order = np.argsort(virtual[:, 1], kind="stable")
    # each symbol's inner-chunk rows, found once: a decoder is made per symbol
    chunks = ShardIndex(table=table, digests=np.zeros((0, 2), np.uint64), moments=Moments.empty(0)).symbol_chunk_rows(
        len(bars)
    )
    return Root(
        manifest=manifest,
        rows=rows,
        local_segments=local,
        segments=virtual[order],
        segment_split=local[order, 3].astype(np.int8),
        root_shards=table,
        symbol_chunks=chunks,
    )


def _check_shards(rows: SymbolRows, table: np.ndarray) -> tuple[bool, str]:
    """Whether the shard index holds more than the manifest's bars (``ahead``), and how it differs (``bad``)."""
    bars, shard_rows = rows.bars_per_symbol, rows.shard_rows
    counts = -(-bars // shard_rows)
    want = np.repeat(np.arange(len(counts)), counts)
    if table.shape != (len(want), len(SHARD_FIELDS)) or not np.array_equal(table[:, 0], want):
        return len(table) > len(want), "has other shards than"
    have = np.minimum(bars[want] - table[:, 1] * shard_rows, shard_rows)
    return bool((table[:, 2] > have).any()), "" if np.array_equal(table[:, 2], have) else "counts other rows than"


def root_arrays(group: zarr.Group, url: str, *names: str) -> list[np.ndarray]:
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
                f"{url}: the {what} ({name}) is damaged: {describe_damage(found[name])}; rebuild the cache"
            ) from None
        out.append(np.asarray(found[name]))
    return out


def shard_index(group: zarr.Group, url: str, table: np.ndarray, n_features: int) -> ShardIndex:
    """The root shard index of ``table`` (the ``shards`` rows, checked at open) with its digests and chunk
    moments, read concurrently; a ``CacheError`` naming an array that is damaged or of another size."""
    digests, count, mean, m2 = root_arrays(group, url, DIGEST_ARRAY, *MOMENT_ARRAYS)
    if digests.shape != (len(table), 2):
        raise CacheError(
            f"{url}: {DIGEST_ARRAY} holds {digests.shape[0]} digests for {len(table)} shards; rebuild the cache"
        )
    index = ShardIndex(
        table=table,
        digests=digests.astype(np.uint64, copy=False),
        moments=Moments(count.astype(np.int64).reshape(-1), mean.reshape(-1, n_features), m2.reshape(-1, n_features)),
    )
    chunks = int(index.first_chunks[-1])
    if not (
        len(index.moments.count) == chunks
        and index.moments.mean.shape == index.moments.m2.shape == (chunks, n_features)
    ):
        raise CacheError(
            f"{url}: the chunk moments ({', '.join(MOMENT_ARRAYS)}) do not fit the shard index; rebuild the cache"
        )
    return index
