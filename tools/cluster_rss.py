"""Peak RSS of each dask worker process while ``build_cache`` runs on a ``distributed.LocalCluster``.

A worker runs one task at a time (``threads_per_worker=1``, as ``dask worker --nthreads 1``),
and a task holds one input piece, one symbol's cluster of runs or one shard, so a worker's
peak over its idle footprint should stay near the size of the largest of those, whatever
the number of files. This starts the cluster, imports ``shardcache.ingest.builder`` in every
worker and tunes its allocator as the CLI's builds do (the idle footprint), samples each
worker's RSS with psutil every ``--interval`` seconds during the build and prints a markdown
table (MiB).

Usage::

    python tools/cluster_rss.py [--data DIR] [--days 360] [--workers 2] [--interval 0.01]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import psutil
from distributed import Client, LocalCluster

from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.ingest.sources import expand_inputs, open_source

MIB = 1 << 20


class Sampler(threading.Thread):
    """Records the largest RSS seen for each pid until stopped."""

    def __init__(self, pids: dict[str, int], interval: float) -> None:
        super().__init__(daemon=True)
        self.procs = {w: psutil.Process(p) for w, p in pids.items()}
        self.peak = {w: 0 for w in pids}
        self.interval, self.done = interval, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for w, proc in self.procs.items():
                self.peak[w] = max(self.peak[w], proc.memory_info().rss)
            time.sleep(self.interval)


def _warm() -> int:
    """Import what a build task imports and opt in to the CLI's allocator settings (as ``dask worker
    --preload shardcache.ingest.tasks`` does); the worker's RSS afterwards is its idle footprint."""
    import shardcache.ingest.builder  # noqa: F401
    from shardcache.ingest.tasks import tune_allocator

    tune_allocator()

    return psutil.Process().memory_info().rss


def main(argv: list[str] | None = None) -> int:
    """Build the sample on a LocalCluster and print each worker's idle and peak RSS."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="DBN/Parquet inputs (default: generate the sample)")
    p.add_argument("--days", type=int, default=360, help="days of the generated sample")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.01)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cluster-rss-") as tmp:
        data = args.data or os.path.join(tmp, "dbn")
        if args.data is None:
            make_sample(data, days=args.days)
        files = expand_inputs([data])
        with (
            LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            idle = client.run(_warm)
            sampler = Sampler(client.run(os.getpid), args.interval)
            sampler.start()
            t0 = time.perf_counter()
            cache = build_cache(files, os.path.join(tmp, "c.zarr"), scheduler=client, progress=False)
            elapsed = time.perf_counter() - t0
            sampler.done.set()
            sampler.join()
        biggest = max(os.path.getsize(f) for f in files)
        bars = max(sum(t.num_rows for t in open_source(f).pieces()) for f in files[:5])
    shard = cache.shard_rows * cache.n_features * 4
    print(
        f"{len(files)} files (largest {biggest / 1024:.0f} KiB, ~{bars} bars), {cache.n_bars:,} bars, "
        f"{cache.n_shards} shards of {shard / MIB:.1f} MiB decoded; build {elapsed:.1f} s on "
        f"{args.workers} workers x 1 thread\n"
    )
    print("| worker | idle RSS (MiB) | peak RSS (MiB) | peak - idle (MiB) |")
    print("|---|---:|---:|---:|")
    for w in sorted(idle):
        print(f"| {w} | {idle[w] / MIB:.0f} | {sampler.peak[w] / MIB:.0f} | {(sampler.peak[w] - idle[w]) / MIB:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
