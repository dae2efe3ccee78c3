"""Resident mode: the split's bars, decoded once, kept while the stream lives.

When a stream's ``memory_budget`` covers every bar its windows read (``resident_bytes``), its
in-process passes share one ``Resident``: one arena (host memory, or the GPU's with a CUDA
device) holding one block per shard of the split, at a fixed place (``BlockTable``). A pass
that still has blocks to decode runs the stream's reader (``shardcache.read.reader``) over
the arena: it decodes each missing block as the plan reaches it, as a streamed pass would,
and marks it decoded once read (a pass left early keeps what it read). A pass with every
block decoded (from the second epoch on, whatever its epoch, rank, world size or resume)
reads nothing and starts no thread: ``Resident.batches`` gathers each batch on the caller's thread, straight
from the arena (numpy fancy indexing on the CPU, one thread whatever torch's settings; on
the GPU ``index_select`` on the current stream, no copy from the host but the pool's
window index).

Batches are the same as streamed ones: the plan, its pools and their served order do not
change, only where a pool's windows are read from (``served`` gives the arena rows). The
arena is freed when the stream is closed or dropped. DataLoader workers never use it.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import StreamClosedError
from ..format.layout import spanned_shards
from ..format.windows import Ranges
from .options import Batch, MetaBatch
from .plan import EpochPlan, PoolLayout

if TYPE_CHECKING:
    from .readspec import ReadSpec

__all__ = ["BlockTable", "Resident", "mapped", "resident_bytes"]


_HUGE = 4 << 20  # maps from this size ask for transparent huge pages, as numpy does for its own arrays


def mapped(shape: tuple[int, ...], dtype: Any, populate: bool = False, huge: bool = True) -> np.ndarray:
    """A new array in an anonymous memory map of its own (page-aligned): only written pages are
    resident, and they go back to the OS as soon as it is freed, whatever the allocator keeps.

    A large map asks for huge pages (``MADV_HUGEPAGE``; the kernel may refuse): windows gather
    faster from them than from 4 KiB pages. The map is private: a shared anonymous map is shmem,
    whose pages fault in slower and may take no huge pages. ``populate`` faults every page in at
    once (an output buffer), faster than page by page. ``huge=False`` leaves the advice out for
    short-lived maps faulted in on the way to a first batch, where fresh huge pages fault in
    slower. docs/performance.md has the figures behind each choice."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    buf = mmap.mmap(-1, max(1, nbytes), flags=flags)
    if huge and nbytes >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.ndarray(shape, dtype, buffer=buf)  # the root array: views refer to it


