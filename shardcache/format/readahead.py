"""Read-ahead hints for a local cache's shard files: ``will_read`` asks the OS to fetch the files a reader
is about to read, together, when they have gone cold in the page cache. Hints only: nothing is read
here, and a reader that skips them reads the same bytes."""

from __future__ import annotations

import os

import numpy as np
from zarr.storage import LocalStore

from .cache import Cache
from .layout import chunk_key, spanned_shards

__all__ = ["in_page_cache", "will_read"]


def in_page_cache(path: str) -> bool:
    """Whether the first page of the file ``path`` is in the OS's page cache: a one-byte read that may not
    wait for the disk (``RWF_NOWAIT``; a miss may start reading the page, which does no harm to a hint). False
    where that cannot be told (no such read, a file system that refuses it, such as tmpfs, no file)."""
    if not hasattr(os, "RWF_NOWAIT"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT) >= 0
    except OSError:  # BlockingIOError: not in the page cache; EOPNOTSUPP: cannot tell
        return False
    finally:
        os.close(fd)


def will_read(cache: Cache, starts: np.ndarray, stops: np.ndarray) -> None:
    """Ask the OS to fetch the shard files of ``cache``'s virtual rows ``[starts[k], stops[k])`` ahead of
    their reads, so that a local cache's small shards gone cold in the page cache come from disk together,
    not one at a time as each read reaches them (a cold epoch of 2,000 small symbols). A hint: nothing
    is read, and nothing is done for an object store, through a node-local copy, or on an OS without
    ``posix_fadvise``. Nor when the first and the last of the files are in the page cache already
    (``in_page_cache``): files read together last time go cold together, and asking for 2,000 warm
    files each epoch cost a twentieth of its time."""
    root = cache.handles.group.store_path
    if cache.local is not None or not isinstance(root.store, LocalStore) or not hasattr(os, "posix_fadvise"):
        return
    folder = os.path.join(str(root.store.root), root.path)
    starts = np.asarray(starts, dtype=np.int64)
    shards = spanned_shards(starts, np.maximum(np.asarray(stops, dtype=np.int64) - 1, starts), cache.shard_rows)
    symbol, row = cache.rows.locate(shards * cache.shard_rows)  # every shard's symbol at once, not one search each
    paths = [
        os.path.join(folder, chunk_key(i, "features", k))
        for i, k in zip(symbol.tolist(), (row // cache.shard_rows).tolist())
    ]
    if not paths or (in_page_cache(paths[0]) and in_page_cache(paths[-1])):
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # a missing shard is for its read to report
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
