"""The parts of torch that shardcache uses outside its public, typed API, in one place.

``TESTED`` is the range of torch versions they were written and tested for;
``tests/test_adapters.py`` checks each against the installed torch and fails, naming this
module, once torch moves past that range.

* ``new_shared``: a storage made straight in shared memory (``UntypedStorage._new_shared``, as
  torch's own ``default_collate`` makes a worker's batch). The public
  ``UntypedStorage(n).share_memory_()`` makes it in private memory, then copies it into shared
  memory: a worker's first batch would wait for that copy (see docs/performance.md).
* ``shutdown_workers``: stop a DataLoader iterator's worker processes now
  (``_MultiProcessingDataLoaderIter._shutdown_workers``, what its finalizer calls); torch has no
  public call for it while the iterator is still referenced.
* ``in_shared_memory``: ``Tensor.share_memory_``, public but untyped in torch's stubs.
"""

from __future__ import annotations

from typing import Any, cast

import torch

__all__ = ["TESTED", "in_shared_memory", "new_shared", "shutdown_workers"]

TESTED = ((2, 2), (2, 14))  # torch versions from the first up to (not including) the second


def new_shared(nbytes: int) -> torch.UntypedStorage:
    """A new CPU storage of ``nbytes`` in shared memory, which crosses to another process by its handle."""
    return cast(torch.UntypedStorage, torch.UntypedStorage._new_shared(nbytes))  # type: ignore[no-untyped-call]


def shutdown_workers(it: Any) -> None:
    """Stop the worker processes of a DataLoader iterator (one with ``num_workers > 0``) now."""
    it._shutdown_workers()


def in_shared_memory(t: torch.Tensor) -> torch.Tensor:
    """``t`` moved into shared memory (in place), so forked and spawned processes see one copy."""
    return cast(torch.Tensor, t.share_memory_())  # type: ignore[no-untyped-call]
