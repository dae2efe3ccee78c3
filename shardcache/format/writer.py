"""Writing the layout of ``shardcache.format.layout``: symbol documents, whole shards, the root index, the
manifest last. Every object is written whole with one request (``objects.Objects``) and nothing is read
back or checked for existence first, so a one-shard symbol costs five PUTs on an object store.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import CacheError
from .decode import ShardDecoder, decode_shard
from .encode import encode_shard
from .index import DIGEST_ARRAY, MOMENT_ARRAYS, SHARD_ARRAY, SHARD_FIELDS, ShardIndex, ShardRecord
from .layout import (
    ATTR,
    CHUNK_KEYS,
    chunk_codec,
    chunk_key,
    compressors,
    group_path,
    shard_digest,
    symbol_chunk_rows,
)
from .manifest import Layout, Manifest, incomplete
from .metadata import SymbolDocuments, group_document, symbol_documents, zarr_objects
from .moments import Moments
from .objects import STRAY, Objects
from .rows import SymbolRows

__all__ = ["CacheWriter"]


def _small(g: zarr.Group, name: str, data: np.ndarray, dims: tuple[str, ...], **attrs: Any) -> None:
    """A small one-chunk root array of ``data`` (zstd + crc32c), created in ``g``."""
    arr = g.create_array(
        name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=tuple(max(1, n) for n in data.shape),
        compressors=compressors("zstd"),
        fill_value=0,
        dimension_names=dims,
        attributes=attrs or None,
        chunk_key_encoding=CHUNK_KEYS,
    )
    if data.size:
        arr[...] = data


class CacheWriter:
    """Writes a cache's symbol documents, whole shards (one writer per shard), the root index and the manifest.

    Shards are addressed in the virtual row space of ``bars_per_symbol``. A symbol's inner chunks have
    ``symbol_chunks[i]`` rows (``layout.symbol_chunk_rows`` by default; an append passes the stored ones,
    which never change). ``create=True`` starts a cache (root marked incomplete, ``feature`` names, every
    symbol's documents); ``create=False`` writes nothing until asked (a resume, an append). Picklable, so
    shard writes can run as dask tasks on any worker.
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
        symbol_chunks: Any = None,
    ) -> None:
        self.objects = Objects(url, storage_options)
        self.url, self.storage_options = self.objects.url, storage_options
        self.feature_names = list(feature_names)
        self.n_features = len(feature_names)
        self.shard_rows = int(shard_rows)
        self.chunk_rows = int(chunk_rows)
        self.codec = codec
        if self.shard_rows % self.chunk_rows:
            raise CacheError(f"shard rows {shard_rows} must be a multiple of chunk rows {chunk_rows}")
        self.rows = SymbolRows.of(np.asarray(bars_per_symbol).reshape(-1), self.shard_rows)
        self.bars_per_symbol = self.rows.bars_per_symbol
        self.n_bars = int(self.bars_per_symbol.sum())
        if symbol_chunks is None:
            symbol_chunks = symbol_chunk_rows(self.bars_per_symbol, self.chunk_rows)
        self.symbol_chunks = np.asarray(symbol_chunks, dtype=np.int64).reshape(-1)
        if len(self.symbol_chunks) != len(self.bars_per_symbol) or (self.shard_rows % self.symbol_chunks).any():
            raise CacheError(f"inner-chunk rows {self.symbol_chunks.tolist()} must divide shard rows {shard_rows}")
        self._codecs = (chunk_codec(codec), chunk_codec("zstd"))  # features' inner chunks, time chunks
        if create:
            self._create()

    def documents(self, i: int) -> SymbolDocuments:
        """Symbol ``i``'s ``zarr.json`` templates (``metadata.SymbolDocuments``: one per inner-chunk size)."""
        return symbol_documents(self.n_features, self.shard_rows, int(self.symbol_chunks[i]), self.codec)

    def _create(self) -> None:
        """A new cache: the incomplete root and its ``symbols`` group, then every symbol's documents (the feature
        names are the manifest's: a string array is one tensorstore cannot open). A local folder already there
        is cleared first, as zarr's mode "w" does."""
        if self.objects.root is not None and os.path.lexists(self.objects.root):
            shutil.rmtree(self.objects.root)

        def root(g: zarr.Group) -> None:
            g.attrs[ATTR] = incomplete()
            g.create_group("symbols")

        self.objects.put_many(zarr_objects(root))
        self.write_symbols(range(len(self.bars_per_symbol)))

    def write_symbols(self, symbols: Iterable[int], first_new: int = 0) -> None:
        """Write the ``features`` and ``time`` documents of ``symbols`` at their ``bars_per_symbol``, and the group
        document of those from ``first_new`` on (an append's new symbols); equal local documents share a file."""
        out: dict[str, bytes] = {}
        for i in symbols:
            out.update(self.documents(i).symbol(int(i), int(self.bars_per_symbol[i]), group=int(i) >= first_new))
        self.objects.put_many(out, share=True)

    def sweep(self) -> int:
        """Remove (and count) the temporary files killed writes left in a local cache, so they are never
        published; none on object stores, where a PUT is whole or absent."""
        root = self.objects.root
        if root is None:
            return 0
        strays = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if STRAY.search(f)]
        for path in strays:
            os.unlink(path)
        return len(strays)

    @property
    def n_shards(self) -> int:
        """Shards of all symbols (virtual shards ``0..n_shards``)."""
        return self.rows.n_shards

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

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        """Virtual rows ``[start, stop)`` that shard ``shard`` holds."""
        i, a, b = self.rows.shard_span(shard)
        return int(self.rows.bases[i]) + a, int(self.rows.bases[i]) + b

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Virtual rows ``[start, stop)`` (inside one shard of one symbol) as stored: features and
        timestamps (the rows of its tail shard an append keeps)."""
        i = int(np.searchsorted(self.rows.bases, start, side="right")) - 1
        a, b = start - int(self.rows.bases[i]), stop - int(self.rows.bases[i])
        k = a // self.shard_rows
        path = f"{group_path(i)}/features"
        meta = self.documents(i).features_metadata(int(self.bars_per_symbol[i]))
        feats = ShardDecoder.from_metadata(self.objects.store, path, meta).read(a, b)
        raw = self.objects.get_many([chunk_key(i, "time", k)])[chunk_key(i, "time", k)]
        if raw is None:
            raise CacheError(f"{self.url}: {chunk_key(i, 'time', k)} is missing; rebuild the cache")
        ts = decode_shard(raw, self.shard_rows, int(self.symbol_chunks[i]), self._codecs[1], np.int64, 0)
        s0 = k * self.shard_rows
        return feats, ts[a - s0 : b - s0]

    def write_shard(self, shard: int, features: np.ndarray, ts: np.ndarray) -> ShardRecord:
        """Write shard ``shard`` whole (its ``features`` object and its ``time`` chunk, one request each)
        and return its row of the root index."""
        return self.write_shards([(shard, features, ts)])[0]

    def write_shards(self, items: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> list[ShardRecord]:
        """``write_shard`` of each ``(shard, features, bar times)`` of ``items``, each step for all of them in turn,
        then every object in one ``put_many`` (10% faster at 2,000 small symbols: docs/notes/scale-notes.md)."""
        shards = []
        for shard, features, ts in items:
            i, a, b = self.rows.shard_span(shard)
            block = np.ascontiguousarray(features, dtype=np.float32)
            times = np.asarray(ts, dtype=np.int64)
            if block.shape != (b - a, self.n_features) or times.shape != (b - a,):
                raise CacheError(f"shard {shard}: expected {(b - a, self.n_features)} rows, got {block.shape}")
            shards.append((i, a // self.shard_rows, block, times, int(self.symbol_chunks[i])))
        data = [encode_shard(block, self.shard_rows, rows, self._codecs[0]) for _, _, block, _, rows in shards]
        stamps = [encode_shard(t, self.shard_rows, rows, self._codecs[1], fill=0) for _, _, _, t, rows in shards]
        digests = [shard_digest(block) for _, _, block, _, _ in shards]
        objects = {}
        for (i, k, _, _, _), value, stamp in zip(shards, data, stamps):
            for key, obj in ((chunk_key(i, "features", k), value), (chunk_key(i, "time", k), stamp)):
                if obj is None:  # every value the fill value: zarr stores no object
                    self.objects.delete(key)
                else:
                    objects[key] = obj
        self.objects.put_many(objects)
        return [
            ShardRecord(
                symbol=i,
                shard=k,
                rows=len(times),
                first_ts=int(times[0]),
                last_ts=int(times[-1]),
                stored_bytes=0 if value is None else len(value),
                chunk_rows=rows,
                digest=digest,
                moments=Moments.of(block, np.arange(0, len(block), rows)),
            )
            for (i, k, block, times, rows), value, digest in zip(shards, data, digests)
        ]

    def write_history(self, history: dict[str, Any]) -> None:
        """Store the inputs and append records (``{"sources": [...], "appends": [...]}``) as the ``history``
        group's attributes: out of the manifest, and not read to open the cache."""
        made = zarr_objects(lambda g: g.create_group("history", attributes=history))
        self.objects.put("history/zarr.json", made["history/zarr.json"])

    def write_index(self, segments: np.ndarray, index: ShardIndex) -> None:
        """The root index: ``segments`` (symbol, start, stop, split in the symbol's own rows), ``shards``,
        ``shard_digests`` and the chunk moments, written together (each array's document and chunk)."""
        if len(index.table) != self.n_shards:
            raise CacheError(f"{self.url}: the shard index has {len(index.table)} rows for {self.n_shards} shards")

        def make(g: zarr.Group) -> None:
            _small(g, "segments", segments.astype(np.int64), ("all_segments", "field"))
            _small(
                g, SHARD_ARRAY, index.table.astype(np.int64), ("all_shards", "shard_field"), fields=list(SHARD_FIELDS)
            )
            _small(g, DIGEST_ARRAY, index.digests.astype(np.uint64), ("all_shards", "digest_word"))
            m = index.moments
            count, mean, m2 = MOMENT_ARRAYS
            _small(g, count, m.count.astype(np.int64), ("all_chunks",))
            _small(g, mean, m.mean.astype(np.float64), ("all_chunks", "feature"))
            _small(g, m2, m.m2.astype(np.float64), ("all_chunks", "feature"))

        made = zarr_objects(make)
        made.pop("zarr.json")
        self.objects.put_many(made)

    def write_manifest(self, manifest: Manifest) -> None:
        """The root's ``zarr.json`` with the manifest marked complete: the last write of a build or append."""
        self.objects.put("zarr.json", group_document(ATTR, manifest.to_json()))

    def finish(self, segments: np.ndarray, segment_split: np.ndarray, manifest: Manifest, index: ShardIndex) -> None:
        """Write the root index (``segments`` in virtual rows, ``index`` every shard's row), then ``manifest``,
        which must describe this writer's symbols and layout, marked complete: the last write."""
        if manifest.bars_per_symbol != self.bars_per_symbol.tolist() or manifest.layout != self.layout:
            raise CacheError(f"{self.url}: the manifest to write does not describe the cache written")
        seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
        split = np.asarray(segment_split, dtype=np.int8).reshape(-1)
        order = np.lexsort((seg[:, 1], seg[:, 0]))
        seg, split = seg[order], split[order]
        sym = seg[:, 0]
        local = np.stack([sym, seg[:, 1] - self.rows.bases[sym], seg[:, 2] - self.rows.bases[sym], split], axis=1)
        self.write_index(local, index)
        self.write_manifest(manifest)
