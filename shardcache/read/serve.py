"""One pass's batches for one worker of a ``WindowStream``: ``serve``, from a complete resident arena on the
caller's thread, else from a ``Reader``; a DataLoader worker hands them over in shared memory (``ship``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import StreamClosedError
from ..tuning import RUN_BYTES, RUNS_AHEAD
from .options import Batch, MetaBatch
from .plan import EpochPlan
from .reader import Reader
from .ship import ship

if TYPE_CHECKING:
    from .stream import WindowStream

__all__ = ["SUPERSEDED", "serve"]

SUPERSEDED = "this WindowStream iterator was closed, or superseded by a newer iter()"


def serve(
    stream: WindowStream, plan: EpochPlan, worker: int, workers: int, generation: int | None
) -> Iterator[Batch | MetaBatch]:
    """Batches ``worker``, ``+ workers``, ... of ``plan``; in the main process (``generation``) each delivered
    batch is counted into the pass state, and a newer pass stops it."""
    batches = range(worker, plan.n_batches, workers)
    if not batches:
        return
    in_worker = generation is None
    spec, passes = stream.read_spec, stream.passes
    run = stream.order.batch_size if in_worker else RUN_BYTES // (4 * stream.seq_len * spec.nx)
    resident = None
    if not in_worker and stream.resident:
        resident = stream.resources.arena(spec, stream.sources.shard_rows)
        if resident.complete:  # nothing to read: each batch gathered on this thread, no reader
            for batch, gathered in resident.batches(spec, plan, batches):
                if generation != passes.generation or stream.closed:
                    raise StreamClosedError(SUPERSEDED)
                passes.delivered = batch + 1
                yield gathered
            return
    capacity = stream.capacity(plan, workers) if resident is None else resident.nbytes
    most = stream.batch_windows  # a worker ring's slots hold the largest batch
    reader = Reader(
        spec,
        plan,
        batches,
        capacity,
        decoders=stream.decoders,
        run_windows=run,
        outputs=stream.resources.worker_ring((spec.x_shape(most), spec.y_shape(most))) if in_worker else None,
        resident=resident,
        ahead=1 if in_worker else RUNS_AHEAD,
    )
    stream.resources.readers.add(reader)
    try:
        reader.start()
        while (ready := reader.next()) is not None:
            x, y = ready.x, ready.y
            if ready.event is not None:  # a device: the gather thread's copies, on its own stream
                spec.storage.here([x, y], [ready.event])
            for batch, p, r in ready.batches:
                if reader.stop.is_set() or (generation is not None and generation != passes.generation):
                    raise StreamClosedError(SUPERSEDED)
                if not in_worker:
                    passes.delivered = batch + 1
                if ready.meta is None:
                    out: Batch | MetaBatch = Batch(x[p:r], y[p:r])
                else:
                    out = MetaBatch(x[p:r], y[p:r], *(m[p:r] for m in ready.meta))
                yield ship(out) if in_worker else out
    finally:
        reader.close()
