"""The package's version, read once from its installed metadata (pyproject.toml is the only copy)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("shardcache")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
