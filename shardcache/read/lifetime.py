"""What a ``WindowStream`` started or holds in one process (readers, a ``loader()``'s workers, its resident
arena, a worker's ring), and how ``close()`` ends it all; none of it travels when the stream is pickled."""

from __future__ import annotations

import weakref
from typing import Any

from ..errors import StreamClosedError
from .reader import Reader
from .readspec import ReadSpec
from .resident import Resident
from .ship import WorkerRing, forget
from .torch_adapter import shutdown_workers

__all__ = ["StreamResources"]


class StreamResources:
    """A stream's threads, worker processes and arenas in this process (``ship_id`` names its rings)."""

    def __init__(self, ship_id: str) -> None:
        self.ship_id = ship_id
        self.closed = False
        self.readers: weakref.WeakSet[Reader] = weakref.WeakSet()
        self.loader_iters: weakref.WeakSet[Any] = weakref.WeakSet()  # a loader()'s, whose workers close() stops
        self.resident: Resident | None = None  # made by the first resident pass, kept until close()
        self.ring: WorkerRing | None = None  # in a DataLoader worker: its ring, kept across passes

    def check_open(self) -> None:
        if self.closed:
            raise StreamClosedError("WindowStream is closed")

    def close_readers(self) -> None:
        """Stop the readers of the passes begun so far (a new pass supersedes them)."""
        for reader in list(self.readers):
            reader.close()

    def arena(self, spec: ReadSpec, shard_rows: int) -> Resident:
        """The resident arena of the stream's in-process passes, made on first use."""
        if self.resident is None:
            self.resident = Resident(spec, shard_rows)
        return self.resident

    def worker_ring(self, shapes: tuple[tuple[int, ...], ...]) -> WorkerRing:
        """This DataLoader worker's shared-memory slots for batches of at most ``shapes``, made on first use."""
        if self.ring is None:
            self.ring = WorkerRing(self.ship_id, shapes)
        return self.ring

    def close(self) -> None:
        """Stop every reader thread and DataLoader worker, free the arena and the rings' mappings."""
        self.closed = True
        for it in list(self.loader_iters):
            shutdown_workers(it)
        self.close_readers()
        if self.resident is not None:  # freed now, even while an iterator of it is still referenced
            self.resident.release()
            self.resident = None
        forget(self.ship_id)

    def __getstate__(self) -> dict[str, Any]:
        return {"ship_id": self.ship_id, "closed": self.closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["ship_id"])  # type: ignore[misc]
        self.closed = state["closed"]
