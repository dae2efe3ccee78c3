"""Whole-number options, checked one way in every wing: a float, a bool or a string is refused
(``OptionTypeError``, never truncated), a value out of range is an ``OptionError`` naming the option."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import OptionError, OptionTypeError

__all__ = ["MAX_COUNT", "whole_number"]

MAX_COUNT = 2**62
"""Counts, epochs and seeds stay below this: the pass state and the plan hold them in int64."""


def whole_number(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` of option ``name`` as an int of at least ``minimum`` and below ``MAX_COUNT``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise OptionTypeError(f"{name}={value!r}: expected a whole number")
    if value < minimum:
        raise OptionError(name, int(value), f"must be at least {minimum}")
    if value >= MAX_COUNT:
        raise OptionError(name, int(value), "must be below 2**62")
    return int(value)
