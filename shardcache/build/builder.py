"""The builder: market-data files in, a complete sharded cache out, in bounded memory.

Stages, each a set of independent dask tasks (``tasks.run_tasks``):

1. **scan** (one task per input file): read bounded pieces, clean values, split each piece
   by symbol, sort it by time and spill it as an Arrow run file in the staging folder.
2. **merge** (one task per symbol): group a symbol's runs into clusters of overlapping time
   ranges (one cluster per daily file in the usual case), sort each cluster by time, drop
   duplicate timestamps (the last record in input order wins) and find segment starts
   (gaps above ``max_gap`` and split boundaries).
3. **place** (in the driver, small): skip symbols shorter than a window, lay each symbol's
   rows out in time order in its own group (``format.layout``; shards addressed in the virtual row
   space of ``layout.symbol_bases``), build the segment table.
4. **stats** (one task per shard, z-score only): per-feature count/mean/M2 over the train
   split, merged with Chan's formula, so no statistic leaks from val/test.
5. **write** (one task per shard): compute features, normalize, write the whole shard.
   One writer per shard; nothing writes a partial shard. Stages 4 and 5 are ``shardcache.build.compute``.

``stats_from=CACHE`` skips stage 4 and normalizes with CACHE's statistics and split cut
times instead: what ``shardcache.build.append`` keeps, so a cache built at once this way equals
one built by appends. Scan and merge are also the first stages of an append.

Memory is bounded by a piece, a cluster and a shard per worker, never by the bar count.
Every finished task is recorded in the staging folder, and the cache is published (renamed
into place) only once complete, so a killed build resumes where it stopped (``resume``)
and readers never see a partial cache: see ``shardcache.build.staging``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ShardcacheError
from ..format.cache import Cache, open_cache
from ..format.layout import default_chunking, group_path, symbol_bases
from ..format.writer import CacheWriter
from .checks import check_bar_sizes, check_options, check_splits, resolve_unmapped, stats_source
from .cluster import check_cluster
from .compute import ShardWork, cluster_path, merge_moments, read_arrow, shard_stats, write_arrow, write_shard
from .features import required_columns, resolve_features
from .sources import Source, expand_inputs, format_duration, open_sources, parse_duration
from .splits import SplitSpec, parse_split
from .staging import Staging, digest, fingerprint, prepare
from .summary import bytes_summary, split_bar_counts, stored_bytes, window_count

__all__ = [
    "Merged",
    "Scanned",
    "build_cache",
    "connect",
    "merge_symbols",
    "open_inputs",
    "place_clusters",
    "scan_inputs",
]

log = logging.getLogger("shardcache")
_SKETCH = 65  # timestamps kept per run to place fraction splits


# -- stage results -------------------------------------------------------------------------
# One row per run file: which input file, piece and per-piece symbol code it came from (its
# path, see ``_run_path``), the global symbol id (filled in by the driver), rows and time range.
# Runs travel as rows of one array per file, never as Python objects: a build holds every run
# of every input between the scan and the merge, so their size is what grows with the data.
_RUN = np.dtype(
    [
        ("file", "<i4"),
        ("piece", "<i4"),
        ("code", "<i4"),
        ("sym", "<i4"),
        ("n", "<i8"),
        ("ts_min", "<i8"),
        ("ts_max", "<i8"),
    ]
)


@dataclass
class _Scan:
    symbols: list[str]  # names of ``runs["sym"]`` (file-local ids until the driver renumbers them)
    runs: np.ndarray  # _RUN rows, in the order written
    sketch: np.ndarray  # (len(runs), _SKETCH) int64: timestamps placing fraction splits
    drops: Counter
    reordered: int
    records: int
    median_dt: int | None
    step: int | None  # the most common step between a symbol's consecutive bars (tabular inputs' bar size)
    symbology: dict[str, Any]  # what the source learned about symbols (DBN: unmapped instruments), plain JSON


@dataclass(slots=True)
class _Run:
    """One run file, as a merge job gets it (built per symbol from the ``_RUN`` rows)."""

    path: str
    n: int
    ts_min: int
    ts_max: int
    key: tuple[int, int]


def _run_path(staging: str, run: np.void) -> str:
    return os.path.join(staging, "runs", f"{int(run['file']):06d}-{int(run['piece']):05d}-{int(run['code']):05d}.arrow")


@dataclass
class Merged:
    """One symbol after the merge: its sorted cluster files, segment starts and raw last bar."""

    symbol: str
    sym: int  # the merge job: its cluster files are ``cluster_path(staging, sym, c)``
    cluster_rows: np.ndarray  # bars per cluster file, in time order
    n: int
    seg_starts: np.ndarray
    seg_split: np.ndarray
    duplicates: int
    tail: dict  # the last bar's timestamp, source values and instrument: the "previous bar" of a later append
    rolls: list[list[int]] = field(default_factory=list)  # [ts_ns, from instrument, to instrument] at each change
    first_ts: int = 0  # the first bar's timestamp: an append plans its gap check from it, reading no spill


@dataclass
class Scanned:
    """Every input's runs after the scan, with what the summary counts."""

    runs: np.ndarray
    sketch: np.ndarray
    symbols: list[str]
    dts: list[int]
    records: int
    reordered: int
    drops: Counter
    steps: list[int | None]  # per input: the most common step between a symbol's bars
    unmapped: dict[str, int]  # DBN instruments with no symbol mapping (see ``checks.resolve_unmapped``)


