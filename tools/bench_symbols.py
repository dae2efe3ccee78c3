"""Many symbols: the same bars laid out as many symbols and as few (default 2,000 x 300 and 4 x 150,000).

For each layout (``--symbols``, many first), on local disk and on a moto S3 server on 127.0.0.1
(``python -m moto.server``, fake credentials; nothing leaves the machine), it measures in fresh processes:

* **build**: ``build_cache`` from one Parquet file (``shardcache.ingest.sample.make_sample_parquet``),
  seconds inside the process and bars/s, and the objects (files) the cache holds;
* **import + open + first batch**: ``import shardcache``, ``open_cache``, ``import torch`` (the
  first use of ``WindowStream``), the first batch of a ``WindowStream`` (seq_len 60, batch 256),
  each step timed in the process, and the wall time of the whole process (interpreter start included);
* **epoch**: one whole epoch of that stream through ``loader(0)`` and ``loader(2)`` (two DataLoader
  workers), seconds inside the process from ``iter`` to the last batch; locally also ``loader(0)`` with
  the cache's files dropped from the page cache first (``POSIX_FADV_DONTNEED`` on each: a cache read
  long after it was written, or by another node's disk cache gone cold); on S3 also two runs of
  ``loader(2)`` through one named ``cache_dir`` (the node-local shard cache): the first fills it, the
  second (a new process) reads from it;
* **info / ls / verify**: the wall time of ``python -m shardcache.cli info|ls|verify CACHE``.

On S3 it also counts every request each of these processes made, from the server's log
(``s3_requests``: deterministic, where timings on loopback are not; on real S3 each request costs a
10-50 ms first byte), and prints them by kind (GET zarr.json, GET data, PUT, LIST, HEAD, DELETE) per
symbol, per shard and per stored object in a second table.

With ``--rounds R`` the local steps run R times, the layouts in turn, each build into a folder of its own
(nothing is deleted before the end), and each local figure is the median of its R rounds.

Prints a markdown table, one column per layout and store, and the ratio of each layout to the last
(fewest symbols) in the same store.

On ext4 without a journal (this project's machines), a new inode skips every inode deleted in the last
one to six minutes (the kernel's ``recently_deleted``): a many-symbol build run soon after many files were
deleted (this tool's own cleanup of a previous run, a test run) is several times slower, all of it kernel
time. Run it on a file system that has been left alone for a few minutes, and not twice in a row.

Usage::

    python tools/bench_symbols.py [--bars 600000] [--symbols 2000,4] [--features 16] [--stores local,s3]
        [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from bench_s3 import ENV, Moto  # the moto server on loopback, shared with the S3 benchmark
from s3_requests import COLUMNS, Counts

BUILD = """
import json, sys, time
from shardcache import build_cache
src, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()
cache = build_cache(src, out, storage_options=options, progress=False, overwrite=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "bars": cache.n_bars, "symbols": len(cache.symbols),
                  "shards": cache.n_shards}))
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

EPOCH = """
import json, sys, time
import shardcache
from shardcache import WindowStream
cache = shardcache.open_cache(sys.argv[1], json.loads(sys.argv[2]))
local = {"cache_dir": sys.argv[4]} if len(sys.argv) > 4 else {}
with WindowStream(cache, 60, split=cache.split_names[0], batch_size=256, **local) as stream:
    t0 = time.perf_counter()
    n = sum(len(x) for x, _ in stream.loader(int(sys.argv[3])))
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "windows": n}))
"""

# (row label, per what) of the request table; per: symbol, shard or object (the stored objects)
STEPS = {
    "build": "symbol",
    "open + first batch": "symbol",
    "epoch, loader(0)": "shard",
    "epoch, loader(2)": "shard",
    "epoch, loader(2), cache_dir, first run": "shard",
    "epoch, loader(2), cache_dir, next run": "shard",
    "shardcache info": "symbol",
    "shardcache ls": "symbol",
    "shardcache verify": "object",
}


