"""``Manifest``: the root attributes of a cache (``attrs["shardcache"]``), typed, with their JSON round trip.

The on-disk contract (format 5) is the JSON document ``to_json`` writes and ``from_json`` reads:

* the store: ``feature_names``, ``symbols`` with each one's ``groups`` path and ``bars_per_symbol``,
  ``layout`` (shard and chunk rows, codec, shards), ``format_version`` and ``complete`` (written last);
* how it was built: ``build`` (the ``BuildOptions``, resolved ``max_gap_ns`` and ``bar_ns``, the
  inputs' fingerprint), ``normalize`` and ``stats``, ``splits`` (spec, names, cut times, bars each);
* what the build counted: ``counts`` (bars, records read and dropped, windows, ...), ``bytes``,
  ``rolls`` of continuous symbols, ``tails`` (each symbol's raw last bar, which an append continues
  from), ``appends`` (how many; only once there was one), ``created``, ``elapsed_s``.

``from_json`` refuses formats 1 to 3, a newer format, an incomplete cache and a document missing a
field, naming it. Per-symbol parts (``symbols``, ``groups``, ``bars_per_symbol``, ``rolls``, ``tails``)
stay the JSON lists and dicts they are read as: opening a cache of thousands of symbols builds no
object per symbol. ``Manifest.identity`` is a digest of that JSON: the cache's identity under any name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ..errors import CacheError, ShardcacheError
from .build_options import BuildOptions
from .layout import FORMAT_VERSION

__all__ = [
    "BuildRecord",
    "Bytes",
    "Counts",
    "Layout",
    "Manifest",
    "Splits",
    "Stats",
    "Windows",
    "incomplete",
    "marked_complete",
]

DUPLICATES = "keep the last record in input order"  # the build's policies, stated in every manifest
OUT_OF_ORDER = "sorted by time"


def incomplete() -> dict[str, Any]:
    """The root attributes a cache is created with: its format, not complete until the manifest is written."""
    return {"format_version": FORMAT_VERSION, "complete": False}


def marked_complete(doc: Any) -> bool:
    """Whether root attributes say their cache is complete (a cache that then fails to open is damaged)."""
    return isinstance(doc, Mapping) and bool(doc.get("complete"))


def _check_readable(get: _Reader, url: str) -> None:
    """Refuse root attributes of an old or newer format, or of a build that did not finish."""
    version = get("format_version")
    if type(version) is int and 1 <= version < FORMAT_VERSION:
        raise CacheError(f"{url}: cache format {version} is no longer read; rebuild it with build-cache")
    if version != FORMAT_VERSION:
        raise CacheError(
            f"{url}: cache format version {version} is newer than this shardcache (reads {FORMAT_VERSION}); "
            "upgrade shardcache"
        )
    if not get("complete", False):
        raise CacheError(
            f"{url}: cache is incomplete (its build did not finish); rerun build-cache "
            "with --resume to finish it or --overwrite to start again"
        )


class _Reader:
    """Fields of one JSON object of the manifest, a missing one named with its path (``layout.codec``)."""

    def __init__(self, doc: Any, url: str, path: str = "") -> None:
        if not isinstance(doc, Mapping):
            raise CacheError(f"{url}: the manifest's {path or 'document'} is not an object; rebuild the cache")
        self.doc, self.url, self.path = doc, url, path

    def __call__(self, key: str, *default: Any) -> Any:
        if key in self.doc:
            return self.doc[key]
        if default:
            return default[0]
        raise CacheError(
            f"{self.url}: the manifest has no {self.path + '.' if self.path else ''}{key} (it was edited, or "
            "written by another program); rebuild the cache"
        )

    def part(self, key: str) -> _Reader:
        return _Reader(self(key), self.url, f"{self.path}.{key}" if self.path else key)


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Z-score statistics per feature (in ``feature_names`` order) and the bars they were taken over."""

    mean: list[float]
    """Each feature's mean over the statistics' bars."""
    std: list[float]
    """Each feature's standard deviation over them."""
    count: int
    """The bars they were computed over."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['stats']``)."""
        return {"mean": self.mean, "std": self.std, "count": self.count}


