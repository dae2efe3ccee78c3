"""Durations as options write them (``30s``, ``1m`` or ``1min``, ``5m``, ``1h``, ``1d`` or ``1D``, ``0``), in nanoseconds.

The format's: ``BuildOptions`` records ``max_gap`` and ``bar`` as this text, and the build reads files with it.
"""

from __future__ import annotations

import re

__all__ = ["DAY_NS", "format_duration", "parse_duration"]

DAY_NS = 86_400_000_000_000
_UNITS = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": DAY_NS,
    "min": 60_000_000_000,  # pandas' spellings of a minute and a day
    "D": DAY_NS,
}
_DURATION = re.compile(r"^\s*(\d+)\s*(ns|us|ms|s|min|m|h|d|D)?\s*$")


def parse_duration(text: str) -> int:
    """Nanoseconds in ``text`` such as ``1s``, ``1m``, ``5m``, ``1h``, ``1d`` or ``0``."""
    match = _DURATION.match(str(text))
    if not match or (match.group(2) is None and int(match.group(1)) != 0):
        raise ValueError(
            f"bad duration {text!r}: use a whole number and a unit (ns, us, ms, s, m or min, h, d or D), e.g. 30s, 5min, 1h, 30D, or 0"
        )
    return int(match.group(1)) * _UNITS[match.group(2) or "ns"]


def format_duration(ns: int) -> str:
    """``ns`` in the largest unit that divides it (``60_000_000_000`` -> ``1m``), for messages."""
    for unit in ("d", "h", "m", "s", "ms", "us"):
        if ns and ns % _UNITS[unit] == 0:
            return f"{ns // _UNITS[unit]}{unit}"
    return f"{ns}ns"
