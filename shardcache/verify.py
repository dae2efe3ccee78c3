"""Check a cache end to end: checksums, shard digests, timestamps and the segment table.

``verify_cache`` (``shardcache verify CACHE``) re-reads the whole cache one shard at a
time, so memory stays at one shard whatever the cache size, and names every problem by the
store key it concerns (``features/c/3/0``, ``ts/c/3``, ``segments``):

* a shard object that is missing, or that fails to decode: zarr checks the crc32c of
  every inner chunk and of the shard index, so flipped or truncated bytes show up here;
* a shard whose decoded rows differ from the digest recorded at build time
  (``manifest["layout"]["digests"]``, see ``store.shard_digest``);
* timestamps that do not increase inside a segment, and a segment table that does not
  tile the rows (segments in row order, no gaps or overlaps, each symbol's rows together
  and, in format 2, starting at its region), valid symbol and split ids, or array shapes
  that disagree with the manifest.

Only the shards that hold rows are read (``Cache.shard_table``); in format 2 the unused
rows between symbol regions are not stored and not checked.

A cache that cannot be opened at all (missing, incomplete, newer format, damaged segment
table) raises ``CacheError`` instead of returning a report.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .store import Cache, _one_line, open_cache, shard_digest
from .tasks import Progress

__all__ = ["Problem", "VerifyReport", "compare_caches", "verify_cache"]

_VOLATILE = ("created", "elapsed_s")  # manifest entries that differ between two runs of one build


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a cache: the store key (or array) it concerns and what is wrong."""

    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


@dataclass
class VerifyReport:
    """What ``verify_cache`` checked and found; ``ok`` when nothing is wrong."""

    path: str
    shards: int
    rows: int
    digests_checked: int
    problems: list[Problem] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_shards(self) -> list[str]:
        """Keys of the shard objects with a problem, in order."""
        return sorted({p.key for p in self.problems if "/c/" in p.key}, key=_key_order)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "path": self.path, "ok": self.ok, "shards": self.shards, "rows": self.rows,
            "digests_checked": self.digests_checked, "bad_shards": self.bad_shards,
            "problems": [{"key": p.key, "problem": p.problem} for p in self.problems],
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def format(self) -> str:
        """The report for people: one line per problem, then a verdict."""
        lines = [str(p) for p in self.problems]
        what = (f"{self.shards} shards, {self.rows:,} rows, {self.digests_checked} digests checked "
                f"in {self.elapsed_s:.1f} s")
        if self.ok:
            lines.append(f"{self.path}: OK ({what})")
        else:
            lines.append(f"{self.path}: {len(self.problems)} problem(s), {len(self.bad_shards)} bad shard(s) "
                         f"({what})")
        return "\n".join(lines)


def _key_order(key: str) -> tuple[str, int]:
    head, _, rest = key.partition("/c/")
    return head, int(rest.split("/")[0]) if rest.split("/")[0].isdigit() else -1


def _read(cache: Cache, array: zarr.Array, name: str, shard: int, a: int, b: int,
          problems: list[Problem]) -> np.ndarray | None:
    """Rows ``[a, b)`` of one shard of ``array``, or None after recording why they cannot be had."""
    key = f"{name}/" + array.metadata.encode_chunk_key((shard,) + (0,) * (array.ndim - 1))
    if not cache.shard_exists(shard, name):
        problems.append(Problem(key, "missing"))
        return None
    try:
        return np.asarray(array[a:b])
    except MemoryError:
        raise
    except Exception as exc:  # checksum mismatch (ValueError) or a codec error
        problems.append(Problem(key, f"corrupt ({_one_line(exc)})"))
        return None


def _check_layout(cache: Cache, problems: list[Problem]) -> list[str] | None:
    """Array shapes and chunking against the manifest; the recorded digests, if any."""
    m = cache.manifest
    f, t = cache.features, cache.ts
    rows = cache.n_bars if cache.region_rows is None else len(cache.symbols) * cache.region_rows
    if f.shape != (rows, cache.n_features):
        problems.append(Problem("features", f"shape {f.shape}, manifest says {(rows, cache.n_features)}"))
    if t.shape != (rows,):
        problems.append(Problem("ts", f"shape {t.shape}, manifest says {(rows,)}"))
    if f.shards is not None and f.shards[0] != cache.shard_rows:
        problems.append(Problem("features", f"shards of {f.shards[0]} rows, manifest says {cache.shard_rows}"))
    digests = m.get("layout", {}).get("digests")
    if digests is not None and len(digests) != cache.n_shards:
        problems.append(Problem("manifest", f"{len(digests)} shard digests for {cache.n_shards} shards"))
    return digests