def window_view(arena: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Every window of an arena of rows ``[n, F]`` as a view ``[n - seq_len + 1, seq_len, F]`` (no copy):
    window ``r`` is rows ``r .. r + seq_len - 1``."""
    n, f = arena.shape
    return torch.as_strided(arena, (max(n - seq_len + 1, 0), seq_len, f), (f, f, 1))


@dataclass(frozen=True, kw_only=True)
class BlockTable:
    """One block per shard holding a valid window start: cache rows ``lo[k]:hi[k]`` (the shard's
    first start to its last window's end) at arena row ``at[k]``; ``block[s]`` is shard ``s``'s
    block (-1: none)."""

    shard_rows: int
    shards: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    at: np.ndarray
    block: np.ndarray

    @classmethod
    def of(cls, ranges: Ranges, shard_rows: int) -> BlockTable:
        """The blocks of every shard of ``ranges`` (a split's valid starts)."""
        ids = spanned_shards(ranges.start, ranges.last_starts(), shard_rows)
        a, b = ranges.count_below(ids * shard_rows), ranges.count_below((ids + 1) * shard_rows)
        keep = b > a
        ids, a, b = ids[keep].astype(np.int64), a[keep], b[keep]
        lo = ranges.start_at(a).astype(np.int64)
        hi = ranges.start_at(b - 1).astype(np.int64) + ranges.span
        at = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64)
        block = np.full(int(ids[-1]) + 1 if len(ids) else 0, -1, np.int64)
        block[ids] = np.arange(len(ids))
        return cls(shard_rows=int(shard_rows), shards=ids, lo=lo, hi=hi, at=at, block=block)

    @property
    def n_rows(self) -> int:
        return int((self.hi - self.lo).sum())


def resident_bytes(spec: ReadSpec) -> int:
    """Bytes of the arena that holds every bar a stream's windows read (every column it reads)."""
    return BlockTable.of(spec.ranges, spec.sources.shard_rows).n_rows * spec.row_bytes


class Resident:
    """The arena of a stream's resident passes: input columns ``x`` and target columns ``y`` (the
    same tensor when they are the same columns) of every block, and which blocks are decoded.

    Only the reader of the live pass writes it (a new pass closes the previous reader first);
    on a CUDA device ``events[k]`` marks block ``k``'s copy to the device done. ``release``
    drops the arena even while a pass's iterator is still referenced (that pass then fails).
    """

    def __init__(self, spec: ReadSpec, shard_rows: int) -> None:
        self.table = BlockTable.of(spec.ranges, shard_rows)
        n, nx, device = self.table.n_rows, spec.nx, spec.device

        def make(cols: int) -> torch.Tensor:
            if device.type == "cuda":
                return torch.empty((n, cols), device=device)
            return torch.from_numpy(mapped((n, cols), np.float32))

        self.x = make(nx)
        self.y = self.x if spec.same_columns else make(spec.ny)
        self.nbytes = n * spec.row_bytes  # within the stream's memory_budget
        self.done = np.zeros(len(self.table.lo), dtype=bool)
        self.events: dict[int, Any] = {}
        view = window_view(self.x, spec.window.seq_len)  # every window as a view: [n, seq_len, nx]
        if device.type == "cuda":
            self.windows: Any = view
        else:
            self.windows = view.numpy()
            self.windows.flags.writeable = False
        self.yn = self.y if device.type == "cuda" else self.y.numpy()

    def release(self) -> None:
        """Drop the arena (``close()``): memory goes back once no gather is under way."""
        self.x = self.y = self.windows = self.yn = None  # type: ignore[assignment]

    def served(
        self, plan: EpochPlan, g: int, ranges: Ranges, starts: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Pool ``g``'s window starts in served order (None unless ``starts``) and the same windows'
        arena rows (one offset per piece, then the pool's order: ``plan.pool_windows``' order)."""
        t = self.table
        parts = plan.pool_pieces(g, ranges, t.shard_rows)
        first = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        k = t.block[plan.shards[int(plan.pool_bounds[g]) : int(plan.pool_bounds[g + 1])]]
        order = plan.pool_order(g, len(first))
        rows = (first + np.repeat(t.at[k] - t.lo[k], [len(p) for p in parts]))[order]
        return (first[order] if starts else None), rows

    def pool_layout(
        self, plan: EpochPlan, g: int, ranges: Ranges, skip: set[int]
    ) -> tuple[PoolLayout, np.ndarray, np.ndarray]:
        """Pool ``g`` of ``plan`` read from the arena: its layout (the blocks still to decode, not
        in ``skip``, and every window's arena row in served order), its blocks and those to decode."""
        t = self.table
        blocks = t.block[plan.shards[int(plan.pool_bounds[g]) : int(plan.pool_bounds[g + 1])]]
        todo = np.asarray(
            [k for k in dict.fromkeys(blocks.tolist()) if not self.done[k] and k not in skip], dtype=np.int64
        )
        starts, rows = self.served(plan, g, ranges)
        layout = PoolLayout(pool=int(g), lo=t.lo[todo], hi=t.hi[todo], at=t.at[todo], starts=starts, rows=rows)
        return layout, blocks, todo

    @property
    def complete(self) -> bool:
        """Every block is decoded: a pass reads nothing from the cache."""
        return bool(self.done.all())

    def batches(self, spec: ReadSpec, plan: EpochPlan, batches: range) -> Iterator[tuple[int, Batch | MetaBatch]]:
        """``(i, batch)`` for each batch ``i`` of ``batches``, gathered from the complete arena on the
        caller's thread into new tensors (a ``MetaBatch`` with ``spec.meta``)."""
        dev = self.x.device
        if dev.type == "cuda":
            current = torch.cuda.current_stream(dev)
            self.x.record_stream(current)  # the allocator waits for these gathers before freeing the arena
            if self.y is not self.x:
                self.y.record_stream(current)
            for event in self.events.values():
                current.wait_event(event)  # the first pass's copies to the device
            ysteps = torch.from_numpy(spec.window.target_steps).to(dev)
        off, bounds = plan.pool_offsets, plan.batch_bounds
        first = (np.searchsorted(off, bounds[:-1], side="right") - 1).tolist()  # each batch's pools
        last = (np.searchsorted(off, bounds[1:] - 1, side="right") - 1).tolist()
        cuts, offs, meta = bounds.tolist(), off.tolist(), spec.meta
        pools: dict[int, tuple[np.ndarray | None, Any]] = {}

        def pool(g: int, keep: int) -> tuple[np.ndarray | None, Any]:
            """Pool ``g``'s starts and arena rows, made when first reached; pools below ``keep`` are done."""
            if g not in pools:
                for old in [k for k in pools if k < keep]:
                    del pools[old]
                starts, rows = self.served(plan, g, spec.ranges, meta)
                pools[g] = (starts, torch.from_numpy(rows).to(dev) if dev.type == "cuda" else rows)
            return pools[g]

        for i in batches:
            a, b, g0, g1 = cuts[i], cuts[i + 1], first[i], last[i]
            if g0 == g1:  # most batches: one pool
                starts, rows = pool(g0, g0)
                lo, hi = a - offs[g0], b - offs[g0]
                rows, starts = rows[lo:hi], (None if starts is None else starts[lo:hi])
            else:
                parts = [(pool(g, g0), max(a - offs[g], 0), b - offs[g]) for g in range(g0, g1 + 1)]
                got = [p[0][lo:hi] for p, lo, hi in parts if p[0] is not None]  # starts are made with meta
                starts = np.concatenate(got) if meta else None
                cat = torch.cat if dev.type == "cuda" else np.concatenate
                rows = cat([p[1][lo:hi] for p, lo, hi in parts])
            windows, yn = self.windows, self.yn  # no reference to the arena outlives the batch
            if windows is None:
                raise StreamClosedError("this WindowStream iterator was closed")
            if isinstance(yn, torch.Tensor):  # CUDA: the arena is on the device
                x = torch.index_select(windows, 0, rows)
                y = torch.index_select(yn, 0, (rows[:, None] + ysteps).reshape(-1)).view(spec.y_shape(len(rows)))
            else:
                x = torch.from_numpy(windows[rows])
                y = torch.from_numpy(yn[spec.window.target_rows(rows)])
            del windows, yn
            yield i, (Batch(x, y) if starts is None else MetaBatch(x, y, *spec.window_meta(starts)))
