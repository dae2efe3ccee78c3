"""``BuildOptions``: what a cache is built with, checked once, recorded in its manifest.

One frozen, keyword-only record that the command line parses into, ``build_cache`` takes and an append reads
back (``Manifest.build.options``); its field names are the one list of build options. Settings of one run
(workers, overwrite, resume, ...) live apart (``shardcache.ingest.run.RunOptions``). Every check raises an
``OptionError`` naming the parameter.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, OptionTypeError
from .durations import parse_duration
from .layout import CODECS
from .numbers import whole_number
from .splits import SplitSpec, parse_split
from .typed_json import dump, json_field, load

__all__ = ["DELIMITERS", "MAX_CHUNKS", "MAX_SHARD_ROWS", "NORMALIZE", "BuildOptions", "parse_delimiter"]

NORMALIZE = ("zscore", "none")
DELIMITERS = {"comma": ",", "semicolon": ";", "tab": "\t", "pipe": "|"}
_AUTO_GAP = 3_600 * 10**9  # max_gap="auto": max(1 h, 5 bars)


def parse_delimiter(value: str | None) -> str | None:
    """The one-character delimiter that ``csv_delimiter`` names (None: sniffed from each file's header)."""
    if value is None:
        return None
    text = DELIMITERS.get(str(value).lower(), "\t" if value == "\\t" else value)
    if not isinstance(text, str) or len(text) != 1 or text in '"\r\n':
        raise OptionError("csv_delimiter", value, "must be one character such as ';', or comma, semicolon, tab, pipe")
    return text


MAX_SHARD_ROWS = 1 << 24
"""The most rows a shard takes (``shard_rows``): a reader decodes whole shards into memory."""
MAX_CHUNKS = 1 << 16
"""The most inner chunks a shard takes (``shard_rows // chunk_rows``): 16 bytes each in its index."""


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """How a cache is built: features, normalization, splits, segment gaps, input columns, layout.

    ``max_gap="auto"`` cuts segments at gaps above max(1 h, 5 bars), or at a duration in the CLI's
    forms (``"300s"``, ``"5m"``; ``0`` never cuts); ``normalize="zscore"`` standardizes every feature with train-split statistics, or
    with those of the cache ``stats_from`` (whose split cut times are then kept too);
    ``split_cuts_ns`` fixes ``split``'s cut times instead of resolving its fractions (what
    ``--stats recompute`` keeps of its cache). ``seq_len``/``horizon`` only size the summary's
    window count: windows are chosen at read time. ``columns`` may be one comma-separated text.
    """

    features: str | tuple[str, ...] | None = None
    normalize: str = "zscore"
    split: str = "none"
    max_gap: str = "auto"
    bar: str | None = None
    ts_column: str | None = None
    symbol_column: str | None = None
    csv_delimiter: str | None = None
    columns: tuple[str, ...] | None = None
    shard_rows: int | None = None
    chunk_rows: int | None = None
    codec: str = "blosc-lz4"
    seq_len: int = 60
    horizon: int = 1
    stats_from: str | None = json_field(when_set=True, default=None)
    split_cuts_ns: tuple[int, ...] | None = json_field(when_set=True, default=None)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked, normalized values are set once, here
        set_(self, "features", _features(self.features))
        set_(self, "columns", _columns(self.columns))
        for name in ("bar", "ts_column", "symbol_column", "csv_delimiter"):
            _text_or_none(name, getattr(self, name))
        if self.normalize not in NORMALIZE:
            raise OptionError("normalize", self.normalize, "choose zscore or none")
        if self.codec not in CODECS:
            raise OptionError("codec", self.codec, f"choose one of {', '.join(CODECS)}")
        parse_delimiter(self.csv_delimiter)
        for name, least in (("seq_len", 1), ("horizon", 0), ("shard_rows", 1), ("chunk_rows", 1)):
            value = getattr(self, name)
            set_(self, name, None if value is None else whole_number(name, value, least))
        _check_chunking(self.shard_rows, self.chunk_rows)
        if self.bar is not None and _signed_duration("bar", self.bar) <= 0:
            raise OptionError("bar", self.bar, "must be a positive duration such as 1s, 1m or 5m")
        set_(self, "max_gap", _max_gap(self.max_gap))
        split = "none" if self.split is None else self.split
        if not isinstance(split, str):
            raise OptionTypeError(f"split={split!r}: must be a str such as train=0.8,val=0.2 or none")
        set_(self, "split", parse_split(split).text)
        if self.stats_from is not None:
            set_(self, "stats_from", os.fspath(self.stats_from))
            if not self.stats_from.strip():
                raise OptionError("stats_from", self.stats_from, "is empty: the path or URL of a cache")
        if self.split_cuts_ns is not None:
            if self.stats_from is not None:
                raise OptionError(
                    "stats_from",
                    self.stats_from,
                    "keeps its cache's split cut times: pass it or {split_cuts_ns}, not both",
                    {"split_cuts_ns": None},
                )
            set_(self, "split_cuts_ns", tuple(int(c) for c in self.split_cuts_ns))
        spec = self.splits()  # fixed cut times fit the split's names
        if self.normalize == "zscore" and spec.names != ["all"] and "train" not in spec.names:
            raise OptionError(
                "split",
                self.split,
                "z-score statistics come from a split named train, and this layout has none; name one train, "
                "or pass {normalize}",
                {"normalize": "none"},
            )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The build options' names: what the manifest records, and what an append refuses."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each build option's default, by name (the command line's defaults are these)."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    def replace(self, **changes: Any) -> BuildOptions:
        """These options with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def splits(self) -> SplitSpec:
        """``split`` parsed (at ``split_cuts_ns`` when those are fixed)."""
        spec = parse_split(self.split)
        return spec if self.split_cuts_ns is None else spec.at(self.split_cuts_ns)

    @property
    def stats_split(self) -> str | None:
        """Where z-score statistics come from: ``"train"``, ``"all"`` (no splits) or None (no normalization)."""
        if self.normalize != "zscore":
            return None
        return "all" if parse_split(self.split).names == ["all"] else "train"

    def max_gap_ns(self, bar_ns: int | None) -> int:
        """``max_gap`` in ns; ``auto`` from the bar size (``bar_ns``, one minute when unknown)."""
        if self.max_gap == "auto":
            return max(_AUTO_GAP, 5 * (bar_ns or 60 * 10**9))
        return parse_duration(self.max_gap)

    def to_json(self) -> dict[str, Any]:
        """The options as the manifest's ``build`` records them (lists for sequences)."""
        out: dict[str, Any] = dump(self)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> BuildOptions:
        """The options ``to_json`` recorded; a ``FieldError`` naming a missing, unknown or mistyped one."""
        options: BuildOptions = load(dict(doc), cls)
        return options


def _features(value: Any) -> str | tuple[str, ...] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise OptionTypeError(f"features={value!r}: must be a str (comma-separated) or a sequence of str")


def _columns(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    given = value
    if isinstance(value, str):
        value = [c.strip() for c in value.split(",") if c.strip()]
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise OptionTypeError(f"columns={value!r}: must be a sequence of column names")
    if not value:  # an empty list would mean every column: say so instead of reading them all
        raise OptionError("columns", given, "names no column: give names such as open,close, or leave it out")
    return tuple(value)


def _text_or_none(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise OptionTypeError(f"{name}={value!r}: must be a str")


def _check_chunking(shard_rows: int | None, chunk_rows: int | None) -> None:
    """``shard_rows`` and ``chunk_rows`` at most ``MAX_SHARD_ROWS``; both given, at most ``MAX_CHUNKS`` chunks
    that divide the shard."""
    for name, rows in (("shard_rows", shard_rows), ("chunk_rows", chunk_rows)):  # a chunk lies in one shard
        if rows is not None and rows > MAX_SHARD_ROWS:
            raise OptionError(name, rows, f"at most {MAX_SHARD_ROWS:,} rows (a reader decodes whole shards in memory)")
    if shard_rows is not None and chunk_rows is not None:
        if shard_rows // chunk_rows > MAX_CHUNKS:
            raise OptionError(
                "chunk_rows",
                chunk_rows,
                f"gives {shard_rows // chunk_rows:,} chunks a shard; at most {MAX_CHUNKS:,} "
                "(each takes 16 bytes of the shard's index): give larger chunks",
            )
        if chunk_rows > shard_rows:
            raise OptionError("chunk_rows", chunk_rows, "must not exceed {shard_rows}", {"shard_rows": shard_rows})
        if shard_rows % chunk_rows:
            raise OptionError("chunk_rows", chunk_rows, "must divide {shard_rows}", {"shard_rows": shard_rows})


def _max_gap(value: Any) -> str:
    """``max_gap`` as its text (``auto``, a duration; an int of ns as the duration it is), checked."""
    if value is None:
        return "auto"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value != 0:  # the CLI's forms: a bare number has no unit (300 would be 300 ns)
            raise OptionError(
                "max_gap",
                int(value),
                "a bare number has no unit: write 'auto', a duration such as '300s' or '5m', or 0",
            )
        return "0"
    if not isinstance(value, str):
        raise OptionTypeError(f"max_gap={value!r}: must be 'auto', a duration such as 5m or 1h, or 0")
    if value.strip().lower() == "auto":
        return "auto"
    if _signed_duration("max_gap", value, "'auto', ") < 0:
        raise OptionError("max_gap", value, "must be 0 (never cut) or more")
    return value


def _signed_duration(name: str, text: str, also: str = "") -> int:
    """``text`` as ns, a leading ``-`` kept (so the option can say which values it takes); one line if malformed."""
    body = str(text).strip()
    negative = body.startswith("-") and body[1:2].isdigit()
    try:
        ns = parse_duration(body[1:] if negative else body)
    except ValueError as exc:
        raise OptionError(name, text, str(exc).replace("use a whole", f"use {also}a whole")) from None
    return -ns if negative else ns
