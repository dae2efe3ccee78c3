"""A stream's passes: which epoch each pass is, how far the current one got, and their plans.

Every pass is a full epoch, the one after the previous pass; ``set_epoch`` and ``load_state_dict`` pin
the next pass. ``PassState``'s shared int64 tensor (layout known to this module alone: pinned epoch,
history length, history pairs, then each DataLoader worker's pass count) lets the main process see the
passes a plain DataLoader's workers began; a ``loader()``'s workers read their pass from a ``SharedPass``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from ..errors import OptionError, StateError
from ..format.numbers import MAX_COUNT
from ..format.windows import Ranges
from .mixture import Shares
from .plan import EpochPlan, make_plan
from .settings import PlanSettings
from .torch_adapter import in_shared_memory

__all__ = [
    "MAX_HISTORY",
    "MAX_WORKERS",
    "History",
    "Pass",
    "PassState",
    "Planner",
    "SharedPass",
    "check_history",
    "check_signature",
]

MAX_HISTORY = 8  # checkpoints of one epoch a resume can chain
MAX_WORKERS = 256  # DataLoader workers whose passes a plain DataLoader counts

History = tuple[tuple[int, int], ...]
"""A resume history: ``(world, batches delivered per rank)`` at each checkpoint of an epoch, oldest first."""


@dataclass(frozen=True, kw_only=True)
class Pass:
    """One pass: its ``epoch``, the resume ``history`` it continues (empty: from the first batch), its ``rank`` and ``world``."""

    epoch: int
    history: History = ()
    rank: int = 0
    world: int = 1


_ANCHOR, _HLEN, _HIST = 0, 1, 2
_WORKERS = _HIST + 2 * MAX_HISTORY


def check_history(history: Any) -> History:
    """``history`` as a ``History``: pairs of ints, world >= 1 and delivered >= 0, at most ``MAX_HISTORY``."""
    try:
        pairs = [tuple(pair) for pair in history]
    except TypeError:
        pairs = None
    if pairs is None or not all(len(p) == 2 and all(_is_int(v) for v in p) for p in pairs):
        raise StateError(f"state_dict history {history!r} is not [[world, batches], ...]")
    out = tuple((int(w), int(c)) for w, c in pairs)
    if any(w < 1 or c < 0 or w >= MAX_COUNT or c >= MAX_COUNT for w, c in out):
        raise StateError(f"state_dict history {history!r} is not [[world, batches], ...]: world >= 1, batches >= 0")
    if len(out) > MAX_HISTORY:
        raise StateError(f"a resume can chain {MAX_HISTORY} checkpoints of one epoch, not {len(out)}")
    return out


_SINCE = {"cache"}  # signature fields a state saved before they existed lacks: such a state is taken
_WHEN_SET = (
    "weights",
    "epoch_windows",
    "split_times",
    "fold",
    "embargo",
    "normalization",
)  # recorded only when set: absent means None


def check_signature(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse a saved ``state`` whose signature is not ``mine``, naming each field that differs."""
    keys = [*mine, *(k for k in _WHEN_SET if k not in mine)]
    bad = {
        k: (state.get(k), mine.get(k)) for k in keys if state.get(k) != mine.get(k) and (k in state or k not in _SINCE)
    }
    if bad:
        detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in bad.items())
        raise StateError(f"state_dict is from a different stream ({detail})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


class PassState:
    """The pass count and position of one stream, shared with its DataLoader workers."""

    def __init__(self) -> None:
        self._shared = in_shared_memory(torch.zeros(_WORKERS + MAX_WORKERS, dtype=torch.int64))
        self._owner = os.getpid()  # the process whose passes this state counts (and its DataLoader workers)
        self.main_passes = 0  # passes begun in the main process since the pin
        self.current: Pass | None = None  # the main process's current pass
        self.delivered = 0  # batches of the current pass delivered to the caller
        self.generation = 0  # numbers the main process's passes: an iterator of an older one is superseded
        self.board: SharedPass | None = None  # in a loader()'s worker: where its main process writes each pass

    # -- reading -------------------------------------------------------------------------
    @property
    def pinned(self) -> Pass:
        """The pinned pass: the epoch and resume history of the first pass after the pin."""
        n = int(self._shared[_HLEN])
        h = self._shared[_HIST : _HIST + 2 * n].tolist()
        return Pass(epoch=int(self._shared[_ANCHOR]), history=tuple((h[2 * i], h[2 * i + 1]) for i in range(n)))

    def worker_passes(self, worker: int) -> int:
        """Passes DataLoader worker ``worker`` began since the pin."""
        return int(self._shared[_WORKERS + worker])

    def passes(self) -> int:
        """Passes since the pin: the main process's, or a plain DataLoader's (its workers count them)."""
        return max(self.main_passes, int(self._shared[_WORKERS:].max()))

    def nth(self, k: int) -> Pass:
        """Epoch and resume history of the ``k``-th pass since the pin."""
        pin = self.pinned
        return pin if k == 0 else Pass(epoch=pin.epoch + k)

    def upcoming(self) -> Pass:
        """The next pass (its epoch and history)."""
        return self.nth(self.passes())

    @property
    def fresh(self) -> bool:
        """No pass began since the pin, in this process or in a DataLoader worker."""
        return self.main_passes == 0 and not int(self._shared[_WORKERS:].sum())

    # -- writing -------------------------------------------------------------------------
    def claim(self) -> None:
        """In a process other than the owner and its workers (``mp.spawn`` ranks), take a private copy."""
        if self._owner != os.getpid():
            self._shared, self._owner = in_shared_memory(self._shared.clone()), os.getpid()

    def pin(self, epoch: int, history: History = ()) -> None:
        """Make the next pass ``epoch``, continuing ``history``; every count starts again."""
        if len(history) > MAX_HISTORY:
            raise StateError(f"a resume can chain {MAX_HISTORY} checkpoints of one epoch, not {len(history)}")
        self.claim()
        st = self._shared
        st[_ANCHOR], st[_HLEN] = int(epoch), len(history)
        st[_HIST : _HIST + 2 * len(history)] = torch.tensor([v for pair in history for v in pair], dtype=torch.int64)
        st[_WORKERS:] = 0
        self.main_passes, self.current, self.delivered = 0, None, 0

    def begin(self, rank: int, world: int) -> Pass:
        """Begin the next pass in the main process, for ``rank`` of ``world``: the current pass from now on."""
        self.claim()
        p = replace(self.nth(self.main_passes), rank=rank, world=world)
        self.main_passes += 1
        self.current, self.delivered = p, 0
        self.generation += 1
        return p

    def begin_worker(self, worker: int, rank: int, world: int) -> Pass:
        """Begin a pass in DataLoader worker ``worker``: a ``loader()``'s main process's pass, else the worker's own next."""
        if self.board is not None:
            return self.board.read()
        if worker >= MAX_WORKERS:
            raise OptionError(
                "num_workers", worker + 1, f"WindowStream supports up to {MAX_WORKERS} DataLoader workers"
            )
        k = int(self._shared[_WORKERS + worker])
        self._shared[_WORKERS + worker] = k + 1
        return replace(self.nth(k), rank=rank, world=world)

    def count_delivered(self) -> None:
        """One more batch of the current pass reached the caller."""
        self.delivered += 1

    def follow(self, board: SharedPass) -> None:
        """In a ``loader()``'s worker: take each pass from ``board``."""
        self.board = board

    def position(self, batches: Callable[[Pass], int]) -> tuple[int, History]:
        """The epoch and resume history a resume continues from: the current pass's, the next epoch once
        all its ``batches(pass)`` are delivered, or the pinned pass before any pass."""
        self.claim()
        p = self.current
        if p is None:
            up = self.upcoming()
            return up.epoch, up.history
        if self.delivered >= batches(p):
            return p.epoch + 1, ()
        return p.epoch, (*p.history, (p.world, self.delivered))


class SharedPass:
    """A ``loader()``'s record of the pass its main process began, for its workers: epoch, rank, world, n, n pairs."""

    def __init__(self) -> None:
        self._shared = in_shared_memory(torch.zeros(4 + 2 * MAX_HISTORY, dtype=torch.int64))

    def write(self, p: Pass) -> None:
        flat = [v for pair in p.history for v in pair]
        self._shared[: 4 + len(flat)] = torch.tensor(
            [p.epoch, p.rank, p.world, len(p.history), *flat], dtype=torch.int64
        )

    def read(self) -> Pass:
        v = self._shared.tolist()
        n = v[3]
        return Pass(epoch=v[0], rank=v[1], world=v[2], history=tuple((v[4 + 2 * i], v[5 + 2 * i]) for i in range(n)))


class Planner:
    """The plans of a stream's passes over ``ranges`` with ``settings`` (and ``shares``); the last few are kept."""

    _KEEP = 4

    def __init__(
        self,
        *,
        ranges: Ranges,
        n_rows: int,
        shard_rows: int,
        settings: PlanSettings,
        what: str,
        shares: Shares | None = None,
    ) -> None:
        self.ranges, self.n_rows, self.shard_rows, self.settings = ranges, n_rows, shard_rows, settings
        self.shares = shares
        self.n_windows = ranges.total() if shares is None else shares.total  # an epoch's windows
        self.what = what  # names the windows in a message ("split 'train' of /data/es.zarr")
        self._plans: dict[tuple[Any, ...], EpochPlan] = {}

    def plan(self, p: Pass) -> EpochPlan:
        """Pass ``p``'s plan on its rank; a world with more ranks than windows is refused."""
        self.check_world(p.world)
        key = (p.epoch, p.history, p.rank, p.world)
        if key not in self._plans:
            if len(self._plans) > self._KEEP:
                self._plans.clear()
            self._plans[key] = make_plan(
                self.ranges,
                self.n_rows,
                self.shard_rows,
                **asdict(self.settings),  # batch_size, shuffle, seed, mix, drop_last
                epoch=p.epoch,
                rank=p.rank,
                world=p.world,
                history=p.history,
                shares=self.shares,
            )
        return self._plans[key]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plans": {}}  # a worker makes the plans it needs

    def batches(self, p: Pass) -> int:
        """Batches of pass ``p`` (the same on every rank)."""
        return self.plan(replace(p, rank=0)).n_batches

    def check_world(self, world: int) -> None:
        if world > self.n_windows:
            raise OptionError(
                "world_size",
                world,
                f"more ranks than the {self.n_windows:,} windows of {self.what}: every rank would get no batch; "
                f"use at most {self.n_windows:,} ranks (WORLD_SIZE), or more windows (a smaller seq_len or stride)",
            )

    def check_position(self, epoch: int, history: Sequence[tuple[int, int]]) -> None:
        """Refuse a resume history that is not a position inside epoch ``epoch``."""
        for k, (world, done) in enumerate(history):
            if world > self.n_windows:
                raise StateError(
                    f"state_dict history {[list(h) for h in history]!r}: world size {world} has more ranks than "
                    f"the {self.n_windows:,} windows of {self.what}"
                )
            n = self.batches(Pass(epoch=epoch, history=tuple(history[:k]), world=world))
            if done >= n:
                raise StateError(
                    f"state_dict history {[list(h) for h in history]!r}: checkpoint {k + 1} has {done} batches "
                    f"delivered per rank at world size {world}, but that part of epoch {epoch} has {n}: "
                    "not a position inside the epoch (a finished epoch is saved as the next epoch, history [])"
                )
