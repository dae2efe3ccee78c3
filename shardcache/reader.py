"""The reader thread behind ``WindowStream``: decodes shard blocks ahead of use, in plan order.

One ``Reader`` per iterator walks the iterator's batches, decodes each block a batch needs
with one ``Cache.read_rows`` call (up to ``prefetch`` blocks at once, on a small thread pool, so
object stores have several requests in flight), keeps blocks resident from their first to their
last use within the memory capacity, and hands ``Task``s (a batch's windows grouped by block)
to the consumer through a bounded queue. ``close()`` joins every thread it started.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from .index import BatchGroups, EpochPlan, reader_batches

if TYPE_CHECKING:
    from .stream import WindowStream

__all__ = ["Reader", "Task"]

_QUEUE_TASKS = 8
_POLL = 0.1


class _Block:
    """One decoded block: rows ``[row0, row0 + rows)`` as input columns ``x`` and target columns ``y``."""

    __slots__ = ("row0", "x", "y", "windows", "nbytes", "event", "host")

    def __init__(self, row0: int, x: torch.Tensor, y: torch.Tensor, seq_len: int, nbytes: int) -> None:
        self.row0 = row0
        self.x, self.y, self.nbytes = x, y, nbytes
        n, f = x.shape
        self.windows = torch.as_strided(x, (n - seq_len + 1, seq_len, f), (f, f, 1))
        self.event: Any = None
        self.host: tuple[torch.Tensor, ...] = ()


class _Group(NamedTuple):
    """A batch's windows from one block: output rows ``[a, b)``; ``last`` frees the block after."""

    block: _Block
    xidx: torch.Tensor
    yidx: torch.Tensor
    a: int
    b: int
    last: bool


class Task(NamedTuple):
    """Batch ``batch`` of the epoch, ready to gather: ``n`` windows whose start rows are ``index``."""

    batch: int
    n: int
    groups: list[_Group]
    index: torch.Tensor


_END = object()


class _Stopped(Exception):
    """Raised inside the reader thread when its iterator was closed."""


