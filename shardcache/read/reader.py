"""The reader behind ``WindowStream``: each mixing pool decoded into one arena, and runs of
batches copied out of it on a background thread.

A gather thread walks the iterator's runs (``plan.reader_runs``), waits for their pools' blocks, gathers
each run into new tensors (``storage.gather``) and queues it. Decoder threads read blocks ahead, as far as
the capacity allows; small fast blocks are read in groups on the gather thread itself, since handing them to
decoders one by one costs more in thread switches and GIL hand-overs than their reads (docs/notes/scale-notes.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import StreamClosedError
from ..tuning import FAST_READ, GROUP_BLOCKS, LAYOUT_WINDOWS, RUNS_AHEAD, SMALL_BLOCK
from .plan import EpochPlan, PoolLayout, Run, pool_layouts, reader_runs
from .readspec import ReadSpec
from .resident import Resident
from .ship import Loan
from .storage import WHOLE, Arena, chunk_for, gather, mapped, one_thread_here, target_steps

__all__ = ["Reader", "Ready"]

_POLL = 0.1


class _Pool:
    """One pool's ``arena``, laid out by ``layout``, with the decodes still under way. Resident, the arena
    is the ``Resident``'s, ``layout`` holds the blocks still to decode (``todo``) and ``blocks`` all of them."""

    def __init__(
        self,
        *,
        layout: PoolLayout,
        arena: Arena,
        index: Any,
        blocks: np.ndarray | None = None,
        todo: np.ndarray | None = None,
    ) -> None:
        self.layout, self.arena, self.index = layout, arena, index
        self.blocks, self.todo = blocks, todo
        self.submitted = 0
        self.nbytes = 0
        self.unchecked = 0  # blocks read with no check that the caches were not replaced after them
        self.pending: list[Future[None]] = []
        self.events: list[Any] = []  # a device's: one per block copied to it
        self.host: list[torch.Tensor] = []  # a device's: the host blocks kept until their copies finish

    @functools.cached_property
    def rows(self) -> Any:
        """Each served window's arena row, as the gathers take them (the shuffle, made while the blocks decode)."""
        return self.index(self.layout.rows)


@dataclass(frozen=True, kw_only=True)
class Ready:
    """A gathered run: ``(batch, p, r)`` in ``batches`` is rows ``[p, r)`` of ``x``, ``y`` and ``meta``
    (``MetaBatch``'s fields after ``y``, or None); ``event`` (CUDA) marks the copies done."""

    batches: list[tuple[int, int, int]]
    x: torch.Tensor
    y: torch.Tensor
    meta: tuple[torch.Tensor, ...] | None
    event: Any


_END = object()


class _Outputs:
    """float32 output buffers of runs, each reused once every batch taken from it is gone (``ship.Loan``), which
    saves faulting in fresh pages (docs/performance.md). At most ``keep`` sets are kept; more are left to the caller."""

    def __init__(self, shapes: list[tuple[int, ...]], keep: int) -> None:
        self.shapes, self.keep = shapes, keep
        self.slots: list[Loan] = []

    def take(self, n: int) -> list[torch.Tensor]:
        """Tensors of ``n`` rows, one per buffer shape, in a set no live tensor uses."""
        slot = next((s for s in self.slots if s.free()), None)
        if slot is None:
            slot = Loan([mapped(shape, np.float32, populate=True, huge=False) for shape in self.shapes])
            if len(self.slots) < self.keep:
                self.slots.append(slot)
        return slot.lend(n)


class _Stopped(Exception):
    """Raised inside the reader's threads when its iterator was closed."""


