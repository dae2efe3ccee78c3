"""Check a cache end to end: checksums, shard digests, timestamps and the segment tables.

``verify_cache`` (``shardcache verify CACHE``) re-reads the whole cache one shard at a
time, so memory stays at one shard whatever the cache size, and names every problem by the
store key it concerns (``symbols/3/features/c/0/0``, ``symbols/3/time/c/0``, ``segments``):

* a shard object that is missing, or that fails to decode: zarr checks the crc32c of
  every inner chunk and of the shard index, so flipped or truncated bytes show up here;
* a shard whose decoded rows differ from the digest recorded at build time (the
  ``digests`` attribute of each symbol's ``features``, see ``layout.shard_digest``);
* a symbol's timestamps that do not strictly increase, a symbol's segment table
  (``segment_start``/``segment_stop``/``segment_split``) that does not tile its rows in
  order or disagrees with the root ``segments`` index, split ids outside the manifest's
  splits, and array shapes or chunking that disagree with the manifest.

A cache that cannot be opened at all (missing, incomplete, old or newer format, damaged
segment index) raises ``CacheError`` instead of returning a report.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from ..format.cache import Cache, open_cache
from ..format.layout import describe_damage, shard_digest

__all__ = ["Problem", "VerifyReport", "compare_caches", "verify_cache"]

_VOLATILE = ("created", "elapsed_s")  # manifest entries that differ between two runs of one build


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a cache: the store key (or array) it concerns and what is wrong."""

    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"


@dataclass(kw_only=True)
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
            "path": self.path,
            "ok": self.ok,
            "shards": self.shards,
            "rows": self.rows,
            "digests_checked": self.digests_checked,
            "bad_shards": self.bad_shards,
            "problems": [{"key": p.key, "problem": p.problem} for p in self.problems],
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def format(self) -> str:
        """The report for people: one line per problem, then a verdict."""
        lines = [str(p) for p in self.problems]
        what = (
            f"{self.shards} shards, {self.rows:,} rows, {self.digests_checked} digests checked "
            f"in {self.elapsed_s:.1f} s"
        )
        if self.ok:
            lines.append(f"{self.path}: OK ({what})")
        else:
            lines.append(f"{self.path}: {len(self.problems)} problem(s), {len(self.bad_shards)} bad shard(s) ({what})")
        return "\n".join(lines)


# what zarr and the codecs raise for damaged bytes or metadata, and Cache for a missing array (a CacheError
# is a ValueError); an OSError (a store that stopped answering) is not damage and ends the check
_DAMAGE = (ValueError, RuntimeError, TypeError, KeyError, IndexError)


def _key_order(key: str) -> tuple[tuple[int, int, str], ...]:
    """Store keys in numeric order of their parts (``symbols/2/...`` before ``symbols/10/...``)."""
    return tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in key.split("/"))


def _read(cache: Cache, shard: int, array: str, a: int, b: int, problems: list[Problem]) -> np.ndarray | None:
    """Local rows ``[a, b)`` of one shard of a symbol's ``array``, or None after recording why they cannot be had."""
    key = cache.shard_key(shard, array)
    if not cache.shard_exists(shard, array):
        problems.append(Problem(key, "missing"))
        return None
    try:
        return np.asarray(cache.array(cache.shard_symbol(shard)[0], array)[a:b])
    except _DAMAGE as exc:  # checksum mismatch (ValueError) or a codec error; an OSError is no damage
        problems.append(Problem(key, f"corrupt ({describe_damage(exc)})"))
        return None


