"""Per-shard work of a build or an append: a shard's features, train-split statistics, the write.

A task takes a batch of consecutive shards (``shard_batches``), its rows from the merge's cluster files.
A feature that looks at the previous bar reads one leading row: from the clusters or, for an appended
symbol's first new bar, the raw last bar the manifest keeps (``ShardWork.tails``). Rows an append keeps
(``ShardWork.first_new``) are read back and written again with the new ones: every write a whole shard.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from ..errors import ShardcacheError
from ..format.index import ShardRecord
from ..format.writer import CacheWriter
from .features import compute_features
from .tasks import pack

__all__ = [
    "BATCH_ROWS",
    "ShardWork",
    "Spills",
    "batch_rows",
    "cluster_path",
    "merge_moments",
    "row_bytes",
    "shard_batches",
    "shard_stats",
    "write_shards",
]


def cluster_path(staging: str, job: int, part: int) -> str:
    """The merge's spill file ``part`` of job ``job`` (a build keeps numbers per cluster, not paths)."""
    return os.path.join(staging, "clusters", f"{job:06d}-{part:04d}.arrow")


@dataclass(kw_only=True)
class ShardWork:
    """Where each row to compute comes from, and how to normalize and write it."""

    staging: str  # the folder holding the cluster files
    clusters: np.ndarray  # (n, 3) int64: merge job, file part and first row in that file of each cluster, in row order
    first_row: np.ndarray  # row of each cluster's first bar
    counts: np.ndarray  # bars per cluster
    segments: np.ndarray  # the whole segment table, in row order
    segment_split: np.ndarray
    names: list[str]
    writer: CacheWriter
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    train_split: int | None = None
    read_columns: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    tails: dict[int, dict[str, Any]] = field(default_factory=dict)  # row -> raw bar before new rows
    first_new: dict[int, int] = field(default_factory=dict)  # shard -> first row not already stored (appends)


# a spill file's schema metadata: every record batch but the last holds these rows
BATCH_ROWS = b"shardcache.rows_per_batch"


