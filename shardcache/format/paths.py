"""Local paths and URLs: one rule for the format, the build and its sources.

A plain path and a ``file://`` URL are local (read with ``os``); any other ``scheme://`` is
read through fsspec.
"""

from __future__ import annotations

__all__ = ["is_local", "is_url", "local_path"]


def is_url(path: str) -> bool:
    """Whether ``path`` is read through fsspec (a URL other than ``file://``)."""
    return "://" in path and not path.startswith("file://")


def is_local(path: str) -> bool:
    """Whether ``path`` is a path on this machine (a plain path or ``file://``)."""
    return not is_url(path)


def local_path(path: str) -> str:
    """The filesystem path of a plain path or a ``file://`` URL."""
    return path.removeprefix("file://")
