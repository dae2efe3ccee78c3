"""Stream every sliding window of a cache as ready batches, and read single windows by index.

``WindowStream`` is a ``torch.utils.data.IterableDataset`` for training
(``DataLoader(stream, batch_size=None, num_workers=k)`` or ``stream.loader(k)``);
``WindowDataset`` is its map-style twin for evaluation and random access.

How a batch is made
    The epoch's plan (``index.make_plan``) is computed before a byte is read. Each iterator
    has a reader (``shardcache.reader``): decoder threads read each mixing pool's shard
    blocks (rows ``[first start, last start + seq_len + horizon)`` of a shard, one zarr call
    each) into one arena per pool, in plan order and up to ``prefetch`` blocks at once, as
    far ahead as the budget allows (the open pools plus ``prefetch`` blocks, or
    ``memory_budget``); a gather thread copies runs of consecutive batches out of the
    arenas with one ``torch.index_select(torch.as_strided(arena, (n, seq_len, F), (F, F, 1)),
    0, rows, out=x)`` per pool and queues them, so each window is copied once, from the
    decoded bars into the batch, and the consumer only takes ready batches.

Shuffling
    Shards are permuted every epoch (from ``seed`` and the epoch), each rank takes an equal
    contiguous run of that order, and its pieces are cut into pools of ``mix`` consecutive
    shards whose windows are permuted together. Unlike a global shuffle, one batch draws
    from the ``mix`` (at a pool boundary ``2 * mix``) shards of its pool, i.e. from a few
    ``mix * shard_rows``-bar stretches of the data, not from the whole cache: raise ``mix``
    for more mixing at the cost of ``mix`` resident blocks per reader.

Exactly once
    Every valid window is served once per epoch across DataLoader workers and DDP ranks:
    batch ``i`` of a rank goes to worker ``i % num_workers``, so the batch order does not
    depend on ``num_workers``. So that every rank has the same number of batches,
    ``plan().dropped`` windows (fewer than the world size) are left out of each epoch,
    and with ``drop_last`` also each rank's last partial batch.

Torch threads
    The gather thread runs torch on one intra-op thread (see ``shardcache.reader``): split
    over both cores of the test machine, the copy ran 3-8x slower as soon as another thread
    was busy. The caller's thread settings are left as they are.

Outputs
    Every batch is a tensor the caller may keep; in-process, the batches of one run (up to
    ``reader.RUN_BYTES``) are views of one tensor. In a DataLoader worker each batch is
    allocated alone in shared memory, as ``default_collate`` does, so sending it to the
    main process costs no extra copy.

Position and resume
    A stream remembers its epoch and the batches delivered in it (``state_dict``). A new
    iteration continues after the last delivered batch; one that starts after a finished
    epoch begins the next epoch. In-process iteration counts batches itself; with
    ``num_workers > 0`` only ``stream.loader(...)`` can count them (a plain DataLoader
    keeps the main-process position unchanged). Workers read the position from a small
    shared-memory tensor, so persistent workers follow ``set_epoch`` too. A ``loader()``
    fixes each pass's starting position in a tensor of its own before any worker starts (or
    resumes), and its workers read that one: the main process counts batches while the
    workers start, and a worker that reads ``consumed`` after the first batches were counted
    would start at the wrong batch.

Resources
    ``close()`` (or ``with``) stops every reader's threads and DataLoader worker the stream
    started; a garbage-collected iterator stops its reader (generator ``finally``).
"""

from __future__ import annotations

import functools
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .index import EpochPlan, Ranges, make_plan, valid_ranges
from .reader import RUN_BYTES, Reader
from .store import Cache, open_cache

__all__ = ["WindowStream", "WindowDataset"]

_LRU_BLOCKS = 4


