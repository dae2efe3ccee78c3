"""The build's checks of what the inputs must agree on (``BuildOptions`` checks the options): each ends a
build with one line naming the option or the files, or warns of what it keeps (unmapped ids, empty splits)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import OptionError, ShardcacheError
from ..format.durations import format_duration
from ..format.splits import SplitSpec
from .sources import Source

__all__ = ["check_bar_sizes", "check_splits", "resolve_unmapped"]

log = logging.getLogger("shardcache")


def check_bar_sizes(srcs: Sequence[Source], steps: Sequence[int | None], bar: str | None) -> int | None:
    """The one bar size of a build's inputs, in ns; refuse two sizes, or a ``bar`` a table cannot give. DBN files
    know theirs; tables give the most common step between bars (``steps``, None without two bars of a symbol)."""
    sizes: dict[int, str] = {}
    for src, step in zip(srcs, steps):
        size = src.bar_ns
        if size is None and step is not None:
            size = step
            want = getattr(src, "bar_request", None)
            if want is not None and want < step:
                raise OptionError(
                    "bar", bar, f"{src.path} holds {format_duration(step)} bars; a coarser input never gives finer bars"
                )
            if want is not None and want != step:
                raise OptionError(
                    "bar",
                    bar,
                    f"{src.path} holds {format_duration(step)} bars and {src.kind} bars are taken as they are; "
                    "resample them before the build, or drop {bar}",
                    {"bar": None},
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


def resolve_unmapped(
    paths: Sequence[str], symbols: Sequence[list[str]], symbology: Sequence[dict[str, Any]]
) -> dict[str, int]:
    """Name each DBN file's unmapped instruments from another file's mappings where one has them, in place in
    ``symbols[i]`` (file i's names); warn per file and return the manifest's counts (empty: all mapped)."""
    names: dict[int, set[str]] = {}  # ids come as strings (plain JSON)
    for info in symbology:
        for iid, name in (info.get("ids") or {}).items():
            names.setdefault(int(iid), set()).add(name)
    records: Counter[int] = Counter()
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
            nearest = "dated outside their instrument's mapping dates; each took its nearest mapping"
            log.warning("%s: %d records " + nearest, path, info["outside"])
    if not records and not outside:
        return {}
    return {
        "instruments": len(records),
        "records": int(sum(records.values())),
        "named_from_other_inputs": named,
        "outside_mapping_dates": outside,
    }


def check_splits(spec: SplitSpec, stats_of: str | None, bars: dict[str, int]) -> None:
    """Refuse z-score statistics over an empty train split; warn about other splits with no bars."""
    if stats_of == "train" and not bars.get("train"):
        raise OptionError(
            "split",
            spec.text,
            "the train split has no bars, so z-score normalization has no statistics; move the split dates "
            "later, or pass {normalize}",
            {"normalize": "none"},
        )
    for name in spec.names:
        if len(spec.names) > 1 and not bars.get(name):
            log.warning("split %s has no bars (its dates are after all data?); it will give no windows", name)
