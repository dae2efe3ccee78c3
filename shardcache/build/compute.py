"""Per-shard work of a build or an append: a shard's features, train-split statistics, the write.

Rows come from the sorted cluster files the merge stage spilled (``ShardWork.clusters``, in row
order, named by ``cluster_path``). A feature that looks at the previous bar (``log_return``, ``gap``) reads one extra
leading row: from the clusters, or, for the first new bar of an appended symbol, from the
raw last bar the manifest keeps per symbol (``ShardWork.tails``), so appended bars get the
same features as a build that saw every bar at once. Rows of a shard that an append keeps
(``ShardWork.first_new``) are read back from the cache as stored and written again with the new
rows: one writer per shard, every write a whole shard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from ..errors import ShardcacheError
from ..format.index import ShardRecord
from ..format.writer import CacheWriter
from .features import compute_features

__all__ = ["ShardWork", "cluster_path", "merge_moments", "read_arrow", "shard_stats", "write_arrow", "write_shard"]


def cluster_path(staging: str, sym: int, c: int) -> str:
    """The merge stage's spill file of cluster ``c`` of merge job (symbol) ``sym``; a build keeps
    the two numbers per cluster, not thousands of path strings."""
    return os.path.join(staging, "clusters", f"{sym:06d}-{c:06d}.arrow")


@dataclass(kw_only=True)
class ShardWork:
    """Where each row to compute comes from, and how to normalize and write it."""

    staging: str  # the folder holding the cluster files
    clusters: np.ndarray  # (n, 2) int64: merge job and cluster number of each cluster file, in row order
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
    tails: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # row -> raw bar ({"ts": ..., column: ...}) before new rows
    first_new: dict[int, int] = field(default_factory=dict)  # shard -> first row not already stored (appends)


def write_arrow(path: str, table: pa.Table) -> None:
    """Spill ``table`` as an Arrow IPC file."""
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_arrow(path: str) -> pa.Table:
    """A spilled Arrow IPC file, memory-mapped."""
    return ipc.open_file(pa.memory_map(path, "r")).read_all()


def _cluster(work: ShardWork, ci: int) -> str:
    sym, c = work.clusters[ci].tolist()
    return cluster_path(work.staging, sym, c)


def _lead(work: ShardWork, row: int) -> dict[str, np.ndarray] | None:
    """The raw bar at ``row`` as one-row columns, if it is stored in a cluster or kept as a tail."""
    ci = int(np.searchsorted(work.first_row, row, side="right")) - 1
    if ci >= 0 and row < work.first_row[ci] + work.counts[ci]:
        table = read_arrow(_cluster(work, ci)).slice(row - int(work.first_row[ci]), 1)
        return {c: table[c].to_numpy() for c in ["ts", *work.read_columns]}
    tail = work.tails.get(row)
    if tail is None:
        return None
    return {
        "ts": np.asarray([tail["ts"]], dtype=np.int64),
        **{c: np.asarray([tail[c]], dtype=np.float64) for c in work.read_columns},
    }


def rows_features(work: ShardWork, a: int, b: int, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features (unnormalized), timestamps and split ids of rows ``[a, b)``, all in the clusters."""
    lead = _lead(work, a - 1) if a > 0 else None
    ci = int(np.searchsorted(work.first_row, a, side="right")) - 1
    parts, row = [], a
    while row < b:
        first = int(work.first_row[ci])
        table = read_arrow(_cluster(work, ci))
        take = min(b, first + table.num_rows) - row
        parts.append(table.slice(row - first, take))
        row += take
        ci += 1
    table = pa.concat_tables(parts)
    ts = table["ts"].to_numpy().astype(np.int64, copy=False)
    cols = {c: table[c].to_numpy() for c in work.read_columns}
    n_lead = 0 if lead is None else 1
    if lead is not None:
        ts = np.concatenate([lead["ts"].astype(np.int64), ts])
        cols = {c: np.concatenate([lead[c], v]) for c, v in cols.items()}
    rows = np.arange(a - n_lead, b, dtype=np.int64)
    seg = np.searchsorted(work.segments[:, 1], rows, side="right") - 1
    starts = np.zeros(len(rows), dtype=bool)
    starts[0] = True
    starts[1:] = seg[1:] != seg[:-1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # refused below, not warned about
        feats = compute_features(work.names, cols, ts, starts)
    feats, ts, seg = feats[n_lead:], ts[n_lead:], seg[n_lead:]
    _check_finite(work, shard, feats, ts, seg, "is not finite")
    return feats, ts, work.segment_split[seg]


def _check_finite(work: ShardWork, shard: int, feats: np.ndarray, ts: np.ndarray, seg: np.ndarray, what: str) -> None:
    """Refuse to write a NaN or infinity: they come from inputs float32 cannot hold (|x| > 3.4e38)
    or from a derived feature of extreme inputs."""
    bad = ~np.isfinite(feats)
    if not bad.any():
        return
    rows, cols = np.nonzero(bad)
    sym = work.symbols[int(work.segments[seg[rows[0]], 0])] if work.symbols else "?"
    raise ShardcacheError(
        f"feature {work.names[cols[0]]!r} {what} at {len(rows)} bar(s) of shard {shard}, first {sym} at "
        f"{np.datetime64(int(ts[rows[0]]) // 10**9, 's')}: an input value float32 cannot hold (|x| > 3.4e38) or a "
        "derived feature of extreme inputs; fix those bars or pick other --features"
    )


def shard_stats(job: tuple[ShardWork, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-feature (count, mean, M2) of one shard's train-split rows."""
    work, shard = job
    feats, _, split = rows_features(work, *work.writer.shard_bounds(shard), shard)
    if work.train_split is not None:
        feats = feats[split == work.train_split]
    x = feats.astype(np.float64)
    n = np.full(x.shape[1], len(x), dtype=np.float64)
    mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
    m2 = ((x - mean) ** 2).sum(axis=0)
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


def write_shard(job: tuple[ShardWork, int]) -> ShardRecord:
    """Compute, normalize and write one whole shard (with the rows an append keeps); its row of the root index."""
    work, shard = job
    a, b = work.writer.shard_bounds(shard)
    c = work.first_new.get(shard, a)
    feats, ts, _ = rows_features(work, c, b, shard)
    if work.mean is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            feats = ((feats - work.mean) / work.std).astype(np.float32)
        seg = np.searchsorted(work.segments[:, 1], c + np.arange(len(ts)), side="right") - 1
        _check_finite(work, shard, feats, ts, seg, "overflows float32 after z-scoring")
    if c > a:
        old_feats, old_ts = work.writer.read(a, c)
        feats, ts = np.concatenate([old_feats, feats]), np.concatenate([old_ts, ts])
    return work.writer.write_shard(shard, feats, ts)
