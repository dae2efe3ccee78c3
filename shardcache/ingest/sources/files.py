"""Input files at local paths or fsspec URLs (``s3://``, ``gs://``, ``memory://``...): find, open, identify.

A path or ``file://`` URL is read with the operating system, any other URL through ``fsspec`` with the
build's ``storage_options`` (for ``s3://``, ``s3fs.S3FileSystem`` arguments or the AWS environment).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import IO, Any

from ...errors import SourceError
from ...format.paths import is_url, local_path, probe
from ...format.remote import filesystem

__all__ = ["find_urls", "open_input", "stat_input", "url_fs"]


def url_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path on it; a one-line SourceError if it has none."""
    try:
        return filesystem(url, storage_options)
    except (ImportError, ValueError) as exc:
        raise SourceError(url, f"cannot open this URL ({exc})") from None


def open_input(path: str, storage_options: dict[str, Any] | None = None) -> IO[bytes]:
    """``path`` opened for binary reading: a local file, or an fsspec file for a URL."""
    if not is_url(path):
        return open(local_path(path), "rb")
    fs, p = url_fs(path, storage_options)
    fh: IO[bytes] = fs.open(p, "rb")
    return fh


def stat_input(path: str, storage_options: dict[str, Any] | None = None) -> tuple[int, int | str]:
    """Size and version of an input: its mtime in ns locally, else the object's ETag or modification time."""
    if not is_url(path):
        st = os.stat(local_path(path))
        return st.st_size, st.st_mtime_ns
    fs, p = url_fs(path, storage_options)
    info = fs.info(p)
    version = next(
        (info[k] for k in ("ETag", "etag", "LastModified", "mtime", "updated", "created") if info.get(k)), ""
    )
    return int(info.get("size") or 0), str(version).strip('"')


def find_urls(
    spec: str, storage_options: dict[str, Any] | None, keep: Callable[[str], bool]
) -> tuple[list[str], list[str]]:
    """URLs of the input files the URL ``spec`` names (an object, a prefix, a glob) and of those ``keep`` skips."""
    problem = probe(spec, storage_options)  # one quick request: no client retries on an endpoint that is not there
    if problem is not None:
        raise SourceError(spec, problem)
    fs, path = url_fs(spec, storage_options)
    found: list[str] = []
    skipped: list[str] = []
    if glob.has_magic(path):
        for hit, info in sorted(fs.glob(path, detail=True).items()):
            if info.get("type") == "directory":
                more, also = _walk(fs, hit, keep)
                found += more
                skipped += also
            else:
                (found if keep(hit) else skipped).append(hit)
    elif fs.isfile(path):
        found = [path]
    elif fs.isdir(path):
        found, skipped = _walk(fs, path, keep)
    else:
        raise SourceError(spec, "no such file or directory")
    return [fs.unstrip_protocol(p) for p in found], [fs.unstrip_protocol(p) for p in skipped]


def _walk(fs: Any, root: str, keep: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    root = root.rstrip("/")
    found: list[str] = []
    skipped: list[str] = []
    for p in fs.find(root):
        rel = p[len(root) :].strip("/").split("/")
        if not any(part.startswith(".") for part in rel[:-1]):
            (found if keep(p) else skipped).append(p)
    return found, skipped