# -- stage 1: scan ---------------------------------------------------------------------------
def _scan(job: tuple[int, Source, str, list[str], bool]) -> _Scan:
    i, src, staging, columns, sketch = job
    runs, sketches, names, reordered, dts, steps = [], [], {}, 0, [], Counter()
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
        for rows in np.split(order, bounds):
            code = int(codes[rows[0]])
            sym = names.setdefault(symbols[code], len(names))
            part = body.take(pa.array(rows))
            part_ts = ts[rows]
            run = np.array((i, k, code, sym, len(rows), part_ts[0], part_ts[-1]), dtype=_RUN)
            write_arrow(_run_path(staging, run), part)
            del part
            if len(part_ts) > 1:
                diffs = np.diff(part_ts)
                dts.append(int(np.median(diffs)))
                if src.bar_ns is None:  # a table's bar size: the most common step (DBN files know theirs)
                    values, counts = np.unique(diffs[diffs > 0], return_counts=True)
                    top = np.argsort(counts)[-8:]  # a bounded tally: the mode is among each run's commonest steps
                    steps.update(dict(zip(values[top].tolist(), counts[top].tolist())))
            runs.append(run)
            if sketch:  # only fraction splits need it (65 timestamps per run)
                sketches.append(part_ts[np.linspace(0, len(rows) - 1, _SKETCH).round().astype(np.int64)])
        del piece, body
    drops = Counter(src.drops)
    return _Scan(
        list(names),
        np.array(runs, dtype=_RUN),
        np.stack(sketches) if sketches else np.empty((0, _SKETCH), np.int64),
        drops,
        reordered,
        src.records,  # the file's records (DBN ticks folded into bars count one by one)
        int(np.median(dts)) if dts else None,
        steps.most_common(1)[0][0] if steps else None,
        dict(src.symbology),
    )