@dataclass(frozen=True, kw_only=True)
class Splits:
    """The split layout: its spec, names in time order, cut times and bars per split."""

    spec: str = "none"
    """The ``--split`` given: ``none``, fractions or dates."""
    names: list[str] = field(default_factory=lambda: ["all"])
    """Split names in time order (``['all']`` without splits)."""
    stats_split: str | None = None  # JSON "stats_from": where z-score statistics come from (train, all) or None
    """The split z-score statistics come from (``train``, ``all``), or None."""
    cuts_ns: list[int] = field(default_factory=list)  # where each later split starts
    """Where each later split starts (ns since the epoch, UTC)."""
    bars: dict[str, int] = field(default_factory=dict)
    """Bars in each split."""

    @property
    def cuts(self) -> list[str]:
        """The cut times as ISO text (UTC), for people."""
        return [str(np.datetime64(int(c), "ns")) for c in self.cuts_ns]

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['splits']``)."""
        return {
            "spec": self.spec,
            "names": self.names,
            "stats_from": self.stats_split,
            "cuts_ns": self.cuts_ns,
            "cuts": self.cuts,
            "bars": self.bars,
        }


@dataclass(frozen=True, kw_only=True)
class Windows:
    """The summary's window count at the build's ``seq_len`` and ``horizon`` (stride 1, every split)."""

    seq_len: int = 60
    """The ``seq_len`` the build's window count is for."""
    horizon: int = 1
    """The ``horizon`` the build's window count is for."""
    count: int = 0
    """Valid windows at that ``seq_len`` and ``horizon``, all splits."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (``counts['windows']``)."""
        return {"seq_len": self.seq_len, "horizon": self.horizon, "count": self.count}


@dataclass(frozen=True, kw_only=True)
class Counts:
    """What the build (and each append) counted."""

    bars: int = 0
    """Bars stored."""
    records_read: int = 0
    """Records read from the inputs."""
    symbols: int = 0
    """Symbols stored."""
    segments: int = 0
    """Segments: runs of bars no window crosses (gaps, splits, rolls cut them)."""
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> records
    """Records dropped, by reason."""
    reordered: int = 0  # records out of time order, sorted
    """Records out of time order, sorted into place."""
    rolls: int = 0
    """Contract rolls of continuous symbols."""
    resampled: dict[str, Any] | None = None  # {"from": [bar sizes], "to": bar size} when --bar resampled DBN bars
    """With ``--bar``: the bar sizes read and the one stored."""
    unmapped: dict[str, int] | None = None  # DBN instruments with no symbol mapping (``checks.resolve_unmapped``)
    """DBN instruments with no symbol mapping, by file."""
    windows: Windows = field(default_factory=Windows)
    """The build's window count (``Windows``)."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['counts']``)."""
        out: dict[str, Any] = {
            "bars": self.bars,
            "records_read": self.records_read,
            "symbols": self.symbols,
            "segments": self.segments,
            "dropped": self.dropped,
            "reordered": self.reordered,
            "rolls": self.rolls,
        }
        if self.resampled:
            out["resampled"] = self.resampled
        if self.unmapped:
            out["unmapped"] = self.unmapped
        out["windows"] = self.windows.to_json()
        return out


