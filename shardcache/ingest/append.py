"""Appends: add later bars (the next day's files) to a cache without rewriting finished shards.

A cache keeps each symbol in its own group (``shardcache.format.layout``), so a symbol grows in
place. ``append_cache`` scans and merges the new inputs with the build's own stages, then
for every symbol with new bars:

* refuses bars at or before the symbol's last stored bar (one line naming the file): an
  append adds only later bars, it never inserts or replaces;
* rewrites its partial last shard (its stored rows read back as they are, plus the new ones),
  writes new whole shards after it, then the ``zarr.json`` of its ``features`` and ``time`` at
  their new length; every other object of every symbol is left as it is, and the root index
  (``segments``, ``shards``, ``shard_digests``) is written again whole;
* continues the symbol's last segment when the first new bar follows the last stored one
  within the cache's ``max_gap``, in the same split and on the same instrument (a continuous
  symbol that rolls at the boundary starts a new segment, its roll recorded as a build
  records it), so windows across the boundary become valid; the first new bar's features use
  the raw last bar kept in the manifest (``tails``, with its instrument), as a build that
  saw every bar at once would.

New symbols get new groups after the existing ones (the symbol list keeps its order).
Splits keep the cache's cut times (fraction splits were resolved to times at the first
build), and statistics are frozen: the cache's mean/std normalize the new bars.
``stats="recompute"`` instead rebuilds the cache from its recorded inputs plus the new ones
(``--overwrite``) at the same split cut times: every shard is rewritten with statistics over
all train bars.

Atomicity reuses the build's staging (``shardcache.ingest.staging``): locally the append works on
``OUT.staging/cache.zarr``, a tree of hard links to ``OUT``'s files, and is swapped in with
one ``renameat2(RENAME_EXCHANGE)``. ``CacheWriter`` writes every object to a temporary name and
renames it into place, which replaces a staged link instead of writing through it, so the
staging copy never changes a file it shares with ``OUT``. A killed append leaves
``OUT`` byte for byte untouched and resumes with ``resume=True``. On object stores the
append writes in place: new and rewritten shards first (a rewritten tail shard keeps its
stored rows), then the grown symbols' documents, the history, the root index and the manifest
last. Those
last writes are decided once and saved in the staging folder (``_Finish``) before the first of
them, so a rerun after a kill among them writes the same ones (never a second history record),
and a ``resume`` of an append already finished changes nothing.
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
from ..format.manifest import Manifest
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
    """An append's last writes (grown symbols' documents, history, root index, manifest), saved in its staging folder
    before the first of them. On an object store they go in place, so a rerun after a kill among them
    writes these again: it cannot place the bars again from a half-written cache, and it never records
    its inputs and its append a second time."""

    bars_per_symbol: np.ndarray
    segments: np.ndarray
    segment_split: np.ndarray
    shards: np.ndarray  # the root shard index after the append (``ShardIndex.table``)
    digests: np.ndarray  # and its digests
    grown: list[int]
    first_new: int  # the first new symbol (its group document is written too)
    manifest: dict[str, Any]  # the new manifest, as stored (``Manifest.to_json``)
    history: dict[str, Any]


def _t(ts_ns: int) -> str:
    return str(np.datetime64(int(ts_ns), "ns").astype("datetime64[s]")).replace("T", " ")


def _open_target(out: str, storage_options: dict[str, Any] | None) -> tuple[Manifest, Cache | None]:
    """The manifest of the cache to append to and the cache opened, or a one-line refusal (missing,
    not a cache, an old format). The cache is None when its segment index is already an append's
    and its manifest not yet (an object-store append killed in its last writes, see ``_Finish``)."""
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
    """Refuse, before reading any bar, inputs a build would refuse to mix with the cache's own: other
    features, other source columns (a tick schema beside bars) or, where a file knows it (DBN), another
    bar size."""
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
    """Refuse inputs whose bar size (DBN: the schema's; a table: the scan's most common ``steps``) is
    not the cache's ``bar_ns``, as ``checks.check_bar_sizes`` refuses two sizes in one build."""
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
    """Each symbol's segments with its new bars (symbol, start, stop, split in the symbol's rows): a stored
    last segment goes on unless a gap, a split or a roll cuts it. Also the symbols (new ones last), their
    bar counts and, by symbol, the new bars and the row they start at."""
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
    """Place each symbol's new bars after its stored ones (new symbols in new groups), in the
    appended cache's virtual rows."""
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


