"""``Manifest``: the root attributes of a cache (``attrs["shardcache"]``), typed, with their JSON round trip.

The JSON document ``to_json`` writes and ``from_json`` reads is the on-disk contract (format 5, described in
docs/store.md); ``from_json`` refuses other formats, an incomplete cache and a bad field, naming it. The
per-symbol parts stay the JSON lists and dicts they are read as: opening a cache of thousands of symbols
builds no object per symbol.
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

from ..errors import CacheError
from .build_options import BuildOptions
from .layout import FORMAT_VERSION
from .typed_json import FieldError, dump, json_field, load

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


def _check_readable(doc: Mapping[str, Any], url: str) -> None:
    """Refuse root attributes of an old or newer format, or of a build that did not finish."""
    version = doc.get("format_version")
    if type(version) is int and 1 <= version < FORMAT_VERSION:
        raise CacheError(f"{url}: cache format {version} is no longer read; rebuild it with build-cache")
    if version != FORMAT_VERSION:
        raise CacheError(
            f"{url}: cache format version {version} is newer than this shardcache (reads {FORMAT_VERSION}); "
            "upgrade shardcache"
        )
    if not doc.get("complete", False):
        raise CacheError(
            f"{url}: cache is incomplete (its build did not finish); rerun build-cache "
            "with --resume to finish it or --overwrite to start again"
        )


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Z-score statistics per feature (in ``feature_names`` order) and the bars they were taken over."""

    mean: list[float]
    """Each feature's mean over the statistics' bars."""
    std: list[float]
    """Each feature's standard deviation over them."""
    count: int
    """The bars they were computed over."""


@dataclass(frozen=True, kw_only=True)
class Splits:
    """The split layout: its spec, names in time order, cut times and bars per split."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("cuts",)
    """Worked out for plain readers, written after the fields, never read back (``typed_json``)."""

    spec: str = "none"
    """The ``--split`` given: ``none``, fractions or dates."""
    names: list[str] = field(default_factory=lambda: ["all"])
    """Split names in time order (``['all']`` without splits)."""
    stats_split: str | None = json_field(key="stats_from", default=None)
    """The split z-score statistics come from (``train``, ``all``), or None (stored as ``stats_from``)."""
    cuts_ns: list[int] = field(default_factory=list)
    """Where each later split starts (ns since the epoch, UTC)."""
    bars: dict[str, int] = field(default_factory=dict)
    """Bars in each split."""

    @property
    def cuts(self) -> list[str]:
        """The cut times as ISO text (UTC), for people."""
        return [str(np.datetime64(int(c), "ns")) for c in self.cuts_ns]


@dataclass(frozen=True, kw_only=True)
class Windows:
    """The summary's window count at the build's ``seq_len`` and ``horizon`` (stride 1, every split)."""

    seq_len: int = 60
    """The ``seq_len`` the build's window count is for."""
    horizon: int = 1
    """The ``horizon`` the build's window count is for."""
    count: int = 0
    """Valid windows at that ``seq_len`` and ``horizon``, all splits."""


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
    dropped: dict[str, int] = field(default_factory=dict)
    """Records dropped, by reason."""
    reordered: int = 0
    """Records out of time order, sorted into place."""
    rolls: int = 0
    """Contract rolls of continuous symbols."""
    resampled: dict[str, Any] | None = json_field(when_set=True, default=None)
    """With ``--bar``: the bar sizes read (``from``) and the one stored (``to``)."""
    unmapped: dict[str, int] | None = json_field(when_set=True, default=None)
    """DBN instruments with no symbol mapping, by file (``checks.resolve_unmapped``)."""
    windows: Windows = field(default_factory=Windows)
    """The build's window count (``Windows``)."""


