"""``ShardReader``: a cache's store as one process holds it open, and the rows of ``features`` read from it.

Per process (fsspec's asynchronous clients do not survive a fork) it keeps the root group, the arrays opened
so far and one ``decode.ShardDecoder`` per symbol read, made from the manifest's layout and the root index
alone (no request per symbol). A shard that is missing or fails its checks is named in one ``CacheError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ..errors import CacheError
from .decode import ChunkError, MissingShard, ShardDecoder
from .layout import describe_damage, open_group
from .paths import is_url, read_options
from .remote import reported
from .root import NoCacheError

if TYPE_CHECKING:
    from .cache import Cache

__all__ = ["Handles", "ShardReader"]


@dataclass
class Handles:
    """What one process holds open of a cache: the root group, arrays and decoders by symbol."""

    group: zarr.Group
    arrays: dict[tuple[int, str], zarr.Array[Any]] = field(default_factory=dict)
    decoders: dict[int, ShardDecoder] = field(default_factory=dict)
    templates: dict[int, ShardDecoder] = field(default_factory=dict)  # by inner-chunk rows: what others copy
    pid: int = field(default_factory=os.getpid)  # fsspec async clients (s3fs) do not survive a fork


class ShardReader:
    """A cache's store opened in this process (``handles``), and its rows of ``features`` (``read``)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        self.url, self.storage_options = url, storage_options
        self._now: Handles | None = None
        self._root: zarr.Group | None = None  # the root group as opened: remade in another process without a read

    def open(self) -> zarr.Group:
        """Open the root group (a missing or damaged one named in one ``CacheError``)."""
        try:
            group = open_group(self.url, "r", read_options(self.url, self.storage_options))
        except json.JSONDecodeError as exc:
            raise CacheError(
                f"{self.url}: the cache's metadata (zarr.json) is damaged ({describe_damage(exc)}); rebuild the "
                "cache (build-cache --overwrite replaces it)"
            ) from None
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError, ValueError) as exc:
            raise NoCacheError(f"{self.url}: no cache found ({exc.__class__.__name__})") from None
        except Exception as exc:  # an object store's client raises its own kinds
            if not is_url(self.url):
                raise
            raise CacheError(f"{self.url}: cannot read the cache ({describe_damage(exc)})") from None
        self._now, self._root = Handles(group), group
        return group

    def handles(self, cache: Cache) -> Handles:
        """This process's handles: opened again in a DataLoader worker (forked or spawned), where ``cache``
        is checked to be the one its manifest was read from."""
        if self._now is None or self._now.pid != os.getpid():
            if self._root is None:
                self.open()
            else:  # the root group from the metadata read at opening, over a store (and fsspec client) of its own
                self._now = Handles(pickle.loads(pickle.dumps(self._root)))
            cache.check_same()
        assert self._now is not None
        return self._now

    def view(self) -> ShardReader:
        """A reader sharing this one's store and opened arrays, with decoders of its own."""
        other = ShardReader(self.url, self.storage_options)
        other._root, h = self._root, self._now
        other._now = None if h is None else Handles(h.group, h.arrays, pid=h.pid)
        return other

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_now": None}

    def read(self, cache: Cache, i: int, base: int, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        """Virtual rows ``[start, stop)`` of symbol ``i`` (its first row ``base``) of ``cache``, into ``out``."""
        with reported(self.url, self.storage_options):
            try:
                return self._decoder(cache, i).read(start - base, stop - base, out)
            except (MissingShard, ChunkError) as exc:
                assert exc.shard is not None  # ShardDecoder.read names the shard it was reading
                cache.check_same()  # a swap between an index and its chunks' reads: "replaced", not damaged
                shard = base // cache.shard_rows + exc.shard
                problem = "is missing" if isinstance(exc, MissingShard) else f"is corrupt: {exc}"
                raise CacheError(
                    f"{self.url}: shard {shard} ({cache.shard_key(shard)}) {problem}; "
                    "`shardcache verify` lists every damaged shard; rebuild the cache"
                ) from None

    def _decoder(self, cache: Cache, i: int) -> ShardDecoder:
        """Symbol ``i``'s shard decoder, made from the manifest (its layout and the symbol's rows) and the root
        index (its inner chunks' rows): no read. The first of each inner-chunk size is made from the layout,
        the others copy it (``ShardDecoder.like``): a first epoch of 2,000 symbols makes 2,000."""
        h = self.handles(cache)
        dec = h.decoders.get(i)
        if dec is not None:
            return dec
        root = h.group.store_path
        group = cache.manifest.groups[i]  # not ``cache.groups``: a copy of every symbol's
        path = f"{root.path}/{group}/features" if root.path else f"{group}/features"
        chunk_rows = int(cache.symbol_chunks[i])  # a short symbol's inner chunks are smaller
        template = h.templates.get(chunk_rows)
        if template is None:
            layout = cache.manifest.layout
            try:
                template = h.templates[chunk_rows] = ShardDecoder.from_layout(
                    root.store,
                    path,
                    n_rows=int(cache.bars_per_symbol[i]),
                    n_features=cache.n_features,
                    shard_rows=int(layout.shard_rows),
                    chunk_rows=chunk_rows,
                    codec=layout.codec,
                    local=cache.local,
                    space=_space(cache) if cache.local is not None else "",
                )
            except (ValueError, TypeError) as exc:  # an edited manifest's layout
                raise CacheError(
                    f"{self.url}: the manifest's layout cannot be read ({describe_damage(exc)}); rebuild the cache"
                ) from None
        dec = h.decoders[i] = template.like(path, int(cache.bars_per_symbol[i]))
        return dec


def _space(cache: Cache) -> str:
    """``cache``'s folder in a ``LocalCache``: a digest of its URL and build (its fingerprint and creation
    time), so the copies of a rebuilt cache are never taken for this one's."""
    m = cache.manifest
    ident = json.dumps([cache.url, m.build.fingerprint, m.created])
    return hashlib.blake2b(ident.encode(), digest_size=10).hexdigest()
