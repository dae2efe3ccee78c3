"""Multi-core scaling of the in-process stream: first batch and a full epoch at 1 and 2 cores.

Each row is a fresh process pinned to the given cores (``os.sched_setaffinity`` before torch is
imported, as ``taskset -c`` would), with ``OMP_NUM_THREADS=1`` and one torch thread like
``tools/bench.py``. It times a shuffled ``WindowStream(cache, 60, split="all",
batch_size=256)``: the first batch (open, plan, first decode), then the rest of the epoch
(windows/s after the first batch; the consumer only counts windows), and the process's CPU
seconds over the epoch. ``decoders`` is the stream's default (one per core of the affinity)
unless a row sets it. ``--baseline TREE`` adds the same default rows run on another source
tree (``PYTHONPATH=TREE``), interleaved, for a before/after on the same loaded machine.

    python tools/bench_cores.py --work data/bench --rounds 2 [--baseline /path/to/old/checkout]

Caches are ``WORK/cache-<F>.zarr`` as ``tools/bench.py`` builds them (built here if missing).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_first import THREAD_ENV, _cache, tool_parser

__all__ = ["VARIANTS", "epoch", "main"]

# (label, cores, decoders): None is the stream's default
VARIANTS = (
    ("1 core", "0", None),
    ("2 cores", "0,1", None),
    ("2 cores, decoders=1", "0,1", 1),
    ("1 core, decoders=2", "0", 2),
)


def epoch(cache_path: str, cores: str, decoders: int | None, seed: int) -> dict[str, Any]:
    """Child: pin to ``cores``, then one shuffled epoch; first batch s, windows/s after it, CPU s."""
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    import torch

    from shardcache import WindowStream

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    kw = {} if decoders is None else {"decoders": decoders}
    stream = WindowStream(cache_path, 60, horizon=1, split="all", batch_size=256, shuffle=True, seed=seed, **kw)
    n = n_first = 0
    with stream:
        for x, _y in stream:
            if not n:
                t1, c1, n_first = time.perf_counter(), time.process_time(), len(x)
            n += len(x)
        t2, c2 = time.perf_counter(), time.process_time()
        used = stream.decoders
    return {
        "first_batch_s": t1 - t0,
        "windows_per_s": (n - n_first) / (t2 - t1),
        "cpu_s": c2 - c1,
        "windows": n,
        "decoders": used,
    }


def _run(tree: str, cache: str, cores: str, decoders: int | None, seed: int) -> dict[str, Any]:
    """One fresh pinned process on source tree ``tree`` (its working directory too)."""
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": tree}
    code = (
        f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import bench_cores; print(json.dumps(bench_cores.epoch({cache!r}, {cores!r}, {decoders!r}, {seed})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = tool_parser(
        "bench_cores.py", __doc__, (2, "interleaved rounds"), "also run the default rows on this source tree"
    ).parse_args(argv)
    here = str(Path(__file__).resolve().parents[1])
    rows = [("new", here, *v) for v in VARIANTS]
    if args.baseline:
        old = str(Path(args.baseline).resolve())
        rows += [("old", old, label, cores, None) for label, cores, d in VARIANTS if d is None]
    caches = {int(f): _cache(args.work, int(f)) for f in args.features.split(",")}
    results: dict[tuple, list[dict[str, Any]]] = {}
    load0 = os.getloadavg()
    for rnd in range(args.rounds):
        for f, cache in caches.items():
            for tree_name, tree, label, cores, dec in rows if rnd % 2 == 0 else rows[::-1]:
                results.setdefault((f, tree_name, label), []).append(_run(tree, cache, cores, dec, rnd))
    load1 = os.getloadavg()
    print(
        f"in-process stream by cores, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
        f"{load0[0]:.2f} -> {load1[0]:.2f}; {args.rounds} interleaved rounds: windows/s the best, "
        "first batch the median"
    )
    print("| F | tree | cores | decoders | first batch ms | windows/s | vs 1 core | CPU s per epoch |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (f, tree_name, label), runs in results.items():
        best = max(runs, key=lambda r: r["windows_per_s"])
        one = max(results[(f, tree_name, "1 core")], key=lambda r: r["windows_per_s"])["windows_per_s"]
        first = statistics.median(r["first_batch_s"] for r in runs)
        rate, cpu = best["windows_per_s"], statistics.median(r["cpu_s"] for r in runs)
        print(
            f"| {f} | {tree_name} | {label} | {best['decoders']} | {1e3 * first:.0f} | {rate:,.0f} | "
            f"{rate / one:.2f}x | {cpu:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"|".join(map(str, k)): v for k, v in results.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
