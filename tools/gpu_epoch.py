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

Usage (from the repository root; ``tools/bench.py loaders`` builds the ``data/bench`` caches)::

    .venv/bin/python tools/gpu_epoch.py                        # F=9 and F=256 on cuda (or: tools/bench.py gpu)
    .venv/bin/python tools/gpu_epoch.py --device cpu           # the same on the CPU (resident in host memory)

Without a GPU, ``--device cuda`` exits with status 2 and a message. On the CPU the peak is the
process's RSS (sampled every batch) and torch runs one intra-op thread, as in the other scenarios.
Exit status 1 when a peak is over its limit or an epoch misses windows. Windows of 60 bars, batches of 256.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import torch
from bench_harness import BATCH, GIB, SEQ_LEN, parser

__all__ = ["COMMANDS", "main"]


def _epochs(cache: Path, device: torch.device, budget: str | None) -> dict:
    """Two epochs of one stream: windows/s and first batch of each, the peak memory, whether resident."""
    from shardcache import WindowStream

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    proc = psutil.Process()
    peak_rss = proc.memory_info().rss
    out: dict = {"epochs": []}
    with WindowStream(
        cache, SEQ_LEN, split="all", batch_size=BATCH, shuffle=True, device=device, memory_budget=budget
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
    args = parser(
        *("gpu_epoch.py", __doc__, "work"),
        features=("9,256", "feature counts to run"),
        device=("cuda", "cuda, cuda:N or cpu"),
        budget=("auto", "memory_budget of the resident mode"),
        limit_gib=(1.0, "streamed peak target"),
        resident_limit_gib=(4.0, "resident peak target"),
    ).parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        what = f"no CUDA device here (torch {torch.__version__}); run with --device cpu for the CPU path"
        print(f"gpu_epoch: {what}, or on a machine with a GPU", file=sys.stderr)
        return 2
    caches = {int(f): args.work / f"cache-{int(f)}.zarr" for f in args.features.split(",")}
    missing = [str(c) for c in caches.values() if not (c / "zarr.json").exists()]
    if missing:
        print(f"gpu_epoch: no cache at {', '.join(missing)}; build them with tools/bench.py loaders", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    what = "torch.cuda.max_memory_allocated()" if device.type == "cuda" else "peak RSS"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device {device} ({name}), seq_len {SEQ_LEN}, batch {BATCH}, shuffled; peak: {what}\n")
    print("| F | mode | epoch 1 windows/s | epoch 2 windows/s | epoch 2 first batch s | peak GiB | target | result |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    ok = True
    for f, cache in caches.items():
        modes = (("streamed", None, args.limit_gib), ("resident", args.budget, args.resident_limit_gib))
        for mode, budget, limit in modes:
            r = _epochs(cache, device, budget)
            e1, e2 = r["epochs"]
            good = r["peak"] <= limit * GIB and e1["ok"] and e2["ok"] and r["resident"] == (mode == "resident")
            ok &= good
            label = mode if r["resident"] == (mode == "resident") else f"{mode} (budget {args.budget} too small)"
            row = f"| {f} | {label} | {e1['rate']:,.0f} | {e2['rate']:,.0f} | {e2['first']:.3f} | {r['peak'] / GIB:.3f}"
            print(f"{row} | <= {limit} | {'PASS' if good else 'FAIL'} |", flush=True)
    return 0 if ok else 1


COMMANDS = {"gpu": main}

if __name__ == "__main__":
    sys.exit(main())
