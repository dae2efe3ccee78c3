"""Check a cache end to end: every stored object once, against the root index and the manifest.

``verify_cache`` (``shardcache verify``) reads each object once, whole (many at once on an object store,
memory bounded), and names each problem by its store key: a shard or time chunk missing or failing its
crc32c; rows unlike the build's digest (``shard_digests``), or a size or bar time unlike the ``shards``
index; timestamps that do not increase; a ``zarr.json`` unlike the one ``build-cache`` writes
(hard-linked ones joined, ``inspect.shared``); segments that do not tile each symbol's rows. A cache
that cannot be opened raises ``CacheError``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

from ..format.cache import Cache, open_cache
from ..format.decode import ChunkError, MissingShard, ShardDecoder, decode_shard
from ..format.index import ShardIndex
from ..format.layout import chunk_codec, chunk_key, describe_damage, shard_digest
from ..format.metadata import SymbolDocuments, symbol_documents
from ..format.moments import Moments
from ..format.objects import Objects
from .shared import join_shared

__all__ = ["Problem", "VerifyReport", "compare_caches", "verify_cache"]

_VOLATILE = ("created", "elapsed_s")  # manifest entries that differ between two runs of one build


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a cache: the store key (or array) it concerns and what is wrong."""

    key: str
    problem: str
    shared: tuple[str, ...] = ()  # the documents that are one hard-linked file with ``key`` (``join_shared``)

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


@dataclass(kw_only=True)
class VerifyReport:
    """What ``verify_cache`` checked and found; ``ok`` when nothing is wrong."""

    path: str
    """The cache verified."""
    shards: int
    """Shard objects read."""
    rows: int
    """Rows decoded."""
    digests_checked: int
    """Shards whose digest was compared with the root index."""
    problems: list[Problem] = field(default_factory=list)
    """Every problem found (none: the cache is intact)."""
    elapsed_s: float = 0.0
    """Seconds the check took."""

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    @property
    def bad_shards(self) -> list[str]:
        """Keys of the shard objects with a problem, in order."""
        return sorted({p.key for p in self.problems if "/c." in p.key}, key=_key_order)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "path": self.path,
            "ok": self.ok,
            "shards": self.shards,
            "rows": self.rows,
            "digests_checked": self.digests_checked,
            "bad_shards": self.bad_shards,
            "problems": [
                {"key": p.key, "problem": p.problem, **({"shared": list(p.shared)} if p.shared else {})}
                for p in self.problems
            ],
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def format(self) -> str:
        """The report for people: one line per problem, then a verdict."""
        what = f"{self.shards} shards, {self.rows:,} rows, {self.digests_checked} digests checked"
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s), {len(self.bad_shards)} bad shard(s)"
        return "\n".join([*map(str, self.problems), f"{self.path}: {verdict} ({what} in {self.elapsed_s:.1f} s)"])


def _key_order(key: str) -> tuple[tuple[int, int, str], ...]:
    """Store keys in numeric order of their parts (``symbols/2/...`` before ``symbols/10/...``)."""
    return tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"[/.]", key))


class _Fetched(ShardDecoder):
    """A shard decoder over objects already fetched (``objects``, key -> bytes or None): no request."""

    objects: dict[str, bytes | None]

    def _get(self, key: str, byte_range: Any = None) -> np.ndarray | None:
        if (data := self.objects.get(key)) is None:
            return None
        raw = np.frombuffer(data, dtype=np.uint8)
        if isinstance(byte_range, SuffixByteRequest):
            return raw[max(len(raw) - byte_range.suffix, 0) :]
        if isinstance(byte_range, RangeByteRequest):
            return raw[byte_range.start : byte_range.end]
        return raw


