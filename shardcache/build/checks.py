"""The build's checks: options before any input is read, then what the inputs must agree on.

Each check ends a build with one :class:`~shardcache.errors.ShardcacheError` line naming the
option or the files, or logs a warning for what it keeps (unmapped instruments, empty splits).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CacheError, ShardcacheError
from ..format.layout import CODECS
from ..format.paths import probe
from .sources import Source, format_duration, parse_duration
from .sources.csv import parse_delimiter
from .splits import SplitSpec

__all__ = ["BUILD_OPTIONS", "check_bar_sizes", "check_options", "check_splits", "resolve_unmapped", "stats_source"]

log = logging.getLogger("shardcache")

# The options a cache is built with, recorded in its manifest's "build": an append keeps them,
# ``--stats recompute`` rebuilds with them.
BUILD_OPTIONS = (
    "features",
    "normalize",
    "split",
    "max_gap",
    "bar",
    "ts_column",
    "symbol_column",
    "csv_delimiter",
    "columns",
    "shard_rows",
    "chunk_rows",
    "codec",
    "seq_len",
    "horizon",
)


def _positive(flag: str, value: Any, *, zero: bool = False) -> None:
    """Refuse a non-integer, negative (or, unless ``zero``, zero) value of ``flag``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ShardcacheError(f"{flag} {value!r}: expected a whole number")
    if value < 0 or (value == 0 and not zero):
        raise ShardcacheError(f"{flag} {value}: must be {'0 or more' if zero else 'at least 1'}")


