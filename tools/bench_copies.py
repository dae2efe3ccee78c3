"""What checking node-local copies costs: an epoch read from a warm ``cache_dir``, against another source tree.

Each measurement is a fresh interpreter (one torch thread) that fills ``cache_dir`` with one epoch of a
``WindowStream(cache, 60, split="all", batch_size=256, cache_dir=...)``, then times ``--epochs`` more
epochs of the same stream, every shard read from its copy, and reports their median. ``--baseline TREE``
runs the same in a second source tree (``PYTHONPATH=TREE``, e.g. a checkout from before the check),
interleaved with this one over ``--rounds`` so both sides share the machine's load; the table gives each
side's median epoch and the ratio of the two, pair by pair.

    python tools/bench_copies.py --baseline /path/to/old/checkout --rounds 4

The cache is ``WORK/copies-<F>.zarr``: ``--bars`` bars of ``--features`` float32 columns over two symbols,
built here if missing (Parquet through ``build_cache``, no normalization).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "measure"]

CHILD = """
import json, shutil, sys, time
import torch
torch.set_num_threads(1)
from shardcache import WindowStream
cache, folder, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
shutil.rmtree(folder, ignore_errors=True)
kw = dict(batch_size=256, split="all", cache_dir=folder)
with WindowStream(cache, 60, **kw) as s:
    for _ in s:  # fills the copies
        pass
with WindowStream(cache, 60, **kw) as s:
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = sum(len(x) for x, _ in s)
        times.append(time.perf_counter() - t0)
print(json.dumps({"epoch_s": sorted(times)[len(times) // 2], "windows": n}))
"""


def ensure_cache(work: Path, bars: int, features: int) -> Path:
    """The benchmark's cache (built once): ``bars`` bars of ``features`` columns, two symbols."""
    from shardcache import CacheError, build_cache, open_cache
    from shardcache.ingest.sample import make_sample_parquet

    path = work / f"copies-{features}.zarr"
    try:
        open_cache(path)
    except CacheError:
        print(f"bench_copies: building {path} ...", file=sys.stderr, flush=True)
        files = make_sample_parquet(
            work / f"copies-{features}-in", n_bars=bars, n_features=features, symbols=["A", "B"]
        )
        build_cache(str(files[0]), path, normalize="none", overwrite=True, progress=False)
    return path


def measure(tree: str, cache: Path, folder: Path, epochs: int) -> dict:
    """One fresh process of source tree ``tree``: its median epoch from the copies in ``folder``."""
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), str(folder), str(epochs)],
        env=env, capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"bench_copies: a run in {tree} failed:\n{out.stderr[-2000:]}")
    shutil.rmtree(folder, ignore_errors=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="a second source tree to run interleaved with this one")
    p.add_argument("--rounds", type=int, default=4, help="processes per side")
    p.add_argument("--epochs", type=int, default=11, help="timed epochs per process (the median counts)")
    p.add_argument("--bars", type=int, default=200_000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--work", type=Path, default=Path("data/bench"))
    args = p.parse_args(argv)
    if min(args.rounds, args.epochs, args.bars, args.features) < 1:
        raise SystemExit("bench_copies: --rounds, --epochs, --bars and --features must be at least 1")
    args.work.mkdir(parents=True, exist_ok=True)
    cache = ensure_cache(args.work, args.bars, args.features)
    here = str(Path(__file__).resolve().parents[1])
    sides = {"this tree": here, **({"baseline": args.baseline} if args.baseline else {})}
    load, started = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, tree in sides.items():
            runs[name].append(measure(tree, cache, args.work / "copies-folder", args.epochs))
    print(
        f"bench_copies: {started}, {args.bars:,} bars x {args.features} features, {args.rounds} rounds of "
        f"{args.epochs} epochs from a warm cache_dir; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print()
    print("| side | windows | median epoch s (range over rounds) | x baseline (pairs) |")
    print("|---|---:|---:|---:|")
    for name in sides:
        ep = [r["epoch_s"] for r in runs[name]]
        ratio = "-"
        if "baseline" in runs and name != "baseline":
            pairs = [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs[name], runs["baseline"])]
            ratio = f"{statistics.median(pairs):.3f}x ({min(pairs):.3f}-{max(pairs):.3f})"
        print(
            f"| {name} | {runs[name][0]['windows']:,} | {statistics.median(ep):.3f} ({min(ep):.3f}-{max(ep):.3f}) "
            f"| {ratio} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
