"""The caches a stream or a dataset reads, as one row space: ``Sources``.

Cache ``k``'s rows are rows ``[row_bounds[k], row_bounds[k + 1])`` of the shared space, cut into shards of
the gcd of the caches' shard sizes, so no shard straddles two caches or symbols. Every cache serves the same
split, over the same time range unless a ``Cut`` (``split_times``, a fold, an embargo) re-cuts them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import CacheError, OptionError, ShardcacheError
from ..format.cache import Cache, open_cache
from ..format.local_cache import LocalCache
from ..format.readahead import will_read
from ..format.windows import Ranges, SegmentSource, WindowSpec, valid_ranges
from .cuts import Cut
from .options import check_split, no_windows_error
from .settings import CacheSource, LocalCopy

__all__ = ["Sources"]


class Sources:
    """Opened caches with the same features, laid out in one row space, and the split each serves.

    ``Sources.open`` takes what a stream is given (one cache, or a sequence of them, with their
    ``storage_options``), then checks and chooses the split. ``read_rows``, ``locate``,
    ``bar_times`` and ``region_stop`` take rows of the shared row space.
    """

    def __init__(
        self,
        caches: Sequence[Cache],
        *,
        cut: Cut,
        temporary: LocalCache | None = None,
    ) -> None:
        self.temporary = temporary  # a temporary node-local copy of remote caches' shards, removed by its owner
        self.caches = tuple(caches)
        self.urls = [c.url for c in self.caches]
        """Each cache's URL, in the order given."""
        _check_features(self.caches, self.urls)
        _check_normalized(self.caches, self.urls)
        self.shard_rows = math.gcd(*(c.shard_rows for c in self.caches))
        self.row_bounds = np.concatenate([[0], np.cumsum([c.n_rows for c in self.caches])]).astype(np.int64)
        # one region per (cache, symbol), in row order: its first row, cache, symbol and bars
        self._bases = np.concatenate(
            [c.rows.bases[:-1] + o for c, o in zip(self.caches, self.row_bounds)] + [[self.n_rows]]
        )
        self._cache = np.repeat(np.arange(len(self.caches)), [len(c.rows.bars_per_symbol) for c in self.caches])
        self._symbol = np.concatenate([np.arange(len(c.rows.bars_per_symbol)) for c in self.caches])
        self._bars = np.concatenate([c.rows.bars_per_symbol for c in self.caches])
        self.cut = cut
        self.split = self._choose(cut)
        """The split read (``None``: every bar)."""
        times = cut.times(self.caches[0])
        self.split_names = list(self.caches[0].split_names if times is None else times.names)
        """The names of the splits the caches are cut into."""
        self.tables: list[SegmentSource] = [c if times is None else times.table(c) for c in self.caches]

    @classmethod
    def open(
        cls,
        sources: Sequence[CacheSource],
        *,
        cut: Cut,
        local: LocalCopy | None = None,
    ) -> Sources:
        """The caches of ``sources`` (``sources_of``) opened, read through ``local`` when given; the cut checked."""
        if local is not None:
            local.check(sources)
        opened = [open_cache(s.cache, None if s.storage_options is None else dict(s.storage_options)) for s in sources]
        opened, temporary = (opened, None) if local is None else local.apply(opened)
        try:
            return cls(opened, cut=cut, temporary=temporary)
        except BaseException:
            if temporary is not None:
                temporary.close()
            raise

    # -- the split ---------------------------------------------------------------------------
    def _choose(self, cut: Cut) -> str | None:
        """The split every cache serves: each cache's own (the same time range in all), or the cut's."""
        split = cut.split
        if cut.fold is None and cut.split_times is None:
            for cache in self.caches:
                check_split(cache, split)  # a cache without the split is refused by name
            if len(self.caches) > 1 and split not in (None, "all"):
                self._check_cuts(split)
            return split
        names = cut.times(self.caches[0]).names  # type: ignore[union-attr]  # a fold or split_times: never None
        said = repr(cut.fold) if cut.fold is not None else "split_times"
        if split is None and len(names) > 1:
            raise OptionError("split", None, f"{said} cuts {', '.join(names)}: pass split={names[0]!r} (or another)")
        if split not in (None, "all", *names):
            raise OptionError("split", split, f"no such split; {said} cuts {', '.join(names)}")
        if cut.fold is not None:
            _check_fold_stats(self.caches, self.urls, cut)
        return split

    def _check_cuts(self, split: str) -> None:
        """Refuse caches whose ``split`` covers different time ranges, naming the first two that differ."""
        spans = [_span(c, split) for c in self.caches]
        k = next((k for k, s in enumerate(spans) if s != spans[0]), None)
        if k is None:
            return
        raise OptionError(
            "split",
            split,
            f"{self.urls[0]}'s {split} split {_fmt(spans[0])} but {self.urls[k]}'s {_fmt(spans[k])}: the mix "
            "would train on one cache's bars from another's validation or test period; build the caches with the "
            "same --split dates (or --stats-from one of them), or pass split_times= to cut every cache at the same times",
        )

    @property
    def stats(self) -> str:
        """The caches' normalization statistics: ``"shared"`` (one set, or one cache), ``"differ"`` (each
        cache z-scored with its own) or ``"none"`` (not normalized; a z-scored cache with a raw one is refused)."""
        kept = {_stats_key(c) for c in self.caches}
        if len(kept) == 1:
            return "none" if None in kept else "shared"
        return "differ"

    # -- windows -----------------------------------------------------------------------------
    def ranges(self, spec: WindowSpec) -> Ranges:
        """The valid windows of every cache's split, in the shared row space (each cache must have one)."""
        parts = []
        for cache, table in zip(self.caches, self.tables):
            r = valid_ranges(table, spec, split=self.split)
            if not r.total():
                exc = no_windows_error(cache, spec, self.split, table)
                said = self.cut.describe()
                if said and isinstance(exc, OptionError):
                    exc = OptionError(exc.option, exc.value, f"{exc.problem} (as {said} cuts it)", exc.mentions)
                raise _named(exc, cache.url if len(self) > 1 else "")
            parts.append(r)
        if len(parts) == 1:
            return parts[0]
        return Ranges(
            start=np.concatenate([p.start + off for p, off in zip(parts, self.row_bounds)]).astype(np.int64),
            count=np.concatenate([p.count for p in parts]).astype(np.int64),
            stride=spec.stride,
            span=max(p.span for p in parts),
            end=None if not spec.timed else np.concatenate([p.end + off for p, off in zip(parts, self.row_bounds)]),
        )

    def where(self) -> str:
        """Names the windows in a message: ``split 'train' of es.zarr, nq.zarr``."""
        urls = ", ".join(self.urls)
        return urls if self.split in (None, "all") else f"split {self.split!r} of {urls}"

    # -- rows of the shared space ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.caches)

    @property
    def n_rows(self) -> int:
        return int(self.row_bounds[-1])

    @property
    def feature_names(self) -> list[str]:
        return self.caches[0].feature_names

    @property
    def n_features(self) -> int:
        return self.caches[0].n_features

    def _regions(self, rows: np.ndarray) -> np.ndarray:
        """The (cache, symbol) region of each row; a row outside every cache is refused."""
        i = np.searchsorted(self._bases, rows, side="right") - 1
        outside = (i < 0) | (i >= len(self._bars))
        if outside.any():
            raise IndexError(f"row {int(rows[outside][0])} outside the {self.n_rows} rows of the stream's caches")
        return i

    def _region(self, row: int) -> int:
        """``_regions`` of one row, as a scalar search."""
        i = int(np.searchsorted(self._bases, row, side="right")) - 1
        if not 0 <= i < len(self._bars):
            raise IndexError(f"row {row} outside the {self.n_rows} rows of the stream's caches")
        return i

    def _by_cache(self, rows: np.ndarray) -> Iterator[tuple[Cache, np.ndarray, int]]:
        """``(cache, which, offset)`` for each cache holding some of ``rows``: the positions of its rows, its first row."""
        if len(self.caches) == 1:
            yield self.caches[0], np.arange(len(rows)), 0
            return
        src = self._cache[self._regions(rows)]
        for k in np.unique(src).tolist():
            yield self.caches[k], np.flatnonzero(src == k), int(self.row_bounds[k])

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None, *, check: bool = True) -> np.ndarray:
        """Rows ``[start, stop)`` (inside one symbol of one cache) of its ``features`` (``Cache.read_rows``)."""
        k = int(self._cache[self._region(start)])
        off = int(self.row_bounds[k])
        return self.caches[k].read_rows(start - off, stop - off, out, check=check)

    def read_many(self, starts: np.ndarray, stops: np.ndarray, outs: list[np.ndarray], *, check: bool = True) -> None:
        """``read_rows`` of rows ``[starts[k], stops[k])`` into ``outs[k]`` for many blocks at once (``Cache.read_many``)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        for cache, mine, off in self._by_cache(starts):
            cache.read_many(starts[mine] - off, stops[mine] - off, [outs[j] for j in mine.tolist()], check=check)

    def check_same(self) -> None:
        """``Cache.check_same`` of every cache: none was replaced since it was opened."""
        for cache in self.caches:
            cache.check_same()

    def will_read(self, starts: np.ndarray, stops: np.ndarray) -> None:
        """``readahead.will_read`` of the row ranges ``[starts[k], stops[k])`` (each inside one symbol of one cache)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        for cache, mine, off in self._by_cache(starts):
            will_read(cache, starts[mine] - off, stops[mine] - off)

    def region_stop(self, row: int) -> int:
        """End of the rows of the symbol holding ``row``: reads must stop there."""
        i = self._region(row)
        return int(self._bases[i] + self._bars[i])

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Cache, symbol (in that cache) and row in that symbol's own arrays of each row (int64 all)."""
        rows = np.asarray(rows, dtype=np.int64)
        i = np.searchsorted(self._bases, rows, side="right") - 1
        return self._cache[i], self._symbol[i], rows - self._bases[i]

    def bar_times(self, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns since the epoch) of rows, read from each row's cache (``Cache.bar_times``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.caches) == 1:
            return self.caches[0].bar_times(rows)
        flat = rows.reshape(-1)
        out = np.empty(flat.shape, np.int64)
        for cache, mine, off in self._by_cache(flat):
            out[mine] = cache.bar_times(flat[mine] - off)
        return out.reshape(rows.shape)

    def __repr__(self) -> str:
        return f"Sources({self.urls!r}, split={self.split!r}, stats={self.stats!r})"