def check_options(
    *,
    seq_len: int,
    horizon: int,
    shard_rows: int | None,
    chunk_rows: int | None,
    workers: int | None,
    bar: str | None,
    max_gap: str | int | None,
    csv_delimiter: str | None = None,
    normalize: str = "zscore",
    codec: str = "blosc-lz4",
    out: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Refuse malformed options before any input is read or anything is written: numbers, durations,
    the CSV delimiter, choices, and an ``out`` URL whose store does not answer (``format.paths.probe``)."""
    if normalize not in ("zscore", "none"):
        raise ShardcacheError(f"--normalize {normalize!r}: choose zscore or none")
    if codec not in CODECS:
        raise ShardcacheError(f"--codec {codec!r}: choose one of {', '.join(CODECS)}")
    parse_delimiter(csv_delimiter)
    problem = None if out is None else probe(out, storage_options)
    if problem is not None:
        raise CacheError(f"{out}: {problem}")
    _positive("--seq-len", seq_len)
    _positive("--horizon", horizon, zero=True)
    _positive("--shard-rows", shard_rows)
    _positive("--chunk-rows", chunk_rows)
    _positive("--workers", workers)
    if shard_rows is not None and chunk_rows is not None and chunk_rows > shard_rows:
        raise ShardcacheError(f"--chunk-rows {chunk_rows}: must not exceed --shard-rows {shard_rows}")
    if shard_rows is not None and chunk_rows is not None and shard_rows % chunk_rows:
        raise ShardcacheError(f"--chunk-rows {chunk_rows}: must divide --shard-rows {shard_rows}")
    if bar is not None and _signed_duration("--bar", bar) <= 0:
        raise ShardcacheError(f"--bar {bar!r}: must be a positive duration such as 1s, 1m or 5m")
    if isinstance(max_gap, str) and max_gap != "auto" and _signed_duration("--max-gap", max_gap) < 0:
        raise ShardcacheError(f"--max-gap {max_gap!r}: must be 0 (never cut) or more")
    elif isinstance(max_gap, int) and max_gap < 0:
        raise ShardcacheError(f"--max-gap {max_gap}: must be 0 (never cut) or more")


def _signed_duration(flag: str, text: str) -> int:
    """``text`` as ns, a leading ``-`` kept (so the option can say which values it takes); one line if malformed."""
    body = str(text).strip()
    negative = body.startswith("-") and body[1:2].isdigit()
    try:
        ns = parse_duration(body[1:] if negative else body)
    except ValueError as exc:
        raise ShardcacheError(f"{flag} {text!r}: {exc}") from None
    return -ns if negative else ns


def check_bar_sizes(srcs: Sequence[Source], steps: Sequence[int | None], bar: str | None) -> int | None:
    """The one bar size of a build's inputs, in ns; refuse two sizes, or a ``bar`` a table cannot give.

    DBN files know theirs from the schema (and ``bar``); Parquet and CSV files from the most
    common step between consecutive bars (``steps``, None for a file with no two bars of a symbol).
    """
    sizes: dict[int, str] = {}
    for src, step in zip(srcs, steps):
        size = src.bar_ns
        if size is None and step is not None:
            size = step
            want = getattr(src, "bar_request", None)
            if want is not None and want < step:
                raise ShardcacheError(
                    f"--bar {bar}: {src.path} holds {format_duration(step)} bars; a coarser "
                    "input never gives finer bars"
                )
            if want is not None and want != step:
                raise ShardcacheError(
                    f"--bar {bar}: {src.path} holds {format_duration(step)} bars and "
                    f"{src.kind} bars are taken as they are; resample them before the build, "
                    "or drop --bar"
                )
            src.bar_ns = step
        if size is not None:
            sizes.setdefault(size, src.path)
    if len(sizes) > 1:
        (a, path_a), (b, path_b) = list(sizes.items())[:2]
        raise ShardcacheError(
            f"{path_b}: {format_duration(b)} bars, but {path_a} has {format_duration(a)} bars; one "
            "cache holds one bar size (build them apart, or resample DBN bars with --bar)"
        )
    return next(iter(sizes), None)


def resolve_unmapped(paths: Sequence[str], symbols: Sequence[list[str]], symbology: Sequence[dict]) -> dict[str, int]:
    """Name each DBN file's unmapped instruments from another file's mappings where one has them.

    ``symbols[i]`` (file i's symbol names) is renamed in place. Warns once per file and
    returns the counts for the manifest (empty when every record was mapped).
    """
    names: dict[int, set[str]] = {}  # ids come as strings (plain JSON)
    for info in symbology:
        for iid, name in (info.get("ids") or {}).items():
            names.setdefault(int(iid), set()).add(name)
    records = Counter()
    named = outside = 0
    for path, syms, info in zip(paths, symbols, symbology):
        outside += int(info.get("outside") or 0)
        for iid, n in (info.get("unmapped") or {}).items():
            records[int(iid)] += n
            other = names.get(int(iid), set())
            if len(other) == 1 and str(iid) in syms:
                name = next(iter(other))
                syms[syms.index(str(iid))] = name
                named += 1
                log.warning(
                    "%s: instrument %s has no symbol mapping here (%d records); named %s from another input's mappings",
                    path,
                    iid,
                    n,
                    name,
                )
            else:
                log.warning(
                    "%s: instrument %s has no symbol mapping (%d records); kept as symbol '%s'", path, iid, n, iid
                )
        if info.get("outside"):
            log.warning(
                "%s: %d records dated outside their instrument's mapping dates; each took its nearest mapping",
                path,
                info["outside"],
            )
    if not records and not outside:
        return {}
    return {
        "instruments": len(records),
        "records": int(sum(records.values())),
        "named_from_other_inputs": named,
        "outside_mapping_dates": outside,
    }


def stats_source(spec: SplitSpec, normalize: str) -> str | None:
    """Where z-score statistics come from: ``"train"``, ``"all"`` (no splits) or None (no
    normalization); refuse, before any input is read, a layout with splits but no train."""
    if normalize != "zscore":
        return None
    if spec.names == ["all"]:
        return "all"
    if "train" not in spec.names:
        raise ShardcacheError(
            f"--split {spec.text!r}: --normalize zscore takes its statistics from a split named "
            "train, and this layout has none; name one train, or pass --normalize none"
        )
    return "train"


def check_splits(spec: SplitSpec, stats_of: str | None, bars: dict[str, int]) -> None:
    """Refuse z-score statistics over an empty train split; warn about other splits with no bars."""
    if stats_of == "train" and not bars.get("train"):
        raise ShardcacheError(
            f"--split {spec.text!r}: the train split has no bars, so --normalize zscore has no "
            "statistics; move the split dates later, or pass --normalize none"
        )
    for name in spec.names:
        if len(spec.names) > 1 and not bars.get(name):
            log.warning("split %s has no bars (its dates are after all data?); it will give no windows", name)