# -- stage 2: merge -----------------------------------------------------------------------
def _merge(job: tuple[int, str, list[_Run], str, int, np.ndarray, int | None]) -> Merged:
    sym_idx, symbol, runs, staging, max_gap, cuts, last_inst = job  # last_inst: the stored last bar's (appends)
    runs = sorted(runs, key=lambda r: (r.ts_min, r.key))
    clusters: list[list[_Run]] = []
    hi = None
    for run in runs:
        if clusters and run.ts_min <= hi:
            clusters[-1].append(run)
            hi = max(hi, run.ts_max)
        else:
            clusters.append([run])
            hi = run.ts_max
    out, starts, splits, dups, n, last_ts, last_split, rolls = [], [], [], 0, 0, None, None, []
    for c, members in enumerate(clusters):
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
        split = np.searchsorted(cuts, ts, side="right").astype(np.int8)
        prev_ts = np.concatenate([[last_ts if last_ts is not None else ts[0]], ts[:-1]])
        prev_split = np.concatenate([[last_split if last_split is not None else split[0]], split[:-1]])
        cut = split != prev_split
        if max_gap > 0:
            cut |= (ts - prev_ts) > max_gap
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
        write_arrow(cluster_path(staging, sym_idx, c), table)
        out.append(len(ts))
        n += len(ts)
        last_ts, last_split = int(ts[-1]), split[-1]
    tail = {
        "ts": last_ts,
        **{c: table[c][-1].as_py() for c in table.column_names if c != "ts"},
        **({} if last_inst is None else {"instrument": last_inst}),
    }
    return Merged(
        symbol,
        sym_idx,
        np.asarray(out, dtype=np.int64),
        n,
        np.concatenate(starts),
        np.concatenate(splits),
        dups,
        tail,
        rolls,
        first_ts=first_ts,
    )