def _check_distinct(caches: Sequence[Cache], urls: list[str]) -> None:
    """Refuse one cache given twice under any name (a link, a URL, a copy): told apart by ``Manifest.identity``."""
    if len(caches) < 2:
        return
    seen: dict[str, int] = {}
    for k, cache in enumerate(caches):
        j = seen.setdefault(cache.manifest.identity, k)
        if j == k:
            continue
        how = "given twice" if urls[j] == urls[k] else "another name for it, or a copy: the same manifest"
        raise OptionError(
            "caches",
            urls,
            f"caches[{k}] {urls[k]} is caches[{j}] {urls[j]} again ({how}): the stream would serve each of its "
            "windows twice; give each cache once (weights= sets how much of a cache an epoch serves)",
        )


def _check_normalized(caches: Sequence[Cache], urls: list[str]) -> None:
    """Refuse z-scored caches mixed with raw ones: one feature would reach the model on two scales."""
    raw = [_stats_key(c) is None for c in caches]
    if all(raw) or not any(raw):
        return
    z, r = raw.index(False), raw.index(True)
    raise OptionError(
        "caches",
        urls,
        f"{urls[z]} is z-scored (normalize={caches[z].manifest.normalize!r}) but {urls[r]} is raw "
        f"(normalize={caches[r].manifest.normalize!r}): the model would see each feature on two scales; "
        "build every cache with the same build-cache --normalize (and --stats-from one of them to share its statistics)",
    )