def _rank_world() -> tuple[int, int]:
    """Rank and world size: ``torch.distributed`` if initialized, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _columns(cache: Cache, names: Sequence[str] | None, what: str) -> list[int] | None:
    """Column indices of ``names`` in the cache (None keeps every feature)."""
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(f"{what} must be a list of feature names, not a string")
    have = {n: i for i, n in enumerate(cache.feature_names)}
    missing = [n for n in names if n not in have]
    if missing or not names:
        problem = f"unknown feature(s) {', '.join(map(str, missing))}" if missing else "no feature named"
        raise ValueError(f"{what}: {problem}; the cache has {', '.join(have)}")
    return [have[n] for n in names]


class WindowStream(IterableDataset):
    """Every valid window of a cache (``split``, ``stride``), shuffled by shard pools, as ready batches.

    Yields ``(x, y)``: ``x`` float32 ``[B, seq_len, F]`` (the ``features`` columns, all by
    default), ``y`` the target row ``p + seq_len - 1 + horizon`` (the ``target`` columns, all
    by default) ``[B, T]``; with ``return_index`` also ``index`` int64 ``[B]`` (on the CPU),
    each window's start row in the cache's ``features`` array. Use it as
    ``DataLoader(stream, batch_size=None)`` or ``stream.loader(num_workers)``, which also
    makes ``state_dict()`` exact with workers. ``prefetch`` is the number of blocks held
    ahead of the open pools and the number decoded at once (0: one at a time, on the gather
    thread); ``memory_budget`` (bytes of decoded blocks, shared by the DataLoader workers)
    replaces the former. ``mix`` shards are shuffled together; ``device`` is
    where blocks live and batches are gathered (``"cuda"``: each block is copied once,
    pinned and non-blocking).
    """

    def __init__(
        self,
        cache: Cache | str | os.PathLike[str],
        seq_len: int,
        horizon: int = 1,
        stride: int = 1,
        split: str | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        features: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
        prefetch: int = 2,
        memory_budget: int | None = None,
        drop_last: bool = False,
        return_index: bool = False,
        device: str | torch.device | None = None,
        *,
        mix: int = 4,
    ) -> None:
        if batch_size < 1 or prefetch < 0 or mix < 1:
            raise ValueError("need batch_size >= 1, prefetch >= 0 and mix >= 1")
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError("memory_budget must be a positive number of bytes")
        self.cache = open_cache(cache)
        self.seq_len, self.horizon, self.stride, self.split = int(seq_len), int(horizon), int(stride), split
        self.span = self.seq_len + self.horizon
        self.batch_size, self.shuffle, self.mix = int(batch_size), bool(shuffle), int(mix)
        self.drop_last = bool(drop_last)
        self.prefetch, self.memory_budget = int(prefetch), memory_budget
        self.return_index = bool(return_index)
        self.device = torch.device(device if device is not None else "cpu")
        self._ranges: Ranges = valid_ranges(self.cache, self.seq_len, self.horizon, self.stride, split)
        self._xcols = _columns(self.cache, features, "features")
        self._ycols = _columns(self.cache, target, "target")
        self._nx = len(self._xcols) if self._xcols is not None else self.cache.n_features
        self._ny = len(self._ycols) if self._ycols is not None else self.cache.n_features
        self._row_bytes = 4 * (self._nx if self._xcols is None and self._ycols is None else self._nx + self._ny)
        self.rank, self.world = _rank_world()
        self._state = torch.tensor([0, int(seed), 0], dtype=torch.int64).share_memory_()  # epoch, seed, consumed
        self._pass_start: torch.Tensor | None = None  # in a loader()'s worker: that loader's pass start
        self._plans: dict[tuple[int, int], EpochPlan] = {}
        self._readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self._loader_iters: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False
        self._capacity(self.plan(0), 1)  # a memory_budget too small for one pool fails here

    # -- plan and state ------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._state[0])

    @property
    def seed(self) -> int:
        return int(self._state[1])

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's plan for ``epoch`` (the current one by default)."""
        key = (self.epoch if epoch is None else int(epoch), self.seed)
        if key not in self._plans:
            if len(self._plans) > 4:
                self._plans.clear()
            self._plans[key] = make_plan(
                self._ranges, self.cache.n_rows, self.cache.shard_rows, batch_size=self.batch_size,
                shuffle=self.shuffle, seed=key[1], epoch=key[0], rank=self.rank, world=self.world,
                mix=self.mix, drop_last=self.drop_last,
            )
        return self._plans[key]

    @property
    def n_batches(self) -> int:
        """Batches per rank per epoch (the same for every rank and epoch)."""
        return self.plan().n_batches

    def __len__(self) -> int:
        return self.n_batches

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (another shuffle); a no-op if it is the current one, so a resumed
        position survives the usual ``set_epoch`` at the top of the epoch loop."""
        if int(epoch) != self.epoch:
            self._state[0], self._state[2] = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch, seed and batches delivered this epoch, plus the settings a resume must match."""
        return {"epoch": self.epoch, "seed": self.seed, "consumed": int(self._state[2]), **self._signature()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next batch not delivered when ``state`` was saved; refuse another stream."""
        mine = self._signature()
        bad = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if bad:
            detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in bad.items())
            raise ValueError(f"state_dict is from a different stream ({detail})")
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.n_batches:
            raise ValueError(f"state_dict consumed {consumed} batches of {self.n_batches}")
        self._state[0], self._state[1], self._state[2] = int(state["epoch"]), int(state["seed"]), consumed
        self._plans.clear()

    def _signature(self) -> dict[str, Any]:
        """The settings that fix the epoch's batches: a saved position means nothing without them."""
        keys = ("seq_len", "horizon", "stride", "split", "batch_size", "world", "shuffle", "mix", "drop_last")
        return {**{k: getattr(self, k) for k in keys}, "n_windows": self._ranges.total()}

    def _position(self, advance: bool) -> tuple[int, int]:
        """Epoch and first batch of a new iteration; after a finished epoch, the next epoch."""
        epoch, consumed = self.epoch, int(self._state[2])
        if consumed >= self.n_batches > 0:
            epoch, consumed = epoch + 1, 0
            if advance:
                self._state[0], self._state[2] = epoch, 0
        return epoch, consumed

    def _capacity(self, plan: EpochPlan, workers: int) -> int:
        """Bytes of blocks one reader may hold: the open pool plus ``prefetch``, or the budget."""
        need = plan.max_open_pieces()
        block = (self.cache.shard_rows + self.span - 1) * self._row_bytes
        if self.memory_budget is None:
            return (need + self.prefetch) * block
        per = self.memory_budget // workers
        if per < need * block:
            raise ValueError(
                f"memory_budget {self.memory_budget} B gives each of {workers} reader(s) {per} B, but a "
                f"reader must hold {need} blocks of up to {block} B at once (mix={self.mix} shards per pool, "
                f"a batch can straddle two pools): raise memory_budget to at least {need * block * workers} B "
                "or lower mix"
            )
        return per

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self._closed:
            raise RuntimeError("WindowStream is closed")
        info = get_worker_info()
        if info is not None and self._pass_start is not None:
            # a loader()'s worker: the position the main process fixed when this pass began, not
            # the live count, which the main process advances while workers are still starting
            epoch, consumed = int(self._pass_start[0]), int(self._pass_start[1])
        else:  # in-process, or a plain DataLoader's worker (nothing counts, the position is still)
            epoch, consumed = self._position(advance=info is None)
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self._iterate(epoch, consumed, worker, workers, in_worker=info is not None)

    def _iterate(
        self, epoch: int, consumed: int, worker: int, workers: int, in_worker: bool
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        """Batches ``consumed + worker``, ``+ workers``, ... of ``epoch``; in the main process it
        also counts each delivered batch into the state."""
        plan = self.plan(epoch)
        batches = range(consumed + worker, plan.n_batches, workers)
        if not batches:
            return
        run = self.batch_size if in_worker else RUN_BYTES // (4 * self.seq_len * self._nx)
        reader = Reader(self, plan, batches, self._capacity(plan, workers), decoders=self.prefetch,
                        run_windows=run, shared=in_worker and self.device.type == "cpu")
        self._readers.add(reader)
        counts = self._state.numpy()  # the shared position tensor, written without torch's per-call cost
        try:
            reader.start()
            while (ready := reader.next()) is not None:
                x, y, index = ready.x, ready.y, ready.index
                if ready.event is not None:  # CUDA: the gather thread's copies, on its own stream
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(ready.event)
                    x.record_stream(current)
                    y.record_stream(current)
                for batch, p, r in ready.batches:
                    if reader.stop.is_set():
                        raise RuntimeError("WindowStream iterator was closed")
                    if not in_worker:
                        counts[2] = batch + 1
                    yield (x[p:r], y[p:r], index[p:r]) if index is not None else (x[p:r], y[p:r])
        finally:
            reader.close()

    def _empty(self, shape: tuple[int, ...], shared: bool) -> torch.Tensor:
        """A new output tensor; in a DataLoader worker, in shared memory, as ``default_collate`` does,
        so sending it to the main process costs no copy."""
        if not shared:
            return torch.empty(shape, device=self.device)
        storage = torch.UntypedStorage._new_shared(4 * int(np.prod(shape)))
        return torch.empty(0).set_(storage, 0, shape)

    def loader(self, num_workers: int = 0, **dataloader_kwargs: Any) -> DataLoader:
        """A DataLoader (``batch_size=None``) that counts delivered batches into this stream's
        state, so ``state_dict()`` is exact with ``num_workers > 0``; stopped by ``close()``."""
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if key in dataloader_kwargs:
                raise TypeError(f"loader() sets {key} itself; batching is the stream's")
        if dataloader_kwargs.get("in_order") is False:
            raise ValueError("loader() needs in_order=True: batch i comes from worker i % num_workers")
        self._capacity(self.plan(), max(1, num_workers))  # a budget too small for the workers fails here
        return _StreamLoader(self, batch_size=None, num_workers=num_workers, **dataloader_kwargs)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every reader thread and DataLoader worker of this stream; later iteration fails."""
        self._closed = True
        for it in list(self._loader_iters):
            it._shutdown_workers()
        for reader in list(self._readers):
            reader.close()

    def __enter__(self) -> "WindowStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = state["_loader_iters"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers, self._loader_iters = weakref.WeakSet(), weakref.WeakSet()

    def __repr__(self) -> str:
        return (
            f"WindowStream({self.cache.url!r}, seq_len={self.seq_len}, horizon={self.horizon}, "
            f"stride={self.stride}, split={self.split!r}, batch_size={self.batch_size}, "
            f"windows={self._ranges.total()}, rank={self.rank}/{self.world})"
        )


def _loader_worker_init(start: torch.Tensor, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """``worker_init_fn`` of a ``loader()``: the worker's stream reads its pass position from ``start``."""
    info = get_worker_info()
    assert info is not None
    info.dataset._pass_start = start  # type: ignore[union-attr]
    if user_init is not None:
        user_init(worker_id)


class _StreamLoader(DataLoader):
    """A DataLoader over a ``WindowStream`` that counts each batch it delivers into the stream.

    Each pass's first batch is written to ``_start`` (shared memory) before the workers start
    or resume; they read it there, while the stream's own count moves as batches arrive.
    """

    def __init__(self, stream: WindowStream, **kwargs: Any) -> None:
        self._start = torch.zeros(2, dtype=torch.int64).share_memory_()  # epoch, first batch of the pass
        init = functools.partial(_loader_worker_init, self._start, kwargs.pop("worker_init_fn", None))
        super().__init__(stream, worker_init_fn=init, **kwargs)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        stream: WindowStream = self.dataset  # type: ignore[assignment]
        if stream._closed:
            raise RuntimeError("WindowStream is closed")
        if self.num_workers == 0:
            return super().__iter__()  # the stream's own iterator counts in this process
        self._start[0], self._start[1] = stream._position(advance=True)  # before any worker reads it
        it = super().__iter__()
        stream._loader_iters.add(it)
        return self._counted(stream, it)

    @staticmethod
    def _counted(stream: WindowStream, it: Iterator[Any]) -> Iterator[Any]:
        for batch in it:
            stream._state[2] += 1
            yield batch


class WindowDataset(Dataset):
    """Map-style windows in row order: ``ds[i]`` is ``(x [seq_len, F], y [T])`` of the ``i``-th valid window.

    Keeps the last few decoded shard blocks, so nearby indices cost no zarr call.
    """

    def __init__(
        self,
        cache: Cache | str | os.PathLike[str],
        seq_len: int,
        horizon: int = 1,
        split: str | None = None,
        features: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
    ) -> None:
        self.cache = open_cache(cache)
        self.seq_len, self.horizon, self.split = int(seq_len), int(horizon), split
        self.span = self.seq_len + self.horizon
        self._ranges = valid_ranges(self.cache, self.seq_len, self.horizon, 1, split)
        self._n = self._ranges.total()
        self._xcols = _columns(self.cache, features, "features")
        self._ycols = _columns(self.cache, target, "target")
        self._lru: OrderedDict[int, tuple[int, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return self._n

    def row(self, i: int) -> int:
        """Start row of window ``i`` in the cache's ``features`` array."""
        if not -self._n <= i < self._n:
            raise IndexError(f"window {i} out of range for {self._n} windows")
        return int(self._ranges.start_at(np.asarray([i % self._n]))[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.row(i)
        row0, block = self._block(p // self.cache.shard_rows)
        w = block[p - row0 : p - row0 + self.seq_len]
        t = block[p - row0 + self.seq_len - 1 + self.horizon]
        x = w if self._xcols is None else w[:, self._xcols]
        y = t if self._ycols is None else t[self._ycols]
        return torch.tensor(x), torch.tensor(y)

    def _block(self, shard: int) -> tuple[int, np.ndarray]:
        """Rows of ``shard`` plus the overhang its last windows need, from the LRU or one zarr call."""
        hit = self._lru.get(shard)
        if hit is not None:
            self._lru.move_to_end(shard)
            return hit
        lo = shard * self.cache.shard_rows
        hi = min(lo + self.cache.shard_rows + self.span - 1, self.cache.region_stop(lo))
        self._lru[shard] = hit = (lo, self.cache.read_rows(lo, hi))
        while len(self._lru) > _LRU_BLOCKS:
            self._lru.popitem(last=False)
        return hit

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lru"] = OrderedDict()
        return state

    def __repr__(self) -> str:
        return f"WindowDataset({self.cache.url!r}, seq_len={self.seq_len}, horizon={self.horizon}, windows={self._n})"
