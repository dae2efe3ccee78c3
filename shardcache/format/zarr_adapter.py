"""The parts of zarr that shardcache uses outside its public API, in one place.

Everywhere else shardcache uses zarr's documented API only (``zarr``, ``zarr.api.asynchronous``,
``zarr.storage``, ``zarr.abc.store``, ``zarr.buffer``, ``zarr.codecs``, ``zarr.errors``, and
``Array.async_array``). These have no public equivalent in zarr 3.1:

* ``sync``: run a coroutine on zarr's own event loop and wait for it (``zarr.core.sync.sync``, which
  every synchronous zarr call goes through), so many metadata reads or writes run at once;
* ``async_group``: the ``AsyncGroup`` behind a ``zarr.Group`` (its ``_async_group``), to start many
  operations on one group concurrently without reading its metadata again;
* ``ArrayV3Metadata``: a Zarr v3 array's metadata parsed from its ``zarr.json`` document
  (``zarr.core.metadata``), so ``decode.ShardDecoder`` opens an array with that one read.

``TESTED`` is the range of zarr versions they were written and tested for;
``tests/test_adapters.py`` checks each against the installed zarr and fails, naming this module,
once zarr moves past that range.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import zarr
from zarr.core.metadata import ArrayV3Metadata
from zarr.core.sync import sync as _sync

__all__ = ["TESTED", "ArrayV3Metadata", "async_group", "sync"]

TESTED = ((3, 1, 4), (3, 2))  # zarr versions from the first up to (not including) the second

T = TypeVar("T")


def sync(coro: Coroutine[Any, Any, T]) -> T:
    """The result of ``coro``, run on zarr's event loop (from a thread that is not running it)."""
    return _sync(coro)


def async_group(group: zarr.Group) -> zarr.AsyncGroup:
    """The asynchronous group behind ``group`` (the same store, path and metadata)."""
    return group._async_group