@dataclass(frozen=True, kw_only=True)
class Bytes:
    """Stored bytes of the features' shard objects against their raw float32 size."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("ratio",)
    """Worked out for plain readers, written after the fields, never read back (``typed_json``)."""

    stored: int = 0
    """Bytes of the stored feature shards."""
    raw: int = 0
    """Bytes of the same features decoded (float32)."""

    @property
    def ratio(self) -> float | None:
        """``raw / stored`` (None when nothing is stored)."""
        return round(self.raw / self.stored, 3) if self.stored else None


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Rows per shard and per inner chunk, the features' codec and the number of shards of all symbols."""

    shard_rows: int
    """Rows per shard (one object per shard and symbol)."""
    chunk_rows: int
    """Rows per inner chunk (the unit of compression inside a shard)."""
    codec: str = "blosc-lz4"
    """The features' codec: ``blosc-lz4``, ``zstd``, ``lz4`` (Blosc's LZ4 without shuffle) or ``none``."""
    shards: int = 0
    """Shard objects of ``features``, all symbols together."""


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """How the cache was built: its options (stored in the same object), what they resolved to, the
    inputs' fingerprint and the run's worker threads (recorded, never an option)."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("duplicates", "out_of_order")
    """Worked out for plain readers, written after the fields, never read back (``typed_json``)."""
    duplicates: ClassVar[str] = DUPLICATES
    """The build's policy for records of one bar (stated in every manifest)."""
    out_of_order: ClassVar[str] = OUT_OF_ORDER
    """The build's policy for records out of time order."""

    options: BuildOptions = json_field(flatten=True, default_factory=BuildOptions)
    """The build's ``BuildOptions``, as given."""
    max_gap_ns: int = 0
    """``max_gap`` resolved (ns): bars further apart start a new segment."""
    bar_ns: int | None = None
    """The bar size (ns), as read or resampled to (None: unknown)."""
    fingerprint: str = ""
    """A digest of the inputs, options and versions (``staging.digest``): what a ``--resume`` must match."""
    workers: int | None = None
    """Threads the build ran on (recorded, never an option)."""


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A complete cache's root attributes (the store page lists them); ``to_json``/``from_json`` are the bytes."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("normalize", "format_version", "complete")
    """Worked out for plain readers, written after the fields, never read back (``typed_json``)."""
    format_version: ClassVar[int] = FORMAT_VERSION
    complete: ClassVar[bool] = True
    """Always true: a manifest is written last, so a cache with one is complete."""

    feature_names: list[str]
    symbols: list[str]
    groups: list[str]  # each symbol's group path, relative to the root
    bars_per_symbol: list[int]
    layout: Layout
    splits: Splits = field(default_factory=Splits)
    stats: Stats | None = None  # None with normalize="none"
    counts: Counts = field(default_factory=Counts)
    bytes: Bytes = field(default_factory=Bytes)
    rolls: dict[str, list[list[int]]] = field(default_factory=dict)  # symbol -> [[ts_ns, from id, to id], ...]
    tails: dict[str, dict[str, Any]] = field(default_factory=dict)  # symbol -> its raw last bar
    build: BuildRecord = field(default_factory=BuildRecord)
    created: str = ""
    shardcache_version: str = ""
    elapsed_s: float = 0.0
    appends: int = json_field(when_set=True, default=0)

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
        out: dict[str, Any] = dump(self)
        return out

    @classmethod
    def from_json(cls, doc: Any, *, url: str = "the cache") -> Manifest:
        """The manifest of root attributes ``doc``; a ``CacheError`` naming ``url`` for an old, newer or
        incomplete format, or a field that is missing, unknown or of another type."""
        if not isinstance(doc, Mapping):
            raise CacheError(f"{url}: the manifest is not an object; rebuild the cache")
        _check_readable(doc, url)
        try:
            manifest: Manifest = load(dict(doc), cls)
        except FieldError as exc:
            said = (
                f" has no {exc.path} (it was edited, or written by another program)"
                if exc.problem == "is missing"
                else f"'s {exc.path or 'document'} {exc.problem}"
            )
            raise CacheError(f"{url}: the manifest{said}; rebuild the cache") from None
        return manifest
