"""Appends: add later bars (the next day's files) to a cache without rewriting finished shards.

A symbol's new bars must follow its last stored one; its partial last shard is rewritten, new shards written
after it, and its last segment goes on as in one build of every bar (features from the raw last bar kept in
the manifest's ``tails``). Split cuts and statistics stay the cache's (``stats="recompute"`` rebuilds). Locally
the append works on hard links (``CacheWriter`` renames, never writing through one) and is swapped in as a
build is; on an object store it writes in place, its last writes decided once and saved (``_Finish``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._version import __version__
from ..errors import CacheError, OptionError, ShardcacheError, SourceError
from ..format.cache import Cache, IndexAheadError, NoCacheError, open_cache
from ..format.index import ShardIndex
from ..format.layout import ATTR, open_group, symbol_bases, symbol_chunk_rows
from ..format.manifest import Layout, Manifest
from ..format.moments import Moments
from ..format.paths import is_local, local_path
from ..format.remote import filesystem
from ..format.writer import CacheWriter
from .builder import build_cache, connect, write_batches
from .checks import check_bar_sizes
from .compute import ShardWork, shard_batches
from .merge import Merged, merge_symbols, place_clusters
from .outputs import check_out
from .run import RunOptions, settings
from .scan import Inputs, Scanned, Stage, open_inputs, scan_inputs
from .sources.files import stat_input
from .staging import Staging, digest, fingerprint, prepare
from .summary import grown

__all__ = ["STATS", "append_cache"]

STATS = ("frozen", "recompute")
log = logging.getLogger("shardcache")


@dataclass(kw_only=True)
class _Placement:
    """The appended cache's symbols, segment table and what to write."""

    symbols: list[str]
    bars_per_symbol: np.ndarray
    grown: list[int]  # symbols with new bars (their documents are rewritten; the new ones' groups written)
    segments: np.ndarray  # virtual rows of the appended cache (format.layout.symbol_bases)
    segment_split: np.ndarray
    clusters: np.ndarray  # cluster ids (see ShardWork), in row order
    first_rows: np.ndarray  # each cluster's first row
    counts: np.ndarray  # each cluster's bars
    tails: dict[int, dict[str, Any]]  # row -> raw bar before the first new row of a symbol
    first_new: dict[int, int]  # tail shard -> first new row
    touched: list[int]  # shards to write, in row order
    new_bars: int


@dataclass(kw_only=True)
class _Finish:
    """An append's last writes (grown symbols' documents, history, root index, manifest), saved before the
    first: a rerun after a kill among them writes these again, never recording the append twice."""

    bars_per_symbol: np.ndarray
    segments: np.ndarray
    segment_split: np.ndarray
    shards: np.ndarray  # the root shard index after the append (``ShardIndex.table``)
    digests: np.ndarray  # and its digests
    moments: Moments  # and its chunks' moments
    grown: list[int]
    first_new: int  # the first new symbol (its group document is written too)
    manifest: dict[str, Any]  # the new manifest, as stored (``Manifest.to_json``)
    history: dict[str, Any]


def _t(ts_ns: int) -> str:
    return str(np.datetime64(int(ts_ns), "ns").astype("datetime64[s]")).replace("T", " ")


def _open_target(out: str, storage_options: dict[str, Any] | None) -> tuple[Manifest, Cache | None]:
    """The manifest of the cache at ``out`` and the cache (None: an append killed in its last writes)."""
    try:
        cache = open_cache(out, storage_options)
    except IndexAheadError:
        return Manifest.from_json(open_group(out, "r", storage_options).attrs[ATTR], url=out), None
    except NoCacheError:
        fs, path = filesystem(out, storage_options)
        if fs.exists(path):
            raise CacheError(f"{out}: not a shardcache cache; --append adds to a cache made by build-cache") from None
        raise CacheError(f"{out}: no cache to append to (build it first without --append)") from None
    return cache.manifest, cache


