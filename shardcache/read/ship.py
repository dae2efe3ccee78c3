"""DataLoader workers hand their batches to the main process through reused shared memory.

Each worker gathers into a small ring of shared-memory slots (``WorkerRing``): a slot's storage crosses
once, then a batch crosses as a few integers, with no copy or page fault (docs/performance.md). A slot is
reused only once both processes are done with it (``Loan``; the main process writes each released
generation back), so a batch the caller keeps is never overwritten; with every slot busy for ``WAIT``
seconds a batch goes as fresh tensors.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import StreamClosedError
from ..format.local_cache import process_alive
from ..tuning import SLOTS, WAIT
from .options import Batch, MetaBatch
from .torch_adapter import in_shared_memory, new_shared

__all__ = ["Loan", "WorkerRing", "forget", "ship"]

_POLL = 0.0005

Shapes = tuple[tuple[int, ...], ...]


class Loan:
    """Arrays over reused memory, lent out as tensors and free again once every tensor over them is gone: each
    tensor's storage holds a new numpy view (the loan's handle), which every view of the tensor shares."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays
        self._out: list[weakref.ref[np.ndarray]] = []

    def free(self) -> bool:
        return all(handle() is None for handle in self._out)

    def lend(self, n: int) -> list[torch.Tensor]:
        """Tensors over rows ``[:n]`` of each array (the arrays must be free)."""
        views = [a[:n] for a in self.arrays]
        self._out = [weakref.ref(v) for v in views]
        return [torch.from_numpy(v) for v in views]


def _over(storage: torch.UntypedStorage, shapes: Shapes) -> list[np.ndarray]:
    """One float32 numpy array per shape, laid end to end in ``storage``."""
    out, at, flat = [], 0, torch.empty(0).set_(storage)
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[at : at + n].view(shape).numpy())
        at += n
    return out


class _Slot(Loan):
    """One slot: its shared storage and the arrays over it."""

    def __init__(self, storage: torch.UntypedStorage, shapes: Shapes) -> None:
        super().__init__(_over(storage, shapes))
        self.storage = storage


# worker side: the slot behind each data pointer a shipped batch may start at
_BY_POINTER: weakref.WeakValueDictionary[int, WorkerRing] = weakref.WeakValueDictionary()


class WorkerRing:
    """A worker process's slots for batches of at most ``shapes`` (x, y), shared with the main process;
    shared ``gens`` row 0 holds each slot's last generation shipped, row 1 the last one released."""

    def __init__(self, prefix: str, shapes: Shapes) -> None:
        self.key, self.shapes = f"{prefix}/{os.getpid()}/{uuid.uuid4().hex}", shapes
        self.gens = in_shared_memory(torch.zeros((2, SLOTS), dtype=torch.int64))
        self.g = self.gens.numpy()
        self.slots: list[_Slot] = []
        self.index: dict[int, int] = {}  # a slot's data pointer: its number
        self.told: set[int] = set()  # slots whose storage the main process has
        self.starved = False
        self.lock = threading.Lock()
        self.nbytes = 4 * sum(int(np.prod(s)) for s in shapes)

    def _free(self) -> int | None:
        g = self.g
        return next((i for i, s in enumerate(self.slots) if g[0, i] == g[1, i] and s.free()), None)

    def take(self, n: int) -> list[torch.Tensor]:
        """Tensors ``[:n]`` of a free slot (x, y); fresh shared tensors if none frees up within ``WAIT``."""
        i = self._free()
        if i is None and len(self.slots) < SLOTS:
            slot = _Slot(new_shared(self.nbytes), self.shapes)
            i = self.index[slot.arrays[0].ctypes.data] = len(self.slots)
            _BY_POINTER[slot.arrays[0].ctypes.data] = self
            self.slots.append(slot)
        deadline = time.monotonic() + (0 if self.starved else WAIT)
        while i is None and time.monotonic() < deadline:
            time.sleep(_POLL)
            i = self._free()
        self.starved = i is None
        if i is None:
            return [_fresh((n, *s[1:])) for s in self.shapes]
        return self.slots[i].lend(n)

    def reduce(self, batch: Batch | MetaBatch) -> tuple[Any, tuple[_Sent]] | None:
        """What pickles ``batch`` as a slot reference, or None if its tensors are not a slot's."""
        x, y = batch[0], batch[1]
        i = self.index.get(x.data_ptr())
        if i is None:
            return None
        slot, n = self.slots[i], x.shape[0]
        if (
            y.data_ptr() != slot.arrays[1].ctypes.data
            or not x.is_contiguous()
            or not y.is_contiguous()
            or tuple(x.shape[1:]) != self.shapes[0][1:]
            or tuple(y.shape) != (n, *self.shapes[1][1:])
        ):
            return None
        with self.lock:
            gen = int(self.g[0, i]) + 1
            self.g[0, i] = gen
            told = i in self.told
            self.told.add(i)
        sent = _Sent(
            key=self.key,
            pid=os.getpid(),
            slot=i,
            gen=gen,
            rows=n,
            shapes=self.shapes,
            news=None if told else (slot.storage, self.gens),
            meta=tuple(t.numpy() for t in batch[2:]) or None,
        )
        return _arrive, (sent,)


