"""The format's share of a build: ``CacheWriter`` alone, the same bars as many symbols and as few.

For each layout (``--symbols``, default 2,000 x 300 against 4 x 150,000 bars, F=16, random float32
bars as a build computes them), in one process and one after another, it times what the writer
does in a build, without the build's scan, merge, features and dask:

* **create**: the root, the ``feature`` names and every symbol's ``zarr.json`` documents;
* **shards**: every ``write_shard`` (encode the shard and its time chunk, digest, two writes);
* **finish**: the root index (``segments``, ``shards``, ``shard_digests``) and the manifest;

then the objects written and ``verify_cache`` of the result (every object read once). Local
disk by default; ``--url`` writes under another fsspec URL (``memory://`` for the client-side
cost alone). Prints a markdown table with the ratio of each layout to the last.

Usage::

    python tools/bench_writer.py [--bars 600000] [--symbols 2000,4] [--features 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from shardcache.format.index import ShardIndex
from shardcache.format.layout import default_chunking
from shardcache.format.manifest import Counts, Manifest
from shardcache.format.writer import CacheWriter
from shardcache.inspect.verify import verify_cache


def one(out: str, n_symbols: int, bars: int, features: int) -> dict[str, float]:
    """Seconds of each writer step for ``bars`` bars in ``n_symbols`` symbols, and of ``verify``."""
    rng = np.random.default_rng(0)
    per = np.full(n_symbols, bars // n_symbols, dtype=np.int64)
    shard_rows, chunk_rows = default_chunking(features)
    names = [f"f{i}" for i in range(features)]
    t0 = time.perf_counter()
    writer = CacheWriter(out, feature_names=names, bars_per_symbol=per, shard_rows=shard_rows, chunk_rows=chunk_rows)
    t1 = time.perf_counter()
    records, compute = [], 0.0
    for s in writer.shard_ids:
        c0 = time.perf_counter()
        _, a, b = writer.rows.shard_span(s)
        block = rng.standard_normal((b - a, features), dtype=np.float32)
        ts = 10**18 + 60 * 10**9 * np.arange(a, b, dtype=np.int64)
        compute += time.perf_counter() - c0  # the bars themselves: not the writer's
        records.append(writer.write_shard(s, block, ts))
    t2 = time.perf_counter()
    index = ShardIndex.empty().updated(records, per, shard_rows)
    segments = np.stack([np.arange(n_symbols), writer.rows.bases[:-1], writer.rows.bases[:-1] + per], axis=1)
    manifest = Manifest(
        feature_names=names,
        symbols=[f"S{i}" for i in range(n_symbols)],
        groups=writer.groups,
        bars_per_symbol=per.tolist(),
        layout=writer.layout,
        counts=Counts(bars=int(per.sum()), symbols=n_symbols, segments=n_symbols),
    )
    writer.finish(segments, np.zeros(n_symbols, np.int8), manifest, index)
    t3 = time.perf_counter()
    report = verify_cache(out)
    t4 = time.perf_counter()
    assert report.ok, report.format()
    objects = sum(len(f) for _, _, f in os.walk(out)) if "://" not in out else 0
    return {
        "create (s)": t1 - t0,
        "shards (s)": t2 - t1 - compute,
        "finish (s)": t3 - t2,
        "writer total (s)": t3 - t0 - compute,
        "objects": objects,
        "verify (s)": t4 - t3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, default=600_000)
    parser.add_argument("--symbols", default="2000,4")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per layout; the fastest is shown")
    parser.add_argument("--url", default=None, help="an fsspec URL to write under instead of a temporary folder")
    args = parser.parse_args(argv)
    layouts = [int(x) for x in args.symbols.split(",")]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores\n")
    rows: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as work:
        for n in layouts:
            for r in range(args.repeat):
                out = f"{args.url.rstrip('/')}/w{n}-{r}.zarr" if args.url else os.path.join(work, f"w{n}.zarr")
                got = one(out, n, args.bars, args.features)
                rows[n] = {k: min(v, rows.get(n, got)[k]) for k, v in got.items()}
                if not args.url:
                    shutil.rmtree(out)
    base = rows[layouts[-1]]
    head = [f"{n:,} x {args.bars // n:,}" for n in layouts]
    print("| | " + " | ".join(head) + f" | {head[0]} / {head[-1]} |")
    print("|---|" + "---:|" * (len(layouts) + 1))
    for key in base:
        cells = [f"{rows[n][key]:,.0f}" if key == "objects" else f"{rows[n][key]:.3f}" for n in layouts]
        ratio = rows[layouts[0]][key] / base[key] if base[key] else float("nan")
        print(f"| {key} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
