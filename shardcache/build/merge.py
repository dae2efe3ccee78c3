"""Stage 2 of a build or an append, the merge (one task per symbol): a symbol's runs grouped into
clusters of overlapping time ranges (one cluster per daily file in the usual case), each sorted by
time, duplicate timestamps dropped (the last record in input order wins) and segment starts found
(gaps above ``max_gap``, split boundaries and, for a continuous DBN symbol, contract rolls).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .compute import cluster_path, read_arrow, write_arrow
from .scan import Scanned, Stage, run_path

__all__ = ["MergeJob", "Merged", "merge_symbols", "place_clusters"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    """One run file, as a merge job gets it (built per symbol from the scan's ``RUN`` rows)."""

    path: str
    n: int
    ts_min: int
    ts_max: int
    key: tuple[int, int]  # (input file, piece): input order, for "the last record wins"


@dataclass(frozen=True, kw_only=True)
class MergeJob:
    """Merge symbol ``symbol`` (merge job ``sym``: its clusters are ``cluster_path(staging, sym, c)``)
    from its ``runs``, cutting segments at gaps above ``max_gap_ns`` and at the split ``cuts``;
    ``last_instrument`` is the stored last bar's (an append: a first bar on another one is a roll)."""

    sym: int
    symbol: str
    runs: list[_Run]
    staging: str
    max_gap_ns: int
    cuts: np.ndarray
    last_instrument: int | None = None


@dataclass(kw_only=True)
class Merged:
    """One symbol after the merge: its sorted cluster files, segment starts and raw last bar (a task's
    result, saved as a marker)."""

    symbol: str
    sym: int  # the merge job: its cluster files are ``cluster_path(staging, sym, c)``
    cluster_rows: np.ndarray  # bars per cluster file, in time order
    n: int
    seg_starts: np.ndarray
    seg_split: np.ndarray
    duplicates: int
    tail: dict[str, Any]  # the last bar's timestamp, source values and instrument: the "previous bar" of a later append
    rolls: list[list[int]] = field(default_factory=list)  # [ts_ns, from instrument, to instrument] at each change
    first_ts: int = 0  # the first bar's timestamp: an append plans its gap check from it, reading no spill


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


def _merge(job: MergeJob) -> Merged:
    last_inst = job.last_instrument
    out, starts, splits, dups, n, last_ts, last_split, rolls = [], [], [], 0, 0, None, None, []
    first_ts = 0
    for c, members in enumerate(_clusters(job.runs)):
        parts = [read_arrow(r.path) for r in sorted(members, key=lambda r: r.key)]
        if len({"instrument" in p.column_names for p in parts}) > 1:  # DBN runs beside table runs: no ids to compare
            parts = [p.drop_columns(["instrument"]) if "instrument" in p.column_names else p for p in parts]
        table = pa.concat_tables(parts)
        ts = table["ts"].to_numpy()
        if len(members) > 1:
            order = np.argsort(ts, kind="stable")
            table, ts = table.take(pa.array(order)), ts[order]
        keep = np.ones(len(ts), dtype=bool)
        keep[:-1] = ts[1:] != ts[:-1]
        if not keep.all():
            dups += int(len(keep) - np.count_nonzero(keep))
            table, ts = table.filter(pa.array(keep)), ts[keep]
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
        write_arrow(cluster_path(job.staging, job.sym, c), table)
        out.append(len(ts))
        n += len(ts)
        last_ts, last_split = int(ts[-1]), split[-1]
    tail = {
        "ts": last_ts,
        **{c: table[c][-1].as_py() for c in table.column_names if c != "ts"},
        **({} if last_inst is None else {"instrument": last_inst}),
    }
    return Merged(
        symbol=job.symbol,
        sym=job.sym,
        cluster_rows=np.asarray(out, dtype=np.int64),
        n=n,
        seg_starts=np.concatenate(starts),
        seg_split=np.concatenate(splits),
        duplicates=dups,
        tail=tail,
        rolls=rolls,
        first_ts=first_ts,
    )


def place_clusters(m: Merged, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``m``'s cluster files laid out from ``row`` on: ``(sym, c)`` ids, first rows, bar counts."""
    n = len(m.cluster_rows)
    ids = np.stack([np.full(n, m.sym, dtype=np.int64), np.arange(n, dtype=np.int64)], axis=1)
    return ids, row + np.cumsum(m.cluster_rows) - m.cluster_rows, m.cluster_rows


def _drop_runs(job: MergeJob) -> None:
    """Delete a symbol's run files once its merge is recorded (a resume may still need them before)."""
    for r in job.runs:
        if os.path.exists(r.path):
            os.remove(r.path)


def _runs_of(rows: np.ndarray, staging: str) -> list[_Run]:
    return [
        _Run(
            path=run_path(staging, r),
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
    instruments: dict[str, int] | None = None,
) -> list[Merged]:
    """Stage 2: each symbol's runs sorted and cut into segments, one ``Merged`` per symbol (sorted names).

    ``instruments`` (an append) gives a symbol's stored last instrument: a first bar on another one is a roll.
    """
    runs = scanned.runs
    by_sym = np.argsort(runs["sym"], kind="stable")
    bounds = np.searchsorted(runs["sym"][by_sym], np.arange(len(scanned.symbols) + 1))
    at = np.asarray(cuts, dtype=np.int64)
    jobs = [
        MergeJob(
            sym=j,
            symbol=sym,
            runs=_runs_of(runs[by_sym[bounds[j] : bounds[j + 1]]], staging),
            staging=staging,
            max_gap_ns=max_gap_ns,
            cuts=at,
            last_instrument=(instruments or {}).get(sym),
        )
        for j, sym in enumerate(scanned.symbols)
    ]
    return stage(_merge, jobs, "merge", then=_drop_runs, desc="sort symbols", unit="symbol")
