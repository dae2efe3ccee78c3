"""Stage 1 of a build or an append, the scan: each input file read in bounded pieces, each piece sorted by
symbol then time and spilled as one Arrow file in the staging folder (one task per file). A run is one
symbol's rows of one piece; runs travel as rows of one array per file (``RUN``), never as Python objects,
since a build holds every run of every input between the scan and the merge.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from ..errors import OptionError, ShardcacheError
from ..format.build_options import BuildOptions
from ..tuning import SPILL_ROWS
from .checks import resolve_unmapped
from .compute import BATCH_ROWS
from .features import required_columns, resolve_features
from .sources import Source, expand_inputs, open_sources
from .sources.csv import CsvSource
from .sources.dbn import DbnSource

__all__ = ["RUN", "SKETCH", "Inputs", "ScanJob", "Scanned", "open_inputs", "run_path", "scan_inputs"]

SKETCH = 65  # timestamps kept per run to place fraction splits
# One row per run: its input file and piece (its spill file, ``run_path``), per-piece symbol code, global
# symbol id (set by the driver), first row in the spill file, rows and time range.
RUN = np.dtype(
    [(n, "<i4") for n in ("file", "piece", "code", "sym")] + [(n, "<i8") for n in ("offset", "n", "ts_min", "ts_max")]
)
Stage = Callable[..., list[Any]]  # ``Staging.run`` with the run's workers and client bound


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """A run's inputs: the specs, the files they name, opened (one schema), the features and the columns read."""

    specs: list[str]
    paths: list[str]
    sources: list[Source]
    names: list[str]
    read_columns: list[str]


@dataclass(frozen=True, kw_only=True)
class ScanJob:
    """Scan input ``index`` into run files under ``staging``; ``sketch`` samples timestamps for fraction splits."""

    index: int
    source: Source
    staging: str
    columns: list[str]
    sketch: bool


@dataclass(kw_only=True)
class _Scan:
    """One file's scan (a task's marker): its runs and what the summary counts."""

    symbols: list[str]  # names of ``runs["sym"]`` (file-local ids until the driver renumbers them)
    runs: np.ndarray  # RUN rows, in the order written
    sketch: np.ndarray  # (len(runs), SKETCH) int64: timestamps placing fraction splits
    drops: Counter[str]
    reordered: int
    records: int
    median_dt: int | None
    step: int | None  # the most common step between a symbol's consecutive bars (tabular inputs' bar size)
    symbology: dict[str, Any]  # what the source learned about symbols (DBN: unmapped instruments), plain JSON


@dataclass(kw_only=True)
class Scanned:
    """Every input's runs after the scan, with what the summary counts."""

    runs: np.ndarray
    sketch: np.ndarray
    symbols: list[str]
    dts: list[int]
    records: int
    reordered: int
    drops: Counter[str]
    steps: list[int | None]  # per input: the most common step between a symbol's bars
    unmapped: dict[str, int]  # DBN instruments with no symbol mapping (see ``checks.resolve_unmapped``)


def run_path(staging: str, run: np.void | np.ndarray) -> str:
    """The spill file holding one ``RUN`` row's rows (its piece's file)."""
    return os.path.join(staging, "runs", f"{int(run['file']):06d}-{int(run['piece']):05d}.arrow")


def open_inputs(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    options: BuildOptions,
    storage_options: dict[str, Any] | None,
) -> Inputs:
    """The files ``sources`` name, opened as ``options`` read them (refused when their schemas differ)."""
    specs = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    paths = expand_inputs(specs, storage_options)
    srcs = open_sources(
        paths,
        storage_options,
        bar=options.bar,
        ts_column=options.ts_column,
        symbol_column=options.symbol_column,
        csv_delimiter=options.csv_delimiter,
        columns=list(options.columns) if options.columns else None,
    )
    first = srcs[0]
    s = next((s for s in srcs[1:] if s.columns != first.columns), None)
    if s is not None:
        raise ShardcacheError(
            f"{s.path}: mixed schemas in one build: {s.schema} ({', '.join(s.columns)}) vs "
            f"{first.path}: {first.schema} ({', '.join(first.columns)})"
        )
    _check_tabular_options(options, srcs)
    names = resolve_features(options.features, first.columns)
    return Inputs(
        specs=specs, paths=paths, sources=srcs, names=names, read_columns=required_columns(names, first.columns)
    )


_KINDS = {"dbn": "DBN", "parquet": "Parquet", "csv": "CSV"}


