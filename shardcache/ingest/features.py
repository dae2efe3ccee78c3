"""Features: the named float32 columns computed from a source's bar columns, one row per bar.

The default set for OHLCV bars is scale-free, so one model sees ES and NQ alike:

==============  ==============================================  =====================
name            formula                                         needs
==============  ==============================================  =====================
log_return      log(close / previous close)                     close
gap             log(open / previous close)                      open, close
log_range       log(high / low)                                 high, low
body            log(close / open)                               open, close
upper_wick      log(high / max(open, close))                    open, high, close
lower_wick      log(min(open, close) / low)                     open, low, close
log_volume      log(1 + volume)                                 volume
tod_sin         sin(2 pi * time of day / 24 h), UTC             (timestamp)
tod_cos         cos(2 pi * time of day / 24 h), UTC             (timestamp)
==============  ==============================================  =====================

"Previous" means the previous bar of the same segment; at a segment's first bar
(after a gap, at a split boundary or at a symbol's start) ``log_return`` and ``gap`` are 0,
so no feature reaches across a gap. Any source column (``close``, ``volume``, any numeric
Parquet column) can also be passed through by its name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..errors import OptionError, ShardcacheError
from .sources.base import DAY_NS

__all__ = ["DEFAULT_OHLCV", "DERIVED", "compute_features", "required_columns", "resolve_features"]

Columns = Mapping[str, np.ndarray]
log = logging.getLogger("shardcache")


def _prev(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Previous row's value within the segment, NaN at each segment start."""
    out = np.empty_like(x)
    out[0] = np.nan
    out[1:] = x[:-1]
    out[starts] = np.nan
    return out


def _log_ratio_or_zero(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(a / b)
    return np.where(np.isfinite(r), r, 0.0)


def _tod(ts: np.ndarray) -> np.ndarray:
    return 2 * np.pi * (np.asarray(ts, dtype=np.int64) % DAY_NS) / DAY_NS


# name -> (source columns needed, function(cols, ts, starts) -> float64 array)
DERIVED: dict[str, tuple[tuple[str, ...], Callable[[Columns, np.ndarray, np.ndarray], np.ndarray]]] = {
    "log_return": (("close",), lambda c, ts, s: _log_ratio_or_zero(c["close"], _prev(c["close"], s))),
    "gap": (("open", "close"), lambda c, ts, s: _log_ratio_or_zero(c["open"], _prev(c["close"], s))),
    "log_range": (("high", "low"), lambda c, ts, s: np.log(c["high"] / c["low"])),
    "body": (("open", "close"), lambda c, ts, s: np.log(c["close"] / c["open"])),
    "upper_wick": (("open", "high", "close"), lambda c, ts, s: np.log(c["high"] / np.maximum(c["open"], c["close"]))),
    "lower_wick": (("open", "low", "close"), lambda c, ts, s: np.log(np.minimum(c["open"], c["close"]) / c["low"])),
    "log_volume": (("volume",), lambda c, ts, s: np.log1p(np.maximum(c["volume"], 0.0))),
    "tod_sin": ((), lambda c, ts, s: np.sin(_tod(ts))),
    "tod_cos": ((), lambda c, ts, s: np.cos(_tod(ts))),
}
DEFAULT_OHLCV = list(DERIVED)
_OHLCV = ("open", "high", "low", "close", "volume")


def resolve_features(spec: str | Sequence[str] | None, columns: Sequence[str]) -> list[str]:
    """Feature names for ``spec``: ``None`` (the OHLCV set given OHLCV columns, else every column, with a warning
    when only some are there), ``"default"`` (the OHLCV set, or refused), ``"raw"`` (every source column), or
    names, ``default`` and ``raw`` among them if wanted (``default,close``: the defaults plus close)."""
    columns = list(columns)
    ohlcv = all(c in columns for c in _OHLCV)
    default = list(DEFAULT_OHLCV) if ohlcv else columns
    if spec is None:
        partial = [c for c in _OHLCV if c in columns]
        if not ohlcv and partial:
            log.warning(
                "the inputs have %s but no %s: not the default OHLCV features; their columns (%s) are the "
                "features (pass --features to choose)",
                ", ".join(partial),
                ", ".join(c for c in _OHLCV if c not in columns),
                ", ".join(columns),
            )
        return default
    given = [n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    if not given:
        raise OptionError("features", spec, "names no feature")
    if "default" in given and not ohlcv:
        absent = ", ".join(c for c in _OHLCV if c not in columns)
        raise OptionError(
            "features",
            spec if isinstance(spec, str) else ",".join(spec),
            f"the default features need the source columns {', '.join(_OHLCV)}; the inputs have no {absent} "
            f"(their columns: {', '.join(columns)}); name the features, or pass {{features}}",
            {"features": "raw"},
        )
    names = []
    for name in given:
        names += default if name == "default" else columns if name == "raw" else [name]
    for name in names:
        if name in columns:
            continue
        if name not in DERIVED:
            raise ShardcacheError(
                f"unknown feature {name!r}; choose from {', '.join(DERIVED)} or a source column ({', '.join(columns)})"
            )
        if missing := [c for c in DERIVED[name][0] if c not in columns]:
            raise ShardcacheError(f"feature {name!r} needs source column(s) {', '.join(missing)}")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise OptionError(
            "features",
            spec if isinstance(spec, str) else ",".join(spec),
            f"names {', '.join(twice)} twice (count what 'default' and 'raw' hold)",
        )
    return names


def required_columns(names: Sequence[str], columns: Sequence[str]) -> list[str]:
    """Source columns that ``names`` read, in source order."""
    need: set[str] = set()
    for n in names:
        need.update((n,) if n in columns else DERIVED[n][0])
    return [c for c in columns if c in need]


def compute_features(names: Sequence[str], cols: Columns, ts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Feature matrix float32 ``(n, len(names))``; ``starts`` marks segment starts (row 0 unless a lead row)."""
    n = len(ts)
    out = np.empty((n, len(names)), dtype=np.float32)
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    for j, name in enumerate(names):
        out[:, j] = f64[name] if name in f64 else DERIVED[name][1](f64, ts, starts)
    return out
