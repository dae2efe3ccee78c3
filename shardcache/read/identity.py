"""What a stream's saved position reads, in market terms, so a resume can tell an append apart from a change.

Per cache a state records two digests: the build (what fixes every stored bar) and the split's windows as
(symbol, row, count) runs. An append that added no window to the split streamed resumes; otherwise
``check_reads`` refuses, saying what changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import StateError
from ..format.cache import Cache
from ..format.typed_json import dump
from ..format.windows import Ranges

__all__ = ["Reads", "check_reads", "reads_of"]


def reads_of(caches: Sequence[Cache], row_bounds: np.ndarray, ranges: Ranges) -> list[dict[str, str]]:
    """Per cache, ``{"build": digest, "windows": "<count> #<digest>"}``: its build and its windows of ``ranges``."""
    out = []
    for k, cache in enumerate(caches):
        m = cache.manifest
        stats = None if m.stats is None else dump(m.stats)
        build = [m.created, m.build.fingerprint, m.feature_names, stats, m.layout.shard_rows]
        lo, hi = int(row_bounds[k]), int(row_bounds[k + 1])
        mine = (ranges.start >= lo) & (ranges.start < hi)
        symbol, row = cache.rows.locate(ranges.start[mine] - lo)
        h = hashlib.blake2b(json.dumps([ranges.stride, ranges.span]).encode(), digest_size=6)
        h.update(json.dumps([cache.symbols[s] for s in symbol.tolist()]).encode())
        h.update(np.stack([row, ranges.count[mine]]).astype(np.int64).tobytes())
        n = int(ranges.count[mine].sum())
        out.append({"build": _digest(build), "windows": f"{n} #{h.hexdigest()}"})
    return out


class Reads:
    """``reads_of`` a stream's caches, worked out when a state is first saved or loaded."""

    def __init__(self, caches: Sequence[Cache], row_bounds: np.ndarray, ranges: Ranges) -> None:
        self._of = (caches, row_bounds, ranges)

    @functools.cached_property
    def digests(self) -> list[dict[str, str]]:
        """Per cache, its build and windows digests (``reads_of``)."""
        return reads_of(*self._of)


def check_reads(saved: Any, mine: list[dict[str, str]], caches: Sequence[Cache], split: str | None, epoch: Any) -> None:
    """Refuse a saved position whose caches' reads are not ``mine``, naming the first cache that changed, what
    changed and how to go on."""
    saved_list = saved if isinstance(saved, list) else [saved]
    if len(saved_list) != len(mine):
        return  # another number of caches: the settings' check names it
    if sorted(map(str, saved_list)) == sorted(map(str, mine)):
        return  # the same caches in another order: the settings' check names it
    go_on = f"resume at the next epoch with stream.set_epoch({_next(epoch)}), or from the start"
    for cache, then, now in zip(caches, saved_list, mine):
        if then == now:
            continue
        if not isinstance(then, Mapping) or "build" not in then or "windows" not in then:
            raise StateError(
                f"state_dict cannot resume on {cache.url}: it was saved by an earlier shardcache, which names "
                f"a cache by its bar count and cannot tell an append from a change; {go_on}"
            )
        if then["build"] != now["build"]:
            raise StateError(
                f"state_dict cannot resume on {cache.url}: it is another build than the one the state was "
                f"saved on (rebuilt, --append --stats recompute, or another cache), so the bars its plan reads may "
                f"differ; {go_on}"
            )
        where = "the cache's windows" if split in (None, "all") else f"the {split!r} split's windows"
        a, b = (str(then["windows"]).split(" #")[0], now["windows"].split(" #")[0])
        counts = f"{int(a):,} then, {int(b):,} now" if a.isdigit() and a != b else "as many, other rows"
        raise StateError(
            f"state_dict cannot resume on {cache.url}: {where} changed since it was saved ({counts}: an append "
            f"added bars to them); {go_on}"
        )


def _next(epoch: Any) -> str:
    return f"{epoch + 1}" if isinstance(epoch, int) and not isinstance(epoch, bool) else "epoch + 1"


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
