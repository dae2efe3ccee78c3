"""The checks ``WindowStream`` and ``WindowDataset`` share (sizes, the split, columns, the device, rank and
world), and the batches they yield; the settings objects that use them are in ``shardcache.read.settings``."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CacheError, OptionError, OptionTypeError
from ..format.cache import Cache
from ..format.durations import format_duration
from ..format.windows import SegmentSource, WindowSpec, split_segments
from ..tuning import MAX_DECODERS

__all__ = [
    "AUTO_CPU_FRACTION",
    "AUTO_CUDA_FRACTION",
    "CUDA_WORKERS",
    "Batch",
    "MetaBatch",
    "check_device",
    "check_split",
    "columns",
    "default_decoders",
    "no_windows_error",
    "parse_budget",
    "parse_size",
    "rank_world",
    "window_spec",
]

AUTO_CPU_FRACTION = 0.25  # memory_budget="auto": this share of psutil's available memory
AUTO_CUDA_FRACTION = 0.5  # ... or of the device's free memory with device="cuda"


class Batch(NamedTuple):
    """A batch: ``x`` float32 ``[B, seq_len, F]``, ``y`` float32 ``[B, T]`` (``[B, len(horizon), T]``)."""

    x: torch.Tensor
    """Inputs, float32 ``[B, seq_len, F]``."""
    y: torch.Tensor
    """Targets, float32 ``[B, T]`` (``[B, len(horizon), T]`` for a sequence of horizons)."""


class MetaBatch(NamedTuple):
    """A batch with each window's place and times (all int64):

    - ``index`` ``[B, 2]``: symbol, and row of the window's first bar in that symbol's arrays
      (of the window's cache);
    - ``symbol`` ``[B]``: into that cache's ``symbols``;
    - ``time`` ``[B]``: ns since the epoch of the window's **last input bar** (``x[:, -1]``);
    - ``target_time`` ``[B]`` (``[B, len(horizon)]`` for a sequence of horizons): ns since the
      epoch of each **target bar** (the bar ``y`` is read from). An int horizon counts stored bars,
      not minutes: the target bar may lie further ahead than ``horizon`` bar sizes where bars
      are missing (no trade in a minute), so align on ``target_time``, not on ``time + horizon``;
      a duration (``"5min"``) targets the last stored bar at or before ``time + horizon``;
    - ``source`` ``[B]``: the window's cache, an index into the stream's ``caches`` (0 for one cache).
    """

    x: torch.Tensor
    """Inputs, float32 ``[B, seq_len, F]``."""
    y: torch.Tensor
    """Targets, float32 ``[B, T]`` (``[B, len(horizon), T]`` for a sequence of horizons)."""
    index: torch.Tensor  # type: ignore[assignment]  # the public field name shadows tuple.index
    """``[B, 2]``: each window's symbol and the row of its first bar in that symbol's arrays."""
    symbol: torch.Tensor
    """``[B]``: each window's symbol, an index into its cache's ``symbols``."""
    time: torch.Tensor
    """``[B]``: ns since the epoch (UTC) of each window's last input bar."""
    target_time: torch.Tensor
    """``[B]`` (``[B, len(horizon)]``): ns since the epoch (UTC) of each target bar."""
    source: torch.Tensor
    """``[B]``: each window's cache, an index into the stream's ``caches``."""


def rank_world(hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """Rank and world size: ``torch.distributed``'s, else ``hint`` (a spawned worker's), else ``RANK``/``WORLD_SIZE``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if hint is not None:
        return hint
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)  # a rank outside the world: refused by the plan


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise OptionError(name, text, "the environment variable must be an integer") from None


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
_BUDGET_FORMS = "give bytes (an int such as 2_000_000_000), a size such as '512MiB' or '2GB', or 'auto'"
_SIZE_FORMS = "give bytes (an int such as 50_000_000_000) or a size such as '50GB' or '512MiB'"


def parse_budget(value: Any, device: torch.device) -> int | None:
    """Bytes of a ``memory_budget``: ``parse_size``'s forms, or ``"auto"`` (a share of available memory, or of
    the GPU's free memory with a CUDA device); None leaves it unset."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0] * AUTO_CUDA_FRACTION)
        import psutil

        return int(psutil.virtual_memory().available * AUTO_CPU_FRACTION)
    return parse_size(value, "memory_budget", _BUDGET_FORMS)


def parse_size(value: Any, option: str, forms: str = _SIZE_FORMS) -> int:
    """A positive number of bytes given to ``option``: a whole number (an int, ``1e9``, a numpy scalar or a 0-d
    tensor) or a size such as ``"512MiB"``/``"50GB"``; ``forms`` says what is taken."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise OptionError(option, value, forms)
        nbytes = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        nbytes = _whole_bytes(value, option, forms)
    if nbytes <= 0:
        raise OptionError(option, value, f"must be a positive number of bytes; {forms}")
    return nbytes


def _whole_bytes(value: Any, option: str, forms: str) -> int:
    """``value`` as a whole number of bytes: an integral Python or numpy number, or 0-d tensor."""
    number = value
    if isinstance(value, torch.Tensor | np.ndarray):
        if value.ndim != 0:
            raise OptionTypeError(f"{option}={value!r}: a tensor or array must be 0-d (one number); {forms}")
        number = value.item()
    if isinstance(number, bool | np.bool_):
        raise OptionTypeError(f"{option}={value!r}: a bool is not a number of bytes; {forms}")
    if isinstance(number, int | np.integer):
        return int(number)
    if isinstance(number, float | np.floating):
        if not math.isfinite(number) or not float(number).is_integer():
            raise OptionError(option, value, f"{float(number)!r} is not a whole number of bytes; {forms}")
        return int(number)
    raise OptionTypeError(f"{option}={value!r}: {type(value).__name__} is not a number of bytes; {forms}")


def columns(cache: Cache, names: Sequence[str] | None, what: str) -> list[int] | None:
    """Column indices of ``names`` in the cache (None keeps every feature)."""
    if names is None:
        return None
    have = {n: i for i, n in enumerate(cache.feature_names)}
    missing = [n for n in names if n not in have]
    if missing or not names:
        problem = f"unknown feature(s) {', '.join(map(str, missing))}" if missing else "no feature named"
        raise OptionError(what, list(names), f"{problem}; the cache has {', '.join(have)}")
    return [have[n] for n in names]


def check_split(cache: Cache, split: str | None) -> str | None:
    """A cache with several splits must be told which one: leaking val/test into training is silent."""
    names = cache.split_names
    if split is None and len(names) > 1:
        raise OptionError(
            "split",
            None,
            f"{cache.url} has splits {', '.join(names)}: pass split={names[0]!r} (or another), "
            "or split='all' for every split",
        )
    if split is not None and not isinstance(split, str):
        raise OptionTypeError(f"split={split!r}: must be a split name (a str) or 'all'")
    if split not in (None, "all"):
        cache.split_id(split)  # an unknown split fails here, naming the cache's
    return split


def no_windows_error(
    cache: Cache, spec: WindowSpec, split: str | None, table: SegmentSource | None = None
) -> OptionError | CacheError:
    """The error of a stream with no window: the longest segment (of ``table``, else the cache's) against the span."""
    seg = split_segments(cache if table is None else table, split)
    where = f" in split {split!r}" if split not in (None, "all") else ""
    if not len(seg):
        if where:
            return OptionError("split", split, "no window: the cache has no bars in this split")
        return CacheError(f"{cache.url}: no window: the cache has no bars")
    if spec.timed:
        return _no_timed_windows(cache if table is None else table, seg, cache, spec, where)
    k = int(np.argmax(seg[:, 2] - seg[:, 1]))
    sym = cache.symbols[int(seg[k, 0])]
    return OptionError(
        "seq_len",
        spec.seq_len,
        f"no window: with horizon={spec.horizon} a window spans {spec.span} bars, but the longest "
        f"segment{where} (symbol {sym}) has {int(seg[k, 2] - seg[k, 1])} bars; lower seq_len or horizon",
    )


def _no_timed_windows(table: SegmentSource, seg: np.ndarray, cache: Cache, spec: WindowSpec, where: str) -> OptionError:
    """``no_windows_error`` at time horizons: no segment holds a target bar within the horizon after a window."""
    first, last = table.bar_times(seg[:, 1]), table.bar_times(seg[:, 2] - 1)
    k = int(np.argmax(last - first))
    sym, lasting = cache.symbols[int(seg[k, 0])], format_duration(int(last[k] - first[k]))
    return OptionError(
        "horizon",
        spec.horizon,
        f"no window: a time horizon's target is the last stored bar at or before the last input bar's time plus "
        f"the horizon, and must lie after that bar and inside its segment, but no window of seq_len={spec.seq_len} "
        f"has one; the longest segment{where} (symbol {sym}) lasts {lasting} over {int(seg[k, 2] - seg[k, 1])} "
        "bars; lower seq_len or horizon",
    )


def default_decoders(readers: int = 1) -> int:
    """Decoder threads per reader when ``decoders`` is unset: the cores of this process's CPU affinity shared by
    ``readers`` readers, at least 1 and at most ``MAX_DECODERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DECODERS, cores // max(1, readers)))


def window_spec(seq_len: int | WindowSpec, fields: dict[str, Any]) -> WindowSpec:
    """The ``WindowSpec`` given, or one of ``seq_len`` and the entries of ``fields`` naming its settings (taken out)."""
    given = {n: fields.pop(n) for n in ("horizon", "stride", "features", "target") if n in fields}
    horizon, stride, features, target = (given.get(n) for n in ("horizon", "stride", "features", "target"))
    if isinstance(seq_len, WindowSpec):
        beside = [n for n, v in given.items() if v is not None]
        if beside:
            raise OptionTypeError(f"{', '.join(beside)} given beside a WindowSpec: pass them inside the WindowSpec")
        return seq_len
    return WindowSpec(seq_len, 1 if horizon is None else horizon, 1 if stride is None else stride, features, target)


def check_device(device: str | torch.device | None) -> torch.device:
    """The device, refused at once when it is CUDA and torch has none (not at the first batch)."""
    try:
        dev = torch.device(device if device is not None else "cpu")
    except (RuntimeError, TypeError) as exc:
        raise OptionError("device", device, f"not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError("device", str(dev), f"torch sees no CUDA device (torch {torch.__version__})")
    return dev


CUDA_WORKERS = (
    "needs num_workers=0: the stream's own threads decode and copy to the GPU "
    "(worker processes cannot share its CUDA tensors)"
)
