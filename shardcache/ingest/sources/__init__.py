"""Input files as streams of bar tables: the contract every reader keeps, discovery and cleaning.

A :class:`Source` is one opened input file. Its ``pieces()`` yield bounded ``pyarrow``
tables with the columns ``symbol`` (string), ``ts`` (int64 ns since the epoch, UTC, the bar
start) and then ``columns`` (float64, or float32 where a Parquet column is float32). Rows
in a piece need not be sorted; a large file is never loaded whole.

Every reader applies one value policy (:func:`clean_piece`) before it yields a piece, and
counts what it drops in ``Source.drops`` (reason -> rows):

* ``timestamp out of range``: ``ts`` outside 1980-01-01 .. 2100-01-01 (this also catches
  DBN's undefined timestamp);
* ``non-finite price`` / ``non-positive price``: a price column (:data:`PRICE_COLUMNS`)
  that is NaN or infinite (DBN's undefined price included), or ``<= 0``;
* ``non-finite value``: NaN or infinity in any other column.

DBN pieces end with one more column, ``instrument`` (int64 instrument id), so the build can cut a
continuous symbol's series where it rolls from one contract to the next.

Which reader opens a file is decided by its first bytes (``PAR1`` for Parquet, ``DBN`` or
a zstd frame for DBN; a file named ``*.csv``, ``*.csv.gz`` or ``*.csv.zst`` is CSV, plain or
compressed), so a misnamed file is still read or refused plainly. Files may be
local paths or fsspec URLs (``s3://bucket/prefix/*.dbn.zst``), see :mod:`.files`.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from ...errors import SourceError
from ...format.paths import check_storage_options, is_url, local_path
from .base import (
    DBN_MAGIC,
    PARQUET_MAGIC,
    PRICE_COLUMNS,
    ZSTD_MAGIC,
    Source,
    clean_piece,
    format_duration,
    parse_duration,
)
from .csv import CsvSource
from .dbn import DbnSource
from .files import find_urls, open_input
from .parquet import ParquetSource

__all__ = [
    "PRICE_COLUMNS",
    "Source",
    "clean_piece",
    "expand_inputs",
    "format_duration",
    "open_source",
    "open_sources",
    "parse_duration",
]

INPUT_SUFFIXES = (".dbn", ".dbn.zst", ".parquet", ".parq", ".pq", ".csv", ".csv.gz", ".csv.zst")
_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.zst")
_LOOKED_FOR = "looked for " + ", ".join(f"*{s}" for s in INPUT_SUFFIXES) + " in any letter case"
log = logging.getLogger("shardcache")


def _is_input(name: str) -> bool:
    return _skip_reason(name) is None


def _skip_reason(name: str) -> str | None:
    """Why a file that a folder or glob holds is not read: ``suffix`` (not an input suffix in any letter
    case), ``hidden`` (an input's suffix, a hidden name) or ``dotfile`` (neither: ``.DS_Store``); None: read."""
    base = os.path.basename(name.rstrip("/"))
    looks = base.lower().endswith(INPUT_SUFFIXES)
    if base.startswith("."):
        return "hidden" if looks else "dotfile"
    return None if looks else "suffix"


_SKIPS = {"suffix": f"not inputs by their suffix ({_LOOKED_FOR})", "hidden": "hidden files"}  # dotfiles: unnamed


def _walk(root: str) -> tuple[list[str], list[str]]:
    """Input files under ``root``, recursively (hidden folders are not entered), and the files skipped."""
    found: list[str] = []
    skipped: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            (skipped if _skip_reason(f) else found).append(os.path.join(folder, f))
    return found, skipped


def _warn_skipped(spec: str, skipped: Sequence[str]) -> None:
    """Name the files of a folder or glob that are not read, with the reason: none is skipped without a word."""
    by: dict[str | None, list[str]] = {}
    for path in skipped:
        by.setdefault(_skip_reason(path), []).append(path)
    folder = not is_url(spec) and os.path.isdir(spec)
    for reason, why in _SKIPS.items():
        paths = sorted(by.get(reason, []))
        if paths:
            names = ", ".join(os.path.relpath(p, spec) if folder else p for p in paths[:5])
            more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            log.warning("%s: skipped %d file(s), %s: %s%s", spec, len(paths), why, names, more)


def expand_inputs(specs: Sequence[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Files named by ``specs`` (files, folders searched recursively, globs), sorted and unique.

    A spec may be an fsspec URL (an object, a prefix or a glob such as ``s3://b/dbn/*.dbn.zst``),
    listed with ``storage_options``; its files are returned as URLs. A folder's or a glob's files
    that are not inputs by their suffix (any letter case), or are hidden, are named in a warning.
    """
    check_storage_options(storage_options)
    seen: dict[str, str] = {}
    for spec in specs:
        spec = os.fspath(spec)
        if is_url(spec):
            urls, passed = find_urls(spec, storage_options, _is_input)
            _warn_skipped(spec, passed)
            if not urls:
                raise SourceError(spec, f"matches no input files ({_LOOKED_FOR})")
            seen.update((url, url) for url in urls)
            continue
        spec = local_path(spec)
        skipped: list[str] = []
        if os.path.isdir(spec):
            found, skipped = _walk(spec)
        elif os.path.isfile(spec):
            found = [spec]
        elif glob.has_magic(spec):
            found = []
            for hit in glob.glob(spec, recursive=True):
                if os.path.isdir(hit):
                    more, also = _walk(hit)
                    found += more
                    skipped += also
                else:
                    (skipped if _skip_reason(hit) else found).append(hit)
        else:
            raise SourceError(spec, "no such file or directory")
        _warn_skipped(spec, skipped)
        if not found:
            raise SourceError(spec, f"matches no input files ({_LOOKED_FOR})")
        for path in found:
            seen.setdefault(os.path.realpath(path), os.path.normpath(path))
    return sorted(set(seen.values()))


def _sniff(path: str, storage_options: dict[str, Any] | None = None) -> bytes:
    """The first bytes of ``path``, after the checks every input needs (exists, is a file, not empty)."""
    if is_url(path):
        try:
            with open_input(path, storage_options) as fh:
                head = fh.read(8)
        except FileNotFoundError:
            raise SourceError(path, "no such file or directory") from None
        except (OSError, IsADirectoryError) as exc:
            raise SourceError(path, f"cannot read: {exc}") from None
        if not head:
            raise SourceError(path, "empty file")
        return head
    if not os.path.exists(path):
        raise SourceError(path, "no such file or directory")
    if os.path.isdir(path):
        raise SourceError(path, "is a directory (give its files, or pass it through expand_inputs)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise SourceError(path, f"cannot read: {exc.strerror or exc}") from None
    if not head:
        raise SourceError(path, "empty file")
    return head


class _TabularOptions(TypedDict):
    """``open_source``'s arguments that Parquet and CSV sources both take."""

    ts_column: str | None
    symbol_column: str | None
    columns: list[str] | None
    bar: str | None
    storage_options: dict[str, Any] | None


def open_source(
    path: str,
    *,
    bar: str | None = None,
    ts_column: str | None = None,
    symbol_column: str | None = None,
    columns: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    csv_delimiter: str | None = None,
) -> Source:
    """Open ``path`` (a local path or an fsspec URL) as DBN, Parquet or CSV, checking only its header or footer.

    ``bar`` sets the bar size DBN ticks are aggregated to (default ``1m``) or resamples DBN
    OHLCV bars to a multiple of their interval; Parquet and CSV bars are taken as they are
    (a ``bar`` other than their step is refused once the step is known).
    ``ts_column`` and ``symbol_column`` name Parquet or CSV columns. ``columns`` picks and orders
    the value columns of either format. ``storage_options`` are the fsspec arguments for a URL.
    ``csv_delimiter`` is a CSV file's delimiter (default: sniffed from its header).
    """
    check_storage_options(storage_options)
    path = os.fspath(path)
    path = path if is_url(path) else local_path(path)
    head = _sniff(path, storage_options)
    tabular: _TabularOptions = {
        "ts_column": ts_column,
        "symbol_column": symbol_column,
        "columns": columns,
        "bar": bar,
        "storage_options": storage_options,
    }
    if head.startswith(PARQUET_MAGIC):
        return ParquetSource(path, **tabular)
    lower = path.lower()
    if lower.endswith(_CSV_SUFFIXES) and not head.startswith(DBN_MAGIC):  # zstd-compressed CSV included
        return CsvSource(path, csv_delimiter=csv_delimiter, **tabular)
    if head.startswith((DBN_MAGIC, ZSTD_MAGIC)):
        return DbnSource(path, bar=bar, columns=columns, storage_options=storage_options)
    if lower.endswith((".parquet", ".parq", ".pq")):
        raise SourceError(path, "not a Parquet file (bad magic bytes)")
    if ".dbn" in lower:
        raise SourceError(path, "not a DBN file (bad magic bytes)")
    raise SourceError(path, "not a DBN, Parquet or CSV file (unrecognised magic bytes; CSV files must end in .csv)")


def open_sources(paths: Sequence[str], storage_options: dict[str, Any] | None = None, **options: Any) -> list[Source]:
    """``[open_source(p, **options) for p in paths]``, opening URLs 16 at a time (each costs round trips)."""
    if not any(is_url(p) for p in paths):
        return [open_source(p, storage_options=storage_options, **options) for p in paths]
    with ThreadPoolExecutor(16, thread_name_prefix="shardcache-open") as pool:
        return list(pool.map(lambda p: open_source(p, storage_options=storage_options, **options), paths))
