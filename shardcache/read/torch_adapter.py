"""The parts of torch that shardcache uses outside its public, typed API, in one place.

``TESTED`` is the torch range they were written for; ``tests/test_adapters.py`` fails, naming this module,
once torch moves past it. ``new_shared`` makes a storage straight in shared memory (the public
``share_memory_()`` copies, which a worker's first batch would wait for).
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
