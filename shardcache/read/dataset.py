"""``WindowDataset``: the map-style twin of ``WindowStream`` for evaluation and random access.

``ds[i]`` is the ``i``-th valid window in row order; slices and sequences of ints stack windows into one
batch, gathered shard by shard, with the last few decoded blocks kept. Over several caches the index runs
through cache 0's windows, then cache 1's (``offsets``, ``locate``).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import OptionTypeError, SeveralCachesError
from ..format.cache import Cache
from ..format.settings import grouped, only_known
from ..format.windows import WindowSpec
from ..tuning import LRU_BLOCKS
from .cuts import Cut
from .normalize import Normalization
from .options import Batch, MetaBatch, window_spec
from .readspec import ReadSpec, ReadsWindows
from .settings import CacheInput, CacheSource, DatasetFields, LocalCopy, sources_of
from .sources import Sources
from .storage import Arena, block_columns, gather, target_steps

__all__ = ["WindowDataset"]

_INDEX_FORMS = "an int, a slice, or a sequence of ints (a list, a numpy array, a 1-d integer tensor)"


class WindowDataset(ReadsWindows, Dataset[Batch | MetaBatch]):
    """Map-style windows in row order: ``ds[i]`` is ``Batch(x [seq_len, F], y [T])`` of the ``i``-th
    valid window (``y [len(horizon), T]`` for a sequence of horizons); negative ``i`` counts from
    the end. ``ds[a:b]`` and ``ds[[i, j]]`` are ``Batch(x [n, seq_len, F], y [n, T])``.

    Takes the caches and window settings of ``WindowStream`` (keyword-only after ``seq_len``, the
    same split rule), its ``cache_dir``/``cache_limit`` and its ``normalization``; over several caches the index runs through
    cache 0's windows, then cache 1's (``offsets``, ``locate``). Keeps the last few decoded shard
    blocks, so nearby indices cost no zarr call. With ``meta=True`` items are ``MetaBatch``: each
    window's place and times exactly as the stream gives them, for lining predictions up with bars.

    Its order is the stream's: a ``WindowStream`` of the same caches and settings with
    ``shuffle=False``, one rank, no ``weights`` and ``drop_last=False`` serves ``ds[0]``, ``ds[1]``,
    ... ``ds[len(ds) - 1]`` in that order, ``batch_size`` at a time.
    """

    def __init__(
        self,
        caches: CacheInput | CacheSource | Sequence[CacheInput | CacheSource],
        seq_len: int | WindowSpec,
        *,
        cut: Cut | None = None,
        meta: bool = False,
        local: LocalCopy | None = None,
        normalization: Normalization | None = None,
        **fields: Unpack[DatasetFields],
    ) -> None:
        given: dict[str, Any] = dict(fields)  # the typed keywords as a plain dict each settings object takes from
        only_known("WindowDataset", given, DatasetFields.__optional_keys__)
        self.spec = window_spec(seq_len, given)  # options first, then the caches
        cut = grouped("WindowDataset", "cut", Cut, cut, given)
        sources = sources_of(caches, given.pop("storage_options", None))
        local = grouped("WindowDataset", "local", LocalCopy, local, given)
        self.normalization = grouped("WindowDataset", "normalization", Normalization, normalization, given)
        """How served values are scaled (``WindowStream.normalization``)."""
        # a temporary local copy (``sources.temporary``) lives as long as this dataset: removed when it is
        # collected, or at exit
        self.sources = Sources.open(sources, cut=cut, local=local)
        self.read_spec = ReadSpec.of(self.sources, self.spec, torch.device("cpu"), meta, self.normalization)
        self._ranges = self.read_spec.ranges
        self._n = self._ranges.total()
        self.offsets = self._ranges.count_below(self.sources.row_bounds)  # each cache's first window, and the total
        """Index of each cache's first window, then the total (``len(caches) + 1`` ints)."""
        self._lru: OrderedDict[int, tuple[int, Arena]] = OrderedDict()
        self._steps = None if self.spec.timed else target_steps(self.read_spec.storage, self.spec)

    @property
    def cache(self) -> Cache:
        """The cache of a dataset of one (of several: ``caches[k]``, ``k`` from ``locate``)."""
        if len(self.sources) > 1:
            raise SeveralCachesError(f"this WindowDataset indexes {len(self.sources)} caches: use ds.caches[k]")
        return self.sources.caches[0]

    def __len__(self) -> int:
        return self._n

    def row(self, i: int) -> int:
        """Start row of window ``i`` in the caches' row space (one cache's own: ``cache.locate`` names it)."""
        return int(self._ranges.start_at(self._positions(np.asarray([_scalar(i)])))[0])

    def locate(self, i: int) -> tuple[int, int]:
        """Window ``i``'s cache (an index into ``caches``) and its index among that cache's windows."""
        pos = int(self._positions(np.asarray([_scalar(i)]))[0])
        k = int(np.searchsorted(self.offsets, pos, side="right")) - 1
        return k, pos - int(self.offsets[k])

    def __getitem__(self, index: Any) -> Batch | MetaBatch:
        """One window (an int index), or the windows of a slice or a sequence of ints, stacked."""
        i = _scalar(index, sequence_ok=True)
        if i is not None:
            b = self._gather(self._positions(np.asarray([i])))
            return type(b)(*(field[0] for field in b))
        if isinstance(index, slice):
            try:
                return self._gather(np.arange(*index.indices(self._n), dtype=np.int64))
            except TypeError:
                raise _refused(index, "a slice's bounds must be ints or None") from None
        return self._gather(self._positions(_index_array(index)))

    def __getitems__(self, indices: Sequence[int]) -> list[Batch | MetaBatch]:
        """The windows of ``indices`` as a list of samples, gathered together (torch's DataLoader batches)."""
        b = self[indices]
        return [type(b)(*fields) for fields in zip(*b)]

    def _positions(self, pos: np.ndarray) -> np.ndarray:
        """``pos`` (int64) checked against the window count, negatives counted from the end."""
        bad = (pos < -self._n) | (pos >= self._n)
        if bad.any():
            raise IndexError(f"window {int(pos[np.argmax(bad)])} out of range for {self._n} windows")
        return pos % self._n if len(pos) else pos

    def _gather(self, pos: np.ndarray) -> Batch | MetaBatch:
        """Windows at positions ``pos`` (checked), stacked: gathered shard by shard, then put in the asked order."""
        r, n = self.read_spec, len(pos)
        rows = self._ranges.start_at(pos) if n else np.zeros(0, np.int64)
        x, y = r.storage.empty(r.x_shape(n)), r.storage.empty(r.y_shape(n))
        shard = rows // self.sources.shard_rows
        order = np.argsort(shard, kind="stable")
        cuts = np.flatnonzero(np.diff(shard[order])) + 1
        for sel in np.split(np.arange(n), cuts) if n else []:
            row0, arena = self._block(int(shard[order[sel[0]]]))
            a, b = int(sel[0]), int(sel[-1]) + 1
            mine = rows[order[a:b]]
            steps = r.window_steps(mine) if self._steps is None else self._steps
            gather(arena, mine - row0, steps, 0, out=(x[a:b], y[a:b]))
        if n and (order[1:] < order[:-1]).any():  # asked out of shard order
            back = torch.from_numpy(np.argsort(order))
            x, y = x[back], y[back]
        if r.meta:
            return MetaBatch(x, y, *r.window_meta(rows))
        return Batch(x, y)

    def _block(self, shard: int) -> tuple[int, Arena]:
        """Rows of ``shard`` plus the overhang its last windows need, from the LRU or one zarr call."""
        hit = self._lru.get(shard)
        if hit is not None:
            self._lru.move_to_end(shard)
            return hit
        s, r = self.sources, self.read_spec
        lo = shard * s.shard_rows
        hi = min(lo + self._ranges.block_rows(s.shard_rows), s.region_stop(lo))
        scale = None if r.scaler is None else r.scaler.block(lo)
        x, y = block_columns(s.read_rows(lo, hi), (r.xcols, r.ycols), r.same_columns, scale)
        self._lru[shard] = hit = (lo, Arena(x, y, self.spec.seq_len))
        while len(self._lru) > LRU_BLOCKS:
            self._lru.popitem(last=False)
        return hit

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lru": OrderedDict()}  # a worker decodes the blocks it needs

    def __repr__(self) -> str:
        urls = self.sources.urls
        where = urls[0] if len(urls) == 1 else urls
        return f"WindowDataset({where!r}, seq_len={self.seq_len}, horizon={self.horizon}, windows={self._n})"