def place_clusters(m: Merged, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``m``'s cluster files laid out from ``row`` on: ``(sym, c)`` ids, first rows, bar counts."""
    n = len(m.cluster_rows)
    ids = np.stack([np.full(n, m.sym, dtype=np.int64), np.arange(n, dtype=np.int64)], axis=1)
    return ids, row + np.cumsum(m.cluster_rows) - m.cluster_rows, m.cluster_rows


def _drop_runs(job: tuple[int, str, list[_Run], str, int, np.ndarray, int | None]) -> None:
    """Delete a symbol's run files once its merge is recorded (a resume may still need them before)."""
    for r in job[2]:
        if os.path.exists(r.path):
            os.remove(r.path)


# -- the build -------------------------------------------------------------------------------
def _resolve_max_gap(max_gap: str | int | None, bar_ns: int | None) -> int:
    if max_gap is None or max_gap == "auto":
        return max(3_600 * 10**9, 5 * (bar_ns or 60 * 10**9))
    if isinstance(max_gap, int):
        return max_gap
    try:
        return parse_duration(max_gap)
    except ValueError as exc:
        raise ShardcacheError(f"--max-gap {max_gap!r}: {exc}") from None


def build_cache(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    features: str | Sequence[str] | None = None,
    normalize: str = "zscore",
    split: str | None = "none",
    max_gap: str | int | None = "auto",
    bar: str | None = None,
    ts_column: str | None = None,
    symbol_column: str | None = None,
    csv_delimiter: str | None = None,
    columns: Sequence[str] | None = None,
    shard_rows: int | None = None,
    chunk_rows: int | None = None,
    codec: str = "blosc-lz4",
    workers: int | None = None,
    scheduler: Any = None,
    seq_len: int = 60,
    horizon: int = 1,
    overwrite: bool = False,
    resume: bool = False,
    storage_options: dict | None = None,
    progress: bool = True,
    stats_from: str | os.PathLike[str] | Cache | None = None,
    split_cuts_ns: Sequence[int] | None = None,
) -> Cache:
    """Build a cache from DBN/Parquet ``sources`` at ``out`` and return it opened.

    ``max_gap="auto"`` cuts segments at gaps above max(1 h, 5 bars); ``normalize="zscore"``
    standardizes every feature with train-split statistics stored in the manifest, or with
    those of the cache ``stats_from`` (whose split cut times are then kept too).
    ``split_cuts_ns`` fixes ``split``'s cut times instead of resolving its fractions (what
    ``--stats recompute`` keeps of its cache).
    ``seq_len``/``horizon`` only size the summary's window count: windows are chosen at read
    time, and a symbol shorter than one window is kept (it gives no windows at that length).
    A DBN continuous symbol's series is cut where it rolls to another instrument; the rolls
    are in ``manifest["rolls"]``. ``csv_delimiter``: CSV files' delimiter (default: sniffed from each
    header). See the README for the store layout.
    """
    t0 = time.perf_counter()
    check_options(
        normalize=normalize,
        codec=codec,
        out=os.fspath(out),
        storage_options=storage_options,
        seq_len=seq_len,
        horizon=horizon,
        shard_rows=shard_rows,
        chunk_rows=chunk_rows,
        workers=workers,
        bar=bar,
        max_gap=max_gap,
        csv_delimiter=csv_delimiter,
    )
    spec = parse_split(split)
    if split_cuts_ns is not None:
        if stats_from is not None:
            raise ShardcacheError("--stats-from keeps its cache's split cut times: pass it or split_cuts_ns, not both")
        spec = spec.at(split_cuts_ns)
    stats_of = stats_source(spec, normalize)
    tabular = {"ts_column": ts_column, "symbol_column": symbol_column, "csv_delimiter": csv_delimiter}
    specs, paths, srcs = open_inputs(sources, storage_options, bar=bar, columns=columns, **tabular)
    first = srcs[0]
    names = resolve_features(features, first.columns)
    read_cols = required_columns(names, first.columns)
    known = [s for s in srcs if s.bar_ns is not None]
    check_bar_sizes(known, [None] * len(known), bar)  # DBN files know theirs: refused before reading any
    out = os.fspath(out)
    frozen = None if stats_from is None else _frozen(stats_from, storage_options, names, normalize, spec)
    options = {
        "features": features if isinstance(features, (str, type(None))) else list(features),
        "normalize": normalize,
        "split": spec.text,
        "max_gap": str(max_gap),
        "bar": bar,
        **tabular,
        "columns": list(columns) if columns else None,
        "shard_rows": shard_rows,
        "chunk_rows": chunk_rows,
        "codec": codec,
        "seq_len": seq_len,
        "horizon": horizon,
        **({} if frozen is None else {"stats_from": frozen.url}),
        **({} if split_cuts_ns is None else {"split_cuts_ns": spec.dates_ns}),
    }
    wanted = fingerprint(srcs, options, _version())
    staging = prepare(out, storage_options, wanted, resume=resume, overwrite=overwrite, inputs=specs)
    if isinstance(staging, Cache):
        return staging
    with staging.guard("build"), connect(scheduler, staging.root, [out, *paths]) as client:
        stage = functools.partial(staging.run, workers=workers, client=client, show=progress)
        sources_described = [s.describe() for s in srcs]  # the manifest's; the sources go after the scan
        scanned = scan_inputs(stage, srcs, staging.root, read_cols, sketch=bool(spec.fractions) and frozen is None)
        bar_ns = check_bar_sizes(srcs, scanned.steps, bar)
        resampled = sorted(
            {
                format_duration(s.interval)
                for s in srcs
                if getattr(s, "layout", None) == "ohlcv" and s.bar_ns != s.interval
            }
        )
        del srcs, first
        dts, records_read, reordered, drops = scanned.dts, scanned.records, scanned.reordered, scanned.drops
        max_gap_ns = _resolve_max_gap(max_gap, bar_ns or (int(np.median(dts)) if dts else None))
        cuts = _cut_times(spec, frozen, scanned)
        scanned.sketch = scanned.sketch[:0]  # placed the cuts; the merge does not need it
        merged = merge_symbols(stage, staging.root, scanned, max_gap_ns, cuts)
        unmapped = scanned.unmapped
        del scanned
        n_bars = sum(m.n for m in merged)
        if n_bars == 0:
            dropped = ", ".join(f"{k}: {v}" for k, v in drops.items()) or "none dropped"
            raise ShardcacheError(f"{', '.join(specs)}: no bars to build ({dropped})")
        split_bars = _split_bars(merged, len(spec.names))
        check_splits(spec, stats_of if frozen is None else None, dict(zip(spec.names, split_bars)))
        rolls = {m.symbol: m.rolls for m in merged if m.rolls}
        work = _place(merged, names, read_cols, spec, n_bars, shard_rows, chunk_rows, codec, storage_options, staging)
        shards = work.writer.shard_ids
        stats = _zscore(stage, work, normalize, frozen)
        digests = stage(write_shard, [(work, s) for s in shards], "write", desc="write shards", unit="shard")
        staging.written = True
        work.writer.sweep()
        stored = stored_bytes(staging.cache_path, storage_options)
        manifest = {
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "shardcache_version": _version(),
            "feature_names": names,
            "symbols": [m.symbol for m in merged],
            "normalize": normalize,
            "stats": stats,
            "splits": {
                "spec": spec.text,
                "names": spec.names,
                "stats_from": stats_of,  # where zscore statistics come from: train, all (no splits) or stats_from
                "cuts_ns": [int(c) for c in cuts],
                "cuts": [str(np.datetime64(int(c), "ns")) for c in cuts],
                "bars": split_bar_counts(work.segments, work.segment_split, spec.names),
            },
            "rolls": rolls,  # symbol -> [[first bar of the new contract (ns), old instrument id, new id], ...]
            "tails": {m.symbol: m.tail for m in merged},
            "build": {
                **options,
                "max_gap_ns": int(max_gap_ns),
                "bar_ns": bar_ns,
                "fingerprint": digest(wanted),
                "duplicates": "keep the last record in input order",
                "out_of_order": "sorted by time",
                "workers": workers,
            },
            "counts": {
                "bars": n_bars,
                "records_read": records_read,
                "symbols": len(merged),
                "segments": len(work.segments),
                "dropped": {
                    **{k: int(v) for k, v in drops.items()},
                    **(
                        {"duplicate timestamp": sum(m.duplicates for m in merged)}
                        if any(m.duplicates for m in merged)
                        else {}
                    ),
                },
                "reordered": reordered,
                "rolls": sum(len(r) for r in rolls.values()),
                **({"resampled": {"from": resampled, "to": format_duration(bar_ns)}} if resampled else {}),
                **({"unmapped": unmapped} if unmapped else {}),
                "windows": {
                    "seq_len": seq_len,
                    "horizon": horizon,
                    "count": window_count(work.segments, work.segment_split, spec.names, seq_len, horizon),
                },
            },
            "bytes": bytes_summary(stored, n_bars * len(names) * 4),
            "layout": {"codec": codec, "shards": len(shards)},
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }
        work.writer.write_history({"sources": sources_described, "appends": []})
        work.writer.finish(work.segments, work.segment_split, manifest, dict(zip(shards, digests)))
        staging.publish()
        staging.remove()
    return open_cache(out, storage_options)


def _cut_times(spec: SplitSpec, frozen: Cache | None, scanned: Scanned) -> Sequence[int]:
    """The split cut times (ns): those of ``stats_from``, the spec's dates, or its fractions placed
    over the scan's timestamp sketch."""
    if frozen is not None:
        return frozen.manifest["splits"]["cuts_ns"]
    if spec.dates_ns is not None:
        return spec.dates_ns
    if spec.fractions and len(scanned.runs):
        return spec.fraction_cuts(scanned.sketch.ravel(), np.repeat(scanned.runs["n"] / _SKETCH, _SKETCH))
    return []


def _zscore(stage: Any, work: ShardWork, normalize: str, frozen: Cache | None) -> dict | None:
    """Set ``work``'s z-score statistics (``stats_from``'s, or the train split's from a stats stage)
    and return them as the manifest records them; None for ``normalize="none"``."""
    if normalize != "zscore":
        return None
    if frozen is not None:
        stats = frozen.manifest["stats"]
        mean, std, n_train = np.asarray(stats["mean"]), np.asarray(stats["std"]), int(stats["count"])
    else:
        parts = stage(shard_stats, [(work, s) for s in work.writer.shard_ids], "stats", desc="statistics", unit="shard")
        mean, std, n_train = merge_moments(parts)
    work.mean, work.std = mean.astype(np.float32), std.astype(np.float32)
    return {"mean": mean.tolist(), "std": std.tolist(), "count": n_train}


def _split_bars(merged: list[Merged], n_splits: int) -> list[int]:
    """Bars per split over every symbol, from the merge's segment starts (before any row is placed)."""
    bars = np.zeros(n_splits, dtype=np.int64)
    for m in merged:
        stops = np.concatenate([m.seg_starts[1:], [m.n]])
        np.add.at(bars, m.seg_split.astype(np.int64), stops - m.seg_starts)
    return bars.tolist()


def _runs_of(rows: np.ndarray, staging: str) -> list[_Run]:
    return [
        _Run(_run_path(staging, r), int(r["n"]), int(r["ts_min"]), int(r["ts_max"]), (int(r["file"]), int(r["piece"])))
        for r in rows
    ]


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
        np.concatenate(runs) if runs else np.empty(0, _RUN),
        np.concatenate(sketches) if sketches else np.empty((0, _SKETCH), np.int64),
        names,
    )


