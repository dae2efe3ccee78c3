"""A ``WindowStream``'s saved position (the epoch, its checkpoints' history and the signature of the settings
that fix its batches), and the checks ``load_state_dict`` makes before a pass resumes from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionTypeError, StateError
from ..format.numbers import MAX_COUNT
from .identity import check_reads
from .passes import check_history, check_signature

if TYPE_CHECKING:
    from .stream import WindowStream

__all__ = ["restore", "saved_state", "signature"]


def saved_state(stream: WindowStream) -> dict[str, Any]:
    """``stream.state_dict()``: the epoch, its history and the signature; the same on every rank."""
    epoch, history = stream.passes.position(stream.planner.batches)
    return {"epoch": epoch, "seed": stream.order.seed, "history": [list(h) for h in history], **signature(stream)}


def restore(stream: WindowStream, state: Mapping[str, Any]) -> None:
    """``stream.load_state_dict(state)``: pin the next pass to ``state``'s position, once checked."""
    if not isinstance(state, Mapping):
        raise OptionTypeError(
            f"load_state_dict takes a dict made by WindowStream.state_dict(), not {type(state).__name__}"
        )
    missing = [k for k in ("epoch", "history") if k not in state]
    if missing:
        raise StateError(f"state_dict has no {' or '.join(missing)}: not a WindowStream state_dict")
    mine = signature(stream)
    if "cache" in state and all(state.get(k) == v for k, v in mine.items() if k not in ("cache", "n_windows")):
        check_reads(state["cache"], stream.reads.digests, stream.sources.caches, stream.split, state["epoch"])
    check_signature(state, mine)
    epoch = state["epoch"]
    if isinstance(epoch, bool | np.bool_) or not isinstance(epoch, int | np.integer) or not 0 <= epoch < MAX_COUNT:
        raise StateError(f"state_dict epoch {epoch!r}: must be an int >= 0 (below 2**62)")
    history = check_history(state["history"])
    stream.planner.check_position(int(epoch), history)
    stream.passes.pin(int(epoch), history)


def signature(stream: WindowStream) -> dict[str, Any]:
    """The settings that fix the epoch's batches (a mixture's only when set: a single cache's state stays as it was)."""
    h = stream.spec.horizon
    mixed = {
        **stream.mixture.signature(),
        **stream.sources.cut.signature(),
        "normalization": stream.normalization.signature(),
    }
    reads = stream.reads.digests
    return {
        "seq_len": stream.seq_len,
        "horizon": list(h) if isinstance(h, tuple) else h,
        "stride": stream.stride,
        "split": stream.split,
        **stream.order.signature(),
        "n_windows": stream.planner.n_windows,
        "cache": reads[0] if len(reads) == 1 else reads,
        **{k: v for k, v in mixed.items() if v is not None},
    }
