"""Running a build stage as independent dask tasks, with progress a person can follow.

Locally on dask's threaded scheduler, else on a ``dask.distributed`` cluster; a task holds one piece or
shard, so memory per worker is bounded. Progress: a tqdm bar on a terminal, a log line every 10% else.
After :func:`tune_allocator` (the CLI's, or ``dask worker --preload shardcache.ingest.tasks``),
:func:`release_memory` hands back what each task freed.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self, TypeVar

import dask
from dask.callbacks import Callback

from ..tuning import TASK_BATCH

__all__ = ["Progress", "dask_setup", "pack", "release_memory", "run_tasks", "tune_allocator"]

log = logging.getLogger("shardcache")
T = TypeVar("T")
_M_MMAP_THRESHOLD = -3  # mallopt parameter number (glibc malloc.h)
_MMAP_THRESHOLD = 128 << 10  # glibc's initial threshold, kept fixed


_tuned = False  # set once by tune_allocator: this process's owner asked for the settings


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    """glibc, or None under another C library (musl, macOS)."""
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def tune_allocator() -> bool:
    """Pin glibc's mmap threshold and hand freed memory back after every build task, for this whole process.

    For an owner of the process only (the CLI, ``dask worker --preload shardcache.ingest.tasks``, a script);
    False (nothing changed) under another C library."""
    global _tuned
    if (libc := _glibc()) is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    _tuned = True
    return True


def dask_setup(worker: Any) -> None:
    """``dask worker --preload shardcache.ingest.tasks``: the CLI's allocator settings in a cluster's workers."""
    tune_allocator()


def release_memory() -> None:
    """Hand what a finished task freed back to the system, so a build's RSS does not grow with its task count.

    Only after :func:`tune_allocator` (mmap threshold pinned: blocks above 128 KiB go back on free, ``malloc_trim``
    returns smaller ones' pages); else Arrow and glibc keep freed memory (73 MiB at 3,600 files, 51 at 360)."""
    if not _tuned:
        return
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def pack(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive items in tasks ``[lo, hi)`` adding up to at most ``limit`` (a bigger item alone)."""
    groups: list[tuple[int, int]] = []
    lo, held = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and held + size > limit:
            groups.append((lo, i))
            lo, held = i, 0
        held += size
    n = len(sizes)
    if n > lo:
        groups.append((lo, n))
    return groups


class Progress:
    """A progress bar on a terminal, log lines at each tenth otherwise; silent if not ``show``."""

    def __init__(self, total: int, desc: str, show: bool = True, unit: str = "task") -> None:
        self.total, self.desc, self.show, self.done = total, desc, show, 0
        self._bar = None
        self._next_log = 0.1
        self._t0 = time.perf_counter()
        if show and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
        elif show:
            log.info("%s: %d %ss", desc, total, unit)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.show and self.total and self.done / self.total >= self._next_log:
            pct, secs = 100 * self.done / self.total, time.perf_counter() - self._t0
            log.info("%s: %d/%d (%.0f%%) after %.1f s", self.desc, self.done, self.total, pct, secs)
            while self._next_log <= self.done / self.total:
                self._next_log += 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Count(Callback):
    """Progress by finished task: task ``PREFIX<i>`` counts ``counts[i]``."""

    def __init__(self, prefix: str, progress: Progress, counts: list[int]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped_calls_exclude does not reach super()
        self.prefix, self.progress, self.counts = prefix, progress, counts

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        name = key[0] if isinstance(key, tuple) else key
        if isinstance(name, str) and name.startswith(self.prefix):
            self.progress.update(self.counts[int(name[len(self.prefix) :])])


def run_tasks(
    fn: Callable[..., T],
    items: Sequence[Any] | Iterable[Any],
    *,
    desc: str,
    shared: Any = None,
    weights: Sequence[int] | None = None,
    workers: int | None = None,
    client: Any = None,
    show: bool = True,
    unit: str = "task",
) -> list[T]:
    """``[fn(item) for item in items]`` as parallel dask tasks, results in input order.

    ``shared`` reaches the tasks once, as ``fn(item, shared)`` (dask walks every container in an item: one
    holding an O(symbols) description would make a stage O(symbols²)); ``weights`` count items for progress.
    """
    items = list(items)
    if not items:
        return []
    counts = [1] * len(items) if weights is None else [int(w) for w in weights]
    release_memory()  # what the driver freed since the last stage (e.g. the scan's results)
    with Progress(sum(counts), desc, show, unit) as progress:
        if client is not None:
            from distributed import as_completed

            extra = [] if shared is None else [[client.scatter(shared, broadcast=True, hash=False)] * len(items)]
            futures = client.map(fn, items, *extra, pure=False)
            weight = {f.key: c for f, c in zip(futures, counts)}
            for done in as_completed(futures):
                progress.update(weight[done.key])
            gathered: list[T] = client.gather(futures)
            return gathered
        prefix = f"shardcache-{desc.replace(' ', '-')}-"
        extra = [] if shared is None else [dask.delayed(shared, traverse=False, name=f"shared-{prefix}")]
        results: list[T] = []
        nth = dask.delayed(_Nth(fn, items), pure=False)  # a task is an item's number: dask walks no item
        with _Count(prefix, progress, counts):
            # graphs of at most TASK_BATCH tasks: the scheduler's state stays bounded with 10,000s of files
            for lo in range(0, len(items), TASK_BATCH):
                tasks = [
                    nth(i, *extra, dask_key_name=f"{prefix}{i}") for i in range(lo, min(lo + TASK_BATCH, len(items)))
                ]
                results += dask.compute(*tasks, scheduler="threads", num_workers=workers or None)
        return results


class _Nth:
    """``fn`` of item ``i`` of ``items``: a local task's function, whose argument dask does not walk."""

    def __init__(self, fn: Callable[..., Any], items: list[Any]) -> None:
        self.fn, self.items = fn, items

    def __call__(self, i: int, *shared: Any) -> Any:
        return self.fn(self.items[i], *shared)
