"""``SymbolRows``: a cache's symbols laid out in one *virtual* row space, as the window plan sees them.

Each symbol starts on a whole shard (``layout.symbol_bases``), so a virtual shard lies inside one symbol.
Plain zarr and xarray users never see it: each symbol's arrays start at row 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .layout import symbol_bases

__all__ = ["SymbolRows"]


@dataclass(frozen=True, eq=False)
class SymbolRows:
    """The row space of ``bars_per_symbol`` in ``shard_rows``-row shards: ``bases`` (each symbol's first
    virtual row, then the total), and the maps between virtual rows, symbols and shards."""

    bars_per_symbol: np.ndarray
    """Bars of each symbol (int64)."""
    shard_rows: int
    """Rows per shard."""
    bases: np.ndarray = field(init=False)
    """First virtual row of each symbol, then the size of the row space (``len(symbols) + 1`` ints)."""

    def __post_init__(self) -> None:
        bars = np.asarray(self.bars_per_symbol, dtype=np.int64).reshape(-1)
        object.__setattr__(self, "bars_per_symbol", bars)
        object.__setattr__(self, "bases", symbol_bases(bars, self.shard_rows))

    @classmethod
    def of(cls, bars_per_symbol: Any, shard_rows: int) -> SymbolRows:
        """The row space of ``bars_per_symbol`` (any sequence of ints) in ``shard_rows``-row shards."""
        return cls(np.asarray(bars_per_symbol, dtype=np.int64), int(shard_rows))

    @property
    def n_rows(self) -> int:
        """Size of the row space: every symbol's rows, each padded to whole shards."""
        return int(self.bases[-1])

    @property
    def n_shards(self) -> int:
        """Shards of all symbols together (virtual shards ``0..n_shards``)."""
        return self.n_rows // self.shard_rows

    def locate(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """Symbol index and row in that symbol's own arrays of each virtual row (int64 both)."""
        rows = np.asarray(rows, dtype=np.int64)
        sym = np.searchsorted(self.bases, rows, side="right") - 1
        return sym.astype(np.int64), rows - self.bases[np.clip(sym, 0, len(self.bases) - 1)]

    def region_stop(self, row: int) -> int:
        """End (virtual) of the rows of the symbol holding ``row``: reads must stop there."""
        i = int(np.searchsorted(self.bases, row, side="right")) - 1
        return int(self.bases[i] + self.bars_per_symbol[i])

    def shard_symbol(self, shard: int) -> tuple[int, int]:
        """Symbol index and local shard number of virtual shard ``shard``."""
        i = int(np.searchsorted(self.bases, int(shard) * self.shard_rows, side="right")) - 1
        return i, int(shard) - int(self.bases[i]) // self.shard_rows

    def shard_span(self, shard: int) -> tuple[int, int, int]:
        """Symbol and the symbol's local rows ``[a, b)`` that virtual shard ``shard`` holds."""
        i, local = self.shard_symbol(shard)
        a = local * self.shard_rows
        return i, a, min(a + self.shard_rows, int(self.bars_per_symbol[i]))

    @property
    def shard_table(self) -> np.ndarray:
        """``(shard, start, stop)`` in virtual rows of every shard, in row order."""
        s = np.arange(self.n_shards, dtype=np.int64)
        start = s * self.shard_rows
        sym = np.searchsorted(self.bases, start, side="right") - 1
        stop = np.minimum(start + self.shard_rows, self.bases[sym] + self.bars_per_symbol[sym])
        return np.stack([s, start, stop], axis=1)