def _link_tree(src: str, dst: str) -> None:
    """``dst`` as a tree of hard links to ``src``'s files (copies where links are refused)."""
    for root, _, files in os.walk(src):
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=True)
        for name in files:
            try:
                os.link(os.path.join(root, name), os.path.join(target, name))
            except OSError:
                shutil.copy2(os.path.join(root, name), os.path.join(target, name))


def _stage_copy(cache: Cache, staging: Staging) -> None:
    """Locally, the append works on hard links to the cache's files (made once; kept on a resume)."""
    if not staging.local or staging.load("linked") is not None:
        return
    shutil.rmtree(staging.cache_path, ignore_errors=True)
    _link_tree(local_path(cache.url).rstrip("/"), staging.cache_path)
    staging.save("linked", True)


def _rebuild(cache: Cache, sources: Any, out: str, run: RunOptions) -> Cache:
    """``stats="recompute"``: build again from the cache's recorded inputs plus the new ones, with its
    build options at its split cut times (fractions are not resolved again over all bars: no bar
    changes split)."""
    old = [s["path"] for s in cache.history().get("sources", [])]
    new = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    missing = next((p for p in old if is_local(p) and not os.path.exists(local_path(p))), None)
    if missing is not None:
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
    """Write a planned append (``finish``) into the staged cache: the grown symbols' documents, the
    history, the root index and segments, the manifest last."""
    index = ShardIndex(table=finish.shards, digests=finish.digests)
    writer = CacheWriter(
        staging.cache_path,
        feature_names=names,
        bars_per_symbol=finish.bars_per_symbol,
        shard_rows=m.layout.shard_rows,
        chunk_rows=m.layout.chunk_rows,
        codec=m.layout.codec,
        storage_options=storage_options,
        create=False,
        symbol_chunks=index.symbol_chunk_rows(len(finish.bars_per_symbol)),
    )
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
        grown=list(placement.grown),
        first_new=len(cache.symbols),
        manifest=manifest.to_json(),
        history={"sources": [*old.get("sources", []), *described], "appends": [*old.get("appends", []), record]},
    )


def _finished(cache: Cache, inputs: Inputs, stats: str) -> dict[str, Any] | None:
    """The fingerprint of this append if it is the cache's last one, finished (its manifest, written
    after its history, counts it); else None."""
    last = (cache.history().get("appends") or [{}])[-1]
    if "append_to" not in last or cache.manifest.appends != last["append_to"]["appends"] + 1:
        return None
    wanted = fingerprint(inputs.sources, {"append_to": last["append_to"], "stats": stats}, __version__)
    return wanted if digest(wanted) == last.get("fingerprint") else None


def _grown_writer(cache: Cache, staging: Staging, names: list[str], bars_per_symbol: np.ndarray) -> CacheWriter:
    """A writer into the staged copy of ``cache`` grown to ``bars_per_symbol``: a stored symbol keeps its
    inner chunks, a new one gets the rule's."""
    return CacheWriter(
        staging.cache_path,
        feature_names=names,
        bars_per_symbol=bars_per_symbol,
        shard_rows=cache.shard_rows,
        chunk_rows=cache.chunk_rows,
        codec=cache.manifest.layout.codec,
        storage_options=cache.storage_options,
        create=False,
        symbol_chunks=np.concatenate(
            [cache.symbol_chunks, symbol_chunk_rows(bars_per_symbol[len(cache.symbols) :], cache.chunk_rows)]
        ),
    )


def _write(
    stage: Stage, staging: Staging, cache: Cache, scanned: Scanned, inputs: Inputs
) -> tuple[_Placement, Manifest, ShardIndex]:
    """Merge and place the scanned bars and write the shards they touch: the placement, the new
    manifest and the new root shard index."""
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
    writer = _grown_writer(cache, staging, inputs.names, placement.bars_per_symbol)
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
    manifest = grown(
        m,
        symbols=placement.symbols,
        segments=placement.segments,
        segment_split=placement.segment_split,
        merged=merged,
        scanned=scanned,
        writer=writer,
        stored=index.stored_bytes,
        appended=True,
    )
    return placement, manifest, index
