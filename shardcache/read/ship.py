"""DataLoader workers hand their batches to the main process through reused shared memory.

A batch made in a worker process must cross to the main process. Sent as fresh tensors (what
``default_collate`` does), each batch is a new shared-memory segment: page faults in the
worker while it fills it, a file descriptor passed, page faults again in the main process
(12.3 ms a batch at 256 x 60 x 256 against 1.5 ms in-process, measured here). Instead each
worker gathers into a small ring of shared-memory *slots* (``WorkerRing``, grown on demand up
to ``SLOTS``). A slot's storage crosses once, the first time it is used (torch passes its
descriptor; the main process maps it and keeps it); after that a batch crosses as a few
integers (ring, slot, generation, rows) and the main process hands the caller tensors over
its own mapping of the slot: no copy, no fault.

A slot is reused only when both processes are done with it, so a batch the caller keeps is
never overwritten:

* the worker's own references: the slot's arrays' reference counts, as ``reader._Outputs``
  does in-process (a batch queued, or still being pickled, holds one);
* the main process's: every batch a slot carried (its *generation*, written by the worker as
  the batch is pickled) must have been received, and every tensor over it gone. Each time a
  batch arrives, the main process releases every such slot by writing its generation into the
  ring's shared ``released`` row (``release``).

When every slot is in use (the caller keeps many batches) the worker waits at most ``WAIT``
seconds, then sends that batch as fresh tensors, as torch would: slower, never stuck.
``forget`` drops a stream's mappings in the main process (``WindowStream.close``); a ring of
a worker that has exited is dropped when the next ring arrives.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np
import torch

from ..errors import StreamClosedError
from .options import Batch, MetaBatch

__all__ = ["SLOTS", "WAIT", "WorkerRing", "forget", "release", "ship"]

SLOTS = 8  # per worker: runs gathered ahead (2), batches in flight (prefetch_factor, 2 by default), kept by the caller
WAIT = 0.02
_POLL = 0.0005


def _over(storage: torch.UntypedStorage, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    """One numpy array per shape, laid end to end in ``storage``. Each is the owner of its views
    (its base is a tensor, not an array), so its reference count tells whether any view lives."""
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(torch.empty(0).set_(storage, at, shape).numpy())
        at += n
    return out


def _refs(arrays: list[np.ndarray]) -> list[int]:
    return [sys.getrefcount(a) for a in arrays]


class _Slot:
    """One slot's shared storage and the arrays over it, with their reference counts when idle."""

    def __init__(self, storage: torch.UntypedStorage, shapes: tuple[tuple[int, ...], ...]) -> None:
        self.storage = storage
        self.arrays = _over(storage, shapes)
        self.idle = _refs(self.arrays)

    def unused(self) -> bool:
        return _refs(self.arrays) == self.idle

    def tensors(self, n: int) -> list[torch.Tensor]:
        return [torch.from_numpy(a[:n]) for a in self.arrays]


# worker side: the slot behind each data pointer a shipped batch may start at
_BY_POINTER: weakref.WeakValueDictionary[int, WorkerRing] = weakref.WeakValueDictionary()


class WorkerRing:
    """A worker process's slots for batches of at most ``shapes`` (x, y), shared with the main process.

    ``gens`` is shared: row 0 holds each slot's last generation shipped (written here, as the
    batch is pickled), row 1 the last one the main process released.
    """

    def __init__(self, prefix: str, shapes: tuple[tuple[int, ...], ...]) -> None:
        self.key, self.shapes = f"{prefix}/{os.getpid()}/{uuid.uuid4().hex}", shapes
        self.gens = torch.zeros((2, SLOTS), dtype=torch.int64).share_memory_()
        self.g = self.gens.numpy()
        self.slots: list[_Slot] = []
        self.index: dict[int, int] = {}  # a slot's data pointer: its number
        self.told: set[int] = set()  # slots whose storage the main process has
        self.starved = False
        self.lock = threading.Lock()
        self.nbytes = 4 * sum(int(np.prod(s)) for s in shapes)

    def _free(self) -> int | None:
        g = self.g
        return next((i for i, s in enumerate(self.slots) if g[0, i] == g[1, i] and s.unused()), None)

    def take(self, n: int) -> list[torch.Tensor]:
        """Tensors ``[:n]`` of a free slot (x, y); fresh shared tensors if none frees up within ``WAIT``."""
        i = self._free()
        if i is None and len(self.slots) < SLOTS:
            slot = _Slot(torch.UntypedStorage._new_shared(self.nbytes), self.shapes)
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
        return self.slots[i].tensors(n)

    def reduce(self, batch: Batch | MetaBatch) -> tuple[Any, tuple] | None:
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
        meta = tuple(t.numpy() for t in batch[2:]) or None
        news = None if told else (slot.storage, self.gens)
        return _arrive, (self.key, os.getpid(), i, gen, n, self.shapes, news, meta)


def _fresh(shape: tuple[int, ...]) -> torch.Tensor:
    """A new float32 tensor in shared memory of its own, as ``default_collate`` makes in a worker."""
    storage = torch.UntypedStorage._new_shared(4 * int(np.prod(shape)))
    return torch.empty(0).set_(storage, 0, shape)


class _Shipped(Batch):
    """A worker's batch over a ring slot: pickled as a slot reference (see the module docstring)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple]:
        return _reduce(self, Batch)


class _ShippedMeta(MetaBatch):
    """``_Shipped`` with each window's place (``meta=True``)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple]:
        return _reduce(self, MetaBatch)


def _reduce(batch: Batch | MetaBatch, plain: type) -> tuple[Any, tuple]:
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _arrive(
    key: str, pid: int, i: int, gen: int, n: int, shapes: tuple, news: tuple | None, meta: tuple | None
) -> Batch | MetaBatch:
    """Unpickled in the main process: the batch as tensors over this process's mapping of the slot."""
    with _LOCK:
        ring = _RINGS.get(key)
        if news is not None:
            storage, gens = news
            if ring is None:
                for k in [k for k, r in _RINGS.items() if not _alive(r.pid)]:
                    del _RINGS[k]
                ring = _RINGS[key] = _MainRing(pid, gens)
            ring.slots[i] = _Slot(storage, shapes)
        if ring is None or i not in ring.slots:
            raise StreamClosedError(
                f"shardcache: a batch from DataLoader worker {pid} refers to shared memory this "
                "process never received (was the stream closed while its workers ran?)"
            )
        ring.seen[i] = gen
        x, y = ring.slots[i].tensors(n)
        _release_locked()
    if meta is None:
        return Batch(x, y)
    return MetaBatch(x, y, *(torch.from_numpy(m) for m in meta))


def _release_locked() -> None:
    for ring in _RINGS.values():
        g = ring.g
        for i, gen in ring.seen.items():
            if g[1, i] != gen and ring.slots[i].unused():
                g[1, i] = gen


def release() -> None:
    """Give back to their workers every slot whose batches the caller no longer holds."""
    with _LOCK:
        _release_locked()


def forget(prefix: str) -> None:
    """Drop this process's mappings of the rings whose key starts with ``prefix`` (a stream's);
    batches the caller still holds keep their memory until they are gone."""
    with _LOCK:
        for k in [k for k in _RINGS if k.startswith(prefix)]:
            del _RINGS[k]
