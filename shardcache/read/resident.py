"""Resident mode: the split's bars, decoded once, kept while the stream lives.

When ``memory_budget`` covers every bar the windows read (``resident_bytes``), in-process passes share one
arena with a fixed block per shard (``BlockTable``). A pass with blocks left runs the reader over it; once
all are decoded, ``Resident.batches`` gathers on the caller's thread with no reader. Batches are the same as
streamed ones; DataLoader workers never use it.
"""

from __future__ import annotations

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
from .storage import WHOLE, Arena, gather, target_steps

if TYPE_CHECKING:
    from .readspec import ReadSpec

__all__ = ["BlockTable", "Resident", "resident_bytes"]


@dataclass(frozen=True, kw_only=True)
class BlockTable:
    """One block per shard holding a window start: cache rows ``lo[k]:hi[k]`` at arena row ``at[k]``;
    ``block[s]`` is shard ``s``'s block (-1: none)."""

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
        hi = ranges.reach(ranges.start_at(b - 1))
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
    """The arena of a stream's resident passes and which blocks are decoded (``done``; on a device
    ``events[k]`` marks block ``k``'s copy). Only the live pass's reader writes it."""

    def __init__(self, spec: ReadSpec, shard_rows: int) -> None:
        self.table = BlockTable.of(spec.ranges, shard_rows)
        self.arena: Arena | None = spec.arena(self.table.n_rows, keep=True)
        self.nbytes = self.table.n_rows * spec.row_bytes  # within the stream's memory_budget
        self.done = np.zeros(len(self.table.lo), dtype=bool)
        self.events: dict[int, Any] = {}

    def release(self) -> None:
        """Drop the arena (``close()``), even while an iterator of it lives (that pass then fails)."""
        self.arena = None

    def served(
        self, plan: EpochPlan, g: int, ranges: Ranges, starts: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Pool ``g``'s window starts in served order (None unless ``starts``) and their arena rows."""
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
        """Pool ``g`` read from the arena: its layout (blocks still to decode, not in ``skip``), its blocks and those to decode."""
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
        """``(i, batch)`` for each batch ``i`` of ``batches``, gathered from the complete arena on the caller's thread."""
        st = spec.storage
        if self.arena is None:
            raise StreamClosedError("this WindowStream iterator was closed")
        st.here([self.arena.x, self.arena.y], list(self.events.values()))  # a device: the first pass's copies to it
        steps = None if spec.window.timed else target_steps(st, spec.window)
        chunk = 0 if st.on_host else WHOLE  # the host's: numpy alone
        cat = np.concatenate if st.on_host else torch.cat
        off, bounds = plan.pool_offsets, plan.batch_bounds
        first = (np.searchsorted(off, bounds[:-1], side="right") - 1).tolist()  # each batch's pools
        last = (np.searchsorted(off, bounds[1:] - 1, side="right") - 1).tolist()
        cuts, offs, meta, timed = bounds.tolist(), off.tolist(), spec.meta, spec.window.timed
        pools: dict[int, tuple[np.ndarray | None, Any]] = {}

        def pool(g: int, keep: int) -> tuple[np.ndarray | None, Any]:
            """Pool ``g``'s starts and arena rows, made when first reached; pools below ``keep`` are done."""
            if g not in pools:
                for old in [k for k in pools if k < keep]:
                    del pools[old]
                starts, rows = self.served(plan, g, spec.ranges, meta or timed)
                pools[g] = (starts, rows if st.on_host else st.index(rows))
            return pools[g]

        for i in batches:
            a, b, g0, g1 = cuts[i], cuts[i + 1], first[i], last[i]
            parts = [(pool(g, g0), max(a - offs[g], 0), b - offs[g]) for g in range(g0, g1 + 1)]
            pieces = [p[1][lo:hi] for p, lo, hi in parts]
            rows = pieces[0] if len(pieces) == 1 else cat(pieces)
            starts = np.concatenate([p[0][lo:hi] for p, lo, hi in parts if p[0] is not None]) if meta or timed else None
            arena = self.arena  # no reference to the arena outlives the batch
            if arena is None:
                raise StreamClosedError("this WindowStream iterator was closed")
            x, y = gather(arena, rows, steps if steps is not None else spec.window_steps(np.asarray(starts)), chunk)
            del arena
            yield i, (MetaBatch(x, y, *spec.window_meta(starts)) if meta and starts is not None else Batch(x, y))