def _check_inputs(out: str, manifest: Manifest, history: dict[str, Any], inputs: Inputs) -> None:
    """Refuse, before any bar is read, inputs of other features, other columns or (DBN) another bar size."""
    first = inputs.sources[0]
    if inputs.names != manifest.feature_names:
        raise ShardcacheError(
            f"{first.path}: gives features {', '.join(inputs.names)}; the cache {out} has "
            f"{', '.join(manifest.feature_names)}"
        )
    built = next((s for s in reversed(history.get("sources") or []) if s.get("columns")), None)
    if built is not None and list(built["columns"]) != first.columns:
        raise SourceError(
            first.path,
            f"{first.schema} data with columns {', '.join(first.columns)}; the cache {out} was built from "
            f"{built.get('schema')} data with columns {', '.join(built['columns'])}; one cache holds one kind "
            "of bars (build them apart)",
        )
    known = [s for s in inputs.sources if s.bar_ns is not None]
    _check_bar_size(out, manifest, known, [None] * len(known))


def _check_bar_size(out: str, manifest: Manifest, srcs: list[Any], steps: list[int | None]) -> None:
    """Refuse inputs whose bar size (DBN: the schema's; a table: its commonest ``steps``) is not the cache's."""
    size, want = check_bar_sizes(srcs, steps, manifest.build.options.bar), manifest.build.bar_ns
    if size is not None and want and int(size) != int(want):
        path = next(s.path for s in srcs if s.bar_ns == size)
        raise SourceError(
            path,
            f"{size / 1e9:g} s bars; the cache {out} holds {int(want) / 1e9:g} s bars; one cache holds one bar "
            "size (build them apart, or resample DBN bars with --bar)",
        )


def _check_after(cache: Cache, scanned: Scanned, paths: list[str]) -> None:
    """Refuse new bars at or before a symbol's last stored bar, naming the first such file."""
    tails = cache.manifest.tails
    runs = scanned.runs
    for run in runs[np.argsort(runs["file"], kind="stable")]:
        sym = scanned.symbols[int(run["sym"])]
        last = tails.get(sym, {}).get("ts")
        if last is not None and int(run["ts_min"]) <= int(last):
            raise ShardcacheError(
                f"{paths[int(run['file'])]}: {sym} bars from {_t(run['ts_min'])} are not after the cache's last "
                f"{sym} bar ({_t(last)}); an append adds only later bars"
            )


def _grown_segments(
    cache: Cache, merged: list[Merged]
) -> tuple[list[str], list[int], np.ndarray, dict[int, tuple[Merged, int]]]:
    """Symbols (new last), bar counts, segments (a stored last one goes on unless cut) and new bars by symbol."""
    max_gap, tails = int(cache.manifest.build.max_gap_ns), cache.manifest.tails
    symbols = cache.symbols
    where = {s: i for i, s in enumerate(symbols)}
    local = cache.local_segments.copy()  # symbol, start, stop, split in the symbol's rows
    last_of = {int(i): k for k, i in enumerate(local[:, 0].tolist())}  # each symbol's last segment
    n = cache.bars_per_symbol.tolist()
    added, grown = [], {}
    for m in merged:
        if m.symbol not in where:
            where[m.symbol] = len(symbols)
            symbols = [*symbols, m.symbol]
            n.append(0)
        i = where[m.symbol]
        r0 = int(n[i])
        starts, splits = m.seg_starts + r0, m.seg_split
        if r0:
            last = last_of[i]
            gap = m.first_ts - int(tails[m.symbol]["ts"])
            rolled = bool(m.rolls) and m.rolls[0][0] == m.first_ts  # from the stored last bar's instrument
            if int(splits[0]) == int(local[last, 3]) and not (max_gap > 0 and gap > max_gap) and not rolled:
                local[last, 2] = starts[1] if len(starts) > 1 else r0 + m.n  # the last segment goes on
                starts, splits = starts[1:], splits[1:]
        stops = np.r_[starts[1:], r0 + m.n] if len(starts) else starts
        added.append(np.stack([np.full(len(starts), i), starts, stops, splits], axis=1))
        n[i] = r0 + m.n
        grown[i] = (m, r0)
    return symbols, n, np.concatenate([local, *added]).astype(np.int64), grown