def _check_symbol(cache: Cache, i: int, problems: list[Problem]) -> list[str | None] | None:
    """Symbol ``i``'s array shapes and chunking and its segment table; its recorded digests."""
    n, path = int(cache.bars_per_symbol[i]), cache.groups[i]
    f, t = cache.array(i, "features"), cache.array(i, "time")
    if f.shape != (n, cache.n_features):
        problems.append(Problem(f"{path}/features", f"shape {f.shape}, manifest says {(n, cache.n_features)}"))
    if t.shape != (n,):
        problems.append(Problem(f"{path}/time", f"shape {t.shape}, manifest says {(n,)}"))
    if f.shards is None or f.shards[0] != cache.shard_rows:
        problems.append(
            Problem(f"{path}/features", f"shards of {f.shards and f.shards[0]} rows, manifest says {cache.shard_rows}")
        )
    if t.chunks[0] != cache.shard_rows:
        problems.append(Problem(f"{path}/time", f"chunks of {t.chunks[0]} rows, manifest says {cache.shard_rows}"))
    index = cache.local_segments[cache.local_segments[:, 0] == i]
    sym = cache.symbols[i]
    if not len(index) or index[0, 1] != 0 or index[-1, 2] != n:
        problems.append(Problem("segments", f"{sym}'s segments do not cover its rows 0-{n}"))
    gaps = np.flatnonzero(index[1:, 1] != index[:-1, 2])
    if len(gaps):
        problems.append(
            Problem(
                "segments",
                f"{len(gaps)} gap(s) or overlap(s) in {sym}'s rows, first after row {int(index[gaps[0], 2])}",
            )
        )
    empty = np.flatnonzero(index[:, 2] <= index[:, 1])
    if len(empty):
        problems.append(
            Problem(
                "segments",
                f"{len(empty)} empty or reversed segment(s) of {sym}, first at row {int(index[empty[0], 1])}",
            )
        )
    if len(index) and (index[:, 3].min() < 0 or index[:, 3].max() >= len(cache.split_names)):
        problems.append(Problem("segments", f"split ids outside 0-{len(cache.split_names) - 1}"))
    try:
        table = np.stack(
            [
                np.asarray(cache.array(i, name)[...], dtype=np.int64)
                for name in ("segment_start", "segment_stop", "segment_split")
            ],
            axis=1,
        ).reshape(-1, 3)
    except _DAMAGE as exc:  # missing or damaged
        problems.append(Problem(f"{path}/segment_start", f"unreadable ({describe_damage(exc)})"))
    else:
        if not np.array_equal(table, index[:, 1:]):
            problems.append(
                Problem(f"{path}/segment_start", "the symbol's segment table differs from the root segments index")
            )
    digests = f.attrs.get("digests")
    expected = -(-n // cache.shard_rows)
    if digests is not None and not isinstance(digests, list):
        problems.append(Problem(f"{path}/features", f"shard digests are not a list: {digests!r:.60}"))
        return None
    if digests is not None and len(digests) != expected:
        problems.append(Problem(f"{path}/features", f"{len(digests)} shard digests for {expected} shards"))
        return None
    return [None if d is None else str(d) for d in digests] if digests is not None else None


def _check_manifest(cache: Cache, problems: list[Problem]) -> None:
    """Counts and the root segment index against the manifest."""
    if len(cache.groups) != len(cache.symbols) or len(cache.bars_per_symbol) != len(cache.symbols):
        problems.append(
            Problem(
                "manifest",
                f"{len(cache.groups)} groups and {len(cache.bars_per_symbol)} bar "
                f"counts for {len(cache.symbols)} symbols",
            )
        )
    if int(cache.bars_per_symbol.sum()) != cache.n_bars:
        problems.append(
            Problem(
                "manifest", f"bars per symbol add up to {int(cache.bars_per_symbol.sum())}, counts say {cache.n_bars}"
            )
        )
    expected = cache.manifest.counts.segments
    if expected != len(cache.segments):
        problems.append(Problem("segments", f"{len(cache.segments)} segments, manifest says {expected}"))


def verify_cache(
    path: str | os.PathLike[str] | Cache, storage_options: dict[str, Any] | None = None, *, progress: bool = False
) -> VerifyReport:
    """Re-read every shard of the cache at ``path`` and report what is wrong (see the module docstring)."""
    t0 = time.perf_counter()
    cache = open_cache(path, storage_options)
    problems: list[Problem] = []
    _check_manifest(cache, problems)
    checked, rows = 0, cache.shard_rows
    show = progress and sys.stderr.isatty()
    with tqdm(total=cache.n_shards, desc="verify", unit="shard", leave=False, disable=not show) as bar:
        for i in range(len(cache.symbols)):
            digests = _check_symbol(cache, i, problems)
            first, n, prev = int(cache.bases[i]) // rows, int(cache.bars_per_symbol[i]), None
            for k in range(-(-n // rows)):
                shard, a, b = first + k, k * rows, min((k + 1) * rows, n)
                feats = _read(cache, shard, "features", a, b, problems)
                if feats is not None and digests is not None:
                    checked += 1
                    if shard_digest(feats.astype(np.float32, copy=False)) != digests[k]:
                        problems.append(
                            Problem(cache.shard_key(shard), "rows differ from the digest recorded at build time")
                        )
                ts = _read(cache, shard, "time", a, b, problems)
                if ts is not None and len(ts):
                    ts = ts.astype(np.int64, copy=False)
                    bad = np.flatnonzero(ts[1:] <= ts[:-1]) + 1
                    if prev is not None and ts[0] <= prev:
                        bad = np.r_[0, bad]
                    if len(bad):
                        problems.append(
                            Problem(
                                cache.shard_key(shard, "time"),
                                f"timestamps not strictly increasing at {len(bad)} row(s), first "
                                f"at row {a + int(bad[0])} of {cache.symbols[i]}",
                            )
                        )
                    prev = int(ts[-1])
                else:
                    prev = None
                bar.update()
    cache.check_same()
    return VerifyReport(
        path=cache.url,
        shards=cache.n_shards,
        rows=cache.n_bars,
        digests_checked=checked,
        problems=problems,
        elapsed_s=time.perf_counter() - t0,
    )


def compare_caches(
    a: str | os.PathLike[str] | Cache, b: str | os.PathLike[str] | Cache, storage_options: dict[str, Any] | None = None
) -> list[str]:
    """How two caches differ, array for array and in the manifest (less build times); [] when identical.

    Reads one shard of each at a time, e.g. to check that a resumed build equals a clean one.
    """
    ca, cb = open_cache(a, storage_options), open_cache(b, storage_options)
    out = []
    ma, mb = ({k: v for k, v in c.manifest.to_json().items() if k not in _VOLATILE} for c in (ca, cb))
    out += [
        f"manifest[{k!r}]: {ma.get(k)!r} != {mb.get(k)!r}" for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)
    ]
    if ca.history().get("sources") != cb.history().get("sources"):
        out.append("history['sources'] differs")
    for name in ("segments", "segment_split", "bars_per_symbol"):
        if not np.array_equal(getattr(ca, name), getattr(cb, name)):
            out.append(f"{name} differ")
    if ca.shard_rows != cb.shard_rows or not np.array_equal(ca.shard_table, cb.shard_table):
        return [*out, "shards differ (shard rows or bars per symbol)"]
    for shard, lo, hi in ca.shard_table.tolist():
        if not np.array_equal(ca.read_rows(lo, hi), cb.read_rows(lo, hi), equal_nan=True):
            out.append(f"{ca.shard_key(shard)} differs")
        if not np.array_equal(ca.bar_times(np.arange(lo, hi)), cb.bar_times(np.arange(lo, hi))):
            out.append(f"{ca.shard_key(shard, 'time')} differs")
    return out