def _place(
    merged: list[Merged],
    names: list[str],
    read_cols: list[str],
    spec: SplitSpec,
    n_bars: int,
    shard_rows: int | None,
    chunk_rows: int | None,
    codec: str,
    storage_options: dict | None,
    staging: Staging,
) -> ShardWork:
    """Lay each symbol's rows out in time order from its first virtual row, build the segment
    table and create the empty cache (or, on a resume, reopen the one already created)."""
    auto_shard, auto_chunk = default_chunking(len(names))
    shard_rows = shard_rows or auto_shard
    chunk_rows = chunk_rows or min(auto_chunk, shard_rows)
    bases = symbol_bases([m.n for m in merged], shard_rows)
    placed, segs, seg_split = [], [], []
    for sym_id, m in enumerate(merged):
        row = int(bases[sym_id])
        starts = m.seg_starts + row
        stops = np.concatenate([starts[1:], [row + m.n]])
        segs.append(np.stack([np.full(len(starts), sym_id), starts, stops], axis=1))
        seg_split.append(m.seg_split)
        placed.append(place_clusters(m, row))
    segments = np.concatenate(segs).astype(np.int64)
    fs, fs_path = fsspec.core.url_to_fs(staging.cache_path, **(storage_options or {}))
    created = staging.load("created") is not None
    if created and not fs.exists(f"{fs_path.rstrip('/')}/{group_path(0)}/features/zarr.json"):
        log.warning("%s: the cache being built was deleted; writing every shard again", staging.cache_path)
        staging.forget("write")
        created = False
    if not created and not staging.local and staging.replace and fs.exists(fs_path):
        fs.rm(fs_path, recursive=True)
    writer = CacheWriter(
        staging.cache_path,
        feature_names=names,
        bars_per_symbol=[m.n for m in merged],
        shard_rows=shard_rows,
        chunk_rows=chunk_rows,
        codec=codec,
        storage_options=storage_options,
        create=not created,
    )
    staging.save("created", True)
    train = spec.names.index("train") if "train" in spec.names else None
    ids, first_row, counts = (np.concatenate(parts) for parts in zip(*placed))
    return ShardWork(
        staging.root,
        ids,
        first_row,
        counts,
        segments,
        np.concatenate(seg_split).astype(np.int8),
        names,
        writer,
        train_split=train,
        read_columns=read_cols,
        symbols=[m.symbol for m in merged],
    )


