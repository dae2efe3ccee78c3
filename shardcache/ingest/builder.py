"""The builder: market-data files in, a complete sharded cache out, in bounded memory.

Stages of independent dask tasks (``tasks.run_tasks``), each of one file or of a batch of symbols or shards
holding at most one shard's rows: scan (``scan``), merge (``merge``), place (in the driver), z-score
statistics of the train split and the write (``compute``); the manifest last (``summary``). ``stats_from``
takes another cache's statistics and cut times, as an append does. Finished tasks are recorded and the cache
published once complete (``staging``), so a killed build resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import CacheError, OptionError, ShardcacheError
from ..format.build_options import MAX_CHUNKS, BuildOptions
from ..format.cache import Cache, open_cache
from ..format.durations import format_duration
from ..format.index import ShardIndex, ShardRecord
from ..format.layout import default_chunking, group_path, symbol_bases
from ..format.manifest import BuildRecord, Stats
from ..format.paths import probe
from ..format.remote import filesystem
from ..format.splits import SplitSpec
from ..format.writer import CacheWriter
from .checks import check_bar_sizes, check_splits
from .cluster import check_cluster
from .compute import ShardWork, merge_moments, shard_batches, shard_stats, write_shards
from .merge import Merged, merge_symbols, place_clusters
from .outputs import check_out
from .run import RunOptions, settings
from .scan import SKETCH, Inputs, Scanned, Stage, open_inputs, scan_inputs
from .sources import Source
from .staging import Staging, digest, fingerprint, prepare
from .summary import fresh, grown

__all__ = ["build_cache", "connect"]

log = logging.getLogger("shardcache")


def build_cache(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    *,
    run: RunOptions | None = None,
    **fields: Any,
) -> Cache:
    """Build a cache from DBN/Parquet/CSV ``sources`` at ``out`` and return it opened.

    ``options`` are what the cache is built with (recorded in its manifest: see ``BuildOptions``),
    ``run`` how this run goes (``RunOptions``: workers, scheduler, overwrite, resume, storage
    options, progress). Either may be given as keyword arguments naming its fields instead:
    ``build_cache(files, out, split="train=0.8,val=0.2", workers=4)``. A DBN continuous symbol's
    series is cut where it rolls to another instrument (``Manifest.rolls``). See the docs for the
    store layout.
    """
    t0 = time.perf_counter()
    options, run = settings("build_cache", options, run, fields)
    out = check_out(out)
    problem = probe(out, run.storage_options)  # the output's store answers, before any input is read
    if problem is not None:
        raise CacheError(f"{out}: {problem}")
    inputs = open_inputs(sources, options, run.storage_options)
    known = [s for s in inputs.sources if s.bar_ns is not None]
    check_bar_sizes(known, [None] * len(known), options.bar)  # DBN files know theirs: refused before reading any
    frozen = None if options.stats_from is None else _frozen(options, run.storage_options, inputs.names)
    chunking = _chunking(options, len(inputs.names))  # refused before any bar is read
    wanted = fingerprint(inputs.sources, options.to_json(), __version__)
    staging = prepare(out, run.storage_options, wanted, resume=run.resume, overwrite=run.overwrite, inputs=inputs.specs)
    if isinstance(staging, Cache):
        return staging
    with staging.guard("build"), connect(run.scheduler, staging.root, [out, *inputs.paths]) as client:
        stage = functools.partial(staging.run, workers=run.workers, client=client, show=run.progress)
        _build(stage, staging, inputs, options, chunking, frozen, run, digest(wanted), t0)
        staging.publish()
        staging.remove()
    return open_cache(out, run.storage_options)


def _build(
    stage: Stage,
    staging: Staging,
    inputs: Inputs,
    options: BuildOptions,
    chunking: tuple[int, int],
    frozen: Cache | None,
    run: RunOptions,
    fingerprint: str,
    t0: float,
) -> None:
    """Every stage into the staging folder's cache, the manifest last (``chunking``: shard, inner-chunk rows)."""
    spec, srcs = options.splits(), inputs.sources
    described = [s.describe() for s in srcs]  # the history's; the sources go after the scan
    scanned = scan_inputs(
        stage, srcs, staging.root, inputs.read_columns, sketch=bool(spec.fractions) and frozen is None
    )
    bar_ns = check_bar_sizes(srcs, scanned.steps, options.bar)
    if frozen is not None:
        _check_frozen_bar(frozen, bar_ns)
    resampled = _resampled(srcs)
    inputs.sources.clear()  # the readers' state is not needed again: let it go before the merge
    del srcs
    dts = scanned.dts
    max_gap_ns = options.max_gap_ns(bar_ns or (int(np.median(dts)) if dts else None))
    cuts = _cut_times(spec, frozen, scanned)
    scanned.sketch = scanned.sketch[:0]  # placed the cuts; the merge does not need it
    shard_rows, chunk_rows = chunking
    merged = merge_symbols(stage, staging.root, scanned, max_gap_ns, cuts, shard_rows)
    scanned.runs = scanned.runs[:0]  # merged: what grows with the data goes
    if not sum(m.n for m in merged):
        dropped = ", ".join(f"{k}: {v}" for k, v in scanned.drops.items()) or "none dropped"
        raise ShardcacheError(f"{', '.join(inputs.specs)}: no bars to build ({dropped})")
    split_bars = _split_bars(merged, len(spec.names))
    check_splits(spec, options.stats_split if frozen is None else None, dict(zip(spec.names, split_bars)))
    work = _place(merged, inputs, spec, options, run.storage_options, staging, shard_rows, chunk_rows)
    shards = work.writer.shard_ids
    batches = shard_batches(work.writer, shards)
    stats = _zscore(stage, work, batches, options.normalize, frozen)
    records = write_batches(stage, staging, work, batches)
    index = ShardIndex.empty().updated(records, work.writer.bars_per_symbol, work.writer.shard_rows)
    record = BuildRecord(
        options=options, max_gap_ns=int(max_gap_ns), bar_ns=bar_ns, fingerprint=fingerprint, workers=run.workers
    )
    base = fresh(
        options,
        names=inputs.names,
        cuts=cuts,
        stats=stats,
        build=record,
        writer=work.writer,
        resampled={"from": resampled, "to": format_duration(bar_ns)} if resampled and bar_ns else None,
        unmapped=scanned.unmapped,
        elapsed_s=round(time.perf_counter() - t0, 3),
    )
    manifest = grown(base, work, merged, scanned, index.stored_bytes, appended=False)
    work.writer.write_history({"sources": described, "appends": []})
    work.writer.finish(work.segments, work.segment_split, manifest, index)  # the manifest last


