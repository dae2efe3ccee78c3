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

Several caches
    ``WindowStream([es, nq], 60, split="train")`` streams caches with the same features as one:
    each cache's rows are laid out in one row space (``shardcache.read.sources``), so the plan,
    exactly-once delivery, workers, ranks, resume and the resident arena are those of one cache,
    and ``MetaBatch.source`` names each window's cache again. ``weights`` (with
    ``epoch_windows``) serve the caches in given proportions instead of every window once
    (``shardcache.read.mixture``). The split must cover the same times in every cache, or
    ``split_times`` cuts them all again at shared times; each cache keeps its own statistics.

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
    the old one raises ``StreamClosedError`` (a ``RuntimeError``) at its next batch (two live
    iterators of one stream would make the position meaningless). The pass state itself
    (``shardcache.read.passes``) is one object, ``stream.passes``.

Ranks
    Rank and world size are resolved when a pass's plan is made: ``torch.distributed`` if
    initialized, else ``RANK``/``WORLD_SIZE``, else 0/1 (a DataLoader worker started by
    spawn takes its main process's). A stream made before ``init_process_group`` is correct.
    Every valid window is served once per epoch across workers and ranks: batch ``i`` of a
    rank goes to worker ``i % num_workers``. So that every rank has the same number of
    batches, ``plan().dropped`` windows (fewer than the world size) are left out of each
    epoch, and with ``drop_last`` also each rank's last partial batch. A world with more ranks
    than windows is refused when a plan is made (each rank would have no batch).

Elastic resume
    ``state_dict()`` is the same on every rank (ranks move in lockstep); loaded at another
    world size, the rest of the epoch (every window no rank had delivered) is dealt out again,
    each once, in the same order, with the same number of batches on every rank. A state is
    refused (``StateError``, naming the field) when it is from another stream: another seed,
    shuffle, mix, batch size, window shape, split, cache (its bars: an appended cache is
    another; several caches, in their order), weights or split times, or when its history is
    not a position inside its epoch.

Torch threads
    The stream never changes torch's thread settings as the caller sees them: only its gather
    thread runs on one OpenMP thread, set for that thread alone (see ``shardcache.read.reader``).

Outputs
    Batches are ``Batch(x, y)`` (``x, y = batch`` works), or ``MetaBatch(x, y, index, symbol,
    time, target_time, source)`` with ``meta=True`` (``time`` is the last input bar's,
    ``target_time`` each target bar's, ``source`` the window's cache); every tensor is one the caller may keep. A DataLoader worker
    gathers its batches into a few reused shared-memory slots that the main process maps once
    (``shardcache.read.ship``): a batch crosses as a few integers, and a slot is reused only
    once the caller has dropped every tensor over it. ``MetaBatch.index`` is each window's
    symbol and row in that symbol's own arrays, which plain zarr and xarray users can read.

Resources
    ``close()`` (or ``with``) stops every reader's threads and DataLoader worker the stream
    started and frees a resident arena; a garbage-collected iterator stops its reader.
"""

from __future__ import annotations

import functools
import os
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Self

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import OptionError, OptionTypeError, SeveralCachesError, StateError, StreamClosedError
from ..format.cache import Cache
from ..format.numbers import MAX_COUNT, whole_number
from ..format.windows import WindowSpec
from .dataset import WindowDataset
from .identity import check_reads, reads_of
from .lifetime import StreamResources
from .loader import StreamLoader
from .mixture import Mixture
from .options import (
    CUDA_WORKERS,
    Batch,
    LoaderSettings,
    LocalCopy,
    MetaBatch,
    PlanSettings,
    parse_budget,
    rank_world,
    window_spec,
)
from .passes import Pass, PassState, Planner, check_history, check_signature
from .plan import EpochPlan
from .reader import RUN_BYTES, RUNS_AHEAD, Reader
from .readspec import ReadSpec
from .resident import resident_bytes
from .ship import forget, ship
from .sources import CacheInput, ReadsWindows, Sources

__all__ = ["Batch", "MetaBatch", "WindowDataset", "WindowSpec", "WindowStream", "parse_budget"]

_SUPERSEDED = "this WindowStream iterator was closed, or superseded by a newer iter()"


class WindowStream(ReadsWindows, IterableDataset[Batch | MetaBatch]):
    """Every valid window of a cache (one ``split``), shuffled by shard pools, as ready batches.

    ``WindowStream(cache, 60, split="train")``: ``seq_len`` (or a ``WindowSpec``) is the only
    positional setting. ``caches`` is one cache (a path, an fsspec URL or an open ``Cache``) or a
    sequence of them with the same features, streamed as one (``shardcache.read.sources``):
    every window of every cache once per epoch, or ``epoch_windows`` windows in the proportions
    ``weights`` (``shardcache.read.mixture``); ``split_times`` re-cuts every cache's splits at
    shared times. Yields ``Batch(x, y)``: ``x`` float32 ``[B, seq_len, F]`` (the
    ``features`` columns, all by default) and ``y`` the target row ``p + seq_len - 1 +
    horizon`` (the ``target`` columns) ``[B, T]``, or ``[B, len(horizon), T]`` for a sequence
    of horizons; ``meta=True`` yields ``MetaBatch`` (see there: ``time`` is the last input
    bar's, ``target_time`` the target bar's). A cache with several splits needs ``split`` (a
    name, or ``"all"``). The epoch's batches are fixed by the windows and ``PlanSettings``
    (``batch_size``, ``shuffle``, ``seed``, ``mix``, ``drop_last``); how they are read by
    ``LoaderSettings``: ``prefetch`` blocks are decoded ahead of the open pools, by ``decoders``
    threads (default: one per core this process may run on, shared by the DataLoader workers,
    at most 8: see ``default_decoders``); ``memory_budget`` (bytes, ``"512MiB"``, ``"auto"``:
    see ``parse_budget``; shared by the DataLoader workers) caps the decoded blocks instead;
    ``device`` is where blocks live and batches are gathered. ``cache_dir`` keeps a node-local copy
    of each shard object read (shared by every DataLoader worker and rank of the node that names the
    folder), at most ``cache_limit`` bytes (``"50GB"``; None: no limit), oldest evicted first; a
    remote cache without ``cache_dir`` uses a temporary folder of ``cache_limit`` (default 1 GiB),
    removed by ``close()``. See the module docstring for passes, epochs, ranks and resume.
    """

    def __init__(
        self,
        caches: CacheInput | Sequence[CacheInput],
        seq_len: int | WindowSpec,
        *,
        horizon: int | Sequence[int] | None = None,
        stride: int | None = None,
        features: Sequence[str] | None = None,
        target: Sequence[str] | None = None,
        split: str | None = None,
        split_times: str | Mapping[str, str] | None = None,
        weights: Sequence[float] | None = None,
        epoch_windows: int | None = None,
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
        storage_options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        self.spec = window_spec(seq_len, horizon, stride, features, target)  # options first, then the caches
        self.order = PlanSettings.of(batch_size=batch_size, shuffle=shuffle, seed=seed, mix=mix, drop_last=drop_last)
        self.settings = LoaderSettings.of(
            prefetch=prefetch, decoders=decoders, memory_budget=memory_budget, device=device
        )
        given = Sources.given(caches)
        self.mixture = Mixture.of(weights=weights, epoch_windows=epoch_windows, n_sources=len(given))
        local = LocalCopy.of(given, cache_dir, cache_limit)
        self.sources = Sources.open(caches, storage_options, split=split, split_times=split_times, local=local)
        self.read_spec = ReadSpec.of(self.sources, self.spec, self.device, meta)
        self.planner = Planner(
            ranges=self.read_spec.ranges,
            n_rows=self.sources.n_rows,
            shard_rows=self.sources.shard_rows,
            settings=self.order,
            what=self.sources.where(),
            shares=self.mixture.shares(self.sources.row_bounds, self.read_spec.ranges),
        )
        self.passes = PassState()
        self.resources = StreamResources(uuid.uuid4().hex)  # its id names this stream's workers' rings
        weakref.finalize(self, forget, self.resources.ship_id)
        self._dist_hint: tuple[int, int] | None = None  # in a spawned worker: the main process's rank
        self._resident_bytes = None if self.memory_budget is None else resident_bytes(self.read_spec)
        self.settings.check_batch(self.batch_size, self.batch_windows, self.read_spec.window_bytes)
        if not self.resident:
            self._capacity(self.plan(0), 1)  # a memory_budget too small for one pool fails here

    # -- settings ------------------------------------------------------------------------

    @property
    def weights(self) -> tuple[float, ...] | None:
        """Each cache's share of an epoch's windows (``None``: every window once)."""
        return self.mixture.weights

    @property
    def stride(self) -> int:
        """Rows between consecutive window starts."""
        return self.spec.stride

    @property
    def meta(self) -> bool:
        """Whether batches are ``MetaBatch`` (each window's place and times)."""
        return self.read_spec.meta

    @property
    def batch_size(self) -> int:
        """Windows per batch."""
        return self.order.batch_size

    @property
    def shuffle(self) -> bool:
        """Whether each epoch is shuffled (shard order and within pools)."""
        return self.order.shuffle

    @property
    def seed(self) -> int:
        """The shuffle's seed: epoch ``e`` of seed ``s`` is the same on every run."""
        return self.order.seed

    @property
    def mix(self) -> int:
        """Shards whose windows one pool shuffles together."""
        return self.order.mix

    @property
    def drop_last(self) -> bool:
        """Whether a last short batch is dropped."""
        return self.order.drop_last

    @property
    def prefetch(self) -> int:
        """Batches read ahead of the one served (the bound on memory)."""
        return self.settings.prefetch

    @property
    def memory_budget(self) -> int | None:
        """Bytes a resident split may hold decoded (``None``: streamed)."""
        return self.settings.memory_budget

    @property
    def device(self) -> torch.device:
        """Where batches are made (``cuda`` gathers on the GPU)."""
        return self.settings.device

    @property
    def cache(self) -> Cache:
        """The cache of a stream of one (of several: ``caches[i]``, ``i`` being ``MetaBatch.source``)."""
        if len(self.sources) > 1:
            raise SeveralCachesError(
                f"this WindowStream reads {len(self.sources)} caches: use stream.caches[i] (MetaBatch.source is i)"
            )
        return self.sources.caches[0]

    @property
    def decoders(self) -> int:
        """Decoder threads of each reader: as given, else ``default_decoders`` of this process's
        affinity, divided among the DataLoader's workers when read in one."""
        info = get_worker_info()
        return self.settings.decoders_for(1 if info is None else info.num_workers)

    @property
    def batch_windows(self) -> int:
        """The most windows a batch holds: ``batch_size``, or every window when there are fewer."""
        return min(self.order.batch_size, self.planner.n_windows)

    @property
    def rank(self) -> int:
        """This process's rank, as a plan made now would use it."""
        return rank_world(self._dist_hint)[0]

    @property
    def world(self) -> int:
        """The world size (ranks), as a plan made now would use it."""
        return rank_world(self._dist_hint)[1]

    @property
    def resident(self) -> bool:
        """Whether in-process passes keep the split's decoded bars: ``memory_budget`` covers them."""
        need, budget = self._resident_bytes, self.memory_budget
        return need is not None and budget is not None and need <= budget

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran: a closed stream serves no batch."""
        return self.resources.closed

    def check_open(self) -> None:
        """Raise ``StreamClosedError`` once the stream is closed."""
        self.resources.check_open()

    # -- plan and state ------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the next pass."""
        self.passes.claim()
        return self.passes.upcoming().epoch

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's plan for ``epoch`` from its start, or of the next pass by default."""
        rank, world = rank_world(self._dist_hint)
        self.passes.claim()
        p = self.passes.upcoming() if epoch is None else Pass(epoch=whole_number("epoch", epoch, 0))
        return self.planner.plan(replace(p, rank=rank, world=world))

    @property
    def n_batches(self) -> int:
        """Batches of the next pass on this rank (every rank has the same number)."""
        return self.plan().n_batches

    def __len__(self) -> int:
        return self.n_batches

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (an int >= 0, from its first batch); the passes after it
        follow on. Kept as it is when it names the epoch a loaded ``state_dict`` is about to resume."""
        epoch = whole_number("epoch", epoch, 0)
        self.passes.claim()
        if not (self.passes.fresh and epoch == self.passes.pinned.epoch):
            self.passes.pin(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: its number and, per checkpoint, ``[world, batches delivered per
        rank]``, plus the settings a resume must match. The same on every rank."""
        epoch, history = self.passes.position(self.planner.batches)
        return {"epoch": epoch, "seed": self.seed, "history": [list(h) for h in history], **self._signature()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue ``state``'s epoch after its last delivered batch, at any world
        size. A state from another stream, or not inside its epoch, is refused (``StateError``)."""
        if not isinstance(state, Mapping):
            raise OptionTypeError(
                f"load_state_dict takes a dict made by WindowStream.state_dict(), not {type(state).__name__}"
            )
        missing = [k for k in ("epoch", "history") if k not in state]
        if missing:
            raise StateError(f"state_dict has no {' or '.join(missing)}: not a WindowStream state_dict")
        mine = self._signature()
        if "cache" in state and all(state.get(k) == v for k, v in mine.items() if k not in ("cache", "n_windows")):
            check_reads(state["cache"], self._reads, self.sources.caches, self.split, state["epoch"])
        check_signature(state, mine)
        epoch = state["epoch"]
        if isinstance(epoch, bool | np.bool_) or not isinstance(epoch, int | np.integer) or not 0 <= epoch < MAX_COUNT:
            raise StateError(f"state_dict epoch {epoch!r}: must be an int >= 0 (below 2**62)")
        history = check_history(state["history"])
        self.planner.check_position(int(epoch), history)
        self.passes.pin(int(epoch), history)

    def _signature(self) -> dict[str, Any]:
        """The settings that fix the epoch's batches: a saved position means nothing without them
        (a mixture's settings only when set, so a single cache's state is as it always was)."""
        h, times = self.spec.horizon, self.sources.split_times
        mixed = {**self.mixture.signature(), "split_times": None if times is None else times.text}
        return {
            "seq_len": self.seq_len,
            "horizon": list(h) if isinstance(h, tuple) else h,
            "stride": self.stride,
            "split": self.split,
            **self.order.signature(),
            "n_windows": self.planner.n_windows,
            "cache": self._reads[0] if len(self._reads) == 1 else self._reads,
            **{k: v for k, v in mixed.items() if v is not None},
        }

    @functools.cached_property
    def _reads(self) -> list[dict[str, str]]:
        """Per cache, what this stream's plan reads (``shardcache.read.identity``)."""
        return reads_of(self.sources.caches, self.sources.row_bounds, self.read_spec.ranges)

    def begin_pass(self) -> Pass:
        """Begin the next pass in this process, as ``iter()`` does (and a ``loader()`` before its
        workers start): its epoch, resume history, rank and world. The previous pass's iterator is
        superseded; a world with more ranks than windows is refused here."""
        rank, world = rank_world(self._dist_hint)
        self.planner.check_world(world)
        p = self.passes.begin(rank, world)
        self.resources.close_readers()  # the superseded iterator's reader
        return p

    def _capacity(self, plan: EpochPlan, workers: int) -> int:
        """Bytes of blocks one reader may hold: the open pool plus ``prefetch``, or the budget."""
        block = self.spec.block_rows(self.sources.shard_rows) * self.read_spec.row_bytes
        return self.settings.capacity(plan.max_open_pieces(), block, workers, self.mix)

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch | MetaBatch]:
        self.check_open()
        info = get_worker_info()
        if info is None:
            p = self.begin_pass()
            return self._iterate(self.planner.plan(p), 0, 1, generation=self.passes.generation)
        if self.device.type == "cuda":
            raise OptionError("device", str(self.device), CUDA_WORKERS)
        p = self.passes.begin_worker(info.id, *rank_world(self._dist_hint))
        return self._iterate(self.planner.plan(p), info.id, info.num_workers, generation=None)

    def _iterate(
        self, plan: EpochPlan, worker: int, workers: int, generation: int | None
    ) -> Iterator[Batch | MetaBatch]:
        """Batches ``worker``, ``+ workers``, ... of ``plan``; in the main process (``generation``) it
        also counts each delivered batch into the pass state, and stops once a newer pass began."""
        batches = range(worker, plan.n_batches, workers)
        if not batches:
            return
        in_worker = generation is None
        spec, passes = self.read_spec, self.passes
        run = self.batch_size if in_worker else RUN_BYTES // (4 * self.seq_len * spec.nx)
        resident = None
        if not in_worker and self.resident:
            resident = self.resources.arena(spec, self.sources.shard_rows)
            if resident.complete:  # nothing to read: each batch gathered on this thread, no reader
                for batch, gathered in resident.batches(spec, plan, batches):
                    if generation != passes.generation or self.closed:
                        raise StreamClosedError(_SUPERSEDED)
                    passes.delivered = batch + 1
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
        self.resources.track_reader(reader)
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
                    if reader.stop.is_set() or (generation is not None and generation != passes.generation):
                        raise StreamClosedError(_SUPERSEDED)
                    if not in_worker:
                        passes.delivered = batch + 1
                    if ready.meta is None:
                        out: Batch | MetaBatch = Batch(x[p:r], y[p:r])
                    else:
                        out = MetaBatch(x[p:r], y[p:r], *(m[p:r] for m in ready.meta))
                    yield ship(out) if in_worker else out
        finally:
            reader.close()

    def _worker_ring(self) -> Any:
        """This DataLoader worker's shared-memory slots for its batches (made on its first pass)."""
        s, n = self.read_spec, self.batch_windows
        return self.resources.worker_ring((s.x_shape(n), s.y_shape(n)))

    def loader(self, num_workers: int = 0, **dataloader_kwargs: Any) -> DataLoader[Batch | MetaBatch]:
        """A DataLoader (``batch_size=None``) that counts delivered batches into this stream's
        state, so ``state_dict()`` is exact with ``num_workers > 0``; stopped by ``close()``."""
        for key in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if key in dataloader_kwargs:
                raise OptionTypeError(f"loader() sets {key} itself; batching is the stream's")
        if dataloader_kwargs.get("in_order") is False:
            raise OptionError(
                "in_order", False, "loader() needs in_order=True: batch i comes from worker i % num_workers"
            )
        num_workers = whole_number("num_workers", num_workers, 0)
        if num_workers > 0 and self.device.type == "cuda":
            raise OptionError("device", str(self.device), CUDA_WORKERS)
        self._capacity(self.plan(), max(1, num_workers))  # a budget too small for the workers fails here
        return StreamLoader(self, batch_size=None, num_workers=num_workers, **dataloader_kwargs)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every reader thread and DataLoader worker of this stream, and remove its temporary
        local copy; later iteration fails."""
        self.resources.close()
        if self.sources.temporary is not None:
            self.sources.temporary.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if dist.is_available() and dist.is_initialized():  # a spawned worker cannot ask torch.distributed
            state["_dist_hint"] = (dist.get_rank(), dist.get_world_size())
        return state

    def info(self) -> dict[str, Any]:
        """The caches streamed: each one's URL, windows, windows per epoch and statistics, and whether
        the caches' statistics differ (``stats``: ``shared``, ``differ`` or ``none``)."""
        s, shares = self.sources, self.planner.shares
        windows = np.diff(self.read_spec.ranges.count_below(s.row_bounds)).tolist()
        return {
            "split": self.split,
            "split_times": None if s.split_times is None else s.split_times.text,
            "weights": None if self.weights is None else list(self.weights),
            "epoch_windows": self.planner.n_windows,
            "stats": s.stats,
            "caches": [
                {
                    "url": c.url,
                    "windows": w,
                    "per_epoch": w if shares is None else int(shares.windows[k]),
                    "normalize": c.manifest.normalize,
                    "stats": c.stats or None,
                }
                for k, (c, w) in enumerate(zip(s.caches, windows))
            ],
        }

    def __repr__(self) -> str:
        rank, world = rank_world(self._dist_hint)
        s = self.sources
        mixed = "" if self.weights is None else f"weights={self.weights}, "
        mixed += "" if len(s) == 1 else f"stats={s.stats!r}, "
        return (
            f"WindowStream({s.urls[0] if len(s) == 1 else s.urls!r}, seq_len={self.seq_len}, horizon={self.horizon}, "
            f"stride={self.stride}, split={self.split!r}, batch_size={self.batch_size}, {mixed}"
            f"windows={self.planner.n_windows}, memory_budget={self.memory_budget}, "
            f"device={str(self.device)!r}, rank={rank}/{world})"
        )
