"""The builder: market-data files in, a complete sharded cache out, in bounded memory.

Stages, each a set of independent dask tasks (``tasks.run_tasks``):

1. **scan** (one task per input file): read bounded pieces, clean values, split each piece
   by symbol, sort it by time and spill it as an Arrow run file in the staging folder.
2. **merge** (one task per symbol): group a symbol's runs into clusters of overlapping time
   ranges (one cluster per daily file in the usual case), sort each cluster by time, drop
   duplicate timestamps (the last record in input order wins) and find segment starts
   (gaps above ``max_gap`` and split boundaries).
3. **plan** (in the driver, small): skip symbols shorter than a window, lay rows out by
   (symbol, time), build the segment table.
4. **stats** (one task per shard, z-score only): per-feature count/mean/M2 over the train
   split, merged with Chan's formula, so no statistic leaks from val/test.
5. **write** (one task per shard): compute features, normalize, write the whole shard.
   One writer per shard; nothing writes a partial shard.

Memory is bounded by a piece, a cluster and a shard per worker, never by the bar count.
Every finished task is recorded in the staging folder, and the cache is published (renamed
into place) only once complete, so a killed build resumes where it stopped (``resume``)
and readers never see a partial cache: see ``shardcache.staging``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .cluster import check_cluster
from .errors import ShardcacheError
from .features import compute_features, required_columns, resolve_features
from .index import valid_ranges
from .sources import Source, expand_inputs, open_sources, parse_duration
from .splits import SplitSpec, parse_split
from .staging import Staging, digest, fingerprint, prepare
from .store import CODECS, Cache, CacheWriter, default_chunking, open_cache

__all__ = ["build_cache"]

log = logging.getLogger("shardcache")
_SKETCH = 65  # timestamps kept per run to place fraction splits


# -- stage results -------------------------------------------------------------------------
# One row per run file: which input file, piece and per-piece symbol code it came from (its
# path, see ``_run_path``), the global symbol id (filled in by the driver), rows and time range.
# Runs travel as rows of one array per file, never as Python objects: a build holds every run
# of every input between the scan and the merge, so their size is what grows with the data.
_RUN = np.dtype([("file", "<i4"), ("piece", "<i4"), ("code", "<i4"), ("sym", "<i4"),
                 ("n", "<i8"), ("ts_min", "<i8"), ("ts_max", "<i8")])


@dataclass
class _Scan:
    symbols: list[str]  # names of ``runs["sym"]`` (file-local ids until the driver renumbers them)
    runs: np.ndarray  # _RUN rows, in the order written
    sketch: np.ndarray  # (len(runs), _SKETCH) int64: timestamps placing fraction splits
    drops: Counter
    reordered: int
    records: int
    median_dt: int | None


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
class _Symbol:
    symbol: str
    clusters: list[tuple[str, int]]
    n: int
    seg_starts: np.ndarray
    seg_split: np.ndarray
    duplicates: int


@dataclass
class _Layout:
    """Where each global row comes from: cluster files in row order with their first row."""

    paths: list[str]
    first_row: np.ndarray
    segments: np.ndarray
    segment_split: np.ndarray
    names: list[str]
    writer: CacheWriter
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    train_split: int | None = None
    read_columns: list[str] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)


def _write_arrow(path: str, table: pa.Table) -> None:
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _read_arrow(path: str) -> pa.Table:
    return ipc.open_file(pa.memory_map(path, "r")).read_all()


# -- stage 1: scan ---------------------------------------------------------------------------
def _scan(job: tuple[int, Source, str, list[str]]) -> _Scan:
    i, src, staging, columns = job
    runs, sketches, names, reordered, records, dts = [], [], {}, 0, 0, []
    max_rows = max(4096, (64 << 20) // (8 * (len(columns) + 2)))
    for k, piece in enumerate(src.pieces(max_rows)):
        records += piece.num_rows
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
        body = piece.select(["ts", *columns])
        for rows in np.split(order, bounds):
            code = int(codes[rows[0]])
            sym = names.setdefault(symbols[code], len(names))
            part = body.take(pa.array(rows))
            part_ts = ts[rows]
            run = np.array((i, k, code, sym, len(rows), part_ts[0], part_ts[-1]), dtype=_RUN)
            _write_arrow(_run_path(staging, run), part)
            del part
            idx = np.linspace(0, len(rows) - 1, _SKETCH).round().astype(np.int64)
            if len(part_ts) > 1:
                dts.append(int(np.median(np.diff(part_ts))))
            runs.append(run)
            sketches.append(part_ts[idx])
        del piece, body
    drops = Counter(src.drops)
    return _Scan(list(names), np.array(runs, dtype=_RUN),
                 np.stack(sketches) if sketches else np.empty((0, _SKETCH), np.int64),
                 drops, reordered, records + sum(drops.values()), int(np.median(dts)) if dts else None)


# -- stage 2: merge -----------------------------------------------------------------------
def _merge(job: tuple[int, str, list[_Run], str, int, np.ndarray]) -> _Symbol:
    sym_idx, symbol, runs, staging, max_gap, cuts = job
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
    out, starts, splits, dups, n, last_ts, last_split = [], [], [], 0, 0, None, None
    for c, members in enumerate(clusters):
        table = pa.concat_tables([_read_arrow(r.path) for r in sorted(members, key=lambda r: r.key)])
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
        if last_ts is None:
            cut[0] = True
        local = np.flatnonzero(cut)
        starts.append(local + n)
        splits.append(split[local])
        path = os.path.join(staging, "clusters", f"{sym_idx:06d}-{c:06d}.arrow")
        _write_arrow(path, table)
        out.append((path, len(ts)))
        n += len(ts)
        last_ts, last_split = int(ts[-1]), split[-1]
    return _Symbol(symbol, out, n, np.concatenate(starts), np.concatenate(splits), dups)


def _drop_runs(job: tuple[int, str, list[_Run], str, int, np.ndarray]) -> None:
    """Delete a symbol's run files once its merge is recorded (a resume may still need them before)."""
    for r in job[2]:
        if os.path.exists(r.path):
            os.remove(r.path)