def open_inputs(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: dict | None, **kwargs: Any
) -> tuple[list[str], list[str], list[Source]]:
    """The input specs as given, the files they name and those files opened (one schema for all)."""
    specs = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    paths = expand_inputs(specs, storage_options)
    columns = kwargs.pop("columns", None)
    srcs = open_sources(paths, storage_options, columns=list(columns) if columns else None, **kwargs)
    first = srcs[0]
    s = next((s for s in srcs[1:] if s.columns != first.columns), None)
    if s is not None:
        raise ShardcacheError(
            f"{s.path}: mixed schemas in one build: {s.schema} ({', '.join(s.columns)}) vs "
            f"{first.path}: {first.schema} ({', '.join(first.columns)})"
        )
    return specs, paths, srcs


def scan_inputs(stage: Any, srcs: list[Source], staging: str, read_cols: list[str], sketch: bool = False) -> Scanned:
    """Stage 1 over every input (``stage`` is ``Staging.run``): runs spilled, counts gathered; with
    ``sketch``, timestamps sampled from every run to place fraction splits."""
    scans = stage(
        _scan, [(i, s, staging, read_cols, sketch) for i, s in enumerate(srcs)], "scan", desc="read files", unit="file"
    )
    unmapped = resolve_unmapped([s.path for s in srcs], [s.symbols for s in scans], [s.symbology for s in scans])
    runs, sketch, symbols = _gather_runs(scans)
    return Scanned(
        runs,
        sketch,
        symbols,
        [s.median_dt for s in scans if s.median_dt],
        sum(s.records for s in scans),
        sum(s.reordered for s in scans),
        sum((s.drops for s in scans), Counter()),
        [s.step for s in scans],
        unmapped,
    )


