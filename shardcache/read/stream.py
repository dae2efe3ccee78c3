"""Stream every sliding window of a cache as ready batches, and read single windows by index.

``WindowStream`` is a ``torch.utils.data.IterableDataset`` for training
(``DataLoader(stream, batch_size=None, num_workers=k)`` or ``stream.loader(k)``);
``WindowDataset`` (``shardcache.read.dataset``) is its map-style twin for evaluation. Both take a
``WindowSpec`` (or its fields: ``seq_len`` positionally, the rest by keyword only).

How a batch is made
    The epoch's plan (``plan.make_plan``) is computed before a byte is read. Each iterator
    has a reader (``shardcache.read.reader``, given a ``ReadSpec``): ``decoders`` threads read each
    mixing pool's shard blocks into one arena per pool, in plan order, as far ahead as the
    budget allows (the open pools plus ``prefetch`` blocks, or ``memory_budget``); a gather
    thread copies runs of consecutive batches out of the arenas (one ``index_select`` per
    pool) and queues them, so each window is copied once, from the
    decoded bars into the batch, and the consumer only takes ready batches. With a ``memory_budget``
    that holds the split (``resident``) its bars stay decoded (``shardcache.read.resident``).

Shuffling
    Shards are permuted every epoch (from ``seed`` and the epoch), each rank takes an equal
    contiguous run of that order, and its pieces are cut into pools of ``mix`` consecutive
    shards whose windows are permuted together. One batch draws from the ``mix`` (at a pool
    boundary ``2 * mix``) shards of its pool, not from the whole cache: raise ``mix`` for
    more mixing at the cost of ``mix`` resident blocks per reader.

Passes and epochs (one rule, whatever the loader)
    Every new pass (``iter()``: a ``for`` loop, a DataLoader epoch, Lightning's) is a full
    epoch from its first batch; a pass left early (a peek, a ``break``, a sanity check)
    never shortens the next one. Each pass is the next epoch, so a shuffled stream shuffles
    anew; ``shuffle=False`` serves the same windows in the same order every pass.
    ``set_epoch(e)`` pins the next pass to epoch ``e`` (the ones after it are ``e + 1``, ...);
    ``load_state_dict`` pins it to the saved epoch and position, and a ``set_epoch`` of that
    same epoch before the pass keeps the position. In-process the stream counts passes
    itself; a plain DataLoader's worker counts its own passes in the stream's shared-memory
    state (its pass count is the DataLoader's), so plain, persistent and ``loader()``
    workers all agree (``stream.epoch`` reads their count). Only ``loader()`` (or in-process
    iteration) counts delivered batches, so only they make ``state_dict()`` exact mid-epoch.

    A new ``iter()`` in the same process supersedes the previous iterator of the stream:
    the old one raises ``RuntimeError`` at its next batch (two live iterators of one stream
    would make the position meaningless).

Ranks
    Rank and world size are resolved when a pass's plan is made: ``torch.distributed`` if
    initialized, else ``RANK``/``WORLD_SIZE``, else 0/1 (a DataLoader worker started by
    spawn takes its main process's). A stream made before ``init_process_group`` is correct.
    Every valid window is served once per epoch across workers and ranks: batch ``i`` of a
    rank goes to worker ``i % num_workers``. So that every rank has the same number of
    batches, ``plan().dropped`` windows (fewer than the world size) are left out of each
    epoch, and with ``drop_last`` also each rank's last partial batch.

Elastic resume
    ``state_dict()`` is the same on every rank (ranks move in lockstep); loaded at another
    world size, the rest of the epoch (every window no rank had delivered) is dealt out again,
    each once, in the same order, with the same number of batches on every rank.

Torch threads
    The stream never changes torch's thread settings as the caller sees them: only its gather
    thread runs on one OpenMP thread, set for that thread alone (see ``shardcache.read.reader``).

Outputs
    Batches are ``Batch(x, y)`` (``x, y = batch`` works), or ``MetaBatch(x, y, index, symbol,
    time)`` with ``meta=True``; every tensor is one the caller may keep. A DataLoader worker
    gathers its batches into a few reused shared-memory slots that the main process maps once
    (``shardcache.read.ship``): a batch crosses as a few integers, and a slot is reused only
    once the caller has dropped every tensor over it.
    ``return_index`` (before 1.0) is gone: ``meta=True`` gives each window's symbol and row
    in that symbol's own arrays, which plain zarr and xarray users can read.

Resources
    ``close()`` (or ``with``) stops every reader's threads and DataLoader worker the stream
    started and frees a resident arena; a garbage-collected iterator stops its reader.
"""