# -- stages 4 and 5: per-shard features -------------------------------------------------------
def _shard_features(layout: _Layout, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features (unnormalized), timestamps and split ids of one shard's rows."""
    a, b = layout.writer.shard_bounds(shard)
    lead = 1 if a > 0 else 0
    lo = a - lead
    ci = int(np.searchsorted(layout.first_row, lo, side="right")) - 1
    parts = []
    row = lo
    while row < b:
        first = int(layout.first_row[ci])
        table = _read_arrow(layout.paths[ci])
        take = min(b, first + table.num_rows) - row
        parts.append(table.slice(row - first, take))
        row += take
        ci += 1
    table = pa.concat_tables(parts)
    ts = table["ts"].to_numpy().astype(np.int64, copy=False)
    cols = {c: table[c].to_numpy() for c in layout.read_columns}
    seg_starts = layout.segments[:, 1]
    rows = np.arange(lo, b, dtype=np.int64)
    seg = np.searchsorted(seg_starts, rows, side="right") - 1
    starts = np.zeros(len(rows), dtype=bool)
    starts[0] = True
    starts[1:] = seg[1:] != seg[:-1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # refused below, not warned about
        feats = compute_features(layout.names, cols, ts, starts)
    _check_finite(layout, shard, feats[lead:], ts[lead:], seg[lead:], "is not finite")
    return feats[lead:], ts[lead:], layout.segment_split[seg[lead:]]


def _check_finite(layout: _Layout, shard: int, feats: np.ndarray, ts: np.ndarray, seg: np.ndarray,
                  what: str) -> None:
    """Refuse to write a NaN or infinity: they come from inputs float32 cannot hold (|x| > 3.4e38)
    or from a derived feature of extreme inputs."""
    bad = ~np.isfinite(feats)
    if not bad.any():
        return
    rows, cols = np.nonzero(bad)
    sym = layout.symbols[int(layout.segments[seg[rows[0]], 0])] if layout.symbols else "?"
    raise ShardcacheError(
        f"feature {layout.names[cols[0]]!r} {what} at {len(rows)} bar(s) of shard {shard}, first {sym} at "
        f"{np.datetime64(int(ts[rows[0]]) // 10**9, 's')}: an input value float32 cannot hold (|x| > 3.4e38) or a "
        "derived feature of extreme inputs; fix those bars or pick other --features")


def _stats(job: tuple[_Layout, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    layout, shard = job
    feats, _, split = _shard_features(layout, shard)
    if layout.train_split is not None:
        feats = feats[split == layout.train_split]
    x = feats.astype(np.float64)
    n = np.full(x.shape[1], len(x), dtype=np.float64)
    mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
    m2 = ((x - mean) ** 2).sum(axis=0)
    return n, mean, m2


def _merge_moments(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, int]:
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


def _write(job: tuple[_Layout, int]) -> str:
    layout, shard = job
    feats, ts, _ = _shard_features(layout, shard)
    if layout.mean is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            feats = ((feats - layout.mean) / layout.std).astype(np.float32)
        seg = np.searchsorted(layout.segments[:, 1], layout.writer.shard_bounds(shard)[0] + np.arange(len(ts)),
                              side="right") - 1
        _check_finite(layout, shard, feats, ts, seg, "overflows float32 after z-scoring")
    return layout.writer.write_shard(shard, feats, ts)


# -- the build -------------------------------------------------------------------------------
def _stored_bytes(url: str, storage_options: dict | None) -> int:
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return int(fs.du(path.rstrip("/") + "/features"))


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
) -> Cache:
    """Build a cache from DBN/Parquet ``sources`` at ``out`` and return it opened.

    ``max_gap="auto"`` cuts segments at gaps above max(1 h, 5 bars); ``normalize="zscore"``
    standardizes every feature with train-split statistics stored in the manifest.
    ``seq_len``/``horizon`` only size the summary's window count and the short-symbol skip:
    windows are chosen at read time. See the README for the store layout.
    """
    t0 = time.perf_counter()
    if normalize not in ("zscore", "none"):
        raise ShardcacheError(f"--normalize {normalize!r}: choose zscore or none")
    if codec not in CODECS:
        raise ShardcacheError(f"--codec {codec!r}: choose one of {', '.join(CODECS)}")
    spec = parse_split(split)
    if bar is not None:
        try:
            if parse_duration(bar) <= 0:
                raise ValueError("must be a positive duration such as 1s, 1m or 5m")
        except ValueError as exc:
            raise ShardcacheError(f"--bar {bar!r}: {exc}") from None
    specs = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    paths = expand_inputs(specs, storage_options)
    srcs = open_sources(paths, storage_options, bar=bar, ts_column=ts_column, symbol_column=symbol_column,
                        columns=list(columns) if columns else None)
    first = srcs[0]
    s = next((s for s in srcs[1:] if s.columns != first.columns), None)
    if s is not None:
        raise ShardcacheError(
            f"{s.path}: mixed schemas in one build: {s.schema} ({', '.join(s.columns)}) vs "
            f"{first.path}: {first.schema} ({', '.join(first.columns)})"
        )
    names = resolve_features(features, first.columns)
    read_cols = required_columns(names, first.columns)
    bar_ns = first.bar_ns
    out = os.fspath(out)
    options = {
        "features": features if isinstance(features, (str, type(None))) else list(features),
        "normalize": normalize, "split": spec.text, "max_gap": str(max_gap), "bar": bar,
        "ts_column": ts_column, "symbol_column": symbol_column, "columns": list(columns) if columns else None,
        "shard_rows": shard_rows, "chunk_rows": chunk_rows, "codec": codec, "seq_len": seq_len, "horizon": horizon,
    }
    wanted = fingerprint(srcs, options, _version())
    staging = prepare(out, storage_options, wanted, resume=resume, overwrite=overwrite)
    if isinstance(staging, Cache):
        return staging
    written = False
    client, own_client = None, False
    try:
        client, own_client = _client(scheduler)
        if client is not None:
            check_cluster(client, staging.root, [out, *paths])
        run = functools.partial(staging.run, workers=workers, client=client, show=progress)
        sources_described = [s.describe() for s in srcs]  # the manifest's; the sources go after the scan
        scans = run(_scan, [(i, s, staging.root, read_cols) for i, s in enumerate(srcs)], "scan",
                    desc="read files", unit="file")
        del srcs, first, s
        runs, sketch, symbols_all = _gather_runs(scans)
        dts = [s.median_dt for s in scans if s.median_dt]
        records_read = sum(s.records for s in scans)
        reordered = sum(s.reordered for s in scans)
        drops = sum((s.drops for s in scans), Counter())
        del scans
        max_gap_ns = _resolve_max_gap(max_gap, bar_ns or (int(np.median(dts)) if dts else None))
        cuts = spec.dates_ns if spec.dates_ns is not None else (
            spec.fraction_cuts(sketch.ravel(), np.repeat(runs["n"] / _SKETCH, _SKETCH))
            if spec.fractions and len(runs) else [])
        del sketch
        by_sym = np.argsort(runs["sym"], kind="stable")
        bounds = np.searchsorted(runs["sym"][by_sym], np.arange(len(symbols_all) + 1))
        merged = run(
            _merge,
            [(j, sym, _runs_of(runs[by_sym[bounds[j]:bounds[j + 1]]], staging.root), staging.root, max_gap_ns,
              np.asarray(cuts, dtype=np.int64))
             for j, sym in enumerate(symbols_all)],
            "merge", then=_drop_runs, desc="sort symbols", unit="symbol")
        del runs, by_sym
        span = seq_len + horizon
        kept = [m for m in merged if m.n >= span]
        skipped = {m.symbol: m.n for m in merged if m.n < span}
        for sym, n in skipped.items():
            log.warning("symbol %s: %d bars, shorter than one window (%d rows); skipped", sym, n, span)
        n_bars = sum(m.n for m in kept)
        if n_bars == 0:
            dropped = ", ".join(f"{k}: {v}" for k, v in drops.items()) or "none dropped"
            raise ShardcacheError(f"{', '.join(specs)}: no bars to build ({dropped}; "
                                  f"short symbols skipped: {len(skipped)})")
        layout = _plan(kept, names, read_cols, spec, n_bars, shard_rows, chunk_rows, codec,
                       storage_options, staging)
        shards = range(layout.writer.n_shards)
        mean = std = None
        n_train = 0
        if normalize == "zscore":
            parts = run(_stats, [(layout, s) for s in shards], "stats", desc="statistics", unit="shard")
            mean, std, n_train = _merge_moments(parts)
            layout.mean, layout.std = mean.astype(np.float32), std.astype(np.float32)
        digests = run(_write, [(layout, s) for s in shards], "write", desc="write shards", unit="shard")
        written = True
        stored = _stored_bytes(staging.cache_path, storage_options)
        raw = n_bars * len(names) * 4
        manifest = {
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "shardcache_version": _version(),
            "feature_names": names,
            "symbols": [m.symbol for m in kept],
            "normalize": normalize,
            "stats": None if mean is None else {"mean": mean.tolist(), "std": std.tolist(), "count": n_train},
            "splits": {
                "spec": spec.text,
                "names": spec.names,
                "cuts_ns": [int(c) for c in cuts],
                "cuts": [str(np.datetime64(int(c), "ns")) for c in cuts],
                "bars": {name: int(np.diff(layout.segments[layout.segment_split == i, 1:], axis=1).sum())
                         for i, name in enumerate(spec.names)},
            },
            "sources": sources_described,
            "build": {
                **options, "max_gap_ns": int(max_gap_ns), "fingerprint": digest(wanted),
                "duplicates": "keep the last record in input order", "out_of_order": "sorted by time",
                "workers": workers,
            },
            "counts": {
                "bars": n_bars,
                "records_read": records_read,
                "symbols": len(kept),
                "segments": int(len(layout.segments)),
                "dropped": {**{k: int(v) for k, v in drops.items()},
                            **({"duplicate timestamp": sum(m.duplicates for m in merged)}
                               if any(m.duplicates for m in merged) else {})},
                "reordered": reordered,
                "skipped_symbols": skipped,
                "windows": {
                    "seq_len": seq_len, "horizon": horizon,
                    "count": valid_ranges(_SegmentsView(layout, spec.names), seq_len, horizon, 1, None).total(),
                },
            },
            "bytes": {"stored": stored, "raw": raw, "ratio": round(raw / stored, 3) if stored else None},
            "layout": {"codec": codec, "shards": layout.writer.n_shards, "digests": digests},
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }
        layout.writer.finish(layout.segments, layout.segment_split, manifest)
        staging.publish()
        staging.remove()
    except ShardcacheError:
        if written or staging.resumed:  # a finished cache, or earlier progress, stays resumable
            staging.release()
        else:
            staging.remove()
        raise
    except OSError as exc:
        staging.release()
        raise ShardcacheError(f"{exc.filename or out}: {exc.strerror or exc}; the finished part is kept in "
                              f"{staging.root}: run again with --resume to continue") from None
    except BaseException:
        staging.release()
        log.warning("%s: build stopped; the finished part is kept in %s: run again with --resume", out,
                    staging.root)
        raise
    finally:
        if own_client:
            client.close()
    return open_cache(out, storage_options)


@dataclass
class _SegmentsView:
    layout: _Layout
    names: list[str]

    @property
    def segments(self) -> np.ndarray:
        return self.layout.segments

    @property
    def segment_split(self) -> np.ndarray:
        return self.layout.segment_split

    def split_id(self, split: str | None) -> int | None:
        return None if split is None else self.names.index(split)


def _runs_of(rows: np.ndarray, staging: str) -> list[_Run]:
    return [_Run(_run_path(staging, r), int(r["n"]), int(r["ts_min"]), int(r["ts_max"]),
                 (int(r["file"]), int(r["piece"]))) for r in rows]


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
    return (np.concatenate(runs) if runs else np.empty(0, _RUN),
            np.concatenate(sketches) if sketches else np.empty((0, _SKETCH), np.int64), names)


def _plan(kept: list[_Symbol], names: list[str], read_cols: list[str], spec: SplitSpec, n_bars: int,
          shard_rows: int | None, chunk_rows: int | None, codec: str, storage_options: dict | None,
          staging: Staging) -> _Layout:
    """Lay rows out by (symbol, time), build the segment table and create the empty cache
    (or, on a resume, reopen the one already created)."""
    paths, first_row, segs, seg_split = [], [], [], []
    row = 0
    for sym_id, m in enumerate(kept):
        starts = m.seg_starts + row
        stops = np.concatenate([starts[1:], [row + m.n]])
        segs.append(np.stack([np.full(len(starts), sym_id), starts, stops], axis=1))
        seg_split.append(m.seg_split)
        for path, n in m.clusters:
            paths.append(path)
            first_row.append(row)
            row += n
    auto_shard, auto_chunk = default_chunking(len(names))
    shard_rows = shard_rows or auto_shard
    chunk_rows = chunk_rows or min(auto_chunk, shard_rows)
    fs, fs_path = fsspec.core.url_to_fs(staging.cache_path, **(storage_options or {}))
    created = staging.load("created") is not None
    if created and not fs.exists(fs_path.rstrip("/") + "/features/zarr.json"):
        log.warning("%s: the cache being built was deleted; writing every shard again", staging.cache_path)
        staging.forget("write")
        created = False
    if not created and not staging.local and staging.replace and fs.exists(fs_path):
        fs.rm(fs_path, recursive=True)
    writer = CacheWriter(staging.cache_path, n_bars=n_bars, feature_names=names, shard_rows=shard_rows,
                         chunk_rows=chunk_rows, codec=codec, storage_options=storage_options, create=not created)
    staging.save("created", True)
    train = spec.names.index("train") if "train" in spec.names else None
    return _Layout(paths, np.asarray(first_row, dtype=np.int64),
                   np.concatenate(segs).astype(np.int64), np.concatenate(seg_split).astype(np.int8),
                   names, writer, train_split=train, read_columns=read_cols, symbols=[m.symbol for m in kept])


def _client(scheduler: Any) -> tuple[Any, bool]:
    """A dask.distributed client for ``scheduler`` (an address or a Client), and whether we own it."""
    if hasattr(scheduler, "submit"):
        return scheduler, False
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not address:
        return None, False
    from distributed import Client

    try:
        return Client(address, timeout="10s"), True
    except OSError as exc:
        raise ShardcacheError(f"--scheduler {address}: cannot connect ({exc})") from None


def _version() -> str:
    from . import __version__

    return __version__