def _check_fold_stats(caches: Sequence[Cache], urls: list[str], cut: Cut) -> None:
    """Refuse a fold of a cache z-scored at build time with statistics of bars from the fold's validation
    range on: its train windows would carry what the validation period's mean and variance are."""
    fold = cut.fold
    assert fold is not None
    for cache, url in zip(caches, urls):
        splits = cache.manifest.splits
        if _stats_key(cache) is None or splits.stats_split is None:
            continue
        ends = splits.cuts_ns[0] if splits.stats_split == "train" and splits.cuts_ns else None
        if ends is not None and ends <= fold.val[0]:
            continue
        upto = "every bar" if ends is None else f"bars before {np.datetime64(int(ends), 'ns').astype('datetime64[m]')}"
        raise OptionError(
            "fold",
            repr(fold),
            f"{url} is z-scored with the statistics of {upto}, which reach into this fold's validation range: "
            "its training would see them; build the cache with --normalize none to fold it",
        )


def _check_features(caches: Sequence[Cache], urls: list[str]) -> None:
    """Refuse caches without the first one's feature names in the same order, naming the difference."""
    _check_distinct(caches, urls)
    want = caches[0].feature_names
    for cache, url in zip(caches[1:], urls[1:]):
        have = cache.feature_names
        if have == want:
            continue
        missing, extra = [n for n in want if n not in have], [n for n in have if n not in want]
        lacks = [f"{url} lacks {', '.join(missing)}"] if missing else []
        has = [f"{url} has {', '.join(extra)}, which {urls[0]} lacks"] if extra else []
        if lacks or has:
            diff = "; ".join(lacks + has)
        else:
            i = next(i for i, (a, b) in enumerate(zip(want, have)) if a != b)
            diff = f"{url} has the same features in another order (position {i}: {have[i]!r}, not {want[i]!r})"
        raise OptionError("caches", urls, f"every cache needs the features of {urls[0]} in the same order: {diff}")