@dataclass(frozen=True, kw_only=True)
class Bytes:
    """Stored bytes of the features' shard objects against their raw float32 size."""

    stored: int = 0
    """Bytes of the stored feature shards."""
    raw: int = 0
    """Bytes of the same features decoded (float32)."""

    @property
    def ratio(self) -> float | None:
        """``raw / stored`` (None when nothing is stored)."""
        return round(self.raw / self.stored, 3) if self.stored else None

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['bytes']``)."""
        return {"stored": self.stored, "raw": self.raw, "ratio": self.ratio}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Rows per shard and per inner chunk, the features' codec and the number of shards of all symbols."""

    shard_rows: int
    """Rows per shard (one object per shard and symbol)."""
    chunk_rows: int
    """Rows per inner chunk (the unit of compression inside a shard)."""
    codec: str = "blosc-lz4"
    """The features' codec: ``blosc-lz4``, ``zstd``, ``lz4`` or ``none``."""
    shards: int = 0
    """Shard objects of ``features``, all symbols together."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['layout']``)."""
        return {
            "shard_rows": self.shard_rows,
            "chunk_rows": self.chunk_rows,
            "codec": self.codec,
            "shards": self.shards,
        }


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """How the cache was built: its options, what they resolved to, the inputs' fingerprint and the
    run's worker threads (recorded, never an option)."""

    options: BuildOptions = field(default_factory=BuildOptions)
    """The build's ``BuildOptions``, as given."""
    max_gap_ns: int = 0
    """``max_gap`` resolved (ns): bars further apart start a new segment."""
    bar_ns: int | None = None
    """The bar size (ns), as read or resampled to (None: unknown)."""
    fingerprint: str = ""  # ``staging.digest`` of the inputs, options and versions
    """A digest of the inputs, options and versions: what a ``--resume`` must match."""
    workers: int | None = None
    """Threads the build ran on (recorded, never an option)."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (``attrs['shardcache']['build']``)."""
        return {
            **self.options.to_json(),
            "max_gap_ns": self.max_gap_ns,
            "bar_ns": self.bar_ns,
            "fingerprint": self.fingerprint,
            "duplicates": DUPLICATES,
            "out_of_order": OUT_OF_ORDER,
            "workers": self.workers,
        }


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A complete cache's root attributes (see the module docstring); ``to_json``/``from_json`` are the bytes."""

    format_version: ClassVar[int] = FORMAT_VERSION

    feature_names: list[str]
    symbols: list[str]
    groups: list[str]  # each symbol's group path, relative to the root
    bars_per_symbol: list[int]
    layout: Layout
    splits: Splits = field(default_factory=Splits)
    counts: Counts = field(default_factory=Counts)
    build: BuildRecord = field(default_factory=BuildRecord)
    stats: Stats | None = None  # None with normalize="none"
    rolls: dict[str, list[list[int]]] = field(default_factory=dict)  # symbol -> [[ts_ns, from id, to id], ...]
    tails: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # symbol -> its raw last bar: ts, columns, instrument
    bytes: Bytes = field(default_factory=Bytes)
    created: str = ""
    shardcache_version: str = ""
    elapsed_s: float = 0.0
    appends: int = 0

    @property
    def normalize(self) -> str:
        """``zscore`` or ``none``: the build option, also recorded at the root for plain zarr readers."""
        return self.build.options.normalize

    @cached_property
    def identity(self) -> str:
        """What the cache is, whatever its name: a digest of the manifest's canonical text (``to_json``,
        keys sorted). A link, a ``file://`` URL or a copy of a cache has its identity; another build
        (another ``created`` and ``build.fingerprint``) or an append (its counts and tails) has another."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=True)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def replace(self, **changes: Any) -> Manifest:
        """This manifest with ``changes`` (an append's counts, say)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The root attributes as stored, ``complete`` included (a manifest is written last)."""
        out: dict[str, Any] = {
            "created": self.created,
            "shardcache_version": self.shardcache_version,
            "feature_names": self.feature_names,
            "symbols": self.symbols,
            "normalize": self.normalize,
            "stats": None if self.stats is None else self.stats.to_json(),
            "splits": self.splits.to_json(),
            "rolls": self.rolls,
            "tails": self.tails,
            "build": self.build.to_json(),
            "counts": self.counts.to_json(),
            "bytes": self.bytes.to_json(),
            "layout": self.layout.to_json(),
            "elapsed_s": self.elapsed_s,
            "format_version": FORMAT_VERSION,
            "groups": self.groups,
            "bars_per_symbol": self.bars_per_symbol,
            "complete": True,
        }
        if self.appends:
            out["appends"] = self.appends
        return out

    @classmethod
    def from_json(cls, doc: Any, *, url: str = "the cache") -> Manifest:
        """The manifest of root attributes ``doc``; a ``CacheError`` naming ``url`` for an old, newer or
        incomplete format, or a missing field."""
        get = _Reader(doc, url)  # each missing or mistyped field named
        _check_readable(get, url)
        stats = get("stats", None)
        splits, counts, size, layout, build = (get.part(k) for k in ("splits", "counts", "bytes", "layout", "build"))
        windows = counts.part("windows")
        try:
            options = BuildOptions.from_json(build.doc)
        except ShardcacheError as exc:
            raise CacheError(f"{url}: the manifest's build options cannot be used ({exc}); rebuild the cache") from None
        if stats is not None:
            s = _Reader(stats, url, "stats")
            stats = Stats(mean=s("mean"), std=s("std"), count=s("count"))
        return cls(
            feature_names=get("feature_names"),
            symbols=get("symbols"),
            groups=get("groups"),
            bars_per_symbol=get("bars_per_symbol"),
            layout=Layout(**{k: layout(k) for k in ("shard_rows", "chunk_rows", "codec", "shards")}),
            splits=Splits(
                spec=splits("spec"),
                names=splits("names"),
                stats_split=splits("stats_from"),
                cuts_ns=splits("cuts_ns"),
                bars=splits("bars"),
            ),
            counts=Counts(
                bars=counts("bars"),
                records_read=counts("records_read"),
                symbols=counts("symbols"),
                segments=counts("segments"),
                dropped=counts("dropped"),
                reordered=counts("reordered"),
                rolls=counts("rolls"),
                resampled=counts("resampled", None),
                unmapped=counts("unmapped", None),
                windows=Windows(seq_len=windows("seq_len"), horizon=windows("horizon"), count=windows("count")),
            ),
            build=BuildRecord(
                options=options,
                max_gap_ns=build("max_gap_ns"),
                bar_ns=build("bar_ns"),
                fingerprint=build("fingerprint"),
                workers=build("workers", None),
            ),
            stats=stats,
            rolls=get("rolls"),
            tails=get("tails"),
            bytes=Bytes(stored=size("stored"), raw=size("raw")),
            created=get("created"),
            shardcache_version=get("shardcache_version"),
            elapsed_s=get("elapsed_s"),
            appends=get("appends", 0),
        )