def _check_segments(cache: Cache, problems: list[Problem]) -> None:
    """The root segment index: each symbol's segments tile its rows in order, none empty, known split ids."""
    local = cache.local_segments[np.argsort(cache.local_segments[:, 0], kind="stable")]
    sym, start, stop = local[:, 0], local[:, 1], local[:, 2]
    n, names = cache.bars_per_symbol, cache.manifest.symbols
    first = np.searchsorted(sym, np.arange(len(n)))  # each symbol's first segment (its last: the next's - 1)
    last = np.searchsorted(sym, np.arange(len(n)), side="right") - 1
    covered = (last >= first) & (start[np.minimum(first, len(local) - 1)] == 0) & (stop[np.maximum(last, 0)] == n)
    joins = np.flatnonzero((sym[1:] == sym[:-1]) & (start[1:] != stop[:-1]))  # a gap or an overlap
    empty = np.flatnonzero(stop <= start)
    for i in np.flatnonzero(~covered).tolist():
        problems.append(Problem("segments", f"{names[i]}'s segments do not cover its rows 0-{int(n[i])}"))
    for bad, row, say in (
        (joins, stop, "{} gap(s) or overlap(s) in {}'s rows, first after row {}"),
        (empty, start, "{} empty or reversed segment(s) of {}, first at row {}"),
    ):
        for i in np.unique(sym[bad]).tolist():
            mine = bad[sym[bad] == i]
            problems.append(Problem("segments", say.format(len(mine), names[i], int(row[mine[0]]))))
    if len(local) and (local[:, 3].min() < 0 or local[:, 3].max() >= len(cache.split_names)):
        problems.append(Problem("segments", f"split ids outside 0-{len(cache.split_names) - 1}"))


def _check_document(key: str, data: bytes | None, want: bytes, problems: list[Problem]) -> None:
    """A stored ``zarr.json`` against the one ``build-cache`` writes (compared as JSON)."""
    if data is None:
        problems.append(Problem(key, "missing"))
        return
    if data == want:
        return
    try:
        got = json.loads(data)
    except ValueError as exc:
        problems.append(Problem(key, f"unreadable ({describe_damage(exc)})"))
        return
    expected = json.loads(want)
    if not isinstance(got, dict):
        problems.append(Problem(key, "not a zarr.json document"))
    elif got.get("shape") != expected.get("shape"):  # named by its array, not its document
        shape, manifest = tuple(got.get("shape") or ()), tuple(expected["shape"])
        problems.append(Problem(key.removesuffix("/zarr.json"), f"shape {shape}, manifest says {manifest}"))
    elif got != expected:
        keys = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        problems.append(
            Problem(key, f"differs from the zarr.json build-cache writes for this layout ({', '.join(keys)})")
        )


def _batches(cache: Cache, limit: int = 64 << 20) -> Iterator[list[int]]:
    """Symbols in order, grouped so that each group's stored shards hold about ``limit`` bytes at most."""
    sizes = np.bincount(cache.root_shards[:, 0], weights=cache.root_shards[:, 5], minlength=len(cache.symbols))
    batch: list[int] = []
    total = 0.0
    for i, size in enumerate(sizes.tolist()):
        if batch and (total + size > limit or len(batch) >= 512):
            yield batch
            batch, total = [], 0.0
        batch.append(i)
        total += size
    if batch:
        yield batch


