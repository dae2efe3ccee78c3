"""DBN symbology: which symbol each record belongs to, from the metadata's mapping intervals, by instrument
id and UTC date (``ES.c.0`` -> 100 until the roll, then 200). A parent symbol (several instruments on one
date, ``ES.FUT``) is refused; a continuous symbol's instrument changes are its rolls, cut by the build.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from databento_dbn.metadata import MappingIntervalDict

from ...errors import SourceError
from .base import DAY_NS

__all__ = ["Symbols"]

_EPOCH = dt.date(1970, 1, 1)
_DAYS = 1 << 20  # mapping dates are packed below the instrument id in one int64 key


class Symbols:
    """Instrument id and date -> symbol code, from the metadata's mapping intervals (vectorised); records of
    an id with no mapping, or outside its dates (they take the nearest), counted in ``unmapped``/``outside``."""

    def __init__(self, path: str, mappings: Mapping[str, Sequence[MappingIntervalDict]]) -> None:
        rows = []
        for key, intervals in mappings.items():
            for iv in intervals:
                sym = str(iv["symbol"])
                if sym.isdigit():
                    iid, name = int(sym), key
                elif key.isdigit() and sym:
                    iid, name = int(key), sym
                else:
                    continue
                start, end = ((d - _EPOCH).days for d in (iv["start_date"], iv["end_date"]))
                rows.append((iid, min(max(start, 0), _DAYS - 1), end, name))
        _refuse_parents(path, rows)
        rows.sort()
        self.names: list[str] = sorted({r[3] for r in rows})
        index = {n: i for i, n in enumerate(self.names)}
        self.iid = np.array([r[0] for r in rows], dtype=np.int64)
        self.end = np.array([r[2] for r in rows], dtype=np.int64)
        self.code = np.array([index[r[3]] for r in rows], dtype=np.int64)
        self.start = np.array([r[1] for r in rows], dtype=np.int64)
        self.keys = (self.iid << 20) | self.start
        self.unmapped: dict[int, int] = {}  # id -> its code (its number as the symbol)
        self.unmapped_records: Counter[int] = Counter()
        self.outside = 0  # records dated outside every interval of their id (took the nearest one)
        self.mapped = {int(r[0]): r[3] for r in rows}

    def codes(self, iid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Symbol code of each record (instrument ``iid`` at time ``ts``)."""
        iid = iid.astype(np.int64)
        codes = np.full(len(iid), -1, dtype=np.int64)
        if len(self.keys) and len(iid):
            steady = self._steady(ts)
            if steady is not None:
                ids, code = steady
                at = np.clip(np.searchsorted(ids, iid), 0, len(ids) - 1)
                codes = np.where(ids[at] == iid, code[at], -1)
            todo = codes < 0
            if todo.all():
                codes = self._by_date(iid, ts)
            elif todo.any():
                codes[todo] = self._by_date(iid[todo], ts[todo])
        missing = codes < 0
        if missing.any():
            ids, inverse, counts = np.unique(iid[missing], return_inverse=True, return_counts=True)
            self.unmapped_records.update(dict(zip(ids.tolist(), counts.tolist())))
            for v in ids.tolist():
                if v not in self.unmapped:
                    self.unmapped[v] = len(self.names)
                    self.names.append(str(v))
            codes[missing] = np.array([self.unmapped[v] for v in ids.tolist()], dtype=np.int64)[inverse]
        return codes

    def _by_date(self, iid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Codes from the mapping interval holding each record's UTC date, else the id's nearest one."""
        m = len(self.keys)
        day = np.maximum(ts, 0) // DAY_NS
        i = np.searchsorted(self.keys, (iid << 20) | day, side="right") - 1
        here = np.clip(i, 0, m - 1)
        after = np.clip(i + 1, 0, m - 1)
        same = (i >= 0) & (self.iid[here] == iid)
        later = (i + 1 < m) & (self.iid[after] == iid)
        inside = same & (day < self.end[here])
        self.outside += int(np.count_nonzero((same | later) & ~inside))
        return np.where(same, self.code[here], np.where(later, self.code[after], -1))

    def _steady(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, codes) when every id mapped on ``ts``'s days keeps one mapping (a daily file): a cheap lookup."""
        lo, hi = int(ts.min()), int(ts.max())
        if lo < 0:
            return None
        first, last = lo // DAY_NS, hi // DAY_NS
        overlap = (self.start <= last) & (self.end > first)
        ids = self.iid[overlap]
        if not len(ids) or len(np.unique(ids)) != len(ids):
            return None
        if (self.start[overlap] > first).any() or (self.end[overlap] <= last).any():
            return None
        return ids, self.code[overlap]

    def column(self, codes: np.ndarray) -> pa.Array:
        return pc.take(pa.array(self.names, pa.string()), pa.array(codes))


def _refuse_parents(path: str, rows: list[tuple[int, int, int, str]]) -> None:
    """SourceError for a symbol mapped to several instruments over overlapping dates (a parent symbol)."""
    by_name: dict[str, list[tuple[int, int, int]]] = {}
    for iid, start, end, name in rows:
        by_name.setdefault(name, []).append((start, end, iid))
    for name, spans in by_name.items():
        if len({iid for _, _, iid in spans}) < 2:
            continue
        spans.sort()
        for (s0, e0, a), (s1, e1, b) in itertools.pairwise(spans):
            if a != b and s1 < e0:
                ids = sorted({iid for _, _, iid in spans})
                shown = ", ".join(map(str, ids[:6])) + (f", ... ({len(ids)} in all)" if len(ids) > 6 else "")
                raise SourceError(
                    path,
                    f"symbol '{name}' maps {len(ids)} instruments at once (ids {shown}): a "
                    "parent symbol; request the contracts by raw symbol (stype_in raw_symbol, "
                    "e.g. ESH4) or one continuous series (stype_in continuous, e.g. ES.c.0)",
                )
