"""The root shard index: one row per stored shard of every symbol, in plain zarr arrays at the root.

``shards`` (``SHARD_FIELDS``, row ``s`` virtual shard ``s``), ``shard_digests`` (two little-endian
words each) and the moments of every inner chunk of every shard in shard order (``chunk_count``,
``chunk_mean``, ``chunk_m2``) are written once per build or append, whatever the number of symbols, so
``ls``, ``info`` and ``verify`` read them instead of every symbol's objects, and any time range's statistics
come from its whole chunks' moments plus its edges' bars (docs/store.md describes the arrays).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .moments import Moments

__all__ = [
    "DIGEST_ARRAY",
    "MOMENT_ARRAYS",
    "SHARD_ARRAY",
    "SHARD_FIELDS",
    "ShardIndex",
    "ShardRecord",
    "digest_words",
]

SHARD_ARRAY = "shards"
DIGEST_ARRAY = "shard_digests"
MOMENT_ARRAYS = ("chunk_count", "chunk_mean", "chunk_m2")
"""Each inner chunk's bars (int64), and its features' mean and sum of squared deviations (float64, per feature)."""
SHARD_FIELDS = ("symbol", "shard", "rows", "first_ts", "last_ts", "stored_bytes", "chunk_rows")


def digest_words(digest: str) -> tuple[int, int]:
    """A 16-byte hex digest as the two little-endian uint64 words ``shard_digests`` stores."""
    lo, hi = np.frombuffer(bytes.fromhex(digest), dtype="<u8").tolist()
    return int(lo), int(hi)


@dataclass(frozen=True, kw_only=True)
class ShardRecord:
    """What writing one shard leaves for the root index: its place, rows, bar times, size and digest."""

    symbol: int
    shard: int  # the symbol's own shard number
    rows: int
    first_ts: int
    last_ts: int
    stored_bytes: int
    chunk_rows: int
    digest: str  # hex, ``layout.shard_digest``
    moments: Moments  # of each of its inner chunks' stored values, in order


@dataclass(frozen=True, kw_only=True)
class ShardIndex:
    """Every shard's row of ``shards``, its digest words and its inner chunks' moments, in virtual-shard order."""

    table: np.ndarray  # (N, 7) int64, columns SHARD_FIELDS
    digests: np.ndarray  # (N, 2) uint64
    moments: Moments  # every shard's chunks in order (``chunks_of``)

    @classmethod
    def empty(cls, features: int = 0) -> ShardIndex:
        return cls(
            table=np.zeros((0, len(SHARD_FIELDS)), np.int64),
            digests=np.zeros((0, 2), np.uint64),
            moments=Moments.empty(features),
        )

    @cached_property
    def first_chunks(self) -> np.ndarray:
        """Each shard's first chunk in ``moments``, then the number of chunks (``N + 1``)."""
        rows, chunk = self.column("rows"), np.maximum(self.column("chunk_rows"), 1)
        return np.concatenate([[0], np.cumsum(-(-rows // chunk))]).astype(np.int64)

    def symbol_moments(self, symbol: int) -> tuple[Moments, np.ndarray]:
        """The moments of ``symbol``'s inner chunks, and each chunk's first row in the symbol's own rows
        (a symbol's shards are consecutive rows of the table, each full but its last)."""
        lo, hi = np.searchsorted(self.table[:, 0], [symbol, symbol + 1]).tolist()
        rows, chunk = self.column("rows")[lo:hi], np.maximum(self.column("chunk_rows")[lo:hi], 1)
        shard_start = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        starts = [np.arange(0, n, c, dtype=np.int64) + s0 for n, c, s0 in zip(rows, chunk, shard_start)]
        a, b = int(self.first_chunks[lo]), int(self.first_chunks[hi])
        return self.moments.select(np.arange(a, b)), np.concatenate([np.zeros(0, np.int64), *starts])

    def column(self, name: str) -> np.ndarray:
        """One column of the table by its name in ``SHARD_FIELDS``."""
        return self.table[:, SHARD_FIELDS.index(name)]

    def digest(self, row: int) -> str:
        """The hex digest of row ``row``."""
        return str(self.digests[row].astype("<u8").tobytes().hex())

    def symbol_chunk_rows(self, n_symbols: int) -> np.ndarray:
        """Each symbol's inner-chunk rows (from its first shard's row; rows naming no symbol below
        ``n_symbols``, in a damaged index, are left to the checks that name them)."""
        out = np.zeros(n_symbols, np.int64)
        t = self.table
        first = t[(t[:, 1] == 0) & (t[:, 0] >= 0) & (t[:, 0] < n_symbols)]
        out[first[:, 0]] = first[:, SHARD_FIELDS.index("chunk_rows")]
        return out

    @property
    def stored_bytes(self) -> int:
        """Bytes of every ``features`` shard object."""
        return int(self.column("stored_bytes").sum())

    def updated(self, records: Iterable[ShardRecord], bars_per_symbol: np.ndarray, shard_rows: int) -> ShardIndex:
        """The index of a cache of ``bars_per_symbol`` after ``records`` were written: those shards'
        rows from the records, every other shard's kept (a build starts from ``empty()``, an append
        from its cache's index). ValueError if a shard has neither."""
        records = list(records)
        counts = -(-np.asarray(bars_per_symbol, dtype=np.int64) // shard_rows)
        first = np.concatenate([[0], np.cumsum(counts)])
        n = int(first[-1])
        symbol = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        shard = np.arange(n, dtype=np.int64) - first[symbol]
        table = np.zeros((n, len(SHARD_FIELDS)), np.int64)
        digests = np.zeros((n, 2), np.uint64)
        filled = np.zeros(n, bool)
        chunks: list[Moments | None] = [None] * n
        old = self.table
        if len(old):
            old_counts = np.bincount(old[:, 0], minlength=len(counts))[: len(counts)]
            old_first = np.concatenate([[0], np.cumsum(old_counts)])
            keep = shard < old_counts[symbol]
            src = old_first[symbol[keep]] + shard[keep]
            table[keep], digests[keep], filled[keep] = old[src], self.digests[src], True
            old_chunks = self.first_chunks
            for row, o in zip(np.flatnonzero(keep).tolist(), src.tolist()):
                chunks[row] = self.moments.select(np.arange(old_chunks[o], old_chunks[o + 1]))
        for r in records:
            row = int(first[r.symbol]) + r.shard
            table[row] = (r.symbol, r.shard, r.rows, r.first_ts, r.last_ts, r.stored_bytes, r.chunk_rows)
            digests[row] = digest_words(r.digest)
            chunks[row] = r.moments
            filled[row] = True
        if not filled.all():
            k = int(np.flatnonzero(~filled)[0])
            raise ValueError(f"shard {int(shard[k])} of symbol {int(symbol[k])} was neither written nor kept")
        table[:, 0], table[:, 1] = symbol, shard
        return ShardIndex(table=table, digests=digests, moments=Moments.concat([m for m in chunks if m is not None]))