@dataclass(frozen=True, kw_only=True)
class _Sent:
    """What crosses for a batch in a ring slot; ``news`` (the slot's storage and the ring's generations)
    only the first time the slot is used."""

    key: str
    pid: int
    slot: int
    gen: int
    rows: int
    shapes: Shapes
    news: tuple[torch.UntypedStorage, torch.Tensor] | None
    meta: tuple[np.ndarray, ...] | None


def _fresh(shape: tuple[int, ...]) -> torch.Tensor:
    """A new float32 tensor in shared memory of its own, as ``default_collate`` makes in a worker."""
    return torch.empty(0).set_(new_shared(4 * int(np.prod(shape)))).view(shape)


class _Shipped(Batch):
    """A worker's batch over a ring slot: pickled as a slot reference."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self, Batch)


class _ShippedMeta(MetaBatch):
    """``_Shipped`` with each window's place (``meta=True``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self, MetaBatch)


def _reduce(batch: Batch | MetaBatch, plain: type) -> tuple[Any, tuple[Any, ...]]:
    ring = _BY_POINTER.get(batch[0].data_ptr())
    how = ring.reduce(batch) if ring is not None else None
    return how if how is not None else (plain, tuple(batch))


def ship(batch: Batch | MetaBatch) -> Batch | MetaBatch:
    """``batch`` (made in a worker, over a ring slot or fresh) as it is yielded to the DataLoader."""
    return _ShippedMeta(*batch) if isinstance(batch, MetaBatch) else _Shipped(*batch)


# main side: every ring whose slots this process has mapped
class _MainRing:
    def __init__(self, pid: int, gens: torch.Tensor) -> None:
        self.pid, self.gens, self.g = pid, gens, gens.numpy()
        self.slots: dict[int, _Slot] = {}
        self.seen: dict[int, int] = {}  # slot: the last generation received


_RINGS: dict[str, _MainRing] = {}
_LOCK = threading.Lock()  # batches arrive on the main thread, or on the pin-memory thread


def _arrive(sent: _Sent) -> Batch | MetaBatch:
    """Unpickled in the main process: the batch as tensors over this process's mapping of the slot."""
    i = sent.slot
    with _LOCK:
        ring = _RINGS.get(sent.key)
        if sent.news is not None:
            storage, gens = sent.news
            if ring is None:
                for k in [k for k, r in _RINGS.items() if not process_alive(r.pid)]:
                    del _RINGS[k]
                ring = _RINGS[sent.key] = _MainRing(sent.pid, gens)
            ring.slots[i] = _Slot(storage, sent.shapes)
        if ring is None or i not in ring.slots:
            raise StreamClosedError(
                f"shardcache: a batch from DataLoader worker {sent.pid} refers to shared memory this "
                "process never received (was the stream closed while its workers ran?)"
            )
        ring.seen[i] = sent.gen
        x, y = ring.slots[i].lend(sent.rows)
        _release_locked()
    if sent.meta is None:
        return Batch(x, y)
    return MetaBatch(x, y, *(torch.from_numpy(m) for m in sent.meta))


def _release_locked() -> None:
    """Give back the slots whose batches have all arrived and whose loans are back."""
    for ring in _RINGS.values():
        g = ring.g
        for i, gen in ring.seen.items():
            if g[1, i] != gen and ring.slots[i].free():
                g[1, i] = gen


def forget(prefix: str) -> None:
    """Drop this process's mappings of a stream's rings (keys starting with ``prefix``); held batches keep theirs."""
    with _LOCK:
        for k in [k for k in _RINGS if k.startswith(prefix)]:
            del _RINGS[k]