class _Checker:
    """Every check of one shard's objects, against the root index."""

    def __init__(self, cache: Cache, objects: Objects, problems: list[Problem]) -> None:
        self.cache, self.problems = cache, problems
        self.table = cache.root_shards
        self.index: ShardIndex | None = None
        try:
            self.index = cache.shard_index()
        except Exception as exc:  # noqa: BLE001 - a damaged digest or moments array is a finding, not the end
            problems.append(Problem("shard_digests", f"unreadable ({describe_damage(exc)})"))
        self.digests = None if self.index is None else self.index.digests
        self.store = objects.store
        self.chunks = cache.symbol_chunks
        self._decoders: dict[int, _Fetched] = {}
        self.time_codec = chunk_codec("zstd")
        self.checked = 0

    def documents(self, i: int) -> SymbolDocuments:
        """Symbol ``i``'s ``zarr.json`` documents as ``build-cache`` writes them (its inner chunks' size)."""
        c = self.cache
        return symbol_documents(c.n_features, c.shard_rows, int(self.chunks[i]), c.manifest.layout.codec)

    def features(self, objects: dict[str, bytes | None], i: int, shard: int, a: int, b: int) -> None:
        """Shard ``shard``'s ``features`` object: decoded, its size and digest against the index."""
        key, chunk_rows = self.cache.shard_key(shard), int(self.chunks[i])
        if chunk_rows not in self._decoders:  # one decoder per inner-chunk size; ``like`` it for each symbol
            self._decoders[chunk_rows] = _Fetched.from_metadata(self.store, "", self.documents(i).features_metadata(0))
        path = f"{self.cache.manifest.groups[i]}/features"  # not ``Cache.groups``: a copy of every symbol's
        dec = self._decoders[chunk_rows].like(path, int(self.cache.bars_per_symbol[i]))
        dec.objects = objects
        try:
            rows = dec.read(a, b)
        except MissingShard:
            self.problems.append(Problem(key, "missing"))
            return
        except ChunkError as exc:
            self.problems.append(Problem(key, f"corrupt ({describe_damage(exc)})"))
            return
        if self.digests is not None:
            self.checked += 1
            if shard_digest(rows) != self.digests[shard].astype("<u8").tobytes().hex():
                self.problems.append(Problem(key, "rows differ from the digest recorded at build time"))
            self.moments(key, shard, rows, chunk_rows)
        size, want = len(objects[key] or b""), int(self.table[shard, 5])
        if size != want:
            self.problems.append(Problem(key, f"{size:,} bytes, the root index (shards) says {want:,}"))

    def moments(self, key: str, shard: int, rows: np.ndarray, chunk_rows: int) -> None:
        """The shard's inner chunks' moments at the root against those of its decoded rows."""
        assert self.index is not None
        first = self.index.first_chunks
        stored = self.index.moments.select(np.arange(first[shard], first[shard + 1]))
        got = Moments.of(rows, np.arange(0, len(rows), max(1, chunk_rows)))
        same = np.array_equal(stored.count, got.count) and all(
            np.allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True)
            for a, b in ((stored.mean, got.mean), (stored.m2, got.m2))
        )
        if not same:
            self.problems.append(
                Problem(key, "the root's chunk moments (chunk_count, chunk_mean, chunk_m2) differ from its rows")
            )

    def times(self, data: bytes | None, i: int, shard: int, a: int, b: int, prev: int | None) -> int | None:
        """Shard ``shard``'s ``time`` object: decoded, increasing, its ends against the index; its last bar."""
        key, cache = self.cache.shard_key(shard, "time"), self.cache
        if data is None:
            self.problems.append(Problem(key, "missing"))
            return None
        try:
            ts = decode_shard(data, cache.shard_rows, int(self.chunks[i]), self.time_codec, np.int64, 0)[: b - a]
        except ChunkError as exc:
            self.problems.append(Problem(key, f"corrupt ({describe_damage(exc)})"))
            return None
        bad = np.flatnonzero(ts[1:] <= ts[:-1]) + 1
        if prev is not None and ts[0] <= prev:
            bad = np.r_[0, bad]
        if len(bad):
            at = f"first at row {a + int(bad[0])} of {cache.manifest.symbols[i]}"
            self.problems.append(Problem(key, f"timestamps not strictly increasing at {len(bad)} row(s), {at}"))
        (first, last), held = self.table[shard, 3:5].tolist(), (int(ts[0]), int(ts[-1]))
        if held != (first, last):
            says = f"first and last bar times {first}, {last}; the time chunk holds {held[0]}, {held[1]}"
            self.problems.append(Problem("shards", f"row {shard} ({key}): {says}"))
        return held[1]


def _check_manifest(cache: Cache, problems: list[Problem]) -> None:
    """Counts and the root segment index against the manifest."""
    groups, counts, n, total = len(cache.groups), len(cache.bars_per_symbol), len(cache.symbols), cache.n_bars
    if groups != n or counts != n:
        problems.append(Problem("manifest", f"{groups} groups and {counts} bar counts for {n} symbols"))
    if (summed := int(cache.bars_per_symbol.sum())) != total:
        problems.append(Problem("manifest", f"bars per symbol add up to {summed}, counts say {total}"))
    expected = cache.manifest.counts.segments
    if expected != len(cache.segments):
        problems.append(Problem("segments", f"{len(cache.segments)} segments, manifest says {expected}"))


