"""Stream one full epoch of a cache onto a GPU: peak GPU memory and windows/s.

``WindowStream(..., device="cuda")`` copies each decoded block to the GPU once (pinned,
non-blocking) and gathers the windows there, so the GPU holds a few blocks and the batch
being made, never the windows of the epoch. The target for the 665K x 256 cache is
``torch.cuda.max_memory_allocated() <= 1 GiB``.

Usage (from the repository root; ``tools/bench.py`` builds ``data/bench/cache-256.zarr``)::

    .venv/bin/python tools/gpu_epoch.py                       # data/bench/cache-256.zarr on cuda
    .venv/bin/python tools/gpu_epoch.py CACHE --device cpu    # the same loop on the CPU

Without a GPU, ``--device cuda`` exits with status 2 and a message. On the CPU the peak is
the process's RSS (sampled every batch) and torch runs one intra-op thread, as in
``tools/bench.py``. Exit status 1 when the peak is over ``--limit-gib``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil
import torch

__all__ = ["main"]

GIB = 2**30


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_epoch.py", description=__doc__.splitlines()[0])
    p.add_argument("cache", nargs="?", type=Path, default=Path("data/bench/cache-256.zarr"),
                   help="cache to stream (default: %(default)s)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=60, help="window length (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="windows per batch (default: %(default)s)")
    p.add_argument("--limit-gib", type=float, default=1.0, help="peak memory target (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Stream one epoch and print windows/s and the peak memory; 2 if the device is missing."""
    args = _parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_epoch: no CUDA device here (torch {torch.__version__}); run with --device cpu "
              "for the CPU path, or on a machine with a GPU", file=sys.stderr)
        return 2
    if not (args.cache / "zarr.json").exists():
        print(f"gpu_epoch: no cache at {args.cache}; build it with tools/bench.py or build-cache", file=sys.stderr)
        return 2
    from shardcache import WindowStream

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        torch.set_num_threads(1)
    proc = psutil.Process()
    rss0 = peak_rss = proc.memory_info().rss
    t0 = time.perf_counter()
    n, first = 0, 0.0
    with WindowStream(args.cache, args.seq_len, split="all", batch_size=args.batch_size, shuffle=True, device=device) as ds:
        for x, _y in ds:
            n += x.shape[0]
            if not first:
                first = time.perf_counter() - t0
            if device.type == "cpu":
                peak_rss = max(peak_rss, proc.memory_info().rss)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        expected = ds.plan().n_windows
    secs = time.perf_counter() - t0
    if device.type == "cuda":
        peak, what = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated()"
    else:
        peak, what = peak_rss, f"peak RSS (torch and shardcache imported: {rss0 / GIB:.3f} GiB before streaming)"
    ok = peak <= args.limit_gib * GIB
    print(f"device {device}: {n:,} windows of ({args.seq_len}, {ds.cache.n_features}) in {secs:.1f} s = "
          f"{n / secs:,.0f} windows/s, first batch after {first:.3f} s")
    print(f"{what}: {peak / GIB:.3f} GiB (target <= {args.limit_gib} GiB): {'PASS' if ok else 'FAIL'}")
    if n != expected:
        print(f"gpu_epoch: streamed {n:,} windows, the plan has {expected:,}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
