"""Stage 2 of a build or an append, the merge: each symbol's runs in clusters of overlapping time ranges,
each sorted, duplicate timestamps dropped (the last in input order wins), segment starts found (gaps above
``max_gap``, split boundaries, rolls). A task per batch of symbols (``tasks.pack``), its clusters one after
the other in its spill files; the scan's run files are deleted once every batch is recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from ..tuning import BATCH_BYTES, BATCH_TABLES, PLAIN_BYTES, PLAIN_FILES
from .compute import BATCH_ROWS, Spills, cluster_path, row_bytes
from .scan import Scanned, Stage, run_path
from .tasks import pack

__all__ = [
    "MergeJob",
    "Merged",
    "MergedBatch",
    "merge_symbols",
    "place_clusters",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """One run, as a merge task reads it (built per symbol from the scan's ``RUN`` rows)."""

    path: str
    offset: int  # its first row in the spill file
    n: int
    ts_min: int
    ts_max: int
    key: tuple[int, int]  # (input file, piece): input order, for "the last record wins"


@dataclass(frozen=True, kw_only=True)
class MergeJob:
    """Merge job ``index``'s ``symbols`` from their ``RUN`` rows (``symbols[j]``'s: ``runs[bounds[j]:bounds[j+1]]``)."""

    index: int
    symbols: list[str]
    runs: np.ndarray
    bounds: np.ndarray
    staging: str
    max_gap_ns: int
    cuts: np.ndarray
    last_instruments: list[int | None] = field(default_factory=list)  # an append's last ones: another is a roll


@dataclass(kw_only=True)
class Merged:
    """One symbol after the merge: where its sorted clusters are, its segment starts and raw last bar."""

    symbol: str
    job: int  # the merge job: its clusters are in ``cluster_path(staging, job, part)``
    cluster_rows: np.ndarray  # bars per cluster, in time order
    cluster_at: np.ndarray  # (clusters, 2) int64: each cluster's file part and first row in that file
    n: int
    seg_starts: np.ndarray
    seg_split: np.ndarray
    duplicates: int
    tail: dict[str, Any]  # the last bar's timestamp, source values and instrument: the "previous bar" of a later append
    rolls: list[list[int]] = field(default_factory=list)  # [ts_ns, from instrument, to instrument] at each change
    first_ts: int = 0  # the first bar's timestamp: an append plans its gap check from it, reading no spill


@dataclass(kw_only=True)
class MergedBatch:
    """A merge job's symbols, column by column (its task's marker: a few arrays however many symbols)."""

    job: int
    symbols: list[str]
    n: np.ndarray  # bars per symbol
    duplicates: np.ndarray
    first_ts: np.ndarray
    clusters: np.ndarray  # clusters per symbol; their rows and places follow each other below
    cluster_rows: np.ndarray
    cluster_at: np.ndarray
    segments: np.ndarray  # segments per symbol; their starts and splits follow each other below
    seg_starts: np.ndarray
    seg_split: np.ndarray
    tails: list[dict[str, Any]]
    rolls: list[list[list[int]]]

    @classmethod
    def of(cls, job: int, merged: list[Merged]) -> MergedBatch:
        return cls(
            job=job,
            symbols=[m.symbol for m in merged],
            n=np.asarray([m.n for m in merged], dtype=np.int64),
            duplicates=np.asarray([m.duplicates for m in merged], dtype=np.int64),
            first_ts=np.asarray([m.first_ts for m in merged], dtype=np.int64),
            clusters=np.asarray([len(m.cluster_rows) for m in merged], dtype=np.int64),
            cluster_rows=np.concatenate([m.cluster_rows for m in merged]).astype(np.int64),
            cluster_at=np.concatenate([m.cluster_at for m in merged]).astype(np.int64).reshape(-1, 2),
            segments=np.asarray([len(m.seg_starts) for m in merged], dtype=np.int64),
            seg_starts=np.concatenate([m.seg_starts for m in merged]).astype(np.int64),
            seg_split=np.concatenate([m.seg_split for m in merged]).astype(np.int8),
            tails=[m.tail for m in merged],
            rolls=[m.rolls for m in merged],
        )

    @classmethod
    def join(cls, job: int, parts: list[MergedBatch]) -> MergedBatch:
        """``parts``' symbols, one part after the other."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            job=job,
            symbols=[x for p in parts for x in p.symbols],
            **{
                name: np.concatenate([getattr(p, name) for p in parts])
                for name in ("n", "duplicates", "first_ts", "clusters", "cluster_rows", "segments", "seg_starts")
            },
            cluster_at=np.concatenate([p.cluster_at for p in parts]).reshape(-1, 2),
            seg_split=np.concatenate([p.seg_split for p in parts]).astype(np.int8),
            tails=[x for p in parts for x in p.tails],
            rolls=[x for p in parts for x in p.rolls],
        )

    def merged(self) -> list[Merged]:
        """The batch's symbols one by one."""
        c = np.concatenate([[0], np.cumsum(self.clusters)])
        g = np.concatenate([[0], np.cumsum(self.segments)])
        return [
            Merged(
                symbol=symbol,
                job=self.job,
                cluster_rows=self.cluster_rows[c[j] : c[j + 1]],
                cluster_at=self.cluster_at[c[j] : c[j + 1]],
                n=int(self.n[j]),
                seg_starts=self.seg_starts[g[j] : g[j + 1]],
                seg_split=self.seg_split[g[j] : g[j + 1]],
                duplicates=int(self.duplicates[j]),
                tail=self.tails[j],
                rolls=self.rolls[j],
                first_ts=int(self.first_ts[j]),
            )
            for j, symbol in enumerate(self.symbols)
        ]


class _ClusterFiles:
    """A merge job's cluster spill files: a new part when the columns' types change, rows written in
    record batches of ``BATCH_BYTES`` whatever the clusters' sizes (``BATCH_ROWS``), so a task reading a
    shard pages in those only; waiting clusters (slices of mapped spills) copied ``BATCH_TABLES`` at once."""

    def __init__(self, staging: str, job: int) -> None:
        self.staging, self.job = staging, job
        self.part, self.rows, self.per = -1, 0, 0
        self._sink: Any = None
        self._writer: Any = None
        self._schema: pa.Schema | None = None
        self._owned: list[pa.Table] = []  # rows not written yet, in memory of their own
        self._held: list[pa.Table] = []  # rows not written yet, slices of input files
        self._waiting = 0

    def add(self, table: pa.Table) -> tuple[int, int]:
        """Append ``table``; the part it went to and its first row there."""
        table = table.replace_schema_metadata(None)
        if self._writer is None or not table.schema.equals(self._schema, check_metadata=True):
            self.close()
            self.part, self.rows, self._schema = self.part + 1, 0, table.schema
            self.per = max(BATCH_BYTES // row_bytes(table.schema), 1)
            self._sink = pa.OSFile(cluster_path(self.staging, self.job, self.part), "wb")
            self._writer = ipc.new_file(self._sink, table.schema.with_metadata({BATCH_ROWS: str(self.per)}))
        self._held.append(table)
        self._waiting += table.num_rows
        if len(self._held) >= BATCH_TABLES:
            self._owned.append(pa.concat_tables(self._held).combine_chunks())
            self._held = []
        if self._waiting >= self.per:
            self._write(final=False)
        at = (self.part, self.rows)
        self.rows += table.num_rows
        return at

    def _write(self, final: bool) -> None:
        """Write the waiting rows' whole batches (every row if ``final``)."""
        waiting = pa.concat_tables(self._owned + self._held)
        n = waiting.num_rows if final else waiting.num_rows // self.per * self.per
        for at in range(0, n, self.per):
            self._writer.write_table(waiting.slice(at, self.per).combine_chunks())
        rest = waiting.slice(n)
        if rest.num_rows:  # a copy: a slice would keep its whole input file mapped
            rest = rest.take(pa.array(np.arange(rest.num_rows)))
        self._owned, self._held, self._waiting = [rest] if rest.num_rows else [], [], rest.num_rows

    def close(self) -> None:
        if self._writer is not None:
            if self._waiting:
                self._write(final=True)
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None


def _clusters(runs: list[_Run]) -> list[list[_Run]]:
    """Runs grouped by overlapping time ranges, in time order."""
    clusters: list[list[_Run]] = []
    hi = 0
    for run in sorted(runs, key=lambda r: (r.ts_min, r.key)):
        if clusters and run.ts_min <= hi:
            clusters[-1].append(run)
            hi = max(hi, run.ts_max)
        else:
            clusters.append([run])
            hi = run.ts_max
    return clusters


def _merge(job: MergeJob) -> MergedBatch:
    """Merge ``job``'s symbols: a stretch of plain ones of one schema at once, any other by itself."""
    spills = Spills()
    order, kind, widths, file_of = _plain(job, spills)
    # a stretch holds its rows at once: at most PLAIN_BYTES from PLAIN_FILES files (a bigger symbol merges
    # alone, a cluster at a time, so a build's memory stays flat in the bars)
    nbytes = np.add.reduceat(job.runs["n"][order] * widths[order], job.bounds[:-1]) if len(order) else order
    kind[(nbytes > PLAIN_BYTES) | (np.diff(job.bounds) > PLAIN_FILES)] = -1
    read = [set(file_of[order[int(job.bounds[j]) : int(job.bounds[j + 1])]].tolist()) for j in range(len(kind))]
    parts: list[MergedBatch] = []
    with contextlib.closing(_ClusterFiles(job.staging, job.index)) as files:
        j = 0
        while j < len(job.symbols):
            k, held, seen = j + 1, int(nbytes[j]), read[j]
            if kind[j] >= 0:
                while (
                    k < len(job.symbols)
                    and kind[k] == kind[j]
                    and held + int(nbytes[k]) <= PLAIN_BYTES
                    and len(seen | read[k]) <= PLAIN_FILES
                ):
                    held, seen = held + int(nbytes[k]), seen | read[k]
                    k += 1
                parts.append(_merge_plain(job, j, k, order, spills, files))
            else:
                parts.append(MergedBatch.of(job.index, [_merge_one(job, j, spills, files)]))
            j = k
    return MergedBatch.join(job.index, parts)


def _plain(job: MergeJob, spills: Spills) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``job.runs``' order (by symbol, then as ``_clusters`` orders them), each symbol's kind (its runs'
    schema number, or -1 unless plain: no two runs overlap in time, one schema, no instrument ids), and
    each run's bytes a row and spill file number."""
    runs, n_sym = job.runs, len(job.symbols)
    starts = job.bounds[:-1]
    sym = np.repeat(np.arange(n_sym), np.diff(job.bounds))
    files, at = np.unique(runs[["file", "piece"]], return_inverse=True)
    schemas: list[pa.Schema] = []
    ids, widths = [], []
    for f in files:
        schema = spills.rows(run_path(job.staging, f), 0, 0).schema.remove_metadata()
        widths.append(row_bytes(schema))
        same = next((i for i, x in enumerate(schemas) if x.equals(schema)), None)
        if same is None:
            schemas.append(schema)
            same = len(schemas) - 1
        ids.append(-1 if "instrument" in schema.names else same)
    run_kind = np.asarray(ids, dtype=np.int64)[at.reshape(-1)]
    kind = np.minimum.reduceat(run_kind, starts)
    kind[kind != np.maximum.reduceat(run_kind, starts)] = -1
    order = np.lexsort((runs["piece"], runs["file"], runs["ts_min"], sym))
    srt, ssym = runs[order], sym[order]
    # sorted by start, a symbol's runs overlap nowhere if none starts before the one before it ends
    kind[ssym[1:][(srt["ts_min"][1:] <= srt["ts_max"][:-1]) & (ssym[1:] == ssym[:-1])]] = -1
    return order, kind, np.asarray(widths, dtype=np.int64)[at.reshape(-1)], at.reshape(-1)


def _merge_plain(
    job: MergeJob, lo: int, hi: int, order: np.ndarray, spills: Spills, files: _ClusterFiles
) -> MergedBatch:
    """Merge the plain symbols ``lo..hi`` of one schema at once, each as ``_merge_one`` would, its clusters as one."""
    runs = job.runs[order[int(job.bounds[lo]) : int(job.bounds[hi])]]  # each symbol's in cluster order
    n_runs = np.diff(job.bounds[lo : hi + 1])
    m = hi - lo
    table = pa.concat_tables([spills.rows(run_path(job.staging, r), int(r["offset"]), int(r["n"])) for r in runs])
    ts = table["ts"].to_numpy()
    sym_of = np.repeat(np.repeat(np.arange(m), n_runs), runs["n"])
    keep = np.ones(len(ts), dtype=bool)  # the last of equal timestamps (a symbol's runs never share one)
    keep[:-1] = (ts[1:] != ts[:-1]) | (sym_of[1:] != sym_of[:-1])
    dups = np.bincount(sym_of[~keep], minlength=m)
    if not keep.all():
        table, ts, sym_of = table.filter(pa.array(keep)), ts[keep], sym_of[keep]
    n = np.bincount(sym_of, minlength=m)
    first = np.cumsum(n) - n
    split = np.searchsorted(job.cuts, ts, side="right").astype(np.int8)
    cut = np.ones(len(ts), dtype=bool)
    cut[1:] = split[1:] != split[:-1]
    if job.max_gap_ns > 0:
        cut[1:] |= (ts[1:] - ts[:-1]) > job.max_gap_ns
    cut[first] = True
    seg = np.flatnonzero(cut)
    part, row = files.add(table.combine_chunks())  # each symbol's rows follow each other: one cluster a symbol
    last = first + n - 1
    values = table.drop_columns(["ts"]).take(pa.array(last)).to_pylist()
    known = job.last_instruments[lo:hi] if job.last_instruments else [None] * m
    return MergedBatch(
        job=job.index,
        symbols=job.symbols[lo:hi],
        n=n.astype(np.int64),
        duplicates=dups.astype(np.int64),
        first_ts=ts[first].astype(np.int64),
        clusters=np.ones(m, dtype=np.int64),
        cluster_rows=n.astype(np.int64),
        cluster_at=np.stack([np.full(m, part), row + first], axis=1).astype(np.int64),
        segments=np.bincount(sym_of[seg], minlength=m).astype(np.int64),
        seg_starts=(seg - first[sym_of[seg]]).astype(np.int64),
        seg_split=split[seg],
        tails=[
            {"ts": t, **v, **({} if inst is None else {"instrument": inst})}
            for t, v, inst in zip(ts[last].tolist(), values, known)
        ],
        rolls=[[] for _ in range(m)],
    )


def _cluster_rows(members: list[_Run], spills: Spills) -> tuple[pa.Table, np.ndarray, int]:
    """A cluster's runs as one table in time order, each timestamp once; its timestamps; duplicates dropped."""
    parts = [spills.rows(r.path, r.offset, r.n) for r in sorted(members, key=lambda r: r.key)]
    if len({"instrument" in p.column_names for p in parts}) > 1:  # DBN runs beside table runs: no ids to compare
        parts = [p.drop_columns(["instrument"]) if "instrument" in p.column_names else p for p in parts]
    table = pa.concat_tables(parts, promote_options="permissive")  # a float32 Parquet beside a float64 CSV
    ts = table["ts"].to_numpy()
    if len(members) > 1:
        order = np.argsort(ts, kind="stable")
        table, ts = table.take(pa.array(order)), ts[order]
    keep = np.ones(len(ts), dtype=bool)
    keep[:-1] = ts[1:] != ts[:-1]
    if keep.all():
        return table, ts, 0
    return table.filter(pa.array(keep)), ts[keep], int(len(keep) - np.count_nonzero(keep))


def _merge_one(job: MergeJob, j: int, spills: Spills, files: _ClusterFiles) -> Merged:
    """Merge symbol ``job.symbols[j]``."""
    last_inst = job.last_instruments[j] if job.last_instruments else None
    runs = _runs_of(job.runs[int(job.bounds[j]) : int(job.bounds[j + 1])], job.staging)
    out, at, starts, splits, dups, n, last_ts, last_split, rolls = [], [], [], [], 0, 0, None, None, []
    first_ts = 0
    for members in _clusters(runs):
        table, ts, dropped = _cluster_rows(members, spills)
        dups += dropped
        split = np.searchsorted(job.cuts, ts, side="right").astype(np.int8)
        prev_ts = np.concatenate([[last_ts if last_ts is not None else ts[0]], ts[:-1]])
        prev_split = np.concatenate([[last_split if last_split is not None else split[0]], split[:-1]])
        cut = split != prev_split
        if job.max_gap_ns > 0:
            cut |= (ts - prev_ts) > job.max_gap_ns
        if "instrument" in table.column_names:  # a continuous symbol rolls: no window crosses contracts
            inst = table["instrument"].to_numpy()
            prev_inst = np.concatenate([[last_inst if last_inst is not None else inst[0]], inst[:-1]])
            rolled = np.flatnonzero(inst != prev_inst)
            cut[rolled] = True
            rolls += [[int(ts[r]), int(prev_inst[r]), int(inst[r])] for r in rolled]
            last_inst = int(inst[-1])
            table = table.drop_columns(["instrument"])
        if last_ts is None:
            cut[0] = True
            first_ts = int(ts[0])
        local = np.flatnonzero(cut)
        starts.append(local + n)
        splits.append(split[local])
        at.append(files.add(table))
        out.append(len(ts))
        n += len(ts)
        last_ts, last_split = int(ts[-1]), split[-1]
    tail = {
        "ts": last_ts,
        **{c: table[c][-1].as_py() for c in table.column_names if c != "ts"},
        **({} if last_inst is None else {"instrument": last_inst}),
    }
    return Merged(
        symbol=job.symbols[j],
        job=job.index,
        cluster_rows=np.asarray(out, dtype=np.int64),
        cluster_at=np.asarray(at, dtype=np.int64).reshape(-1, 2),
        n=n,
        seg_starts=np.concatenate(starts),
        seg_split=np.concatenate(splits),
        duplicates=dups,
        tail=tail,
        rolls=rolls,
        first_ts=first_ts,
    )


def place_clusters(merged: Sequence[Merged], rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clusters of ``merged`` from each symbol's row of ``rows``: ``(job, part, row)`` ids, first rows, counts."""
    c = np.asarray([len(m.cluster_rows) for m in merged], dtype=np.int64)
    if not c.sum():
        return np.zeros((0, 3), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = np.concatenate([m.cluster_rows for m in merged]).astype(np.int64)
    at = np.concatenate([m.cluster_at.reshape(-1, 2) for m in merged]).astype(np.int64)
    ids = np.column_stack([np.repeat(np.asarray([m.job for m in merged], dtype=np.int64), c), at])
    before = np.concatenate([[0], np.cumsum(counts)])  # a symbol's cluster i starts before[i] - before[its first]
    first = np.repeat(np.asarray(rows, dtype=np.int64) - before[np.cumsum(c) - c], c) + before[:-1]
    return ids, first, counts


def _drop_runs(paths: Sequence[str]) -> None:
    """Delete the scan's run files once every merge job is recorded (a resume may still need them before)."""
    for path in paths:
        Path(path).unlink(missing_ok=True)


def _runs_of(rows: np.ndarray, staging: str) -> list[_Run]:
    return [
        _Run(
            path=run_path(staging, r),
            offset=int(r["offset"]),
            n=int(r["n"]),
            ts_min=int(r["ts_min"]),
            ts_max=int(r["ts_max"]),
            key=(int(r["file"]), int(r["piece"])),
        )
        for r in rows
    ]


def merge_symbols(
    stage: Stage,
    staging: str,
    scanned: Scanned,
    max_gap_ns: int,
    cuts: Sequence[int],
    batch_rows: int,
    instruments: dict[str, int] | None = None,
) -> list[Merged]:
    """Stage 2: one ``Merged`` per symbol (sorted names); ``instruments``: an append's last instrument of each."""
    runs = scanned.runs[np.argsort(scanned.runs["sym"], kind="stable")]
    bounds = np.searchsorted(runs["sym"], np.arange(len(scanned.symbols) + 1))
    rows = np.concatenate([[0], np.cumsum(runs["n"])])[bounds]
    at = np.asarray(cuts, dtype=np.int64)
    groups = pack(np.diff(rows).tolist(), batch_rows)
    jobs = [
        MergeJob(
            index=k,
            symbols=scanned.symbols[lo:hi],
            runs=runs[bounds[lo] : bounds[hi]],
            bounds=bounds[lo : hi + 1] - bounds[lo],
            staging=staging,
            max_gap_ns=max_gap_ns,
            cuts=at,
            last_instruments=[instruments.get(sym) for sym in scanned.symbols[lo:hi]] if instruments else [],
        )
        for k, (lo, hi) in enumerate(groups)
    ]
    done = stage(_merge, jobs, "merge", weights=[hi - lo for lo, hi in groups], desc="sort symbols", unit="symbol")
    _drop_runs(sorted(run_path(staging, r) for r in np.unique(runs[["file", "piece"]])))  # a file a piece
    return [m for batch in done for m in batch.merged()]
