"""``BarTimes``: bar start times of a cache's virtual rows, read by shard of the symbols' ``time`` arrays.

Each shard of ``time`` is one object, read whole (so an append's swap between two ranged reads cannot mix
old and new bytes) and concurrently; the last ``TIME_CHUNKS`` are kept, so memory stays bounded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CacheError
from ..tuning import TIME_CHUNKS
from .decode import ChunkError, decode_shard
from .layout import chunk_codec, chunk_key, describe_damage
from .objects import get_whole
from .remote import reported

if TYPE_CHECKING:
    from .cache import Cache

__all__ = ["BarTimes"]


class BarTimes:
    """The last ``TIME_CHUNKS`` shards of ``time`` read, shared by the threads of one process (a copy in
    another process starts empty)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()  # (symbol, shard): times
        self._lock = threading.Lock()  # several readers' gather threads may ask at once

    def __reduce__(self) -> tuple[type[BarTimes], tuple[()]]:
        return BarTimes, ()  # a copy in another process starts empty: its times are read again where needed

    def read(self, cache: Cache, rows: np.ndarray) -> np.ndarray:
        """Bar start times (int64 ns since the epoch) of ``cache``'s virtual ``rows``."""
        sym, local = cache.rows.locate(rows)
        out = np.empty(sym.shape, dtype=np.int64)
        if not out.size:
            return out
        size = cache.shard_rows  # a symbol's time is sharded as its features: a shard's bar times are one object
        chunk = local // size
        key = sym * (int(chunk.max()) + 1) + chunk  # one number per (symbol, shard)
        order = np.argsort(key, kind="stable")
        first = np.flatnonzero(np.diff(key[order], prepend=-1))  # each group's first place in ``order``
        groups = [
            (int(sym[order[a]]), int(chunk[order[a]]), order[a:b])
            for a, b in zip(first.tolist(), [*first[1:].tolist(), len(order)])
        ]
        with self._lock:
            have = {(i, c): self._kept[(i, c)] for i, c, _ in groups if (i, c) in self._kept}
        have.update(self._fetch(cache, [(i, c) for i, c, _ in groups if (i, c) not in have]))
        for i, c, where in groups:
            out[where] = have[(i, c)][local[where] - c * size]
        with self._lock:
            for i, c, _ in groups:
                self._kept[(i, c)] = have[(i, c)]
                self._kept.move_to_end((i, c))
            while len(self._kept) > TIME_CHUNKS:
                self._kept.popitem(last=False)
        cache.check_same()
        return out

    @staticmethod
    def _fetch(cache: Cache, wanted: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """The ``(symbol, shard)`` shards of ``time`` in ``wanted``, read whole and decoded."""
        root, codec, size = cache.handles.group.store_path, chunk_codec("zstd"), cache.shard_rows
        keys = {(i, c): chunk_key(i, "time", c) for i, c in wanted}
        prefix = f"{root.path}/" if root.path else ""
        with reported(cache.url, cache.storage_options):  # a failed fetch is no swap: outside the check below
            got = get_whole(root.store, [prefix + key for key in keys.values()])
        out = {}
        try:
            for (i, c), key in keys.items():
                raw = got[prefix + key]
                if raw is None:
                    raise CacheError(f"{cache.url}: {key} is missing; rebuild the cache")
                try:
                    ts = decode_shard(raw, size, int(cache.symbol_chunks[i]), codec, np.int64, 0)
                except ChunkError as exc:
                    raise CacheError(
                        f"{cache.url}: {key} is corrupt ({describe_damage(exc)}); rebuild the cache"
                    ) from None
                out[(i, c)] = ts[: min(size, int(cache.bars_per_symbol[i]) - c * size)]
        except CacheError:
            cache.check_same()  # a cache swapped during the reads: "replaced", not damaged
            raise
        return out