def _check_tabular_options(options: BuildOptions, srcs: Sequence[Source]) -> None:
    """Refuse, rather than ignore, a column option for DBN files or a delimiter for non-CSV files."""
    dbn = next((s for s in srcs if isinstance(s, DbnSource)), None)
    for name in ("ts_column", "symbol_column"):
        if getattr(options, name) is not None and dbn is not None:
            raise OptionError(name, getattr(options, name), f"names a Parquet or CSV column; {dbn.path} is a DBN file")
    other = next((s for s in srcs if not isinstance(s, CsvSource)), None)
    if options.csv_delimiter is not None and other is not None:
        raise OptionError(
            "csv_delimiter", options.csv_delimiter, f"applies to CSV files; {other.path} is a {_KINDS[other.kind]} file"
        )


def _spill(path: str, body: pa.Table, order: np.ndarray) -> None:
    """Write ``body``'s rows in ``order`` as one Arrow file of ``SPILL_ROWS``-row batches, a slice at a time."""
    schema = body.schema.with_metadata({BATCH_ROWS: str(SPILL_ROWS).encode()})
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, schema) as writer:
        for lo in range(0, len(order), SPILL_ROWS):
            writer.write_table(body.take(pa.array(order[lo : lo + SPILL_ROWS])).combine_chunks())


@dataclass(kw_only=True)
class _Runs:
    """One piece's runs: ``RUN`` rows, median steps, distinct positive steps and their counts, sketches."""

    runs: np.ndarray
    dts: list[int]
    tallies: list[tuple[np.ndarray, np.ndarray]]
    sketch: np.ndarray