def write_batches(stage: Stage, staging: Staging, work: ShardWork, batches: list[list[int]]) -> list[ShardRecord]:
    """Write the shards of ``batches`` (``shard_batches``) and return their records; sweep a killed write's."""
    sizes = [len(b) for b in batches]
    written = stage(write_shards, batches, "write", shared=work, weights=sizes, desc="write shards", unit="shard")
    staging.written = True
    if staging.strays:  # what a killed write leaves: none unless a run or a task was killed
        work.writer.sweep()
    return [r for batch in written for r in batch]


def _resampled(srcs: list[Source]) -> list[str]:
    """The bar sizes of the DBN OHLCV inputs that ``bar`` resampled (none when it did not)."""
    intervals = [(s, getattr(s, "interval", None)) for s in srcs if getattr(s, "layout", None) == "ohlcv"]
    return sorted({format_duration(i) for s, i in intervals if i is not None and s.bar_ns != i})


def _cut_times(spec: SplitSpec, frozen: Cache | None, scanned: Scanned) -> Sequence[int]:
    """The split cut times (ns): ``stats_from``'s, the spec's dates, or its fractions over the scan's sketch."""
    if frozen is not None:
        return frozen.manifest.splits.cuts_ns
    if spec.dates_ns is not None:
        return spec.dates_ns
    if spec.fractions and len(scanned.runs):
        return spec.fraction_cuts(scanned.sketch.ravel(), np.repeat(scanned.runs["n"] / SKETCH, SKETCH))
    return []