def _span(cache: Cache, split: str) -> tuple[int | None, int | None]:
    """Where ``split`` starts and ends in ``cache`` (ns; None: open-ended)."""
    names, cuts = cache.split_names, list(cache.manifest.splits.cuts_ns)
    i = names.index(split)
    return (int(cuts[i - 1]) if i > 0 else None, int(cuts[i]) if i < len(cuts) else None)


def _fmt(span: tuple[int | None, int | None]) -> str:
    """A split's time range for a message: ``runs from 2023-05-15T19:29:00 to ...``."""

    def when(ns: int | None) -> str:
        return "the first bar" if ns is None else str(np.datetime_as_string(np.datetime64(ns, "ns"), unit="s"))

    lo, hi = span
    return f"runs from {when(lo)}" + (" to the last bar" if hi is None else f" to {when(hi)}")


def _stats_key(cache: Cache) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    stats = cache.manifest.stats
    if cache.manifest.normalize == "none" or stats is None:
        return None
    return tuple(stats.mean), tuple(stats.std)


def _named(exc: ShardcacheError, url: str) -> ShardcacheError:
    """``exc`` about one cache of several, its message prefixed with the cache's URL."""
    if not url:
        return exc
    if isinstance(exc, OptionError):
        return OptionError(exc.option, exc.value, f"{url}: {exc.problem}", exc.mentions)
    return CacheError(f"{url}: {exc}" if url not in str(exc) else str(exc))