def _counted(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_counts=True)`` from one sort (ten times faster on a long run's few steps)."""
    ordered = np.sort(x)
    at = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(x) else np.zeros(0, np.intp)
    return ordered[at], np.diff(np.r_[at, len(x)]).astype(np.intp)


def _runs(ts: np.ndarray, starts: np.ndarray, *, sketch: bool, tally: bool) -> _Runs:
    """The runs of ``ts`` (sorted by symbol, then time; from ``starts``), all at once: each one's values alone."""
    n_runs, n = len(starts), len(ts)
    rows = np.diff(np.r_[starts, n])
    runs = np.zeros(n_runs, dtype=RUN)
    runs["offset"], runs["n"] = starts, rows
    runs["ts_min"], runs["ts_max"] = ts[starts], ts[starts + rows - 1]
    # the steps inside each run (diffs of consecutive rows, less those across two runs), counted by value:
    # the (run, step) pairs in order with their counts, from two sorts of the piece's steps
    inside = np.ones(max(n - 1, 0), dtype=bool)
    inside[starts[1:] - 1] = False
    step = np.diff(ts)[inside]
    owner = np.repeat(np.arange(n_runs, dtype=np.int64), rows - 1)
    values = _counted(step)[0]
    width = max(len(values), 1)
    pairs, counts = _counted(owner * width + np.searchsorted(values, step))
    p_run, p_value = pairs // width, values[pairs % width]
    # each run's median step (np.median's: the middle one, or the mean of the middle two), found by
    # position among the run's sorted steps
    m = rows - 1
    has = m > 0
    below, seen = np.cumsum(m) - m, np.cumsum(counts)
    lo = p_value[np.searchsorted(seen, (below + (m - 1) // 2)[has], side="right")].astype(np.float64)
    hi = p_value[np.searchsorted(seen, (below + m // 2)[has], side="right")].astype(np.float64)
    dts = np.where(m[has] % 2 == 1, lo, (lo + hi) / 2).astype(np.int64).tolist()  # as int(np.median(...))
    tallies = []
    if tally:  # each run's distinct positive steps and their counts, as np.unique gives them
        pos = p_value > 0
        p_run, p_value, counts = p_run[pos], p_value[pos], counts[pos]
        edges = np.searchsorted(p_run, np.arange(n_runs + 1))
        tallies = [(p_value[a:b], counts[a:b]) for a, b in itertools.pairwise(edges.tolist()) if b > a]
    out = np.empty((n_runs if sketch else 0, SKETCH), np.int64)
    if sketch:  # np.linspace(0, n - 1, SKETCH).round() of each run, in the same float steps
        at_ = np.arange(SKETCH, dtype=np.float64)[None, :] * ((rows - 1).astype(np.float64) / (SKETCH - 1))[:, None]
        at_[:, -1] = rows - 1
        out = ts[starts[:, None] + at_.round().astype(np.int64)]
    return _Runs(runs=runs, dts=dts, tallies=tallies, sketch=out)


def _scan(job: ScanJob) -> _Scan:
    src, columns = job.source, job.columns
    runs, sketches, reordered, dts, steps = [], [], 0, [], Counter[int]()
    names: dict[str, int] = {}
    max_rows = max(4096, (64 << 20) // (8 * (len(columns) + 2)))
    for k, piece in enumerate(src.pieces(max_rows)):
        if piece.num_rows == 0:
            continue
        enc = pc.dictionary_encode(piece["symbol"]).combine_chunks()
        codes = enc.indices.to_numpy(zero_copy_only=False)
        symbols = enc.dictionary.to_pylist()
        ts = piece["ts"].to_numpy().astype(np.int64, copy=False)
        by_code = np.argsort(codes, kind="stable")
        grouped_ts, grouped_codes = ts[by_code], codes[by_code]
        same = grouped_codes[1:] == grouped_codes[:-1]
        reordered += int(np.count_nonzero(same & (grouped_ts[1:] < grouped_ts[:-1])))
        order = np.lexsort((ts, codes))
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        body = piece.select(["ts", *(["instrument"] if "instrument" in piece.column_names else []), *columns])
        _spill(run_path(job.staging, np.array((job.index, k, 0, 0, 0, 0, 0, 0), dtype=RUN)), body, order)
        del body
        part = _runs(ts[order], np.r_[0, bounds], sketch=job.sketch, tally=src.bar_ns is None)
        part.runs["file"], part.runs["piece"] = job.index, k
        part.runs["code"] = codes[order[part.runs["offset"]]]
        part.runs["sym"] = [names.setdefault(symbols[c], len(names)) for c in part.runs["code"].tolist()]
        runs.append(part.runs)
        dts += part.dts
        for values, counts in part.tallies:  # each run's commonest steps, in the run's order (ties: the first)
            top = np.argsort(counts)[-8:]  # a bounded tally: the mode is among each run's commonest steps
            steps.update(dict(zip(values[top].tolist(), counts[top].tolist())))
        sketches.append(part.sketch)
        del piece
    return _Scan(
        symbols=list(names),
        runs=np.concatenate(runs) if runs else np.empty(0, RUN),
        sketch=np.concatenate(sketches) if sketches else np.empty((0, SKETCH), np.int64),
        drops=Counter(src.drops),
        reordered=reordered,
        records=src.records,  # the file's records (DBN ticks folded into bars count one by one)
        median_dt=int(np.median(dts)) if dts else None,
        step=steps.most_common(1)[0][0] if steps else None,
        symbology=dict(src.symbology),
    )


def _gather_runs(scans: list[_Scan]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Every run of every file (global symbol ids, sorted names) and their sketches, in scan order."""
    names = sorted({name for s in scans for name in s.symbols})
    ids = {name: j for j, name in enumerate(names)}
    runs, sketches = [], []
    for s in scans:
        r = s.runs.copy()
        if len(r):
            r["sym"] = np.array([ids[name] for name in s.symbols], dtype=np.int32)[r["sym"]]
        runs.append(r)
        sketches.append(s.sketch)
    return (
        np.concatenate(runs) if runs else np.empty(0, RUN),
        np.concatenate(sketches) if sketches else np.empty((0, SKETCH), np.int64),
        names,
    )


def scan_inputs(stage: Stage, srcs: list[Source], staging: str, read_cols: list[str], sketch: bool = False) -> Scanned:
    """Stage 1 over every input: runs spilled, counts gathered (``sketch``: timestamps for fraction splits)."""
    jobs = [ScanJob(index=i, source=s, staging=staging, columns=read_cols, sketch=sketch) for i, s in enumerate(srcs)]
    scans = stage(_scan, jobs, "scan", desc="read files", unit="file")
    unmapped = resolve_unmapped([s.path for s in srcs], [s.symbols for s in scans], [s.symbology for s in scans])
    runs, sketches, symbols = _gather_runs(scans)
    return Scanned(
        runs=runs,
        sketch=sketches,
        symbols=symbols,
        dts=[s.median_dt for s in scans if s.median_dt],
        records=sum(s.records for s in scans),
        reordered=sum(s.reordered for s in scans),
        drops=sum((s.drops for s in scans), Counter()),
        steps=[s.step for s in scans],
        unmapped=unmapped,
    )