def _check_segments(cache: Cache, problems: list[Problem]) -> None:
    """The segment table tiles each symbol's rows in order, one symbol's rows together: rows
    ``[0, n_bars)`` in format 1, ``[i * region_rows, ...)`` for symbol ``i`` in format 2."""
    seg, split = cache.segments, cache.segment_split
    n = cache.n_bars
    if len(split) != len(seg):
        problems.append(Problem("segment_split", f"{len(split)} entries for {len(seg)} segments"))
    if not len(seg):
        if n:
            problems.append(Problem("segments", f"empty, but the cache has {n} rows"))
        return
    order = np.argsort(seg[:, 1], kind="stable")
    s = seg[order]
    region = cache.region_rows
    if region is None and (s[0, 1] != 0 or s[-1, 2] != n):
        problems.append(Problem("segments", f"cover rows {s[0, 1]}-{s[-1, 2]}, not 0-{n}"))
    if region is not None and int((s[:, 2] - s[:, 1]).sum()) != n:
        problems.append(Problem("segments", f"cover {int((s[:, 2] - s[:, 1]).sum())} rows, not {n}"))
    first = np.r_[True, s[1:, 0] != s[:-1, 0]]  # a symbol's first segment
    if region is not None and np.any(s[first, 1] != s[first, 0] * region):
        problems.append(Problem("segments", "a symbol's rows do not start at its region"))
    gaps = np.flatnonzero((s[1:, 1] != s[:-1, 2]) & (~first[1:] if region is not None else True))
    if len(gaps):
        i = int(gaps[0])
        problems.append(Problem("segments", f"{len(gaps)} gap(s) or overlap(s), first after row {s[i, 2]}"))
    empty = np.flatnonzero(s[:, 2] <= s[:, 1])
    if len(empty):
        first = s[empty[0], 1]
        problems.append(Problem("segments", f"{len(empty)} empty or reversed segment(s), first at row {first}"))
    ids = s[:, 0]
    if ids.min() < 0 or ids.max() >= len(cache.symbols):
        problems.append(Problem("segments", f"symbol ids outside 0-{len(cache.symbols) - 1}"))
    if int(np.count_nonzero(np.diff(ids))) + 1 != len(np.unique(ids)):
        problems.append(Problem("segments", "a symbol's rows are not together"))
    if len(split) and (split.min() < 0 or split.max() >= len(cache.split_names)):
        problems.append(Problem("segment_split", f"split ids outside 0-{len(cache.split_names) - 1}"))
    expected = cache.manifest.get("counts", {}).get("segments")
    if expected is not None and expected != len(seg):
        problems.append(Problem("segments", f"{len(seg)} segments, manifest says {expected}"))


def _check_ts(key: str, row0: int, ts: np.ndarray, starts: np.ndarray, prev: int | None,
              problems: list[Problem]) -> None:
    """Timestamps strictly increase inside each segment (``starts``: rows that begin one)."""
    bad = np.flatnonzero((ts[1:] <= ts[:-1]) & ~starts[1:]) + 1
    if prev is not None and not starts[0] and ts[0] <= prev:
        bad = np.r_[0, bad]
    if len(bad):
        problems.append(Problem(key, f"timestamps not increasing inside a segment at {len(bad)} row(s), "
                                     f"first at row {row0 + int(bad[0])}"))


def verify_cache(path: str | os.PathLike[str] | Cache, storage_options: dict | None = None, *,
                 progress: bool = False) -> VerifyReport:
    """Re-read every shard of the cache at ``path`` and report what is wrong (see the module docstring)."""
    t0 = time.perf_counter()
    cache = open_cache(path, storage_options)
    problems: list[Problem] = []
    digests = _check_layout(cache, problems)
    _check_segments(cache, problems)
    seg_starts = np.unique(cache.segments[:, 1])
    checked, prev = 0, None
    with Progress(cache.n_shards, "verify", progress, unit="shard") as bar:
        for i, (shard, a, b) in enumerate(cache.shard_table.tolist()):
            feats = _read(cache, cache.features, "features", shard, a, b, problems)
            if feats is not None and digests is not None and i < len(digests):
                checked += 1
                if shard_digest(feats.astype(np.float32, copy=False)) != digests[i]:
                    problems.append(Problem(cache.shard_key(shard),
                                            "rows differ from the digest recorded at build time"))
            ts = _read(cache, cache.ts, "ts", shard, a, b, problems)
            if ts is not None and len(ts):
                starts = np.zeros(b - a, dtype=bool)
                starts[seg_starts[(seg_starts >= a) & (seg_starts < b)] - a] = True
                key = "ts/" + cache.ts.metadata.encode_chunk_key((shard,))
                _check_ts(key, a, ts.astype(np.int64, copy=False), starts, prev, problems)
                prev = int(ts[-1])
            else:
                prev = None
            bar.update()
    cache._check_same()
    return VerifyReport(cache.url, cache.n_shards, cache.n_bars, checked, problems, time.perf_counter() - t0)


def compare_caches(a: str | os.PathLike[str] | Cache, b: str | os.PathLike[str] | Cache,
                   storage_options: dict | None = None) -> list[str]:
    """How two caches differ, array for array and in the manifest (less build times); [] when identical.

    Reads one shard of each at a time, e.g. to check that a resumed build equals a clean one.
    """
    ca, cb = open_cache(a, storage_options), open_cache(b, storage_options)
    out = []
    ma, mb = ({k: v for k, v in c.manifest.items() if k not in _VOLATILE} for c in (ca, cb))
    out += [f"manifest[{k!r}]: {ma.get(k)!r} != {mb.get(k)!r}" for k in sorted(set(ma) | set(mb))
            if ma.get(k) != mb.get(k)]
    for name in ("segments", "segment_split"):
        if not np.array_equal(getattr(ca, name), getattr(cb, name)):
            out.append(f"{name} differ")
    if (ca.features.shape != cb.features.shape or ca.shard_rows != cb.shard_rows
            or not np.array_equal(ca.shard_table, cb.shard_table)):
        return [*out, f"features: shape {ca.features.shape} != {cb.features.shape} or other shards"]
    for shard, lo, hi in ca.shard_table.tolist():
        if not np.array_equal(ca.read_rows(lo, hi), cb.read_rows(lo, hi), equal_nan=True):
            out.append(f"{ca.shard_key(shard)} differs")
        if not np.array_equal(ca.ts[lo:hi], cb.ts[lo:hi]):
            out.append(f"ts rows {lo}-{hi} differ")
    return out
