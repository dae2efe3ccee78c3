"""Many symbols: the same 600,000 bars as 2,000 symbols x 300 bars and as 4 symbols x 150,000 bars.

For each layout, on local disk and on a moto S3 server on 127.0.0.1 (``python -m moto.server``,
fake credentials; nothing leaves the machine), it measures in fresh processes:

* **build**: ``build_cache`` from one Parquet file (``shardcache.build.sample.make_sample_parquet``),
  seconds inside the process and bars/s;
* **import + open + first batch**: ``import shardcache``, ``open_cache``, ``import torch`` (the
  first use of ``WindowStream``), the first batch of a ``WindowStream`` (seq_len 60, batch 256),
  each step timed in the process, and the wall time of the whole process (interpreter start included);
* **info / ls / verify**: the wall time of ``python -m shardcache.cli info|ls|verify CACHE``.

Prints a markdown table, one column per layout and store, and the many/few ratio of each row.

Usage::

    python tools/bench_symbols.py [--bars 600000] [--many 2000] [--few 4] [--features 16] [--stores local,s3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from bench_s3 import ENV, Moto  # the moto server on loopback, shared with the S3 benchmark

BUILD = """
import json, sys, time
from shardcache import build_cache
src, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()
cache = build_cache(src, out, storage_options=options, progress=False, overwrite=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "bars": cache.n_bars, "symbols": len(cache.symbols)}))
"""

FIRST_BATCH = """
import time
t0 = time.perf_counter()
import json, sys
import shardcache
t_import = time.perf_counter()
cache = shardcache.open_cache(sys.argv[1], json.loads(sys.argv[2]))
t_open = time.perf_counter()
from shardcache import WindowStream  # imports torch
t_torch = time.perf_counter()
with WindowStream(cache, 60, split=cache.split_names[0], batch_size=256) as stream:
    x, y = next(iter(stream))
t_batch = time.perf_counter()
print(json.dumps({"import": t_import - t0, "open": t_open - t_import, "import torch": t_torch - t_open,
                  "first batch": t_batch - t_torch, "shape": list(x.shape)}))
"""


def _python(code_or_args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds and stdout of a fresh ``python`` process; a failure stops the benchmark."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(code_or_args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stdout


def measure(src: str, out: str, options: dict | None, env: dict[str, str]) -> dict[str, str]:
    """One column: build, first batch in a fresh process, and the three commands."""
    opts = json.dumps(options)
    _, text = _python(["-c", BUILD, src, out, opts], env)
    build = json.loads(text)
    row = {"build (s)": f"{build['seconds']:.1f}", "build (bars/s)": f"{build['bars'] / build['seconds']:,.0f}"}
    wall, text = _python(["-c", FIRST_BATCH, out, opts], env)
    first = json.loads(text)
    for step in ("import", "open", "import torch", "first batch"):
        row[f"{step} (s)"] = f"{first[step]:.2f}"
    row["import + open + first batch, process wall (s)"] = f"{wall:.2f}"
    flags = [f"--storage-option={k}={v}" for k, v in (options or {}).items()]
    for command in ("info", "ls", "verify"):
        wall, _ = _python(["-m", "shardcache.cli", command, out, *flags], env)
        row[f"shardcache {command} (s)"] = f"{wall:.2f}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, default=600_000)
    parser.add_argument("--many", type=int, default=2000, help="symbols of the many-symbols layout")
    parser.add_argument("--few", type=int, default=4, help="symbols of the few-symbols layout")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--stores", default="local,s3", help="comma-separated: local, s3 (a moto server)")
    args = parser.parse_args(argv)

    from shardcache.build.sample import make_sample_parquet

    env = {**os.environ, **ENV}
    columns: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-symbols-") as work:
        layouts = {}
        for name, n in (("many", args.many), ("few", args.few)):
            folder = os.path.join(work, name)
            files = make_sample_parquet(
                folder, n_bars=args.bars, n_features=args.features, symbols=[f"S{i:05d}" for i in range(n)]
            )
            layouts[name] = (str(files[0]), n)
        stores = set(args.stores.split(","))
        moto = Moto() if "s3" in stores else None
        try:
            for name, (src, n) in layouts.items():
                label = f"{n:,} x {args.bars // n:,}"
                if "local" in stores:
                    columns[f"{label}, local"] = measure(src, os.path.join(work, f"{name}.zarr"), None, env)
                if moto:
                    import s3fs

                    bucket = f"bench-{name}-{uuid.uuid4().hex[:8]}"
                    s3fs.S3FileSystem(**moto.options).mkdir(bucket)
                    columns[f"{label}, S3 (moto)"] = measure(src, f"s3://{bucket}/c.zarr", moto.options, env)
                for column in list(columns)[-len(stores) :]:  # as they come: a later failure keeps them
                    print(column, json.dumps(columns[column]), file=sys.stderr, flush=True)
        finally:
            if moto:
                moto.stop()
    names = list(columns)
    rows = list(columns[names[0]])
    print(
        f"{args.bars:,} bars x {args.features} features; symbols x bars per symbol; ratio = many / few (same store)\n"
    )
    per_layout = len(names) // 2  # columns are many (each store), then few (each store)
    stores_shown = [n.split(", ", 1)[1] for n in names[:per_layout]]
    print("| | " + " | ".join(names) + " | " + " | ".join(f"ratio {s}" for s in stores_shown) + " |")
    print("|---" * (len(names) + 1 + per_layout) + "|")
    for row in rows:
        values = [columns[c][row] for c in names]
        ratios = []
        for k in range(per_layout):
            x, y = (float(values[j].replace(",", "")) for j in (k, k + per_layout))
            ratios.append(f"{x / y:.2f}" if y else "-")
        print(f"| {row} | " + " | ".join(values) + " | " + " | ".join(ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
