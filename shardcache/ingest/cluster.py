"""Builds on a ``dask.distributed`` cluster: what every worker must reach, checked before any task runs.

With ``--scheduler`` (or ``DASK_SCHEDULER_ADDRESS``) every stage runs on the cluster's workers, which must
all reach the **staging folder** (``OUT.staging``, or under the driver's ``TMPDIR`` for an object-store
``--out``: across machines, a filesystem mounted at the same path) and the **inputs and output** (shared
paths or object-store URLs, never ``memory://``). Start workers with ``--nthreads 1`` so each holds one
piece or shard at a time (docs/scaling.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ..errors import OptionError, ShardcacheError
from .staging import STATE

__all__ = ["check_cluster"]

log = logging.getLogger("shardcache")


def check_cluster(client: Any, staging_root: str, urls: Sequence[str]) -> None:
    """Refuse a distributed build a worker could not finish: no workers, an unseen staging folder, ``memory://``."""
    if private := [u for u in urls if u.startswith("memory://")]:
        raise ShardcacheError(
            f"{private[0]}: memory:// lives inside one process; a distributed build needs "
            "inputs and output every worker can reach (shared paths or an object store)"
        )
    seen = client.run(os.path.exists, os.path.join(staging_root, STATE))
    if not seen:
        raise OptionError("scheduler", client.scheduler.address, "the cluster has no workers")
    if blind := sorted(w for w, ok in seen.items() if not ok):
        hint = "" if os.path.isabs(staging_root) else "; a relative --out is relative to each worker's own folder"
        raise ShardcacheError(
            f"staging folder {staging_root} is not visible on worker(s) {', '.join(blind[:3])}"
            f"{' ...' if len(blind) > 3 else ''}: it must be on a filesystem every worker mounts at the same "
            f"path (put --out there, or for an object-store --out point TMPDIR there){hint}"
        )
    threads = sum(w["nthreads"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    what = "%s: %d workers, %d threads (one input piece or shard per thread at a time)"
    log.info("building on " + what, client.scheduler.address, len(seen), threads)