def _python(code_or_args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds and stdout of a fresh ``python`` process; a failure stops the benchmark."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *code_or_args], check=False, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(code_or_args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stdout


def _objects(out: str, options: dict | None) -> int:
    """Objects (files) the cache holds: listed after its build, outside every counted step."""
    if options is None:
        return sum(len(files) for _, _, files in os.walk(out))
    import s3fs

    return len(s3fs.S3FileSystem(**options).find(out))


def _drop_from_page_cache(out: str) -> None:
    """Every file of the local cache ``out`` out of the page cache: the next epoch reads them from disk."""
    for folder, _, files in os.walk(out):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def measure(
    src: str, out: str, options: dict | None, env: dict[str, str], moto: Moto | None = None
) -> tuple[dict[str, str], dict[str, Counts], dict[str, int]]:
    """One column: build, first batch and one epoch in fresh processes, and the three commands;
    on S3 the requests of each step (``STEPS``) and the symbols, shards and objects they are per."""
    opts = json.dumps(options)
    log, bucket = (moto.request_log, out.split("://", 1)[1].split("/", 1)[0]) if moto else (None, None)
    counts: dict[str, Counts] = {}

    def run(step: str, args: list[str]) -> tuple[float, str]:
        mark = log.mark() if log else 0
        result = _python(args, env)
        if log:
            counts[step] = log.since(mark, bucket)
        return result

    _, text = run("build", ["-c", BUILD, src, out, opts])
    build = json.loads(text)
    sizes = {"symbol": build["symbols"], "shard": build["shards"], "object": _objects(out, options)}
    row = {
        "build (s)": f"{build['seconds']:.2f}",
        "build (bars/s)": f"{build['bars'] / build['seconds']:,.0f}",
        "stored objects": f"{sizes['object']:,}",
    }
    wall, text = run("open + first batch", ["-c", FIRST_BATCH, out, opts])
    first = json.loads(text)
    for step in ("import", "open", "import torch", "first batch"):
        row[f"{step} (s)"] = f"{first[step]:.2f}"
    row["import + open + first batch, process wall (s)"] = f"{wall:.2f}"
    for workers in (0, 2):
        _, text = run(f"epoch, loader({workers})", ["-c", EPOCH, out, opts, str(workers)])
        row[f"epoch, loader({workers}) (s)"] = f"{json.loads(text)['seconds']:.2f}"
    if options is None and hasattr(os, "posix_fadvise"):
        _drop_from_page_cache(out)
        _, text = run("epoch, loader(0), cold", ["-c", EPOCH, out, opts, "0"])
        row["epoch, loader(0), files not in the page cache (s)"] = f"{json.loads(text)['seconds']:.2f}"
    if moto:
        with tempfile.TemporaryDirectory(prefix="bench-symbols-local-") as folder:
            for when in ("first run", "next run"):
                step = f"epoch, loader(2), cache_dir, {when}"
                _, text = run(step, ["-c", EPOCH, out, opts, "2", folder])
                row[f"{step} (s)"] = f"{json.loads(text)['seconds']:.2f}"
    flags = [f"--storage-option={k}={v}" for k, v in (options or {}).items()]
    for command in ("info", "ls", "verify"):
        wall, _ = run(f"shardcache {command}", ["-m", "shardcache.cli", command, out, *flags])
        row[f"shardcache {command} (s)"] = f"{wall:.2f}"
    for step, c in counts.items():
        row[f"{step} (requests)"] = f"{c.total:,}"
    return row, counts, sizes


def _median(rows: list[dict[str, str]]) -> dict[str, str]:
    """Each figure's median over ``rows`` (one per round), written as the first round wrote it."""
    out = {}
    for key, first in rows[0].items():
        try:
            values = [float(r[key].replace(",", "")) for r in rows]
        except ValueError:
            out[key] = first
            continue
        decimals = len(first.split(".", 1)[1]) if "." in first else 0
        out[key] = f"{statistics.median(values):{',' if ',' in first else ''}.{decimals}f}"
    return out


def _ratio(x: str, y: str) -> str:
    try:
        a, b = float(x.replace(",", "")), float(y.replace(",", ""))
    except ValueError:
        return "-"
    return f"{a / b:.2f}" if b else "-"


def request_table(requests: dict[str, tuple[dict[str, Counts], dict[str, int]]]) -> list[str]:
    """Markdown rows of every counted step of every column: total, per symbol/shard/object, by kind."""
    kinds = [k for k in COLUMNS if any(c.column(k) for counts, _ in requests.values() for c in counts.values())]
    lines = [
        "| step | layout | requests | per symbol | per shard | per object | " + " | ".join(kinds) + " |",
        "|---|---|" + "---:|" * (4 + len(kinds)),
    ]
    for step, per in STEPS.items():
        for name, (counts, sizes) in requests.items():
            c = counts.get(step)
            if c is None:
                continue
            each = [
                f"{c.total / sizes[u]:.2f}" if u == per or u == "symbol" else "" for u in ("symbol", "shard", "object")
            ]
            lines.append(
                f"| {step} | {name} | {c.total:,} | "
                + " | ".join(each)
                + " | "
                + " | ".join(f"{c.column(k):,}" for k in kinds)
                + " |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, default=600_000)
    parser.add_argument(
        "--symbols", default="2000,4", help="comma-separated symbol counts of the layouts; ratios are to the last"
    )
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--stores", default="local,s3", help="comma-separated: local, s3 (a moto server)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="local: the layouts measured in turn this many times; medians shown"
    )
    args = parser.parse_args(argv)
    symbol_counts = [int(n) for n in args.symbols.split(",")]

    from shardcache.ingest.sample import make_sample_parquet

    env = {**os.environ, **ENV}
    columns: dict[str, dict[str, str]] = {}
    requests: dict[str, tuple[dict[str, Counts], dict[str, int]]] = {}
    stores = [s for s in ("local", "s3") if s in args.stores.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-symbols-") as work:
        layouts = {}
        for n in symbol_counts:
            folder = os.path.join(work, f"in-{n}")
            files = make_sample_parquet(
                folder, n_bars=args.bars, n_features=args.features, symbols=[f"S{i:05d}" for i in range(n)]
            )
            layouts[f"{n:,} x {args.bars // n:,}"] = (str(files[0]), n)
        moto = Moto(os.path.join(work, "moto.log")) if "s3" in stores else None
        local: dict[str, list[dict[str, str]]] = {label: [] for label in layouts}
        remote: dict[str, dict[str, str]] = {}
        try:
            for r in range(args.rounds):  # the layouts in turn; every build into a folder of its own
                for label, (src, n) in layouts.items():
                    if "local" in stores:
                        row, _, _ = measure(src, os.path.join(work, f"{n}-{r}.zarr"), None, env)
                        local[label].append(row)
                        print(f"{label}, local, round {r + 1}", json.dumps(row), file=sys.stderr, flush=True)
                    if moto and r == 0:  # request counts do not vary: one round
                        import s3fs

                        bucket = f"bench-{n}-{uuid.uuid4().hex[:8]}"
                        s3fs.S3FileSystem(**moto.options).mkdir(bucket)
                        remote[label], counts, sizes = measure(src, f"s3://{bucket}/c.zarr", moto.options, env, moto)
                        requests[label] = (counts, sizes)
                        print(f"{label}, S3 (moto)", json.dumps(remote[label]), file=sys.stderr, flush=True)
        finally:
            if moto:
                moto.stop()
    for label in layouts:
        if "local" in stores:
            columns[f"{label}, local"] = _median(local[label])
        if moto:
            columns[f"{label}, S3 (moto)"] = remote[label]
    names = list(columns)
    rows = list(dict.fromkeys(r for c in names for r in columns[c]))
    print(f"{args.bars:,} bars x {args.features} features; symbols x bars per symbol; ratio = layout / last layout\n")
    per_layout = len(stores)  # columns are layout by layout, each store in turn
    ratio_names = [f"ratio {n.split(', ', 1)[0]} ({n.split(', ', 1)[1]})" for n in names[:-per_layout]]
    print("| | " + " | ".join(names + ratio_names) + " |")
    print("|---" * (len(names) + len(ratio_names) + 1) + "|")
    for row in rows:
        values = [columns[c].get(row, "-") for c in names]
        ratios = [_ratio(values[j], values[len(names) - per_layout + j % per_layout]) for j in range(len(ratio_names))]
        print(f"| {row} | " + " | ".join(values + ratios) + " |")
    if requests:
        print("\nRequests to the moto S3 server, by kind (PUT: every key class; per: the layout's count):\n")
        print("\n".join(request_table(requests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
