"""A stage's shared description for ``tasks.run_tasks`` tests: a dataclass with one entry per symbol, as
``ShardWork`` is, that counts how often its entries are read (dask walks every field of a dataclass in a
task's arguments) and how often it is pickled in this process (each task's copy to a cluster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Described", "peek"]


@dataclass
class Described:
    symbols: list[str]
    n: int = 0
    reads: int = field(default=0, compare=False)

    def __getattribute__(self, name: str) -> Any:
        if name == "symbols":
            object.__setattr__(self, "reads", object.__getattribute__(self, "reads") + 1)
        return object.__getattribute__(self, name)

    def __reduce__(self) -> tuple[Any, ...]:
        Described.pickled += 1
        return Described, (object.__getattribute__(self, "symbols"), self.n)

    pickled = 0  # class-wide: pickles made in this process


def peek(item: int, shared: Described) -> tuple[int, int]:
    """A task: its item and the shared description's size (``n``: no entry read)."""
    return item, shared.n
