"""The bytes a node-local shard cache (``shardcache.format.local_cache``) holds, at one moment and at its peak."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from shardcache.format.local_cache import LEDGER, LocalCache


def _walk(folder: str | Path) -> int:
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "locks"]
        for f in files:
            if not f.startswith(LEDGER):
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except FileNotFoundError:  # a part file renamed since the folder was listed
                    continue
    return total


def shard_bytes(folder: str | Path) -> int:
    """Bytes of the shard files in a local cache's folder (the ledger and lock files left out), as one
    moment saw them: the walk holds the ledger (``LocalCache.paused``), so no file is admitted or evicted
    during it (a walk without it adds up files of different moments: one seen before its eviction, one after)."""
    if not os.path.exists(os.path.join(folder, LEDGER)):
        return _walk(folder)
    with LocalCache(folder).paused():
        return _walk(folder)


@contextlib.contextmanager
def peak_bytes(folder: str | Path) -> Iterator[list[int]]:
    """``[peak]``: the most bytes ``shard_bytes`` saw in ``folder`` while inside, sampled all along."""
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], shard_bytes(folder))
            time.sleep(0.001)  # the ledger free a moment: writers, and a fork (it waits for it), get their turn

    sampler = threading.Thread(target=sample, name="peak-bytes")
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()
    peak[0] = max(peak[0], shard_bytes(folder))
