"""A stream's settings resolved and checked, and the batches it yields.

Shared by ``WindowStream`` and ``WindowDataset``: memory budgets (``parse_budget``), the split a
stream must name, column names, the device, the rank and world of the current process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from ..format.cache import Cache, open_cache
from .plan import WindowSpec

__all__ = [
    "AUTO_CPU_FRACTION",
    "AUTO_CUDA_FRACTION",
    "CUDA_WORKERS",
    "MAX_DECODERS",
    "Batch",
    "MetaBatch",
    "check_device",
    "check_split",
    "columns",
    "count",
    "default_decoders",
    "open_for_reading",
    "parse_budget",
    "rank_world",
    "window_spec",
]

AUTO_CPU_FRACTION = 0.25  # memory_budget="auto": this share of psutil's available memory
AUTO_CUDA_FRACTION = 0.5  # ... or of the device's free memory with device="cuda"
MAX_DECODERS = 8  # default decoder threads per reader, at most: more find no blocks to decode (mix=4, prefetch=2)


class Batch(NamedTuple):
    """A batch: ``x`` float32 ``[B, seq_len, F]``, ``y`` float32 ``[B, T]`` (``[B, len(horizon), T]``)."""

    x: torch.Tensor
    y: torch.Tensor


class MetaBatch(NamedTuple):
    """A batch with each window's place: ``index`` int64 ``[B, 2]`` (symbol, row of the window's first
    bar in that symbol's arrays), ``symbol`` int64 ``[B]`` (into ``cache.symbols``), ``time`` int64
    ``[B]`` (ns since the epoch of the window's last input bar)."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor
    symbol: torch.Tensor
    time: torch.Tensor


def rank_world(hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """Rank and world size: ``torch.distributed`` if initialized, else ``hint`` (the main process's,
    in a spawned worker), else ``RANK``/``WORLD_SIZE``, else 0/1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if hint is not None:
        return hint
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_budget(value: int | str | None, device: torch.device) -> int | None:
    """Bytes of a ``memory_budget``: an int, ``"512MiB"``/``"2GB"``, or ``"auto"`` (a fixed share of
    available memory, or of the GPU's free memory with a CUDA device); None leaves it unset."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0] * AUTO_CUDA_FRACTION)
        import psutil

        return int(psutil.virtual_memory().available * AUTO_CPU_FRACTION)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_budget {value!r}: give bytes, a size such as '512MiB' or '2GB', or 'auto'")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"memory_budget {value!r} must be a positive number of bytes, a size string or 'auto'")
    return int(value)


def columns(cache: Cache, names: Sequence[str] | None, what: str) -> list[int] | None:
    """Column indices of ``names`` in the cache (None keeps every feature)."""
    if names is None:
        return None
    have = {n: i for i, n in enumerate(cache.feature_names)}
    missing = [n for n in names if n not in have]
    if missing or not names:
        problem = f"unknown feature(s) {', '.join(map(str, missing))}" if missing else "no feature named"
        raise ValueError(f"{what}: {problem}; the cache has {', '.join(have)}")
    return [have[n] for n in names]


def open_for_reading(cache: Cache | str | os.PathLike[str], storage_options: dict | None) -> Cache:
    """The cache to read: opened here from a path or URL (with ``storage_options``), or as given."""
    if isinstance(cache, Cache) and storage_options is not None:
        raise ValueError("storage_options apply to a path or URL; this cache is already open")
    return open_cache(cache, storage_options)


def check_split(cache: Cache, split: str | None) -> str | None:
    """A cache with several splits must be told which one: leaking val/test into training is silent."""
    names = cache.split_names
    if split is None and len(names) > 1:
        raise ValueError(
            f"{cache.url} has splits {', '.join(names)}: pass split={names[0]!r} (or another), "
            "or split='all' for every split"
        )
    if split not in (None, "all"):
        cache.split_id(split)  # an unknown split fails here, naming the cache's
    return split


def default_decoders(readers: int = 1) -> int:
    """Decoder threads per reader when ``decoders`` is unset: the cores this process may run on
    (its CPU affinity, not the machine's count: ``taskset``, cgroup cpusets, SLURM), shared by
    ``readers`` readers (DataLoader workers), at least 1 and at most ``MAX_DECODERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DECODERS, cores // max(1, readers)))


def count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``; a float, a bool or a string is refused, not truncated."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an int >= {minimum}")
    return int(value)


def window_spec(seq_len: int | WindowSpec, horizon: Any, stride: Any, features: Any, target: Any) -> WindowSpec:
    """The ``WindowSpec`` given, or one made of the separate settings (None: the default), not both."""
    if isinstance(seq_len, WindowSpec):
        beside = [
            n
            for n, v in zip(("horizon", "stride", "features", "target"), (horizon, stride, features, target))
            if v is not None
        ]
        if beside:
            raise TypeError(f"{', '.join(beside)} given beside a WindowSpec: pass them inside the WindowSpec")
        return seq_len
    return WindowSpec(seq_len, 1 if horizon is None else horizon, 1 if stride is None else stride, features, target)


def check_device(device: str | torch.device | None) -> torch.device:
    """The device, refused at once when it is CUDA and torch has none (not at the first batch)."""
    dev = torch.device(device if device is not None else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(dev)!r}, but torch sees no CUDA device (torch {torch.__version__})")
    return dev


CUDA_WORKERS = (
    "device='cuda' needs num_workers=0: the stream's own threads decode and copy to the GPU "
    "(worker processes cannot share its CUDA tensors)"
)
