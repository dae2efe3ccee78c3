"""The manifest, made in one place: a build's fresh record (``fresh``) or an append's cache manifest grown
by the bars written (``grown``), both counted the same way."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._version import __version__
from ..format.build_options import BuildOptions
from ..format.manifest import BuildRecord, Bytes, Counts, Manifest, Splits, Stats, Windows
from ..format.windows import SegmentTable, n_windows
from ..format.writer import CacheWriter
from .compute import ShardWork
from .merge import Merged
from .scan import Scanned

__all__ = ["fresh", "grown"]


def fresh(
    options: BuildOptions,
    *,
    names: list[str],
    cuts: Sequence[int],
    stats: Stats | None,
    build: BuildRecord,
    writer: CacheWriter,
    resampled: dict[str, Any] | None,
    unmapped: dict[str, int],
    elapsed_s: float,
) -> Manifest:
    """A build's manifest before its bars are counted in (``grown``): what it was built with and from."""
    spec = options.splits()
    return Manifest(
        created=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),  # two builds in one second are two caches
        shardcache_version=__version__,
        feature_names=names,
        symbols=[],
        groups=[],
        bars_per_symbol=[],
        layout=writer.layout,
        stats=stats,
        splits=Splits(
            spec=spec.text, names=spec.names, stats_split=options.stats_split, cuts_ns=[int(c) for c in cuts]
        ),
        build=build,
        counts=Counts(
            resampled=resampled,
            unmapped=unmapped or None,
            windows=Windows(seq_len=options.seq_len, horizon=options.horizon),
        ),
        elapsed_s=elapsed_s,
    )


def grown(
    base: Manifest, work: ShardWork, merged: list[Merged], scanned: Scanned, stored: int, *, appended: bool
) -> Manifest:
    """``base`` with ``merged``'s bars and the scan's counts in (the cache ``work`` wrote; an append counts one)."""
    symbols, segments, split, writer = work.symbols, work.segments, work.segment_split, work.writer
    counts = base.counts
    dropped = Counter(counts.dropped) + Counter(scanned.drops)
    if dups := sum(x.duplicates for x in merged):
        dropped["duplicate timestamp"] += dups
    n_bars = int(writer.bars_per_symbol.sum())
    names, windows, known = base.splits.names, counts.windows, set(symbols)
    table = SegmentTable(segments=segments, segment_split=split, split_names=list(names))
    split_bars = {name: int(np.diff(segments[split == i, 1:], axis=1).sum()) for i, name in enumerate(names)}
    return base.replace(
        symbols=symbols,
        groups=writer.groups,
        bars_per_symbol=writer.bars_per_symbol.tolist(),
        layout=writer.layout,
        splits=dataclasses.replace(base.splits, bars=split_bars),
        tails={**base.tails, **{x.symbol: x.tail for x in merged if x.symbol in known}},
        rolls={**base.rolls, **{x.symbol: [*base.rolls.get(x.symbol, []), *x.rolls] for x in merged if x.rolls}},
        counts=dataclasses.replace(
            counts,
            bars=n_bars,
            records_read=counts.records_read + scanned.records,
            symbols=len(symbols),
            segments=len(segments),
            dropped={k: int(v) for k, v in dropped.items()},
            reordered=counts.reordered + scanned.reordered,
            rolls=counts.rolls + sum(len(x.rolls) for x in merged),
            windows=dataclasses.replace(windows, count=n_windows(table, windows.seq_len, horizon=windows.horizon)),
        ),
        bytes=Bytes(stored=stored, raw=n_bars * len(base.feature_names) * 4),
        appends=base.appends + int(appended),
    )
