"""What sits at a build's ``--out`` when it is not a cache (an input, a file, a folder holding a cache,
another folder), in a few words, so ``--overwrite`` refuses it by name (``staging.RULES`` decides)."""

from __future__ import annotations

import glob
import json
import os
import stat
from collections.abc import Sequence
from typing import Any

from ..errors import OptionError
from ..format.layout import ATTR
from ..format.paths import is_url, local_path

__all__ = ["cache_below", "check_out", "file_kind", "has_cache_layout", "input_clash", "listing"]

_LOOKED_AT = 50  # candidate zarr.json objects read below a folder to find a cache in it


def check_out(out: str | os.PathLike[str]) -> str:
    """``out`` as text, refused when it is empty (it would write into the working folder)."""
    text = os.fspath(out)
    if not str(text).strip():
        raise OptionError("out", text, "is empty: a directory or an fsspec URL such as s3://bucket/cache.zarr")
    return str(text)


def _norm(path: str) -> str:
    """A path or URL compared with others: local paths resolved (links, ``..``), URLs without a trailing ``/``."""
    if is_url(path):
        return path.rstrip("/")
    return os.path.realpath(os.path.abspath(local_path(path)))


def _within(inner: str, outer: str) -> bool:
    sep = "/" if is_url(outer) else os.sep
    return inner.startswith(outer.rstrip(sep) + sep)


def input_clash(out: str, specs: Sequence[str], files: Sequence[str]) -> str | None:
    """How ``out`` meets the build's inputs (``specs``, their ``files``): is, holds or is inside one; None if not."""
    o = _norm(out)
    named = {_norm(f) for f in files}
    given = [(g, _norm(g)) for g in [*specs, *files]]
    for g, p in given:
        if p == o:
            folder = p not in named and (is_url(p) or os.path.isdir(p))
            return "is an input folder of this build" if folder else "is an input file of this build"
    for g, p in given:
        if _within(p, o):
            return f"holds an input of this build ({g})"
    for g, p in given:
        if p not in named and not glob.has_magic(p) and (is_url(p) or os.path.isdir(p)) and _within(o, p):
            return f"is inside the input folder {g}"
    return None


def file_kind(fs: Any, path: str) -> str:
    """What a path that is not a folder is, in a few words (``a file of 12 bytes``, ``a character device``)."""
    if not is_url(path) and type(fs).__name__ == "LocalFileSystem":
        mode = os.stat(path).st_mode
        for test, name in (
            (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"),
            (stat.S_ISFIFO, "a named pipe"),
            (stat.S_ISSOCK, "a socket"),
        ):
            if test(mode):
                return name
    size = fs.size(path)
    return f"a file of {size:,} bytes" if size is not None else "a file"


def listing(entries: Sequence[str]) -> str:
    """A folder's entries for a message: how many and the first few names."""
    names = sorted(os.path.basename(str(e).rstrip("/")) for e in entries)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"it holds {len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"


def _is_cache_root(fs: Any, zarr_json: str) -> bool:
    """Whether ``zarr_json`` is the root metadata of a shardcache cache (a group with the manifest attribute)."""
    try:
        meta = json.loads(fs.cat_file(zarr_json))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("attributes"), dict) and ATTR in meta["attributes"]


def has_cache_layout(fs: Any, path: str) -> bool:
    """Whether the folder ``path`` is laid out as a cache (a damaged one, not someone's folder)."""
    return all(fs.exists(f"{path}/{key}") for key in ("zarr.json", "segments", "symbols"))


def cache_below(fs: Any, path: str) -> str | None:
    """The path (relative to the folder ``path``) of a cache one or two levels below it, if there is one."""
    looked = 0
    for pattern in ("*/zarr.json", "*/*/zarr.json"):
        for hit in sorted(fs.glob(f"{path}/{pattern}")):
            looked += 1
            if _is_cache_root(fs, hit):
                return str(hit)[len(path) :].strip("/").rsplit("/", 1)[0]
            if looked >= _LOOKED_AT:
                return None
    return None