from __future__ import annotations

import functools
import os
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..format.cache import Cache
from .dataset import WindowDataset
from .options import (
    CUDA_WORKERS,
    Batch,
    MetaBatch,
    check_device,
    check_split,
    columns,
    count,
    default_decoders,
    open_for_reading,
    parse_budget,
    rank_world,
    window_spec,
)
from .plan import EpochPlan, WindowSpec, make_plan, no_windows_error, valid_ranges
from .reader import RUN_BYTES, RUNS_AHEAD, Reader, ReadSpec
from .resident import Resident, resident_bytes
from .ship import WorkerRing, forget, ship

__all__ = ["Batch", "MetaBatch", "WindowDataset", "WindowSpec", "WindowStream", "parse_budget"]

_MAX_HISTORY = 8  # checkpoints of one epoch a resume can chain
_MAX_WORKERS = 256
# the shared-memory state: anchor epoch, seed, passes since the anchor (main process), the
# current main pass's epoch and delivered batches, the anchor's resume history, then each
# DataLoader worker's passes since the anchor
_ANCHOR, _SEED, _MAIN, _CUR, _DONE, _HLEN, _HIST = 0, 1, 2, 3, 4, 5, 6
_WORKERS = _HIST + 2 * _MAX_HISTORY


class WindowStream(IterableDataset):
    """Every valid window of a cache (one ``split``), shuffled by shard pools, as ready batches.

    ``WindowStream(cache, 60, split="train")``: ``seq_len`` (or a ``WindowSpec``) is the only
    positional setting. Yields ``Batch(x, y)``: ``x`` float32 ``[B, seq_len, F]`` (the
    ``features`` columns, all by default) and ``y`` the target row ``p + seq_len - 1 +
    horizon`` (the ``target`` columns) ``[B, T]``, or ``[B, len(horizon), T]`` for a sequence
    of horizons; ``meta=True`` yields ``MetaBatch`` (see there). A cache with several splits
    needs ``split`` (a name, or ``"all"``). ``prefetch`` blocks are decoded ahead of the open
    pools, by ``decoders`` threads (default: one per core this process may run on, shared by the
    DataLoader workers, at most 8: see ``default_decoders``); ``memory_budget`` (bytes,
    ``"512MiB"``, ``"auto"``: see ``parse_budget``; shared by the DataLoader workers) caps
    the decoded blocks instead. ``mix`` shards are shuffled together; ``device`` is where
    blocks live and batches are gathered. See the module docstring for passes, epochs,
    ranks and resume.
    """

    def __init__(
        self,
        cache: Cache | str | os.PathLike[str],
        seq_len: int | WindowSpec,
        *,
        horizon: int | Sequence[int] | None = None,
        stride: int | None = None,
        features: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
        split: str | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        mix: int = 4,
        prefetch: int = 2,
        decoders: int | None = None,
        memory_budget: int | str | None = None,
        device: str | torch.device | None = None,
        meta: bool = False,
        storage_options: dict | None = None,
    ) -> None:
        batch_size, mix = count("batch_size", batch_size, 1), count("mix", mix, 1)
        prefetch = count("prefetch", prefetch, 0)
        decoders = None if decoders is None else count("decoders", decoders, 0)
        self.spec = window_spec(seq_len, horizon, stride, features, target)  # options first, then the cache
        self.device = check_device(device)
        self.memory_budget = parse_budget(memory_budget, self.device)
        self.cache = open_for_reading(cache, storage_options)
        self.split = check_split(self.cache, split)
        self.batch_size, self.shuffle, self.mix = int(batch_size), bool(shuffle), int(mix)
        self.drop_last, self.prefetch, self._decoders = bool(drop_last), int(prefetch), decoders
        xcols = columns(self.cache, self.spec.features, "features")
        ycols = columns(self.cache, self.spec.target, "target")
        ranges = valid_ranges(self.cache, self.spec, split=self.split)
        if not ranges.total():
            raise no_windows_error(self.cache, self.spec, self.split)
        self.read_spec = ReadSpec(
            self.cache,
            ranges,
            self.spec.seq_len,
            self.spec.horizons,
            isinstance(self.spec.horizon, tuple),
            xcols,
            ycols,
            len(xcols) if xcols is not None else self.cache.n_features,
            len(ycols) if ycols is not None else self.cache.n_features,
            self.device,
            bool(meta),
        )
        self._state = torch.zeros(_WORKERS + _MAX_WORKERS, dtype=torch.int64).share_memory_()
        self._state[_SEED], self._state[_CUR] = int(seed), -1
        self._owner = os.getpid()  # the process whose passes this state counts (and its DataLoader workers)
        self._pass_start: torch.Tensor | None = None  # in a loader()'s worker: that loader's pass
        self._dist_hint: tuple[int, int] | None = None  # in a spawned worker: the main process's rank
        self._pass_history: tuple[tuple[int, int], ...] = ()  # the current main pass's resume history
        self._pass_world = 1
        self._token = 0  # the live in-process iterator's number
        self._plans: dict[tuple, EpochPlan] = {}
        self._readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self._loader_iters: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False
        self._resident_bytes = None if self.memory_budget is None else resident_bytes(self.read_spec)
        self._resident: Resident | None = None  # made by the first resident pass, kept until close()
        self._ship_id = uuid.uuid4().hex  # names this stream's workers' shared-memory rings (``ship``)
        self._ring: WorkerRing | None = None  # in a DataLoader worker: its ring, kept across passes
        weakref.finalize(self, forget, self._ship_id)
        if not self.resident:
            self._capacity(self.plan(0), 1)  # a memory_budget too small for one pool fails here

    # -- settings ------------------------------------------------------------------------
    seq_len = property(lambda self: self.spec.seq_len)
    horizon = property(lambda self: self.spec.horizon)
    stride = property(lambda self: self.spec.stride)
    span = property(lambda self: self.spec.span)
    meta = property(lambda self: self.read_spec.meta)

    @property
    def decoders(self) -> int:
        """Decoder threads of each reader: as given, else ``default_decoders`` of this process's
        affinity, divided among the DataLoader's workers when read in one."""
        if self._decoders is not None:
            return self._decoders
        info = get_worker_info()
        return default_decoders(1 if info is None else info.num_workers)

    @property
    def rank(self) -> int:
        """This process's rank, as a plan made now would use it."""
        return rank_world(self._dist_hint)[0]

    @property
    def world(self) -> int:
        return rank_world(self._dist_hint)[1]

    @property
    def resident(self) -> bool:
        """Whether in-process passes keep the split's decoded bars: ``memory_budget`` covers them."""
        return self._resident_bytes is not None and self._resident_bytes <= self.memory_budget  # type: ignore[operator]

    @property
    def epoch(self) -> int:
        """The epoch of the next pass."""
        self._claim()
        return self._pass(self._passes())[0]

    @property
    def seed(self) -> int:
        return int(self._state[_SEED])

    # -- plan and state ------------------------------------------------------------------
    def _claim(self) -> None:
        """In a process that is not the stream's owner nor its DataLoader worker (a stream pickled to
        ``mp.spawn`` ranks), take a private copy of the state: ranks must not count each other's passes."""
        if self._owner != os.getpid():
            self._state, self._owner = self._state.clone().share_memory_(), os.getpid()

    def _history(self) -> tuple[tuple[int, int], ...]:
        n = int(self._state[_HLEN])
        h = self._state[_HIST : _HIST + 2 * n].tolist()
        return tuple((int(h[2 * i]), int(h[2 * i + 1])) for i in range(n))

    def _passes(self) -> int:
        """Passes since the anchor: the main process's, or a plain DataLoader's (its workers count them)."""
        return max(int(self._state[_MAIN]), int(self._state[_WORKERS:].max()))

    def _pass(self, k: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        """Epoch and resume history of the ``k``-th pass since the anchor (``set_epoch``, a loaded state)."""
        anchor = int(self._state[_ANCHOR])
        return (anchor, self._history()) if k == 0 else (anchor + k, ())

    def _anchor(self, epoch: int, history: Sequence[tuple[int, int]]) -> None:
        if len(history) > _MAX_HISTORY:
            raise ValueError(f"a resume can chain {_MAX_HISTORY} checkpoints of one epoch, not {len(history)}")
        st = self._state
        st[_ANCHOR], st[_MAIN], st[_CUR], st[_DONE], st[_HLEN] = int(epoch), 0, -1, 0, len(history)
        st[_HIST : _HIST + 2 * len(history)] = torch.tensor(
            [int(v) for pair in history for v in pair], dtype=torch.int64
        )
        st[_WORKERS:] = 0

    def _plan(self, epoch: int, history: tuple, rank: int, world: int) -> EpochPlan:
        key = (epoch, self.seed, history, rank, world)
        if key not in self._plans:
            if len(self._plans) > 4:
                self._plans.clear()
            self._plans[key] = make_plan(
                self.read_spec.ranges,
                self.cache.n_rows,
                self.cache.shard_rows,
                batch_size=self.batch_size,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=epoch,
                rank=rank,
                world=world,
                mix=self.mix,
                drop_last=self.drop_last,
                history=history,
            )
        return self._plans[key]

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's plan for ``epoch`` from its start, or of the next pass by default."""
        self._claim()
        rank, world = rank_world(self._dist_hint)
        if epoch is None:
            return self._plan(*self._pass(self._passes()), rank, world)
        return self._plan(int(epoch), (), rank, world)

    @property
    def n_batches(self) -> int:
        """Batches of the next pass on this rank (every rank has the same number)."""
        return self.plan().n_batches

    def __len__(self) -> int:
        return self.n_batches

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (from its first batch); the passes after it follow on.
        Kept as it is when it names the epoch a loaded ``state_dict`` is about to resume."""
        self._claim()
        fresh = int(self._state[_MAIN]) == 0 and not int(self._state[_WORKERS:].sum())
        if not (fresh and int(epoch) == int(self._state[_ANCHOR])):
            self._anchor(int(epoch), ())

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: its number and, per checkpoint, ``[world, batches delivered per
        rank]``, plus the settings a resume must match. The same on every rank."""
        self._claim()
        st = self._state
        if int(st[_MAIN]) == 0:  # no pass here: the anchor, or after a plain DataLoader's whole passes
            epoch, hist = self._pass(self._passes())
            history = [list(h) for h in hist]
        else:
            epoch, done = int(st[_CUR]), int(st[_DONE])
            n = self._current_batches()
            history = [] if done >= n else [*map(list, self._pass_history), [self._pass_world, done]]
            if done >= n:
                epoch += 1
        return {"epoch": epoch, "seed": self.seed, "history": history, **self._signature()}

    def _current_batches(self) -> int:
        """Batches of the current main pass (the same on every rank)."""
        return self._plan(int(self._state[_CUR]), self._pass_history, 0, self._pass_world).n_batches

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass continue ``state``'s epoch after its last delivered batch, at any world size."""
        mine = self._signature()
        bad = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if bad:
            detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in bad.items())
            raise ValueError(f"state_dict is from a different stream ({detail})")
        self._claim()
        history = [(int(w), int(c)) for w, c in state["history"]]
        if any(w < 1 or c < 0 for w, c in history):
            raise ValueError(f"state_dict history {state['history']!r} is not [[world, batches], ...]")
        self._state[_SEED] = int(state["seed"])
        self._plans.clear()
        self._anchor(int(state["epoch"]), history)

    def _signature(self) -> dict[str, Any]:
        """The settings that fix the epoch's batches: a saved position means nothing without them."""
        h = self.spec.horizon
        return {
            "seq_len": self.seq_len,
            "horizon": list(h) if isinstance(h, tuple) else h,
            "stride": self.stride,
            "split": self.split,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "mix": self.mix,
            "drop_last": self.drop_last,
            "n_windows": self.read_spec.ranges.total(),
        }

    def _begin_pass(self) -> tuple[int, tuple, int, int]:
        """Start a pass in the main process: its epoch, resume history, rank and world."""
        self._claim()
        k = int(self._state[_MAIN])
        epoch, history = self._pass(k)
        rank, world = rank_world(self._dist_hint)
        self._state[_MAIN], self._state[_CUR], self._state[_DONE] = k + 1, epoch, 0
        self._pass_history, self._pass_world = history, world
        self._token += 1
        for reader in list(self._readers):  # the superseded iterator's reader
            reader.close()
        return epoch, history, rank, world

    def _capacity(self, plan: EpochPlan, workers: int) -> int:
        """Bytes of blocks one reader may hold: the open pool plus ``prefetch``, or the budget."""
        need = plan.max_open_pieces()
        block = (self.cache.shard_rows + self.span - 1) * self.read_spec.row_bytes
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
    def __iter__(self) -> Iterator[Batch | MetaBatch]:
        if self._closed:
            raise RuntimeError("WindowStream is closed")
        info = get_worker_info()
        if info is None:
            epoch, history, rank, world = self._begin_pass()
            return self._iterate(self._plan(epoch, history, rank, world), 0, 1, token=self._token)
        if self.device.type == "cuda":
            raise RuntimeError(CUDA_WORKERS)
        if self._pass_start is not None:  # a loader()'s worker: the pass its main process began
            start = self._pass_start.tolist()
            epoch, rank, world, n = start[:4]
            history = tuple((start[4 + 2 * i], start[5 + 2 * i]) for i in range(n))
        else:  # a plain DataLoader's worker: its own pass count is the DataLoader's
            if info.id >= _MAX_WORKERS:
                raise RuntimeError(f"WindowStream supports up to {_MAX_WORKERS} DataLoader workers")
            k = int(self._state[_WORKERS + info.id])
            self._state[_WORKERS + info.id] = k + 1
            epoch, history = self._pass(k)
            rank, world = rank_world(self._dist_hint)
        plan = self._plan(epoch, history, rank, world)
        return self._iterate(plan, info.id, info.num_workers, token=None)

    def _iterate(self, plan: EpochPlan, worker: int, workers: int, token: int | None) -> Iterator[Batch | MetaBatch]:
        """Batches ``worker``, ``+ workers``, ... of ``plan``; in the main process (``token``) it also
        counts each delivered batch into the state, and stops once a newer iterator started."""
        batches = range(worker, plan.n_batches, workers)
        if not batches:
            return
        in_worker = token is None
        spec = self.read_spec
        run = self.batch_size if in_worker else RUN_BYTES // (4 * self.seq_len * spec.nx)
        counts = self._state.numpy()  # the shared position tensor, written without torch's per-call cost
        resident = None
        if not in_worker and self.resident:
            resident = self._resident = self._resident or Resident(spec, self.cache.shard_rows)
            if resident.complete:  # nothing to read: each batch gathered on this thread, no reader
                for batch, gathered in resident.batches(spec, plan, batches):
                    if token != self._token or self._closed:
                        raise RuntimeError("this WindowStream iterator was closed, or superseded by a newer iter()")
                    counts[_DONE] = batch + 1
                    yield gathered
                return
        capacity = self._capacity(plan, workers) if resident is None else resident.nbytes
        reader = Reader(
            spec,
            plan,
            batches,
            capacity,
            decoders=self.decoders,
            run_windows=run,
            outputs=self._worker_ring() if in_worker else None,
            resident=resident,
            ahead=1 if in_worker else RUNS_AHEAD,
        )
        self._readers.add(reader)
        try:
            reader.start()
            while (ready := reader.next()) is not None:
                x, y = ready.x, ready.y
                if ready.event is not None:  # CUDA: the gather thread's copies, on its own stream
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(ready.event)
                    x.record_stream(current)
                    y.record_stream(current)
                for batch, p, r in ready.batches:
                    if reader.stop.is_set() or (token is not None and token != self._token):
                        raise RuntimeError("this WindowStream iterator was closed, or superseded by a newer iter()")
                    if not in_worker:
                        counts[_DONE] = batch + 1
                    if ready.meta is None:
                        out: Batch | MetaBatch = Batch(x[p:r], y[p:r])
                    else:
                        out = MetaBatch(x[p:r], y[p:r], *(m[p:r] for m in ready.meta))
                    yield ship(out) if in_worker else out
        finally:
            reader.close()

    def _worker_ring(self) -> WorkerRing:
        """This DataLoader worker's shared-memory slots for its batches (made on its first pass)."""
        if self._ring is None:
            s = self.read_spec
            self._ring = WorkerRing(self._ship_id, ((self.batch_size, s.seq_len, s.nx), s.y_shape(self.batch_size)))
        return self._ring

    def loader(self, num_workers: int = 0, **dataloader_kwargs: Any) -> DataLoader:
        """A DataLoader (``batch_size=None``) that counts delivered batches into this stream's
        state, so ``state_dict()`` is exact with ``num_workers > 0``; stopped by ``close()``."""
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if key in dataloader_kwargs:
                raise TypeError(f"loader() sets {key} itself; batching is the stream's")
        if dataloader_kwargs.get("in_order") is False:
            raise ValueError("loader() needs in_order=True: batch i comes from worker i % num_workers")
        if num_workers > 0 and self.device.type == "cuda":
            raise ValueError(CUDA_WORKERS)
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
        if self._resident is not None:  # freed now, even while an iterator of it is still referenced
            self._resident.release()
            self._resident = None
        forget(self._ship_id)

    def __enter__(self) -> WindowStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = state["_loader_iters"] = state["_ring"] = state["_resident"] = None
        state["_plans"] = {}
        if dist.is_available() and dist.is_initialized():  # a spawned worker cannot ask torch.distributed
            state["_dist_hint"] = (dist.get_rank(), dist.get_world_size())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers, self._loader_iters = weakref.WeakSet(), weakref.WeakSet()

    def __repr__(self) -> str:
        rank, world = rank_world(self._dist_hint)
        return (
            f"WindowStream({self.cache.url!r}, seq_len={self.seq_len}, horizon={self.horizon}, "
            f"stride={self.stride}, split={self.split!r}, batch_size={self.batch_size}, "
            f"windows={self.read_spec.ranges.total()}, memory_budget={self.memory_budget}, "
            f"device={str(self.device)!r}, rank={rank}/{world})"
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

    Each pass (epoch, rank, world, resume history) is written to ``_start`` (shared memory)
    before the workers start or resume; they read it there, while the stream's own count
    moves as batches arrive.
    """

    def __init__(self, stream: WindowStream, **kwargs: Any) -> None:
        self._start = torch.zeros(4 + 2 * _MAX_HISTORY, dtype=torch.int64).share_memory_()
        init = functools.partial(_loader_worker_init, self._start, kwargs.pop("worker_init_fn", None))
        super().__init__(stream, worker_init_fn=init, **kwargs)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        stream: WindowStream = self.dataset  # type: ignore[assignment]
        if stream._closed:
            raise RuntimeError("WindowStream is closed")
        if self.num_workers == 0:
            return super().__iter__()  # the stream's own iterator counts in this process
        epoch, history, rank, world = stream._begin_pass()  # before any worker reads it
        flat = [v for pair in history for v in pair]
        self._start[: 4 + len(flat)] = torch.tensor([epoch, rank, world, len(history), *flat], dtype=torch.int64)
        it = super().__iter__()
        stream._loader_iters.add(it)
        return self._counted(stream, it)

    @staticmethod
    def _counted(stream: WindowStream, it: Iterator[Any]) -> Iterator[Any]:
        for batch in it:
            stream._state[_DONE] += 1
            yield batch
