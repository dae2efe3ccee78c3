"""Input files as streams of bar tables: the contract every reader keeps, discovery and cleaning.

A :class:`Source`'s ``pieces()`` yield bounded, unsorted ``pyarrow`` tables of ``symbol``, ``ts`` (int64 ns,
UTC, the bar start) and ``columns`` (float64, or a Parquet float32), DBN's with ``instrument`` ids (its rolls).
Every reader drops rows by one policy (:func:`clean_piece`), counted in ``Source.drops``. A reader is told by
the file's first bytes (``PAR1``, ``DBN``, a zstd frame) and a ``*.csv[.gz|.zst]`` name; URLs go by fsspec.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import OptionError, SourceError
from ...format.durations import format_duration, parse_duration
from ...format.paths import check_storage_options, is_url, local_path
from .base import DBN_MAGIC, PARQUET_MAGIC, PRICE_COLUMNS, ZSTD_MAGIC, Source, clean_piece
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


def _skip_reason(name: str) -> str | None:
    """Why a file that a folder or glob holds is not read: ``suffix`` (not an input suffix in any letter
    case), ``hidden`` (an input's suffix, a hidden name) or ``dotfile`` (neither: ``.DS_Store``); None: read."""
    base = os.path.basename(name.rstrip("/"))
    looks = base.lower().endswith(INPUT_SUFFIXES)
    if base.startswith("."):
        return "hidden" if looks else "dotfile"
    return None if looks else "suffix"


_SKIPS = {"suffix": f"not inputs by their suffix ({_LOOKED_FOR})", "hidden": "hidden files"}  # dotfiles: unnamed


def _walk(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """The input files of ``paths`` and under their folders (hidden ones not entered), and the files skipped."""
    found: list[str] = []
    skipped: list[str] = []
    for path in paths:
        for folder, dirs, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
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
        if paths := sorted(by.get(reason, [])):
            names = ", ".join(os.path.relpath(p, spec) if folder else p for p in paths[:5])
            more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            log.warning("%s: skipped %d file(s), %s: %s%s", spec, len(paths), why, names, more)


def expand_inputs(specs: Sequence[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Files named by ``specs`` (files, folders searched recursively, globs, fsspec URLs such as
    ``s3://b/dbn/*.dbn.zst``), sorted and unique; files skipped by suffix or as hidden are named in a warning."""
    check_storage_options(storage_options)
    if not specs:
        raise OptionError("sources", [], "names no input: give at least one file, folder, glob or URL")
    seen: dict[str, str] = {}
    for spec in specs:
        spec = os.fspath(spec)
        if is_url(spec):
            urls, passed = find_urls(spec, storage_options, lambda name: _skip_reason(name) is None)
            _warn_skipped(spec, passed)
            if not urls:
                raise SourceError(spec, f"matches no input files ({_LOOKED_FOR})")
            seen.update((url, url) for url in urls)
            continue
        spec = local_path(spec)
        skipped: list[str] = []
        if os.path.isfile(spec):
            found = [spec]
        elif os.path.isdir(spec) or glob.has_magic(spec):
            found, skipped = _walk([spec] if os.path.isdir(spec) else glob.glob(spec, recursive=True))
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
    url = is_url(path)
    if not url and not os.path.exists(path):
        raise SourceError(path, "no such file or directory")
    if not url and os.path.isdir(path):
        raise SourceError(path, "is a directory (give its files, or pass it through expand_inputs)")
    try:
        with open_input(path, storage_options) as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise SourceError(path, "no such file or directory") from None
    except OSError as exc:
        raise SourceError(path, f"cannot read: {exc if url else exc.strerror or exc}") from None
    if not head:
        raise SourceError(path, "empty file")
    return head


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

    ``bar``: the bar size of DBN ticks (``1m``), or a multiple of DBN OHLCV bars' interval to resample to
    (Parquet and CSV bars are taken as they are). ``ts_column``, ``symbol_column``: Parquet or CSV columns;
    ``columns`` picks and orders the value columns; ``csv_delimiter`` (default: sniffed from the header);
    ``storage_options``: fsspec's, for a URL.
    """
    check_storage_options(storage_options)
    path = os.fspath(path)
    path = path if is_url(path) else local_path(path)
    head = _sniff(path, storage_options)
    tabular: dict[str, Any] = dict(
        ts_column=ts_column, symbol_column=symbol_column, columns=columns, bar=bar, storage_options=storage_options
    )
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