class Reader:
    """One iterator's threads: decodes pools ahead of use and gathers runs of batches.

    Holds at most ``capacity`` bytes of decoded blocks (the pools a run needs always fit), decoded by
    ``decoders`` threads (0: the gather thread decodes every block). With a ``resident`` every pool reads
    from its arena. ``outputs.take(n)`` gives a run's output tensors on the CPU (``_Outputs``, or a worker's
    ``ship.WorkerRing``); ``ahead`` gathered runs wait for the consumer.
    """

    def __init__(
        self,
        spec: ReadSpec,
        plan: EpochPlan,
        batches: range,
        capacity: int,
        *,
        decoders: int = 0,
        run_windows: int = 1,
        outputs: Any = None,
        resident: Resident | None = None,
        ahead: int = RUNS_AHEAD,
    ) -> None:
        self.spec, self.plan, self.capacity = spec, plan, capacity
        self.resident = resident
        self.inflight: dict[int, Future[None] | None] = {}  # resident blocks this reader submitted
        # a run (and its reused output buffers, populated when mapped) never outgrows this reader's
        # epoch, nor its rank's windows (a batch_size above them makes one batch of them all)
        self.run_windows = min(
            max(run_windows, plan.batch_size), max(len(batches), 1) * plan.batch_size, max(plan.n_windows, 1)
        )
        self.used = 0
        self.stop = threading.Event()
        self.failed: BaseException | None = None  # a decoder's error: the blocks queued after it are not read
        self.asked_again = threading.Event()  # the consumer took its first run and asks for more
        self.asked = 0
        self.queue: queue.Queue[object] = queue.Queue(ahead)  # a Ready, an exception to raise, or _END
        self.thread = threading.Thread(target=self._run, name="shardcache-reader", daemon=True)
        self.executor = ThreadPoolExecutor(decoders, thread_name_prefix="shardcache-decode") if decoders > 0 else None
        # seconds a small block's read takes: the fastest of late (a read kept waiting for the GIL now and
        # then does not count, reads that all wait, on a remote store, do), unknown at first
        self.small_read = math.inf
        self.pools: dict[int, _Pool] = {}  # submitted (being decoded or decoded), not yet dropped
        # one walk of the runs, read twice: by the gather loop and, ahead of it, by the block schedule
        self.runs, walk = itertools.tee(reader_runs(plan, batches, self.run_windows))
        self.schedule = self._schedule(walk)
        self.upcoming: tuple[_Pool, int] | None = None  # the next block, not yet submitted
        self.storage = st = spec.storage
        shapes = [spec.x_shape(self.run_windows), spec.y_shape(self.run_windows)]
        if outputs is None and st.on_host:
            outputs = _Outputs(shapes, keep=RUNS_AHEAD + 3)
        self.outputs = outputs  # None: new tensors from the storage
        self.chunk = chunk_for(st, spec.window.seq_len, spec.nx, own_thread=False)  # ``_run`` may raise it
        self.steps = None if spec.window.timed else target_steps(st, spec.window)  # time horizons: per window
        # small blocks read on this thread go in groups (``_read_group``): straight into a host arena of every column
        self.grouped = st.on_host and spec.same_columns and resident is None

    # -- gather thread -------------------------------------------------------------------
    def _run(self) -> None:
        """Thread body: every run, then the end mark; an error goes to the consumer instead."""
        try:
            if self.storage.on_host and one_thread_here():
                self.chunk = WHOLE  # one index_select per pool: it runs on this thread
            for k, run in enumerate(self.runs):
                for g in run.pools:
                    self._wait_decoded(g)
                ready = self._gather(run)
                for g in [g for g in self.pools if g < run.keep]:
                    self._drop(g)
                if k == 0:  # the first batch goes at once, and nothing competes with the consumer
                    self._put(ready)  # for it (decoding ahead, the next copy) until it asks again
                    self._wait_asked_again()
                while self._submit(force=False):
                    pass  # decode ahead while the blocks fit
                if k:
                    self._put(ready)  # after the submissions: a consumer woken first would contend for the GIL
            self._put(_END)
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - every error goes to the consumer, who raises it
            with contextlib.suppress(_Stopped):
                self._put(exc)

    def _put(self, item: object) -> None:
        """Queue ``item`` for the consumer; give up once the iterator is closed."""
        while not self.stop.is_set():
            with contextlib.suppress(queue.Full):
                return self.queue.put(item, timeout=_POLL)
        raise _Stopped

    def _wait_asked_again(self) -> None:
        """Block until the consumer asks for a second run; ``_Stopped`` once the iterator is closed."""
        while not (self.asked_again.wait(_POLL) or self.stop.is_set()):
            pass
        if self.stop.is_set():
            raise _Stopped

    def _schedule(self, runs: Iterator[Run]) -> Iterator[tuple[_Pool, int]]:
        """``(pool, k)`` for every block of ``runs``' pools in the order of first use (a resident pool with
        nothing to decode: ``(pool, -1)``); a pool's arena is made when reached."""
        s, newest = self.spec, -1
        layouts: dict[int, PoolLayout] = {}  # pools laid out ahead, with an earlier one
        for run in runs:
            for g in run.pools:
                if g <= newest:
                    continue
                newest = g
                if self.resident is None:
                    if g not in layouts:
                        ahead = self._layout_batch(g)
                        layouts = dict(zip(ahead, pool_layouts(self.plan, ahead, s.ranges, s.sources.shard_rows)))
                        # their blocks' files asked of the OS together (``readahead.will_read``)
                        laid = list(layouts.values())
                        s.sources.will_read(np.concatenate([x.lo for x in laid]), np.concatenate([x.hi for x in laid]))
                        if len(laid) > 1:  # small pools: their shuffles one after another, while that code is
                            for x in laid:  # hot (3-5x faster than each between the copies of the runs before it)
                                x.served()
                    layout = layouts.pop(g)
                    pool = self.pools[g] = _Pool(layout=layout, arena=s.arena(layout.n_rows), index=s.storage.index)
                else:  # every block scheduled before is submitted by now: share those still under way
                    r = self.resident
                    if r.arena is None:  # released: the stream was closed
                        raise _Stopped
                    layout, blocks, todo = r.pool_layout(self.plan, g, s.ranges, skip=set(self.inflight))
                    pool = self.pools[g] = _Pool(
                        layout=layout, arena=r.arena, index=s.storage.index, blocks=blocks, todo=todo
                    )
                    shared = {int(b) for b in blocks} - {int(b) for b in todo}
                    pool.pending += [f for b, f in self.inflight.items() if b in shared and f is not None]
                    if not len(todo):
                        yield pool, -1
                for k in range(len(layout.lo)):
                    yield pool, k

    def _layout_batch(self, g: int) -> range:
        """Pool ``g`` and the pools after it laid out with it: up to ``LAYOUT_WINDOWS`` windows."""
        sizes = np.cumsum((self.plan.pool_to - self.plan.pool_from)[g : g + 64])
        return range(g, g + max(int(np.searchsorted(sizes, LAYOUT_WINDOWS, side="right")), 1))

    def _drop(self, g: int) -> None:
        """Forget pool ``g`` (its arena is freed) and take its bytes out of the count."""
        self.used -= self.pools.pop(g).nbytes

    def _submit(self, force: bool) -> bool:
        """Start decoding the next block of the schedule (without ``force``, only if it fits); False if none started."""
        if self.upcoming is None:
            self.upcoming = next(self.schedule, None)
        if self.upcoming is None:
            return False
        pool, k = self.upcoming
        if k < 0:  # a resident pool already decoded: reached, nothing to read
            self.upcoming = None
            return True
        nbytes = self._nbytes(pool, k)
        small = nbytes <= SMALL_BLOCK
        here = self.executor is None or (small and self.small_read < FAST_READ)
        if not force and self.used + nbytes > self.capacity:
            return False
        if here and small and self.grouped:
            self._read_group()
            return True
        self.upcoming = None
        self._count(pool, nbytes)
        pool.unchecked += 1
        future = None
        if here or self.executor is None:
            self._decode(pool, k)
        else:
            future = self.executor.submit(self._decode, pool, k)
            pool.pending.append(future)
        if pool.todo is not None:
            self.inflight[int(pool.todo[k])] = future
        return True

    def _nbytes(self, pool: _Pool, k: int) -> int:
        """Decoded bytes of block ``k`` of ``pool``."""
        return int(pool.layout.hi[k] - pool.layout.lo[k]) * self.spec.row_bytes

    def _count(self, pool: _Pool, nbytes: int) -> None:
        """Count a block of ``nbytes`` submitted for ``pool``."""
        self.used += nbytes
        pool.nbytes += nbytes
        pool.submitted += 1

    def _read_group(self) -> None:
        """Read the upcoming small block and the small ones after it that fit (up to ``GROUP_BLOCKS``) on this
        thread, in one ``read_many`` straight into their arenas."""
        group: list[tuple[_Pool, int]] = []
        while self.upcoming is not None and len(group) < GROUP_BLOCKS:
            pool, k = self.upcoming  # never a resident pool's -1: groups are not read for a resident arena
            nbytes = self._nbytes(pool, k)
            if group and (nbytes > SMALL_BLOCK or self.used + nbytes > self.capacity):
                break
            self._count(pool, nbytes)
            group.append((pool, k))
            self.upcoming = next(self.schedule, None)
        if self.stop.is_set():
            raise _Stopped
        t0 = time.perf_counter()
        lo = np.array([p.layout.lo[k] for p, k in group], dtype=np.int64)
        hi = np.array([p.layout.hi[k] for p, k in group], dtype=np.int64)
        at = [int(p.layout.at[k]) for p, k in group]
        outs = [p.arena.x[a : a + n].numpy() for (p, _), a, n in zip(group, at, (hi - lo).tolist())]
        self.spec.sources.read_many(lo, hi, outs)
        if self.spec.scaler is not None:  # every column, the targets scaled alike (``grouped``)
            for a, out in zip(lo.tolist(), outs):
                self.spec.scaler.block(a).x(out)
        self.small_read = min((time.perf_counter() - t0) / len(group), 1.5 * self.small_read)

    def _wait_decoded(self, g: int) -> None:
        """Block until every block of pool ``g`` is decoded (starting any not started yet)."""
        while g not in self.pools or self.pools[g].submitted < len(self.pools[g].layout.lo):
            if not self._submit(force=True):
                raise AssertionError("shardcache reader: the block schedule ended early")
        pool = self.pools[g]
        pool.rows  # noqa: B018 - the shuffle, on this thread while the decoders work
        for future in pool.pending:
            while not wait_futures([future], timeout=_POLL).done:
                if self.stop.is_set():
                    raise _Stopped
            future.result()
        pool.pending.clear()
        if pool.unchecked:  # once after the pool's reads, not once per block (``Cache.read_rows``' check)
            self.spec.sources.check_same()
            pool.unchecked = 0
        r = self.resident
        if r is not None and pool.blocks is not None:  # a device's copies, of this pass or an earlier one
            pool.events = [r.events[int(b)] for b in pool.blocks if int(b) in r.events]

    def _decode(self, pool: _Pool, k: int) -> None:
        """Read block ``k`` of ``pool`` into its place in the arena (a resident block stays decoded for later passes)."""
        if self.stop.is_set():
            raise _Stopped
        if self.failed is not None:  # one failed fetch ends the stream: no more minutes of retries on others
            raise self.failed
        t0 = time.perf_counter()
        try:
            self._read(pool, k)
        except BaseException as exc:
            self.failed = exc
            raise
        if self._nbytes(pool, k) <= SMALL_BLOCK:
            self.small_read = min(time.perf_counter() - t0, 1.5 * self.small_read)  # a race only blurs it
        if pool.todo is not None:
            self.resident.done[int(pool.todo[k])] = True  # type: ignore[union-attr]

    def _read(self, pool: _Pool, k: int) -> None:
        """The read of ``_decode``, through the storage."""
        s = self.spec
        lo, hi, at = int(pool.layout.lo[k]), int(pool.layout.hi[k]), int(pool.layout.at[k])
        scale = None if s.scaler is None else s.scaler.block(lo)
        copy = s.storage.fill(
            pool.arena,
            at,
            hi - lo,
            lambda out: s.sources.read_rows(lo, hi, out=out, check=False),
            (s.xcols, s.ycols),
            scale,
        )
        if copy is None:
            return
        event, host = copy
        pool.host.extend(host)
        if pool.todo is not None:
            self.resident.events[int(pool.todo[k])] = event  # type: ignore[union-attr]
        else:
            pool.events.append(event)

    def _gather(self, run: Run) -> Ready:
        """Copy the run's windows and targets from its pools' arenas into output tensors."""
        s, st, off = self.spec, self.storage, self.plan.pool_offsets
        n = run.b - run.a
        with st.gathering():
            x, y = (
                self.outputs.take(n) if self.outputs is not None else (st.empty(s.x_shape(n)), st.empty(s.y_shape(n)))
            )
            starts = np.empty(n, dtype=np.int64) if s.meta else None
            for g in run.pools:
                pool = self.pools[g]
                s0, s1 = max(run.a - int(off[g]), 0), min(run.b - int(off[g]), len(pool.rows))
                o, m = int(off[g]) + s0 - run.a, s1 - s0
                if starts is not None:
                    starts[o : o + m] = pool.layout.starts[s0:s1]
                steps = s.window_steps(pool.layout.starts[s0:s1]) if self.steps is None else self.steps
                st.wait(pool.events)
                gather(pool.arena, pool.rows[s0:s1], steps, self.chunk, out=(x[o : o + m], y[o : o + m]))
            event = st.mark()
        meta = None if starts is None else s.window_meta(starts)
        spans = [(i, *self.plan.batch_span(i)) for i in range(run.first, run.last + 1)]
        return Ready(batches=[(i, a - run.a, b - run.a) for i, a, b in spans], x=x, y=y, meta=meta, event=event)

    # -- consumer side -------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def next(self) -> Ready | None:
        """The next gathered run, None at the end; re-raises the reader's error."""
        self.asked += 1
        if self.asked == 2:
            self.asked_again.set()
        while True:
            if self.stop.is_set():
                raise StreamClosedError("this WindowStream iterator was closed, or superseded by a newer iter()")
            try:
                item = self.queue.get(timeout=_POLL)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise StreamClosedError("shardcache reader thread ended unexpectedly") from None
                continue
            if isinstance(item, Ready):
                return item
            if isinstance(item, BaseException):
                raise item
            return None  # _END

    def close(self) -> None:
        """Stop the threads (the gather thread and its decoders) and drop every pool and run."""
        self.stop.set()
        self.asked_again.set()  # a gather thread waiting on the consumer's second request returns now
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        if self.executor is not None:  # a decode under way finishes its read, the queued ones are dropped
            self.executor.shutdown(wait=True, cancel_futures=True)
        self.pools.clear()
        self.upcoming, self.resident = None, None
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