def merge_symbols(
    stage: Any,
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
    return stage(
        _merge,
        [
            (
                j,
                sym,
                _runs_of(runs[by_sym[bounds[j] : bounds[j + 1]]], staging),
                staging,
                max_gap_ns,
                np.asarray(cuts, dtype=np.int64),
                (instruments or {}).get(sym),
            )
            for j, sym in enumerate(scanned.symbols)
        ],
        "merge",
        then=_drop_runs,
        desc="sort symbols",
        unit="symbol",
    )


def _frozen(
    stats_from: str | os.PathLike[str] | Cache,
    storage_options: dict | None,
    names: list[str],
    normalize: str,
    spec: SplitSpec,
) -> Cache:
    """The cache whose statistics and cut times a build reuses, checked against the build's options."""
    cache = open_cache(stats_from, storage_options)
    m = cache.manifest
    if cache.feature_names != names:
        raise ShardcacheError(
            f"--stats-from {cache.url}: its features ({', '.join(cache.feature_names)}) are not "
            f"this build's ({', '.join(names)})"
        )
    if m.get("normalize") != normalize or m["splits"].get("spec") != spec.text:
        raise ShardcacheError(
            f"--stats-from {cache.url}: built with --normalize {m.get('normalize')} --split "
            f"{m['splits'].get('spec')}, this build asks for {normalize} and {spec.text}"
        )
    return cache


@contextlib.contextmanager
def connect(scheduler: Any, staging: str, urls: Sequence[str]) -> Iterator[Any]:
    """The dask.distributed client for ``scheduler`` (an address or a Client; else
    ``DASK_SCHEDULER_ADDRESS``), checked to reach ``urls`` and the staging folder; None for
    the local scheduler. A client made here is closed on the way out."""
    if hasattr(scheduler, "submit"):
        check_cluster(scheduler, staging, urls)
        yield scheduler
        return
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not address:
        yield None
        return
    from distributed import Client

    try:
        client = Client(address, timeout="10s")
    except OSError as exc:
        raise ShardcacheError(f"--scheduler {address}: cannot connect ({exc})") from None
    with client:
        check_cluster(client, staging, urls)
        yield client


def _version() -> str:
    from .._version import __version__

    return __version__