def _is_bool(index: Any) -> bool:
    if isinstance(index, torch.Tensor):
        return index.dtype == torch.bool
    return isinstance(index, bool | np.bool_) or (isinstance(index, np.ndarray) and index.dtype == np.bool_)


def _refused(index: Any, why: str) -> OptionTypeError:
    return OptionTypeError(f"window index {index!r}: {why}; give {_INDEX_FORMS}")


def _scalar(index: Any, sequence_ok: bool = False) -> int | None:
    """``index`` as one int (numpy ints, 0-d integer arrays and tensors too); None for a slice or sequence when
    ``sequence_ok``. Anything else is refused, naming the index."""
    if _is_bool(index):
        raise _refused(index, "a bool is not an index")
    if isinstance(index, torch.Tensor | np.ndarray):
        if index.ndim > 0 and sequence_ok:
            return None
        if isinstance(index, np.ndarray):
            integral = index.dtype.kind in "iu"
        else:
            integral = not (index.is_floating_point() or index.is_complex())
        if index.ndim == 0 and integral:
            return int(index.item())
        raise _refused(index, f"a {index.ndim}-d {index.dtype} {type(index).__name__} is not an index")
    if sequence_ok and (isinstance(index, slice) or isinstance(index, Sequence) and not isinstance(index, str | bytes)):
        return None
    if not isinstance(index, str | bytes | float | np.floating):
        try:
            return operator.index(index)
        except TypeError:
            pass
    raise _refused(index, f"{type(index).__name__} is not an index")


def _index_array(index: Any) -> np.ndarray:
    """A sequence of window indices (a list, tuple, range, numpy array or 1-d tensor) as int64."""
    if isinstance(index, torch.Tensor | np.ndarray):
        arr = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else index
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise _refused(index, f"a {arr.ndim}-d {arr.dtype} array is not a sequence of indices")
        return arr.astype(np.int64, copy=False)
    values = list(index)
    if all(type(v) is int for v in values):  # a DataLoader's batch of indices: plain ints
        return np.asarray(values, dtype=np.int64)
    return np.asarray([_scalar(v) for v in values], dtype=np.int64)  # names the first that is not an int
