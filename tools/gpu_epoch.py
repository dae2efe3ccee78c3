"""Two epochs of a cache on a GPU, streamed and resident: windows/s per epoch and peak device memory.

Two modes of ``WindowStream(..., device="cuda")``, each a fresh stream over two epochs:

streamed   no ``memory_budget``: each decoded block is copied to the GPU once per epoch (pinned,
           non-blocking) and the windows are gathered there; the GPU holds a few blocks and the
           batch being made. Target for the 665K x 256 cache: peak <= ``--limit-gib`` (1 GiB).
resident   ``memory_budget`` covering the split (``--budget``, default ``"auto"``: half the free
           GPU memory): epoch 1 decodes each block once into one arena on the GPU (665K x 256
           float32 = 681 MB); epoch 2 copies nothing from the host and starts no thread, each
           batch is one ``index_select`` on the current stream. Target: peak <= ``--resident-limit-gib``
           (4 GiB, the team's GPU).

Usage (from the repository root; ``tools/bench.py`` builds the ``data/bench`` caches)::

    .venv/bin/python tools/gpu_epoch.py                        # F=9 and F=256 on cuda
    .venv/bin/python tools/gpu_epoch.py --device cpu           # the same on the CPU (resident in host memory)

Without a GPU, ``--device cuda`` exits with status 2 and a message. On the CPU the peak is the
process's RSS (sampled every batch) and torch runs one intra-op thread, as in
``tools/bench.py``. Exit status 1 when a peak is over its limit or an epoch misses windows.
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
    p.add_argument(
        "--work",
        type=Path,
        default=Path("data/bench"),
        help="folder of the cache-<F>.zarr caches (default: %(default)s)",
    )
    p.add_argument("--features", default="9,256", help="feature counts to run (default: %(default)s)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=60, help="window length (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="windows per batch (default: %(default)s)")
    p.add_argument("--budget", default="auto", help="memory_budget of the resident mode (default: %(default)s)")
    p.add_argument("--limit-gib", type=float, default=1.0, help="streamed peak target (default: %(default)s)")
    p.add_argument("--resident-limit-gib", type=float, default=4.0, help="resident peak target (default: %(default)s)")
    return p


def _epochs(cache: Path, args: argparse.Namespace, device: torch.device, budget: str | None) -> dict:
    """Two epochs of one stream: windows/s and first batch of each, the peak memory, whether resident."""
    from shardcache import WindowStream

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    proc = psutil.Process()
    peak_rss = proc.memory_info().rss
    out: dict = {"epochs": []}
    with WindowStream(
        cache, args.seq_len, split="all", batch_size=args.batch_size, shuffle=True, device=device, memory_budget=budget
    ) as ds:
        out["resident"], expected = ds.resident, ds.plan(0).n_windows
        for _ in range(2):
            t0 = time.perf_counter()
            n, first = 0, 0.0
            for x, _y in ds:
                n += x.shape[0]
                if not first:
                    first = time.perf_counter() - t0
                if device.type == "cpu":
                    peak_rss = max(peak_rss, proc.memory_info().rss)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            secs = time.perf_counter() - t0
            out["epochs"].append({"windows": n, "rate": n / secs, "first": first, "ok": n == expected})
    out["peak"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss
    return out


def main(argv: list[str] | None = None) -> int:
    """Stream two epochs per mode and feature count; print the table; 2 if the device or a cache is missing."""
    args = _parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_epoch: no CUDA device here (torch {torch.__version__}); run with --device cpu "
            "for the CPU path, or on a machine with a GPU",
            file=sys.stderr,
        )
        return 2
    caches = {int(f): args.work / f"cache-{int(f)}.zarr" for f in args.features.split(",")}
    missing = [str(c) for c in caches.values() if not (c / "zarr.json").exists()]
    if missing:
        print(f"gpu_epoch: no cache at {', '.join(missing)}; build them with tools/bench.py", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    what = "torch.cuda.max_memory_allocated()" if device.type == "cuda" else "peak RSS"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), seq_len {args.seq_len}, batch {args.batch_size}, shuffled; peak: {what}\n")
    print("| F | mode | epoch 1 windows/s | epoch 2 windows/s | epoch 2 first batch s | peak GiB | target | result |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    ok = True
    for f, cache in caches.items():
        modes = (("streamed", None, args.limit_gib), ("resident", args.budget, args.resident_limit_gib))
        for mode, budget, limit in modes:
            r = _epochs(cache, args, device, budget)
            e1, e2 = r["epochs"]
            good = r["peak"] <= limit * GIB and e1["ok"] and e2["ok"] and r["resident"] == (mode == "resident")
            ok &= good
            label = mode if r["resident"] == (mode == "resident") else f"{mode} (budget {args.budget} too small)"
            print(
                f"| {f} | {label} | {e1['rate']:,.0f} | {e2['rate']:,.0f} | {e2['first']:.3f} | "
                f"{r['peak'] / GIB:.3f} | <= {limit} | {'PASS' if good else 'FAIL'} |",
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