def _chunking(options: BuildOptions, n_features: int) -> tuple[int, int]:
    """Shard and inner-chunk rows: the options', else ``default_chunking``'s fitted to the one given."""
    auto_shard, auto_chunk = default_chunking(n_features)
    shard_rows, chunk_rows = options.shard_rows, options.chunk_rows
    if shard_rows is None:
        return (
            auto_shard if chunk_rows is None else -(-auto_shard // chunk_rows) * chunk_rows
        ), chunk_rows or auto_chunk
    if chunk_rows is None:
        chunk_rows = next(d for d in range(min(auto_chunk, shard_rows), 0, -1) if shard_rows % d == 0)
        if shard_rows // chunk_rows > MAX_CHUNKS:
            raise OptionError(
                "shard_rows",
                shard_rows,
                f"has no divisor near the default chunk rows ({auto_chunk}): give {{chunk_rows}} too",
                {"chunk_rows": None},
            )
    return shard_rows, chunk_rows


def _zscore(
    stage: Stage, work: ShardWork, batches: list[list[int]], normalize: str, frozen: Cache | None
) -> Stats | None:
    """Set ``work``'s z-score statistics (``stats_from``'s or the train split's), returned; None unless z-score."""
    if normalize != "zscore":
        return None
    if frozen is not None and frozen.manifest.stats is not None:
        kept = frozen.manifest.stats
        mean, std, n_train = np.asarray(kept.mean), np.asarray(kept.std), int(kept.count)
    else:
        sizes = [len(b) for b in batches]
        done = stage(shard_stats, batches, "stats", shared=work, weights=sizes, desc="statistics", unit="shard")
        mean, std, n_train = merge_moments([(n[i], m[i], m2[i]) for n, m, m2 in done for i in range(len(n))])
    work.mean, work.std = mean.astype(np.float32), std.astype(np.float32)
    return Stats(mean=mean.tolist(), std=std.tolist(), count=n_train)


def _split_bars(merged: list[Merged], n_splits: int) -> list[int]:
    """Bars per split over every symbol, from the merge's segment starts (before any row is placed)."""
    bars = np.zeros(n_splits, dtype=np.int64)
    for m in merged:
        stops = np.concatenate([m.seg_starts[1:], [m.n]])
        np.add.at(bars, m.seg_split.astype(np.int64), stops - m.seg_starts)
    return list(bars.tolist())


def _place(
    merged: list[Merged],
    inputs: Inputs,
    spec: SplitSpec,
    options: BuildOptions,
    storage_options: dict[str, Any] | None,
    staging: Staging,
    shard_rows: int,
    chunk_rows: int,
) -> ShardWork:
    """Lay each symbol's rows out from its first virtual row, build the segment table, create (or reopen) the cache."""
    n = np.asarray([m.n for m in merged], dtype=np.int64)
    bases = symbol_bases(n, shard_rows)[:-1]
    k = np.asarray([len(m.seg_starts) for m in merged], dtype=np.int64)  # segments per symbol
    starts = np.concatenate([m.seg_starts for m in merged]).astype(np.int64) + np.repeat(bases, k)
    stops = np.append(starts[1:], 0)  # a segment ends where the next starts, a symbol's last at its end
    stops[(np.cumsum(k) - 1)[k > 0]] = (bases + n)[k > 0]
    segs = np.stack([np.repeat(np.arange(len(merged)), k), starts, stops], axis=1)
    fs, fs_path = filesystem(staging.cache_path, storage_options)
    created = staging.load("created") is not None
    if created and not fs.exists(f"{fs_path.rstrip('/')}/{group_path(0)}/features/zarr.json"):
        log.warning("%s: the cache being built was deleted; writing every shard again", staging.cache_path)
        staging.forget("write")
        created = False
    if not created and not staging.local and staging.replace and fs.exists(fs_path):
        fs.rm(fs_path, recursive=True)
    writer = CacheWriter(
        staging.cache_path,
        feature_names=inputs.names,
        bars_per_symbol=[m.n for m in merged],
        shard_rows=shard_rows,
        chunk_rows=chunk_rows,
        codec=options.codec,
        storage_options=storage_options,
        create=not created,
    )
    staging.save("created", True)
    ids, first_row, counts = place_clusters(merged, bases.tolist())
    return ShardWork(
        staging=staging.root,
        clusters=ids,
        first_row=first_row,
        counts=counts,
        segments=segs.astype(np.int64),
        segment_split=np.concatenate([m.seg_split for m in merged]).astype(np.int8),
        names=inputs.names,
        writer=writer,
        train_split=spec.names.index("train") if "train" in spec.names else None,
        read_columns=inputs.read_columns,
        symbols=[m.symbol for m in merged],
    )


def _frozen(options: BuildOptions, storage_options: dict[str, Any] | None, names: list[str]) -> Cache:
    """The cache whose statistics and cut times a build reuses, checked against the build's options."""
    assert options.stats_from is not None
    cache = open_cache(options.stats_from, storage_options)
    kept = cache.manifest
    if cache.feature_names != names:
        raise OptionError(
            "stats_from",
            options.stats_from,
            f"its features ({', '.join(cache.feature_names)}) are not this build's ({', '.join(names)})",
        )
    if kept.normalize != options.normalize or kept.splits.spec != options.split:
        raise OptionError(
            "stats_from",
            options.stats_from,
            f"built with normalize {kept.normalize} and split {kept.splits.spec}, this build asks for "
            f"{options.normalize} and {options.split}",
        )
    return cache


def _check_frozen_bar(frozen: Cache, bar_ns: int | None) -> None:
    """Refuse statistics from a cache of another bar size (they would z-score these bars wrongly)."""
    kept = frozen.manifest.build.bar_ns
    if kept is not None and bar_ns is not None and kept != bar_ns:
        raise OptionError(
            "stats_from",
            frozen.url,
            f"its bars are {format_duration(kept)}, this build's are {format_duration(bar_ns)}: "
            "statistics of another bar size would z-score these bars wrongly; pass a cache of the same bar size",
        )


@contextlib.contextmanager
def connect(scheduler: Any, staging: str, urls: Sequence[str]) -> Iterator[Any]:
    """The dask.distributed client for ``scheduler`` (an address or a Client; else ``DASK_SCHEDULER_ADDRESS``),
    checked to reach ``urls`` and the staging folder; None locally. A client made here is closed after."""
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
        raise OptionError("scheduler", address, f"cannot connect ({exc})") from None
    with client:
        check_cluster(client, staging, urls)
        yield client
