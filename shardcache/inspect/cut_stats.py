"""What a read-time cut makes of one cache, for ``shardcache info --split-times`` / ``--fold``: each split's
time range, bars and windows, and the train range's statistics per feature, from ``train_moments``: the
statistics a stream cut the same way applies with ``normalize="zscore"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, OptionTypeError
from ..format.cache import Cache
from ..format.durations import format_duration
from ..format.windows import WindowSpec, split_segments, valid_ranges
from ..read.cuts import Cut
from ..read.folds import duration_option, walk_forward
from ..read.normalize import TRAIN, train_moments
from ..read.sources import Sources
from .shared import text_table

__all__ = ["WALK_FORWARD_KEYS", "InfoCut", "cut_info", "format_cut", "walk_forward_options"]

WALK_FORWARD_KEYS = ("train", "val", "step", "embargo", "test", "expanding")
"""The keys of ``--walk-forward``: ``walk_forward``'s keyword arguments (``expanding`` alone or ``=true``)."""

_OPEN = (int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max))  # TimeCuts' open ends


def walk_forward_options(text: str) -> dict[str, Any]:
    """``--walk-forward``'s text (``"train=180D,val=30D,step=30D,embargo=1h"``) as ``walk_forward``'s keyword
    arguments, each duration checked: a malformed one is refused naming the option and the key."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = (s.strip() for s in part.partition("="))
        if key not in WALK_FORWARD_KEYS:
            problem = f"{key!r} is not one of {', '.join(WALK_FORWARD_KEYS)}"
            raise OptionError("walk_forward", text, problem)
        if key in out:
            raise OptionError("walk_forward", text, f"gives {key} twice")
        if key == "expanding":
            if sep and value.lower() not in ("true", "false"):
                raise OptionError("walk_forward", text, f"expanding={value!r}: give expanding, or expanding=true|false")
            out[key] = not sep or value.lower() == "true"
            continue
        try:
            duration_option(key, value, minimum=0 if key == "embargo" else 1)
        except OptionError as exc:
            raise OptionError("walk_forward", text, f"{key}={value!r}: {exc.problem}") from None
        out[key] = value
    missing = [k for k in ("train", "val") if k not in out]
    if missing:
        raise OptionError("walk_forward", text, f"needs {' and '.join(missing)} (e.g. train=180D,val=30D)")
    return out


@dataclass(frozen=True, kw_only=True)
class InfoCut:
    """The cut ``shardcache info`` shows, as its options give it (``--split-times``, ``--embargo``, or
    ``--walk-forward`` with ``--fold``), every value checked when made: before the cache is read."""

    split_times: str | None = None
    embargo: str | None = None
    walk_forward: str | None = None
    fold: int | None = None

    def __post_init__(self) -> None:
        if self.walk_forward is None:
            if self.fold is not None:
                raise OptionError("fold", self.fold, "needs --walk-forward to make the folds it picks from")
            Cut(split="all", split_times=self.split_times, embargo=self.embargo).describe()  # each value checked
            return
        for name, value in (("split_times", self.split_times), ("embargo", self.embargo)):
            if value is not None:
                own = " (an embargo with embargo= inside it)" if name == "embargo" else ""
                flag = "--" + name.replace("_", "-")
                raise OptionError(name, value, f"--walk-forward makes a fold's ranges{own}: drop {flag}")
        walk_forward_options(self.walk_forward)
        if self.fold is None:
            raise OptionError("walk_forward", self.walk_forward, "needs --fold K: the fold to show (0 is the first)")
        if self.fold < 0:
            raise OptionError("fold", self.fold, "must be at least 0")

    def of(self, cache: Cache) -> Cut | None:
        """The ``Cut`` over ``cache`` (None: none asked for); a fold out of range is refused before a bar is read."""
        if self.walk_forward is None:
            given = self.split_times is not None or self.embargo is not None
            return Cut(split="all", split_times=self.split_times, embargo=self.embargo) if given else None
        try:
            folds = walk_forward(cache, **walk_forward_options(self.walk_forward))
        except OptionError as exc:  # a span the cache's time range cannot hold: said as the option gave it
            if exc.option not in WALK_FORWARD_KEYS:
                raise
            raise OptionError("walk_forward", self.walk_forward, f"{exc.option}={exc.value!r} {exc.problem}") from None
        if self.fold is None or self.fold >= len(folds):
            n = len(folds)
            problem = f"out of range: --walk-forward {self.walk_forward} makes {n} folds of {cache.url} (0..{n - 1})"
            raise OptionError("fold", self.fold, problem)
        return Cut(split="all", fold=folds[self.fold])


def _when(ns: int | None) -> int | None:
    return None if ns is None or ns in _OPEN else int(ns)


def cut_info(cache: Cache, cut: Cut, spec: WindowSpec) -> dict[str, Any]:
    """``cut`` (its ``split`` aside) over ``cache``: each split's range (``start_ns``, ``stop_ns``; None: open),
    where its bars end (``end_ns``: the stop, or the embargo before the next range's start), its bars and its
    windows at ``spec``; and the mean and std per feature over the train range's bars (``stats``)."""
    sources = Sources([cache], cut=Cut(split="all", split_times=cut.split_times, fold=cut.fold, embargo=cut.embargo))
    times = cut.times(cache)
    if times is None:
        raise OptionTypeError("cut_info takes a cut with split_times=, embargo= or fold=")
    table = sources.tables[0]
    splits = []
    for name, start, stop, end in zip(times.names, times.starts, times.stops, times.ends()):
        seg = split_segments(table, name)
        splits.append(
            {
                "name": name,
                "start_ns": _when(start),
                "stop_ns": _when(stop),
                "end_ns": _when(end),
                "bars": int((seg[:, 2] - seg[:, 1]).sum()),
                "first_bar_ns": int(cache.bar_times(seg[:, 1]).min()) if len(seg) else None,
                "last_bar_ns": int(cache.bar_times(seg[:, 2] - 1).max()) if len(seg) else None,
                "windows": valid_ranges(table, spec, split=name).total(),
            }
        )
    moments = train_moments(sources)[0].merged()
    bars = int(moments.count[0])
    stats = {
        n: {"mean": float(m), "std": float(s)} for n, m, s in zip(cache.feature_names, moments.mean[0], moments.std[0])
    }
    return {
        "describe": cut.describe(),
        "fold": None
        if cut.fold is None
        else {"index": cut.fold.index, "train": list(cut.fold.train), "val": list(cut.fold.val)},
        "embargo_ns": times.embargo,
        "splits": splits,
        "stats_range": TRAIN if TRAIN in times.names else "all",
        "stats_bars": bars,
        "stats": stats if bars else None,
        "normalized_at_build": cache.manifest.normalize != "none",
    }


def _utc(ns: int | None, open_end: str) -> str:
    if ns is None:
        return open_end
    return str(np.datetime64(int(ns), "ns").astype("datetime64[s]")).replace("T", " ")


def format_cut(doc: dict[str, Any]) -> list[str]:
    """``cut_info``'s document for people: a line saying the cut, a table of its splits, the train statistics."""
    embargo = (
        f"; each range ends {format_duration(doc['embargo_ns'])} before the next one starts"
        if doc["embargo_ns"]
        else ""
    )
    lines = [f"cut       {doc['describe']}{embargo}"]
    rows: list[tuple[str, ...]] = [
        (
            str(s["name"]),
            _utc(s["start_ns"], "first bar"),
            _utc(s["end_ns"], "last bar"),
            f"{s['bars']:,}",
            f"{s['windows']:,}",
        )
        for s in doc["splits"]
    ]
    lines += text_table(("split", "from (UTC)", "until (UTC)", "bars", "windows"), rows, "lllrr", indent="  ")
    what = "stored values, z-scored at build" if doc["normalized_at_build"] else 'what normalize="zscore" applies'
    head = f"{doc['stats_range']} statistics over {doc['stats_bars']:,} bars ({what})"
    if doc["stats"] is None:
        return [*lines, f"{head}: none, the range has no bars"]
    lines.append(head)
    stats = [(str(n), f"{v['mean']:+.6g}", f"{v['std']:.6g}") for n, v in doc["stats"].items()]
    return lines + text_table(("feature", "mean", "std"), stats, "lrr", indent="  ")