class Reader:
    """One iterator's background thread: decodes blocks ahead of use and prepares gather indices.

    Holds at most ``capacity`` bytes of blocks (more only for a single block larger than
    that); a block is released by the consumer after the last batch that uses it. With
    ``decoders > 0``, up to that many blocks are decoded at once by a thread pool of the
    reader's own (from a remote store, each block is a few requests one after the other):
    blocks are reserved and submitted in the order of their first use, as far ahead as the
    capacity allows, and taken in that order. With ``decoders == 0`` the reader thread
    decodes each block itself when a batch first needs it.
    """

    def __init__(
        self, stream: "WindowStream", plan: EpochPlan, batches: range, capacity: int, decoders: int = 0
    ) -> None:
        self.stream, self.plan, self.batches, self.capacity = stream, plan, batches, capacity
        self.used = 0
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.queue: queue.Queue = queue.Queue(_QUEUE_TASKS)
        self.thread = threading.Thread(target=self._run, name="shardcache-reader", daemon=True)
        self.decoders = decoders
        self.pool = ThreadPoolExecutor(decoders, thread_name_prefix="shardcache-decode") if decoders > 0 else None
        self.decoding: deque[tuple[tuple[int, int], Future]] = deque()  # submitted blocks, in first-use order
        self.upcoming: tuple[int, int] | None = None  # the next block's rows, not yet submitted
        self.schedule: Iterator[tuple[int, int]] = iter(())
        dev = stream.device
        self.copy_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    # -- reader thread -------------------------------------------------------------------
    def _run(self) -> None:
        """Thread body: every task, then the end mark; an error goes to the consumer instead."""
        try:
            for task in self._tasks():
                self._put(task)
            self._put(_END)
        except _Stopped:
            pass
        except BaseException as exc:
            with contextlib.suppress(_Stopped):
                self._put(exc)

    def _put(self, item: object) -> None:
        """Queue ``item`` for the consumer; give up once the iterator is closed."""
        while not self.stop.is_set():
            with contextlib.suppress(queue.Full):
                return self.queue.put(item, timeout=_POLL)
        raise _Stopped

    def _batches(self) -> Iterator[BatchGroups]:
        return reader_batches(self.plan, self.stream._ranges, self.stream.cache.shard_rows, self.batches)

    def _blocks(self) -> Iterator[tuple[int, int]]:
        """Rows of every block in the order ``_tasks`` first needs them (a schedule run ahead)."""
        resident: set[int] = set()
        for bg in self._batches():
            for k, sid in enumerate(bg.shards.tolist()):
                if sid not in resident:
                    resident.add(sid)
                    yield bg.rows[k]
                if bg.last[k]:
                    resident.discard(sid)

    def _tasks(self) -> Iterator[Task]:
        """Each batch's windows grouped by block, each block taken (decoded) at its first use."""
        s = self.stream
        yoff = s.seq_len - 1 + s.horizon
        resident: dict[int, _Block] = {}
        self.schedule = self._blocks() if self.pool is not None else iter(())
        for bg in self._batches():
            sids = bg.shards.tolist()
            if self.pool is not None:  # the blocks this batch needs first, decoded at once
                need = sum(sid not in resident for sid in sids)
                while len(self.decoding) < need:
                    if not self._submit(wait=True):
                        raise RuntimeError("shardcache reader: the block schedule ended early")
            groups = []
            for k, sid in enumerate(sids):
                lo, hi = int(bg.bounds[k]), int(bg.bounds[k + 1])
                block = resident.get(sid)
                if block is None:
                    block = resident[sid] = self._take(bg.rows[k])
                if bg.last[k]:
                    del resident[sid]
                local = bg.starts[lo:hi] - block.row0
                groups.append(_Group(block, torch.from_numpy(local), torch.from_numpy(local + yoff), lo, hi, bg.last[k]))
            while self.pool is not None and len(self.decoding) < self.decoders and self._submit(wait=False):
                pass  # and up to ``decoders`` blocks ahead, while they fit
            yield Task(bg.batch, len(bg.starts), groups, torch.from_numpy(bg.starts))

    def _reserve(self, rows: tuple[int, int], wait: bool) -> bool:
        """Count the block's bytes as held once they fit (or nothing else is held); without
        ``wait``, only if they fit now."""
        nbytes = (rows[1] - rows[0]) * self.stream._row_bytes
        with self.cond:
            while self.used and self.used + nbytes > self.capacity:
                if not wait:
                    return False
                if self.stop.is_set():
                    raise _Stopped
                self.cond.wait(_POLL)
            self.used += nbytes
        return True

    def _submit(self, wait: bool) -> bool:
        """Reserve room for the next block of the schedule and hand it to the pool; without
        ``wait``, only if it fits now. False if it was not submitted (or there is none left)."""
        if self.upcoming is None:
            self.upcoming = next(self.schedule, None)
        rows = self.upcoming
        if rows is None or not self._reserve(rows, wait):
            return False
        self.upcoming = None
        self.decoding.append((rows, self.pool.submit(self._decode, *rows)))  # type: ignore[union-attr]
        return True

    def _take(self, rows: tuple[int, int]) -> _Block:
        """The next block in first-use order (rows ``rows``): decoded here once there is room
        (no pool), or the oldest submitted decode once it is done."""
        if self.pool is None:
            self._reserve(rows, wait=True)
            return self._decode(*rows)
        submitted, future = self.decoding.popleft()
        assert submitted == rows, (submitted, rows)  # the schedule and the batches agree
        while not wait_futures([future], timeout=_POLL).done:
            if self.stop.is_set():
                raise _Stopped
        return future.result()

    def _decode(self, lo: int, hi: int) -> _Block:
        """Read rows ``[lo, hi)`` (already counted in ``used``) in one zarr call and move them to the device."""
        s = self.stream
        nbytes = (hi - lo) * s._row_bytes
        if self.stop.is_set():
            raise _Stopped
        arr = s.cache.read_rows(lo, hi)
        x = torch.from_numpy(arr if s._xcols is None else np.ascontiguousarray(arr[:, s._xcols]))
        y = x if s._ycols is None and s._xcols is None else torch.from_numpy(
            arr if s._ycols is None else np.ascontiguousarray(arr[:, s._ycols])
        )
        if self.copy_stream is None:
            return _Block(lo, x, y, s.seq_len, nbytes)
        host = (x.pin_memory(),) if y is x else (x.pin_memory(), y.pin_memory())
        with torch.cuda.stream(self.copy_stream):
            xd = host[0].to(s.device, non_blocking=True)
            yd = xd if y is x else host[1].to(s.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        block = _Block(lo, xd, yd, s.seq_len, nbytes)
        block.event, block.host = event, host
        return block

    # -- consumer side -------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def next(self) -> Task | None:
        """The next prepared batch, None at the end; re-raises the reader's error."""
        while True:
            if self.stop.is_set():
                raise RuntimeError("WindowStream iterator was closed")
            try:
                item = self.queue.get(timeout=_POLL)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise RuntimeError("shardcache reader thread ended unexpectedly") from None
                continue
            if item is _END:
                return None
            if isinstance(item, BaseException):
                raise item
            return item

    def release(self, task: Task) -> None:
        """Give back the bytes of the blocks whose last batch was ``task``."""
        freed = sum(g.block.nbytes for g in task.groups if g.last)
        if freed:
            with self.cond:
                self.used -= freed
                self.cond.notify_all()

    def close(self) -> None:
        """Stop the threads (the reader's and its decoders) and drop every block and prepared batch."""
        self.stop.set()
        with self.cond:
            self.cond.notify_all()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        if self.pool is not None:  # a decode under way finishes its read, the queued ones are dropped
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.decoding.clear()
        with contextlib.suppress(queue.Empty):
            while True:
                self.queue.get_nowait()