def row_bytes(schema: pa.Schema) -> int:
    """Bytes of a row of ``schema``: its fixed widths, 8 for any other column."""
    return sum(max(t.bit_width // 8, 1) if pa.types.is_primitive(t) else 8 for t in schema.types)


class _Spill:
    """One opened spill file; one of equal record batches (``BATCH_ROWS``) is read only where a slice needs."""

    def __init__(self, path: str) -> None:
        self.reader = ipc.open_file(pa.memory_map(path, "r"))
        per = (self.reader.schema.metadata or {}).get(BATCH_ROWS)
        self.per = int(per) if per is not None else 0
        self.table = None if self.per else self.reader.read_all()
        self.size = 0 if self.per else os.path.getsize(path)  # the mapped pages read (they count in the RSS)
        self.schema = self.reader.schema.remove_metadata()
        self.held = (0, -1, pa.Table.from_batches([], schema=self.schema))  # the batches last read: k0, k1, rows

    def rows(self, offset: int, n: int) -> pa.Table:
        if self.table is not None:
            return self.table.slice(offset, n)
        k0, k1 = offset // self.per, min((offset + n - 1) // self.per, self.reader.num_record_batches - 1)
        if not (self.held[0] <= k0 and k1 <= self.held[1]):  # consecutive small slices share their batch
            batches = [self.reader.get_batch(k) for k in range(k0, k1 + 1)]
            self.held = (k0, k1, pa.Table.from_batches(batches, self.schema))
            self.size += sum(b.nbytes for b in batches)
        return self.held[2].slice(offset - self.held[0] * self.per, n)


class Spills:
    """The spill files a task reads, each mapped once while among the last ``keep``, pages up to ``keep_bytes``."""

    def __init__(self, keep: int = 16, keep_bytes: int = 32 << 20) -> None:
        self.keep, self.keep_bytes = keep, keep_bytes
        self._files: collections.OrderedDict[str, _Spill] = collections.OrderedDict()
        self._bytes = 0  # ``size`` of the files kept

    def rows(self, path: str, offset: int, n: int) -> pa.Table:
        """Rows ``[offset, offset + n)`` of the spill file ``path``."""
        spill = self._files.pop(path, None)
        if spill is None:
            spill = _Spill(path)
        else:
            self._bytes -= spill.size
        out = spill.rows(offset, n)
        while self._files and (len(self._files) >= self.keep or self._bytes + spill.size > self.keep_bytes):
            self._bytes -= self._files.popitem(last=False)[1].size
        if spill.size <= self.keep_bytes:
            self._files[path] = spill
            self._bytes += spill.size
        return out


_Slice = tuple[str, int, int]  # rows ``[offset, offset + n)`` of a spill file: (path, offset, n)


def _cluster(work: ShardWork, ci: int, offset: int, n: int) -> _Slice:
    """Where rows ``[offset, offset + n)`` of cluster ``ci`` are."""
    job, part, first = work.clusters[ci].tolist()
    return cluster_path(work.staging, job, part), first + offset, n


def _lead(work: ShardWork, row: int) -> _Slice | dict[str, np.ndarray] | None:
    """The raw bar at ``row``: where it is in its cluster, or a kept tail as one-row columns; None if neither."""
    ci = int(np.searchsorted(work.first_row, row, side="right")) - 1
    if ci >= 0 and row < work.first_row[ci] + work.counts[ci]:
        return _cluster(work, ci, row - int(work.first_row[ci]), 1)
    if (tail := work.tails.get(row)) is None:
        return None
    return {
        "ts": np.asarray([tail["ts"]], dtype=np.int64),
        **{c: np.asarray([tail[c]], dtype=np.float64) for c in work.read_columns},
    }


def _add(parts: list[_Slice | dict[str, np.ndarray]], piece: _Slice | dict[str, np.ndarray]) -> None:
    """Append ``piece`` to ``parts``, joined to the last slice where it goes on in the same file."""
    last = parts[-1] if parts else None
    if isinstance(piece, tuple) and isinstance(last, tuple) and last[0] == piece[0] and last[1] + last[2] == piece[1]:
        parts[-1] = (last[0], last[1], last[2] + piece[2])
    else:
        parts.append(piece)


def _columns(
    work: ShardWork, pieces: list[pa.Table | dict[str, np.ndarray]]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Timestamps and source columns of ``pieces`` one after the other (tables of one schema at once)."""
    ts_parts: list[np.ndarray] = []
    col_parts: dict[str, list[np.ndarray]] = {c: [] for c in work.read_columns}
    for _, group in itertools.groupby(pieces, lambda p: (0, id(p)) if isinstance(p, dict) else (1, p.schema)):
        run = list(group)  # a kept tail (one-row columns), or consecutive tables of one schema
        part = run[0] if isinstance(run[0], dict) else pa.concat_tables(run)
        values = part if isinstance(part, dict) else {c: part[c].to_numpy() for c in ["ts", *work.read_columns]}
        ts_parts.append(values["ts"].astype(np.int64, copy=False))
        for c in work.read_columns:
            col_parts[c].append(values[c])
    return np.concatenate(ts_parts), {c: np.concatenate(v) for c, v in col_parts.items()}


@dataclass(kw_only=True)
class _Rows:
    """Several shards' rows: ``shards[k]``'s features (unnormalized), times and segment ids are ``at[k]:at[k + 1]``."""

    shards: list[int]
    at: np.ndarray
    feats: np.ndarray
    ts: np.ndarray
    seg: np.ndarray

    def of(self, k: int) -> slice:
        return slice(int(self.at[k]), int(self.at[k + 1]))


def batch_rows(work: ShardWork, spans: list[tuple[int, int, int]], spills: Spills) -> _Rows:
    """Features, timestamps and segment ids of rows ``[a, b)`` of each ``(shard, a, b)`` of ``spans``, in one
    pass, each span as it would be alone (its leading row read, a segment start at its first)."""
    parts: list[_Slice | dict[str, np.ndarray]] = []
    rows, firsts, leads, n = [], [], [], 0
    for _, a, b in spans:
        lead = _lead(work, a - 1) if a > 0 else None
        if lead is not None:
            _add(parts, lead)
            leads.append(n)
        firsts.append(n)
        rows.append(a - (lead is not None))  # the span's first row, its lead row if it has one
        n += b - rows[-1]
        ci = int(np.searchsorted(work.first_row, a, side="right")) - 1
        row = a
        while row < b:
            first = int(work.first_row[ci])
            take = min(b, first + int(work.counts[ci])) - row
            _add(parts, _cluster(work, ci, row - first, take))
            row += take
            ci += 1
    ts, cols = _columns(work, [p if isinstance(p, dict) else spills.rows(*p) for p in parts])
    at = np.asarray(firsts, dtype=np.int64)  # where each span's rows begin in the batch
    at_rows = np.arange(n, dtype=np.int64) + np.repeat(np.asarray(rows, dtype=np.int64) - at, np.diff(at, append=n))
    seg = np.searchsorted(work.segments[:, 1], at_rows, side="right") - 1
    starts = np.zeros(n, dtype=bool)
    starts[1:] = seg[1:] != seg[:-1]
    starts[firsts] = True
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # refused below, not warned about
        feats = compute_features(work.names, cols, ts, starts)
    keep = np.ones(n, dtype=bool)
    keep[leads] = False
    out = _Rows(
        shards=[s for s, _, _ in spans],
        at=np.concatenate([[0], np.cumsum([b - a for _, a, b in spans])]),
        feats=feats[keep],
        ts=ts[keep],
        seg=seg[keep],
    )
    _check_finite(work, out, out.feats, "is not finite")
    return out


def _check_finite(work: ShardWork, rows: _Rows, feats: np.ndarray, what: str) -> None:
    """Refuse to write a NaN or infinity (an input float32 cannot hold), naming the first shard with one."""
    bad = ~np.isfinite(feats)
    if not bad.any():
        return
    k = int(np.searchsorted(rows.at, int(np.argmax(bad.any(axis=1))), side="right")) - 1
    at = rows.of(k)
    cells, cols = np.nonzero(bad[at])
    first = at.start + int(cells[0])
    sym = work.symbols[int(work.segments[rows.seg[first], 0])] if work.symbols else "?"
    raise ShardcacheError(
        f"feature {work.names[cols[0]]!r} {what} at {len(cells)} bar(s) of shard {rows.shards[k]}, first {sym} at "
        f"{np.datetime64(int(rows.ts[first]) // 10**9, 's')}: an input value float32 cannot hold (|x| > 3.4e38) or a "
        "derived feature of extreme inputs; fix those bars or pick other --features"
    )


def shard_batches(writer: CacheWriter, shards: Sequence[int]) -> list[list[int]]:
    """``shards`` (in row order) in tasks of at most a shard's rows, by the rows alone (a resume's the same)."""
    rows = [b - a for a, b in map(writer.shard_bounds, shards)]
    return [list(shards[lo:hi]) for lo, hi in pack(rows, writer.shard_rows)]


def shard_stats(work: ShardWork, shards: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-feature (count, mean, M2) of each shard's train-split rows, a row per shard, in one pass."""
    rows = batch_rows(work, [(s, *work.writer.shard_bounds(s)) for s in shards], Spills())
    sizes = np.diff(rows.at)
    keep = np.ones(len(rows.seg), dtype=bool)
    if work.train_split is not None:
        keep = work.segment_split[rows.seg] == work.train_split
    x = rows.feats[keep].astype(np.float64)
    count = np.bincount(np.repeat(np.arange(len(shards)), sizes)[keep], minlength=len(shards))
    first = np.cumsum(count) - count  # each shard's first kept row in ``x``
    some = count > 0
    mean = np.zeros((len(shards), x.shape[1]))
    m2 = np.zeros_like(mean)
    if some.any():  # sums row after row, shard by shard: what ``x.mean(axis=0)`` adds for one shard
        mean[some] = np.add.reduceat(x, first[some], axis=0) / count[some, None]
        m2[some] = np.add.reduceat((x - np.repeat(mean, count, axis=0)) ** 2, first[some], axis=0)
    n = np.repeat(count.astype(np.float64)[:, None], x.shape[1], axis=1)
    return n, mean, m2


def merge_moments(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Chan et al.'s pairwise merge of (count, mean, M2): exact, out of core."""
    n, mean, m2 = parts[0][0].copy(), parts[0][1].copy(), parts[0][2].copy()
    for nb, mb, m2b in parts[1:]:
        tot = n + nb
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = mb - mean
            mean = np.where(tot > 0, mean + delta * nb / tot, 0.0)
            m2 = m2 + m2b + np.where(tot > 0, delta**2 * n * nb / tot, 0.0)
        n = tot
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(np.where(n > 0, m2 / n, 0.0))
    std = np.where(std > 0, std, 1.0)
    return mean, std, int(n[0]) if len(n) else 0


def write_shards(work: ShardWork, shards: list[int]) -> list[ShardRecord]:
    """Compute and normalize ``shards``' rows and write each whole (with the rows an append keeps); their records."""
    spans = []
    for shard in shards:
        a, b = work.writer.shard_bounds(shard)
        spans.append((shard, work.first_new.get(shard, a), b))
    rows = batch_rows(work, spans, Spills())
    feats = rows.feats
    if work.mean is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            feats = ((feats - work.mean) / work.std).astype(np.float32)
        _check_finite(work, rows, feats, "overflows float32 after z-scoring")
    items = []
    for k, (shard, c, _) in enumerate(spans):
        block, ts = feats[rows.of(k)], rows.ts[rows.of(k)]
        a = work.writer.shard_bounds(shard)[0]
        if c > a:
            old_feats, old_ts = work.writer.read(a, c)
            block, ts = np.concatenate([old_feats, block]), np.concatenate([old_ts, ts])
        items.append((shard, block, ts))
    return work.writer.write_shards(items)