def verify_cache(
    path: str | os.PathLike[str] | Cache, storage_options: dict[str, Any] | None = None, *, progress: bool = False
) -> VerifyReport:
    """Read every object of the cache at ``path`` once and report what is wrong (see the module docstring)."""
    t0 = time.perf_counter()
    cache = open_cache(path, storage_options)
    problems: list[Problem] = []
    _check_manifest(cache, problems)
    objects = Objects(cache.url, cache.storage_options)
    check = _Checker(cache, objects, problems)
    rows = cache.shard_rows
    _check_segments(cache, problems)
    group = check.documents(0).group  # every group's document is the same
    _check_document("symbols/zarr.json", objects.get_many(["symbols/zarr.json"])["symbols/zarr.json"], group, problems)
    show = progress and sys.stderr.isatty()
    with tqdm(total=cache.n_shards, desc="verify", unit="shard", leave=False, disable=not show) as bar:
        for batch in _batches(cache):
            keys: list[str] = []
            for i in batch:
                n = int(cache.bars_per_symbol[i])
                keys += check.documents(i).symbol(i, n)
                keys += [chunk_key(i, a, k) for k in range(-(-n // rows)) for a in ("features", "time")]
            got = objects.get_many(keys)
            for i in batch:
                n = int(cache.bars_per_symbol[i])
                for key, want in check.documents(i).symbol(i, n).items():
                    _check_document(key, got[key], want, problems)
                first, prev = int(cache.rows.bases[i]) // rows, None
                for k in range(-(-n // rows)):
                    shard, a, b = first + k, k * rows, min((k + 1) * rows, n)
                    check.features(got, i, shard, a, b)
                    prev = check.times(got[chunk_key(i, "time", k)], i, shard, a, b, prev)
                    bar.update()
    cache.check_same()
    problems = join_shared(problems, objects.root, cache.manifest.groups, cache.manifest.symbols)
    return VerifyReport(
        path=cache.url,
        shards=cache.n_shards,
        rows=cache.n_bars,
        digests_checked=check.checked,
        problems=problems,
        elapsed_s=time.perf_counter() - t0,
    )


def compare_caches(
    a: str | os.PathLike[str] | Cache, b: str | os.PathLike[str] | Cache, storage_options: dict[str, Any] | None = None
) -> list[str]:
    """How two caches differ (arrays, the manifest less build times), a shard at a time; [] when identical."""
    ca, cb = open_cache(a, storage_options), open_cache(b, storage_options)
    ma, mb = ({k: v for k, v in c.manifest.to_json().items() if k not in _VOLATILE} for c in (ca, cb))
    out = [
        f"manifest[{k!r}]: {ma.get(k)!r} != {mb.get(k)!r}" for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)
    ]
    if ca.history().get("sources") != cb.history().get("sources"):
        out.append("history['sources'] differs")
    for name in ("segments", "segment_split", "bars_per_symbol"):
        if not np.array_equal(getattr(ca, name), getattr(cb, name)):
            out.append(f"{name} differ")
    if ca.shard_rows != cb.shard_rows or not np.array_equal(ca.rows.shard_table, cb.rows.shard_table):
        return [*out, "shards differ (shard rows or bars per symbol)"]
    for shard, lo, hi in ca.rows.shard_table.tolist():
        if not np.array_equal(ca.read_rows(lo, hi), cb.read_rows(lo, hi), equal_nan=True):
            out.append(f"{ca.shard_key(shard)} differs")
        if not np.array_equal(ca.bar_times(np.arange(lo, hi)), cb.bar_times(np.arange(lo, hi))):
            out.append(f"{ca.shard_key(shard, 'time')} differs")
    return out
