"""The on-disk layout (format 5): one Zarr v3 group per symbol, a root index and the ``shardcache`` manifest.

docs/store.md draws the layout. Every array is dense (row ``r`` of a symbol is its ``r``-th bar in time
order), a segment is a run of one symbol's bars in one split with no gap above ``max_gap``, and the
manifest's ``complete`` flag is written last. The constants, codecs and row arithmetic of that layout live
here; ``cache.Cache`` reads it and ``writer.CacheWriter`` writes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any, cast

import numcodecs
import numpy as np
import zarr
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from ..errors import CacheError, one_line
from .paths import check_storage_options, is_url
from .remote import open_store
from .zarr_adapter import sync

__all__ = [
    "ATTR",
    "CHUNK_KEYS",
    "CODECS",
    "FORMAT_VERSION",
    "TIME_ATTRS",
    "chunk_codec",
    "chunk_key",
    "compressors",
    "default_chunking",
    "describe_damage",
    "gather",
    "group_path",
    "node_array",
    "node_group",
    "open_group",
    "shard_digest",
    "spanned_shards",
    "symbol_bases",
    "symbol_chunk_rows",
]

FORMAT_VERSION = 5
ATTR = "shardcache"
# every array's chunk keys: zarr's default encoding with "." (``c.3.0``), so a chunk is a file of its
# array's folder, not of two more folders (format 4 used "/": six folders a symbol instead of three)
CHUNK_KEYS: dict[str, Any] = {"name": "default", "separator": "."}
CODECS = ("blosc-lz4", "zstd", "lz4", "none")
TIME_ATTRS = {"units": "nanoseconds since 1970-01-01", "calendar": "proleptic_gregorian"}


def compressors(codec: str) -> list[BytesBytesCodec]:
    """Inner-chunk codecs for ``codec``, always ending in a crc32c checksum per chunk."""
    first: list[BytesBytesCodec]
    if codec == "blosc-lz4":
        first = [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=4)]
    elif codec == "zstd":
        first = [ZstdCodec(level=3)]
    elif codec == "lz4":  # LZ4 in Blosc without shuffle: a Zarr v3 codec, where numcodecs.lz4 is not (zarrs refuses it)
        first = [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle", typesize=4)]
    elif codec == "none":
        first = []
    else:
        raise CacheError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    return [*first, Crc32cCodec()]


def chunk_codec(codec: str) -> Any | None:
    """The numcodecs codec that encodes (and decodes) a chunk as ``compressors(codec)`` does, before its
    crc32c; None for ``none``. Made from those zarr codecs' own configuration."""
    first = [c.to_dict() for c in compressors(codec)[:-1]]
    if not first:
        return None
    name, cfg = str(first[0]["name"]), dict(cast("dict[str, Any]", first[0].get("configuration", {})))
    if name == "blosc":
        cfg["shuffle"] = ("noshuffle", "shuffle", "bitshuffle").index(cfg["shuffle"])
    return numcodecs.get_codec({"id": name.removeprefix("numcodecs."), **cfg})


def default_chunking(n_features: int) -> tuple[int, int]:
    """Shard and inner-chunk rows: shards of ~8 MiB decoded (4-16 MiB keep the decode thread ahead of the
    gather with little prefetch memory, ``tools/bench.py``), 8 inner chunks each."""
    target = 8 << 20
    rows = 1 << int(np.log2(max(1, target // (4 * max(1, n_features)))))
    shard_rows = int(min(max(rows, 4096), 65536))
    return shard_rows, shard_rows // 8


def open_group(
    url: str | os.PathLike[str], mode: str = "r", storage_options: dict[str, Any] | None = None
) -> zarr.Group:
    """Open the cache group at a local path or any fsspec URL (an object store's with ``remote.open_store``);
    ``storage_options`` must be a mapping (an ``OptionTypeError`` otherwise)."""
    check_storage_options(storage_options)
    url = os.fspath(url)
    kwargs: dict[str, Any] = {"mode": mode, "zarr_format": 3}
    if is_url(url):
        return zarr.open_group(open_store(url, storage_options, read_only=mode == "r"), **kwargs)
    return zarr.open_group(url, **kwargs)


def node_array(group: zarr.Group, path: str) -> zarr.Array[Any]:
    """The array at ``path`` under ``group``: KeyError if there is none, or a group is there instead."""
    node = group[path]
    if not isinstance(node, zarr.Array):
        raise KeyError(f"{path} is a group, not an array")
    return node


def node_group(group: zarr.Group, path: str) -> zarr.Group:
    """The group at ``path`` under ``group``: KeyError if there is none, or an array is there instead."""
    node = group[path]
    if not isinstance(node, zarr.Group):
        raise KeyError(f"{path} is an array, not a group")
    return node


def group_path(i: int) -> str:
    """The group of the ``i``-th symbol: by index, so any symbol text (``BRK/B``, unicode) works."""
    return f"symbols/{int(i)}"


def chunk_key(i: int, array: str, k: int) -> str:
    """Store key of chunk ``k`` of symbol ``i``'s ``array``: ``symbols/<i>/features/c.<k>.0`` (chunked in rows
    only) or ``symbols/<i>/time/c.<k>``."""
    sep: str = CHUNK_KEYS["separator"]
    return f"{group_path(i)}/{array}/c{sep}{int(k)}" + (f"{sep}0" if array == "features" else "")


def symbol_bases(bars_per_symbol: Any, shard_rows: int) -> np.ndarray:
    """First virtual row of each symbol, plus the total: ``base[i + 1] = base[i] + ceil(n_i / R) * R``."""
    n = np.asarray(bars_per_symbol, dtype=np.int64).reshape(-1)
    return np.concatenate([[0], np.cumsum(-(-n // shard_rows) * shard_rows)]).astype(np.int64)


def symbol_chunk_rows(bars_per_symbol: Any, chunk_rows: int) -> np.ndarray:
    """Inner-chunk rows of each symbol's ``features``, fixed when its array is created: ``chunk_rows`` halved
    while the half still holds the symbol's bars, down to ``chunk_rows / 16`` (a 300-bar symbol decodes a
    512-row chunk, not an 8,192-row one of 96% fill); the root index records each shard's."""
    n = np.asarray(bars_per_symbol, dtype=np.int64).reshape(-1)
    c = np.full(len(n), int(chunk_rows), dtype=np.int64)
    for _ in range(4):  # 16 = 2**4
        half = c // 2
        shrink = (c % 2 == 0) & (half >= n) & (half >= 1)
        c = np.where(shrink, half, c)
    return c


def describe_damage(exc: BaseException) -> str:
    """A read error of damaged data as one short line: its type, its first line, a checksum named."""
    text = one_line(exc)[:200] if str(exc).strip() else ""
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
    s = np.sort(np.repeat(a, n) + np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))
    return s[np.append(True, s[1:] != s[:-1])] if len(s) else s  # not np.unique: it imports numpy.ma (~10 ms)


def gather(coros: list[Any], limit: int = 64) -> None:
    """Run ``coros`` on zarr's event loop, ``limit`` at a time (metadata writes of many symbols)."""

    async def run() -> None:
        gate = asyncio.Semaphore(limit)

        async def one(c: Any) -> None:
            async with gate:
                await c

        results = await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    if coros:
        sync(run())
