"""Builds on a ``dask.distributed`` cluster: what every worker must reach, checked before any task runs.

With ``--scheduler tcp://HOST:PORT`` (or ``DASK_SCHEDULER_ADDRESS``) every build stage runs
as tasks on the cluster's workers (``client.map``, one task per input file, per batch of symbols
or per batch of shards; the stage's shared description is scattered to every worker once) and
only the small plan is computed in the driver. Two things must then be
reachable from every worker:

* the **staging folder** (spilled runs and clusters, finished-task markers): ``OUT.staging``
  beside a local ``--out``, or a folder under the driver's temp directory (``TMPDIR``) for
  an object-store ``--out``. On one machine (a ``LocalCluster``, or ``dask worker`` processes
  beside the driver) that is automatic; across machines it must be a shared filesystem
  mounted at the same path everywhere (put ``--out``, or ``TMPDIR`` for an ``s3://`` output,
  on it);
* the **inputs and the output**: shared paths or object-store URLs. ``memory://`` is private
  to each process and is refused.

Memory per worker: a task holds one bounded input piece (scan), one symbol's cluster of
overlapping runs, about one input file's worth (merge), or one shard (stats, write: a batch of
small shards is computed one shard at a time), and a worker runs ``nthreads`` tasks at once. Start workers with ``--nthreads 1`` (``dask worker
--nworkers N --nthreads 1``) so each worker process holds at most one piece or one shard.
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
    """Refuse a distributed build that some worker could not finish: no workers, a staging folder
    a worker does not see, or ``memory://`` data."""
    private = [u for u in urls if u.startswith("memory://")]
    if private:
        raise ShardcacheError(
            f"{private[0]}: memory:// lives inside one process; a distributed build needs "
            "inputs and output every worker can reach (shared paths or an object store)"
        )
    seen = client.run(os.path.exists, os.path.join(staging_root, STATE))
    if not seen:
        raise OptionError("scheduler", client.scheduler.address, "the cluster has no workers")
    blind = sorted(w for w, ok in seen.items() if not ok)
    if blind:
        hint = "" if os.path.isabs(staging_root) else "; a relative --out is relative to each worker's own folder"
        raise ShardcacheError(
            f"staging folder {staging_root} is not visible on worker(s) {', '.join(blind[:3])}"
            f"{' ...' if len(blind) > 3 else ''}: it must be on a filesystem every worker mounts at the same "
            f"path (put --out there, or for an object-store --out point TMPDIR there){hint}"
        )
    threads = sum(w["nthreads"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    log.info(
        "building on %s: %d workers, %d threads (one input piece or shard per thread at a time)",
        client.scheduler.address,
        len(seen),
        threads,
    )