def _place(cache: Cache, merged: list[Merged]) -> _Placement:
    """Place each symbol's new bars after its stored ones (new symbols in new groups), in virtual rows."""
    shard_rows, tails = cache.shard_rows, cache.manifest.tails
    symbols, n, local, grown = _grown_segments(cache, merged)
    bases = symbol_bases(n, shard_rows)
    virtual = np.stack([local[:, 0], local[:, 1] + bases[local[:, 0]], local[:, 2] + bases[local[:, 0]]], axis=1)
    order = np.argsort(virtual[:, 1], kind="stable")
    lead: dict[int, dict[str, Any]] = {}
    first_new: dict[int, int] = {}
    touched: list[int] = []
    placed: list[tuple[Merged, int]] = []
    for i, (m, r0) in grown.items():
        v0 = int(bases[i]) + r0
        if r0:
            lead[v0 - 1] = tails[m.symbol]
            if r0 % shard_rows:
                first_new[v0 // shard_rows] = v0
        placed.append((m, v0))
        touched += range(v0 // shard_rows, (v0 + m.n - 1) // shard_rows + 1)
    ids, first_rows, counts = place_clusters([m for m, _ in placed], [v0 for _, v0 in placed])
    by_row = np.argsort(first_rows, kind="stable")
    return _Placement(
        symbols=symbols,
        bars_per_symbol=np.asarray(n, dtype=np.int64),
        grown=sorted(grown),
        segments=virtual[order],
        segment_split=local[order, 3].astype(np.int8),
        clusters=ids[by_row],
        first_rows=first_rows[by_row],
        counts=counts[by_row],
        tails=lead,
        first_new=first_new,
        touched=sorted(touched),
        new_bars=int(counts.sum()),
    )


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link to ``src`` at ``dst`` (a copy where links are refused)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _stage_copy(cache: Cache, staging: Staging) -> None:
    """Locally, the append works on hard links to the cache's files (made once; kept on a resume)."""
    if not staging.local or staging.load("linked") is not None:
        return
    shutil.rmtree(staging.cache_path, ignore_errors=True)
    shutil.copytree(local_path(cache.url).rstrip("/"), staging.cache_path, copy_function=_link_or_copy)
    staging.save("linked", True)


def _rebuild(cache: Cache, sources: Any, out: str, run: RunOptions) -> Cache:
    """``stats="recompute"``: build again from the recorded inputs and the new ones, at the cache options and cuts."""
    old = [s["path"] for s in cache.history().get("sources", [])]
    new = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    if (missing := next((p for p in old if is_local(p) and not os.path.exists(local_path(p))), None)) is not None:
        raise ShardcacheError(
            f"{missing}: an input of {out} is gone; --stats recompute rebuilds from every input "
            "(use --stats frozen to append without it)"
        )
    changed = next((s["path"] for s in cache.history().get("sources", []) if _changed(s, run.storage_options)), None)
    if changed is not None:
        raise ShardcacheError(
            f"{changed}: an input of {out} changed since it was built (size or modification time); --stats "
            "recompute rebuilds from every recorded input and would replace the cache's bars from it: put the "
            "original back, or use --stats frozen to append without reading it"
        )
    options = cache.manifest.build.options.replace(stats_from=None, split_cuts_ns=cache.manifest.splits.cuts_ns)
    return build_cache([*old, *new], out, options, run=dataclasses.replace(run, overwrite=True))


def _changed(recorded: dict[str, Any], storage_options: dict[str, Any] | None) -> bool:
    """Whether an input the history recorded (``Source.describe``) is no longer what it was."""
    if "size" not in recorded:
        return False
    path = recorded["path"]
    if "mtime" in recorded:
        st = os.stat(local_path(path))
        return (st.st_size, st.st_mtime) != (recorded["size"], recorded["mtime"])
    return stat_input(path, storage_options) != (recorded["size"], recorded.get("version"))


def append_cache(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    stats: str = "frozen",
    run: RunOptions | None = None,
    **fields: Any,
) -> Cache:
    """Add the bars of ``sources`` (later than each symbol's last bar) to the cache at ``out``.

    Uses the cache's build options (a build option given here is refused); ``run`` (or its fields
    as keyword arguments: workers, scheduler, resume, storage_options, progress) says how this run
    goes. ``stats="frozen"`` keeps the cache's statistics and rewrites only each symbol's partial
    last shard, ``"recompute"`` rebuilds it (see the module docstring). ``resume`` finishes an
    interrupted append; run again once it is finished, it changes nothing.
    """
    t0 = time.perf_counter()
    out = check_out(out)
    _, run = settings("append_cache", None, run, fields, build=False)
    if run.overwrite:
        raise OptionError("overwrite", True, "an append adds to its cache in place, it never replaces it")
    if stats not in STATS:
        raise OptionError("stats", stats, f"choose {' or '.join(STATS)}")
    m, cache = _open_target(out, run.storage_options)
    if stats == "recompute":
        if cache is None:
            raise CacheError(
                f"{out}: an append to it stopped in its last writes; finish it first (--append "
                "--resume with the same inputs)"
            )
        return _rebuild(cache, sources, out, run)
    inputs = open_inputs(sources, m.build.options, run.storage_options)
    _check_inputs(out, m, {} if cache is None else cache.history(), inputs)
    previous = {"fingerprint": m.build.fingerprint, "bars": m.counts.bars, "appends": m.appends}
    done = _finished(cache, inputs, stats) if run.resume and cache is not None else None
    wanted = done or fingerprint(inputs.sources, {"append_to": previous, "stats": stats}, __version__)
    staging = prepare(out, run.storage_options, wanted, resume=run.resume, overwrite=True, inputs=inputs.specs)
    assert isinstance(staging, Staging)  # a finished cache is returned only for a build's own fingerprint
    if done is not None and cache is not None:  # an object store's append killed after its last write
        staging.remove()
        log.info("%s: this append is already in the cache; nothing to resume", out)
        return cache
    with staging.guard("append"), connect(run.scheduler, staging.root, [out, *inputs.paths]) as client:
        finish = staging.load("finish", kind=_Finish)
        if finish is None:
            if cache is None:
                raise CacheError(
                    f"{out}: its segment index is an append's and its manifest is not, and "
                    f"{staging.root} keeps no append to finish; rebuild the cache"
                )
            stage = functools.partial(staging.run, workers=run.workers, client=client, show=run.progress)
            finish = _plan(stage, staging, cache, inputs, stats, previous, digest(wanted), t0)
            staging.save("finish", finish)
        staging.written = True
        _write_finish(staging, finish, m, inputs.names, run.storage_options, out)
        staging.publish()
        staging.remove()
    return open_cache(out, run.storage_options)


def _write_finish(
    staging: Staging, finish: _Finish, m: Manifest, names: list[str], storage_options: dict[str, Any] | None, out: str
) -> None:
    """Write a planned append (``finish``) into the staged cache, the manifest last."""
    index = ShardIndex(table=finish.shards, digests=finish.digests, moments=finish.moments)
    chunks = index.symbol_chunk_rows(len(finish.bars_per_symbol))
    writer = _grown_writer(staging, m.layout, names, finish.bars_per_symbol, storage_options, chunks)
    writer.write_symbols(finish.grown, first_new=finish.first_new)
    writer.write_history(finish.history)
    writer.finish(finish.segments, finish.segment_split, Manifest.from_json(finish.manifest, url=out), index)


def _plan(
    stage: Stage,
    staging: Staging,
    cache: Cache,
    inputs: Inputs,
    stats: str,
    previous: dict[str, Any],
    fingerprint: str,
    t0: float,
) -> _Finish:
    """Scan, merge, place and write the new bars: the append's last writes, decided once."""
    described = [s.describe() for s in inputs.sources]
    scanned = scan_inputs(stage, inputs.sources, staging.root, inputs.read_columns)
    _check_bar_size(cache.url, cache.manifest, inputs.sources, scanned.steps)
    inputs.sources.clear()  # the readers' state is not needed again
    placement, manifest, index = _write(stage, staging, cache, scanned, inputs)
    record = {
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "inputs": len(described),
        "bars": placement.new_bars,
        "stats": stats,
        "fingerprint": fingerprint,
        "append_to": previous,
        "shards_rewritten": len(placement.first_new),
        "shards_written": len(placement.touched) - len(placement.first_new),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    old = cache.history()
    return _Finish(
        bars_per_symbol=placement.bars_per_symbol,
        segments=placement.segments,
        segment_split=placement.segment_split,
        shards=index.table,
        digests=index.digests,
        moments=index.moments,
        grown=list(placement.grown),
        first_new=len(cache.symbols),
        manifest=manifest.to_json(),
        history={"sources": [*old.get("sources", []), *described], "appends": [*old.get("appends", []), record]},
    )


def _finished(cache: Cache, inputs: Inputs, stats: str) -> dict[str, Any] | None:
    """The fingerprint of this append if it is the cache's last one, finished (its manifest counts it)."""
    last = (cache.history().get("appends") or [{}])[-1]
    if "append_to" not in last or cache.manifest.appends != last["append_to"]["appends"] + 1:
        return None
    wanted = fingerprint(inputs.sources, {"append_to": last["append_to"], "stats": stats}, __version__)
    return wanted if digest(wanted) == last.get("fingerprint") else None


def _grown_writer(
    staging: Staging,
    layout: Layout,
    names: list[str],
    bars_per_symbol: np.ndarray,
    storage_options: dict[str, Any] | None,
    symbol_chunks: np.ndarray,
) -> CacheWriter:
    """A writer into the staged copy of a cache grown to ``bars_per_symbol``, with these inner chunks."""
    return CacheWriter(
        staging.cache_path,
        feature_names=names,
        bars_per_symbol=bars_per_symbol,
        shard_rows=layout.shard_rows,
        chunk_rows=layout.chunk_rows,
        codec=layout.codec,
        storage_options=storage_options,
        create=False,
        symbol_chunks=symbol_chunks,
    )


def _write(
    stage: Stage, staging: Staging, cache: Cache, scanned: Scanned, inputs: Inputs
) -> tuple[_Placement, Manifest, ShardIndex]:
    """Merge, place and write the scanned bars: the placement, the new manifest and root shard index."""
    m = cache.manifest
    _check_after(cache, scanned, inputs.paths)
    instruments = {sym: int(t["instrument"]) for sym, t in m.tails.items() if "instrument" in t}
    merged = merge_symbols(
        stage, staging.root, scanned, m.build.max_gap_ns, m.splits.cuts_ns, cache.shard_rows, instruments
    )
    placement = _place(cache, merged)
    if not placement.new_bars:
        raise ShardcacheError(f"{', '.join(inputs.paths[:3])}: no bars to append")
    _stage_copy(cache, staging)
    new = symbol_chunk_rows(placement.bars_per_symbol[len(cache.symbols) :], cache.chunk_rows)  # the rule's
    chunks = np.concatenate([cache.symbol_chunks, new])  # a stored symbol keeps its inner chunks
    writer = _grown_writer(staging, m.layout, inputs.names, placement.bars_per_symbol, cache.storage_options, chunks)
    work = ShardWork(
        staging=staging.root,
        clusters=placement.clusters,
        first_row=placement.first_rows,
        counts=placement.counts,
        segments=placement.segments,
        segment_split=placement.segment_split,
        names=inputs.names,
        writer=writer,
        read_columns=inputs.read_columns,
        symbols=placement.symbols,
        tails=placement.tails,
        first_new=placement.first_new,
    )
    if m.stats is not None:  # frozen
        work.mean = np.asarray(m.stats.mean).astype(np.float32)
        work.std = np.asarray(m.stats.std).astype(np.float32)
    records = write_batches(stage, staging, work, shard_batches(writer, placement.touched))
    index = cache.shard_index().updated(records, placement.bars_per_symbol, cache.shard_rows)
    manifest = grown(m, work, merged, scanned, index.stored_bytes, appended=True)
    return placement, manifest, index
