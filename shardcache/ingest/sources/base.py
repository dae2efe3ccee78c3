"""What every input reader shares: the :class:`Source` contract and the value policy, apart from the
package's discovery code so that the readers import it and the package imports them, one way.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import SourceError
from ...format.durations import DAY_NS, format_duration, parse_duration
from ...format.paths import is_url
from .files import stat_input

__all__ = [
    "DAY_NS",
    "DBN_MAGIC",
    "PARQUET_MAGIC",
    "PRICE_COLUMNS",
    "TS_MAX",
    "TS_MIN",
    "ZSTD_MAGIC",
    "Source",
    "clean_piece",
    "format_duration",
    "keep_rows",
    "parse_duration",
    "refuse_empty_columns",
]

PRICE_COLUMNS = ("open", "high", "low", "close", "price", "bid", "ask")
TS_MIN = 315_532_800_000_000_000  # 1980-01-01T00:00:00Z in ns
TS_MAX = 4_102_444_800_000_000_000  # 2100-01-01T00:00:00Z in ns

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
DBN_MAGIC = b"DBN"


class Source:
    """One opened input file (``kind``: ``dbn``, ``parquet``, ``csv``). ``bar_ns``: its bar size (a table's
    commonest step, None until seen); ``symbology``: what a reader learned of symbols (DBN: unmapped ids);
    ``records``: the records (rows, DBN records) the last ``pieces()`` read."""

    kind = ""
    storage_options: dict[str, Any] | None = None

    def __init__(self, path: str, schema: str, columns: list[str], bar_ns: int | None) -> None:
        self.path = path
        self.schema = schema
        self.columns = list(columns)
        self.bar_ns = bar_ns
        self.drops: Counter[str] = Counter()  # rows dropped, by reason
        self.symbology: dict[str, Any] = {}
        self.records = 0

    def pieces(self, max_rows: int = 1 << 20) -> Iterator[pa.Table]:
        """Yield cleaned tables of at most ``max_rows`` rows, reading the file in bounded steps."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this input, to tell later whether it changed."""
        what = {"kind": self.kind, "schema": self.schema, "columns": self.columns}  # an append compares them
        if is_url(self.path):
            size, version = stat_input(self.path, self.storage_options)
            return {"path": self.path, "size": size, "version": version, **what}
        st = os.stat(self.path)
        return {"path": self.path, "size": st.st_size, "mtime": st.st_mtime, **what}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, schema={self.schema!r}, columns={self.columns})"


def keep_rows(
    ts: np.ndarray, prices: Sequence[np.ndarray], others: Sequence[np.ndarray], counter: Counter[str]
) -> np.ndarray | None:
    """Row mask of the value policy, each dropped row counted once; None when all pass (readers clean ticks too)."""
    ts = np.asarray(ts)
    bad_ts = (ts < TS_MIN) | (ts >= TS_MAX)
    nonfinite = np.zeros(len(ts), dtype=bool)
    nonpositive = np.zeros(len(ts), dtype=bool)
    for col in prices:
        finite = np.isfinite(col)
        nonfinite |= ~finite
        nonpositive |= finite & (col <= 0)
    other = np.zeros(len(ts), dtype=bool)
    for col in others:
        other |= ~np.isfinite(col)
    drop = bad_ts | nonfinite | nonpositive | other
    if not drop.any():
        return None
    for reason, mask in (
        ("timestamp out of range", bad_ts),
        ("non-finite price", nonfinite & ~bad_ts),
        ("non-positive price", nonpositive & ~nonfinite & ~bad_ts),
        ("non-finite value", other & ~nonpositive & ~nonfinite & ~bad_ts),
    ):
        if n := int(np.count_nonzero(mask)):
            counter[reason] += n
    return ~drop


def _values(table: pa.Table, name: str) -> np.ndarray:
    """A value column as floats, nulls as NaN."""
    col = table.column(name)
    if col.null_count:
        col = col.cast(pa.float64()).fill_null(float("nan"))
    values: np.ndarray = col.to_numpy()
    return values


def clean_piece(table: pa.Table, counter: Counter[str], finite: set[str] | None = None) -> pa.Table:
    """Drop rows that break the value policy (see the package docstring), counting them by reason;
    ``finite`` collects the value columns with a finite value (to name one entirely null or NaN)."""
    names = [n for n in table.column_names if n not in ("symbol", "ts", "instrument")]
    ts = table.column("ts").to_numpy()
    values = {n: _values(table, n) for n in names}
    if finite is not None:
        finite.update(n for n, v in values.items() if n not in finite and np.isfinite(v).any())
    prices = [v for n, v in values.items() if n in PRICE_COLUMNS]
    others = [v for n, v in values.items() if n not in PRICE_COLUMNS]
    keep = keep_rows(ts, prices, others, counter)
    return table if keep is None else table.filter(pa.array(keep))


def refuse_empty_columns(path: str, columns: Sequence[str], finite: set[str], rows: int) -> None:
    """SourceError naming the value columns that held no finite value in ``rows`` rows read."""
    empty = [c for c in columns if c not in finite]
    if rows and empty:
        others = [c for c in columns if c in finite]
        hint = f"leave it out with --columns {','.join(others)}" if others else "this file has no usable values"
        raise SourceError(
            path,
            f"column{'s' if len(empty) > 1 else ''} {', '.join(repr(c) for c in empty)} "
            f"{'are' if len(empty) > 1 else 'is'} entirely null or NaN; {hint}",
        )
