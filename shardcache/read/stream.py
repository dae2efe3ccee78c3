"""Stream every sliding window of a cache as ready batches: ``WindowStream``.

A thin front: the epoch's plan is made before a byte is read (``plan``), a pass's state lives in ``passes``,
the caches' row space in ``sources``, and each iterator's batches come from ``serve``. What it promises is
docs/guarantees.md, each promise a test in ``tests/test_stream*.py``.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Self, Unpack

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import OptionError, OptionTypeError, SeveralCachesError
from ..format.cache import Cache
from ..format.numbers import whole_number
from ..format.settings import grouped, only_known
from ..format.windows import WindowSpec
from .cuts import Cut
from .dataset import WindowDataset
from .identity import Reads
from .lifetime import StreamResources
from .loader import StreamLoader
from .mixture import Mixture
from .normalize import Normalization
from .options import CUDA_WORKERS, Batch, MetaBatch, parse_budget, rank_world, window_spec
from .passes import Pass, PassState, Planner
from .plan import EpochPlan
from .readspec import ReadSpec, ReadsWindows
from .resident import resident_bytes
from .serve import serve
from .settings import (
    CacheInput,
    CacheSource,
    LoaderSettings,
    LocalCopy,
    PlanSettings,
    StreamFields,
    sources_of,
    weights_of,
)
from .ship import forget
from .sources import Sources
from .state import restore, saved_state

__all__ = ["Batch", "MetaBatch", "WindowDataset", "WindowSpec", "WindowStream", "parse_budget"]


class WindowStream(ReadsWindows, IterableDataset[Batch | MetaBatch]):
    """Every valid window of a cache (one ``split``), shuffled by shard pools, as ready batches.

    ``WindowStream(cache, 60, split="train")``: ``seq_len`` (or a ``WindowSpec``) is the only
    positional setting. ``caches`` is one cache (a path, an fsspec URL, an open ``Cache`` or a
    ``CacheSource``) or a sequence of them with the same features, streamed as one: every window of
    every cache once per epoch, or ``epoch_windows`` windows in the proportions of the sources' weights;
    ``split_times`` re-cuts every cache's splits at shared times. A cache with several splits needs
    ``split`` (a name, or ``"all"``). Yields ``Batch(x, y)``: ``x`` float32 ``[B, seq_len, F]`` (the
    ``features`` columns, all by default) and ``y`` the target row ``p + seq_len - 1 + horizon`` (the
    ``target`` columns; a duration ``horizon="5min"``: the last bar at or before the last input bar's time
    plus it) ``[B, T]``, or ``[B, len(horizon), T]`` for a sequence of horizons;
    ``meta=True`` yields ``MetaBatch``.

    The other settings come as objects, or as keyword arguments naming their fields
    (``batch_size=512`` for ``order=PlanSettings(batch_size=512)``; one or the other for each object):

    - ``cut`` (``Cut``: ``split``, ``split_times``, ``fold``, ``embargo``): which bars are served, in time;
    - the window: ``horizon``, ``stride``, ``features``, ``target`` (a ``WindowSpec``'s fields);
    - ``order`` (``PlanSettings``: ``batch_size``, ``shuffle``, ``seed``, ``mix``, ``drop_last``): which
      batches an epoch has;
    - ``loading`` (``LoaderSettings``: ``prefetch``, ``decoders``, ``memory_budget``, ``device``): how
      they are read, and where batches are gathered;
    - ``local`` (``LocalCopy``: ``cache_dir``, ``cache_limit``): node-local copies of the shard objects
      read, shared by every DataLoader worker and rank of the node that names the folder; a remote
      cache without ``cache_dir`` uses a temporary folder of ``cache_limit`` (default 1 GiB), removed
      by ``close()``;
    - ``normalization`` (``Normalization``: ``normalize``, ``normalize_targets``, ``pool_caches``): z-score
      the served values with the statistics of the stream's own train range (``stats``); None by default;
    - per cache (``CacheSource``: ``storage_options``, ``weight``), or for all: ``storage_options`` (one
      mapping, or one per cache) and ``weights`` (one per cache).

    docs/guarantees.md has what passes, epochs, ranks and resume promise.
    """

    def __init__(
        self,
        caches: CacheInput | CacheSource | Sequence[CacheInput | CacheSource],
        seq_len: int | WindowSpec,
        *,
        cut: Cut | None = None,
        epoch_windows: int | None = None,
        meta: bool = False,
        order: PlanSettings | None = None,
        loading: LoaderSettings | None = None,
        local: LocalCopy | None = None,
        normalization: Normalization | None = None,
        **fields: Unpack[StreamFields],
    ) -> None:
        given: dict[str, Any] = dict(fields)  # the typed keywords as a plain dict each settings object takes from
        only_known("WindowStream", given, StreamFields.__optional_keys__)
        self.spec = window_spec(seq_len, given)  # options first, then the caches
        cut = grouped("WindowStream", "cut", Cut, cut, given)
        self.order = grouped("WindowStream", "order", PlanSettings, order, given)
        """Which batches an epoch has: ``batch_size``, ``shuffle``, ``seed``, ``mix``, ``drop_last``."""
        self.loading = grouped("WindowStream", "loading", LoaderSettings, loading, given)
        """How batches are read: ``prefetch``, ``decoders``, ``memory_budget`` (resolved bytes), ``device``."""
        sources = sources_of(caches, given.pop("storage_options", None))
        weights = weights_of(sources, given.pop("weights", None))
        self.mixture = Mixture.of(weights=weights, epoch_windows=epoch_windows, n_sources=len(sources))
        local = grouped("WindowStream", "local", LocalCopy, local, given)
        self.normalization = grouped("WindowStream", "normalization", Normalization, normalization, given)
        """How served values are scaled: ``normalize``, ``normalize_targets``, ``pool_caches``."""
        self.sources = Sources.open(sources, cut=cut, local=local)
        self.read_spec = ReadSpec.of(self.sources, self.spec, self.loading.device, meta, self.normalization)
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
        self.reads = Reads(self.sources.caches, self.sources.row_bounds, self.read_spec.ranges)
        budget = self.loading.memory_budget
        self._resident_bytes = None if budget is None else resident_bytes(self.read_spec)
        self.loading.check_batch(self.order.batch_size, self.batch_windows, self.read_spec.window_bytes)
        if not self.resident:
            self.capacity(self.plan(0), 1)  # a memory_budget too small for one pool fails here

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
        return self.loading.decoders_for(1 if info is None else info.num_workers)

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
        need, budget = self._resident_bytes, self.loading.memory_budget
        return need is not None and budget is not None and need <= budget

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran: a closed stream serves no batch."""
        return self.resources.closed

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
        return saved_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue ``state``'s epoch after its last delivered batch, at any world
        size. A state from another stream, or not inside its epoch, is refused (``StateError``)."""
        restore(self, state)

    def begin_pass(self) -> Pass:
        """Begin the next pass in this process, as ``iter()`` and a ``loader()`` do, superseding the previous one."""
        rank, world = rank_world(self._dist_hint)
        self.planner.check_world(world)
        p = self.passes.begin(rank, world)
        self.resources.close_readers()  # the superseded iterator's reader
        return p

    def capacity(self, plan: EpochPlan, workers: int) -> int:
        """Bytes of decoded blocks each of ``workers`` readers of ``plan`` may hold (``LoaderSettings.capacity``)."""
        block = self.read_spec.ranges.block_rows(self.sources.shard_rows) * self.read_spec.row_bytes
        return self.loading.capacity(plan.max_open_pieces(), block, workers, self.order.mix)

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch | MetaBatch]:
        self.resources.check_open()
        info = get_worker_info()
        if info is None:
            p = self.begin_pass()
            return serve(self, self.planner.plan(p), 0, 1, generation=self.passes.generation)
        if self.loading.device.type == "cuda":
            raise OptionError("device", str(self.loading.device), CUDA_WORKERS)
        p = self.passes.begin_worker(info.id, *rank_world(self._dist_hint))
        return serve(self, self.planner.plan(p), info.id, info.num_workers, generation=None)

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
        if num_workers > 0 and self.loading.device.type == "cuda":
            raise OptionError("device", str(self.loading.device), CUDA_WORKERS)
        self.capacity(self.plan(), max(1, num_workers))  # a budget too small for the workers fails here
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
        """The caches streamed: each one's URL, windows, windows per epoch and statistics, whether the
        caches' statistics differ (``stats``: ``shared``, ``differ`` or ``none``) and the read-time
        ``normalization`` (None: the values as stored)."""
        s, shares = self.sources, self.planner.shares
        windows = np.diff(self.read_spec.ranges.count_below(s.row_bounds)).tolist()
        return {
            "split": self.split,
            **s.cut.signature(),
            "weights": None if self.mixture.weights is None else list(self.mixture.weights),
            "epoch_windows": self.planner.n_windows,
            "stats": s.stats,
            "normalization": self.normalization.signature(),
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
        mixed = "" if self.mixture.weights is None else f"weights={self.mixture.weights}, "
        mixed += "" if len(s) == 1 else f"stats={s.stats!r}, "
        mixed += "" if self.normalization.normalize is None else f"normalize={self.normalization.normalize!r}, "
        return (
            f"WindowStream({s.urls[0] if len(s) == 1 else s.urls!r}, seq_len={self.seq_len}, horizon={self.horizon}, "
            f"stride={self.stride}, split={self.split!r}, batch_size={self.order.batch_size}, {mixed}"
            f"windows={self.planner.n_windows}, memory_budget={self.loading.memory_budget}, "
            f"device={str(self.loading.device)!r}, rank={rank}/{world})"
        )
