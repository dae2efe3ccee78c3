"""Hand-made DBN inputs: files written with ``databento_dbn.Metadata.encode`` (symbol mappings with
date intervals, any stype and schema) and the bar columns they hold."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import databento_dbn as dbn
import numpy as np

from shardcache.ingest.sample import _Interval, _Mapping, _records

__all__ = ["DAY0", "HOUR", "MIN", "T0", "bars", "dbn_file"]

MIN = 60 * 10**9
HOUR = 60 * MIN
DAY0 = dt.date(2024, 3, 4)
T0 = int(np.datetime64("2024-03-04T22:00", "ns").astype(np.int64))  # two hours before midnight UTC


def dbn_file(path: Path, schema: str, recs: dict | np.ndarray, mappings: list, stype: dbn.SType) -> Path:
    """A DBN v3 file with the given symbol mappings (``[(key, [(start, end, symbol)]), ...]``); a
    structured ``recs`` is written byte for byte (record types included)."""
    recs = recs if isinstance(recs, np.ndarray) else _records(schema, recs)
    ts = recs["ts_event"].view(np.int64)
    meta = dbn.Metadata(
        dataset="GLBX.MDP3",
        start=int(ts.min()),
        end=int(ts.max()) + 1,
        stype_in=stype,
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.from_str(schema),
        symbols=[k for k, _ in mappings],
        mappings=[_Mapping(k, [_Interval(a, b, s) for a, b, s in ivs]) for k, ivs in mappings],
        version=3,
    )
    path.write_bytes(bytes(meta.encode()) + recs.tobytes())
    return path


def bars(ts: np.ndarray, close: np.ndarray, iid: np.ndarray | int) -> dict:
    """OHLCV columns of bars closing at ``close`` (open = close, a half-point range, volume 10)."""
    return {
        "ts_event": ts,
        "instrument_id": np.broadcast_to(iid, ts.shape).copy(),
        "open": close,
        "high": close + 0.25,
        "low": close - 0.25,
        "close": close,
        "volume": np.full(len(ts), 10.0),
    }
