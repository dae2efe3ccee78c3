"""``WindowStream.loader()``: a DataLoader that counts each batch it delivers into its stream.

Each pass (``WindowStream.begin_pass``) is written to a ``SharedPass`` before the workers start or resume,
and they read it there (``PassState.follow``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from torch.utils.data import DataLoader, get_worker_info

from .options import Batch, MetaBatch
from .passes import PassState, SharedPass

if TYPE_CHECKING:
    from .stream import WindowStream

__all__ = ["StreamLoader"]


def _worker_init(board: SharedPass, user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """``worker_init_fn`` of a ``loader()``: the worker's stream takes each pass from ``board``."""
    info = get_worker_info()
    assert info is not None
    cast("WindowStream", info.dataset).passes.follow(board)
    if user_init is not None:
        user_init(worker_id)


class StreamLoader(DataLoader[Batch | MetaBatch]):
    """A DataLoader over a ``WindowStream`` (``batch_size=None``) that counts each batch it delivers
    into the stream, so ``state_dict()`` is exact with worker processes; stopped by ``close()``."""

    def __init__(self, stream: WindowStream, **kwargs: Any) -> None:
        self._board = SharedPass()
        init = functools.partial(_worker_init, self._board, kwargs.pop("worker_init_fn", None))
        super().__init__(stream, worker_init_fn=init, **kwargs)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        stream: WindowStream = self.dataset  # type: ignore[assignment]
        stream.resources.check_open()
        if self.num_workers == 0:
            return super().__iter__()  # the stream's own iterator counts in this process
        self._board.write(stream.begin_pass())  # before any worker reads it
        it = super().__iter__()
        stream.resources.loader_iters.add(it)
        return self._counted(stream.passes, it)

    @staticmethod
    def _counted(passes: PassState, it: Iterator[Any]) -> Iterator[Any]:
        for batch in it:
            passes.count_delivered()
            yield batch
