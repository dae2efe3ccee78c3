"""Stores: many symbols against few (``bench.py symbols``) and one cache on S3 against local disk (``bench.py s3``).

Both run a moto S3 server on 127.0.0.1 (``s3_requests.Moto``) and count its requests from its log: deterministic,
where loopback timings are not (on real S3 each request waits a 10-50 ms first byte: the count is what to compare).

``symbols``: the same bars from one Parquet file as each ``--symbols`` layout (ratios to the last), each step a fresh
process: the build (seconds, bars/s, stored objects); import, ``open_cache``, ``import torch`` and the first batch;
an epoch through ``loader(0)`` and ``loader(2)`` (locally also from files dropped from the page cache, on S3 twice
through one ``cache_dir``); ``shardcache info|ls|verify``; on S3 each step's requests by kind, per symbol, shard
and object. ``--rounds R``: medians of R local rounds. ext4 without a journal skips inodes deleted minutes ago
when it makes a new one: run it on a file system left alone for a few minutes, not twice in a row.

``s3``: ``open_cache``, ``Cache.read_rows`` shard by shard, zarr's read of each symbol's whole array (its shards
fetched ``async.concurrency`` at a time), an epoch with 0 and 2 workers; best of ``--repeat``; GETs and HEADs per shard.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench_harness import parser, table
from s3_requests import COLUMNS, ENV, Counts, Moto

__all__ = ["COMMANDS", "STEPS", "request_table", "s3_main", "symbols_main"]

MIB = 1 << 20
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
                  "first batch": t_batch - t_torch}))
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
print(json.dumps({"seconds": time.perf_counter() - t0, "windows": n}))
"""
# the request table's steps, and what each is counted per (symbol, shard or stored object)
STEPS = dict.fromkeys(("build", "open + first batch"), "symbol")
STEPS |= dict.fromkeys(("epoch, loader(0)", "epoch, loader(2)"), "shard")
STEPS |= dict.fromkeys((f"epoch, loader(2), cache_dir, {when}" for when in ("first run", "next run")), "shard")
STEPS |= {"shardcache info": "symbol", "shardcache ls": "symbol", "shardcache verify": "object"}


# -- symbols ---------------------------------------------------------------------------------
def _python(args: list[str], env: dict[str, str]) -> tuple[float, Any]:
    """Wall seconds and the last stdout line as JSON (or None) of a fresh ``python``; a failure stops the run."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], check=False, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    return time.perf_counter() - t0, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None


def _measure(src: str, out: str, options: dict | None, moto: Moto | None) -> tuple[dict, dict, dict]:
    """One column: build, first batch, epochs and the three commands in fresh processes; on S3 the requests of
    each step (``STEPS``) and the symbols, shards and objects they are per."""
    opts, env, counts = json.dumps(options), {**os.environ, **ENV}, {}
    log, bucket = (moto.request_log, out.split("://", 1)[1].split("/", 1)[0]) if moto else (None, None)

    def step(name: str, args: list[str]) -> tuple[float, Any]:
        mark = log.mark() if log else 0
        result = _python(args, env)
        if log:
            counts[name] = log.since(mark, bucket)
        return result

    build = step("build", ["-c", BUILD, src, out, opts])[1]
    if options is None:
        objects = sum(len(files) for _, _, files in os.walk(out))
    else:
        import s3fs

        objects = len(s3fs.S3FileSystem(**options).find(out))
    sizes = {"symbol": build["symbols"], "shard": build["shards"], "object": objects}
    row = {"build (s)": f"{build['seconds']:.2f}", "build (bars/s)": f"{build['bars'] / build['seconds']:,.0f}"}
    row["stored objects"] = f"{objects:,}"
    wall, first = step("open + first batch", ["-c", FIRST_BATCH, out, opts])
    row.update({f"{k} (s)": f"{first[k]:.2f}" for k in ("import", "open", "import torch", "first batch")})
    row["import + open + first batch, process wall (s)"] = f"{wall:.2f}"
    for w in (0, 2):
        epoch = step(f"epoch, loader({w})", ["-c", EPOCH, out, opts, str(w)])[1]
        row[f"epoch, loader({w}) (s)"] = f"{epoch['seconds']:.2f}"
    if options is None and hasattr(os, "posix_fadvise"):
        for folder, _, files in os.walk(out):  # every file out of the page cache: the next epoch reads the disk
            for name in files:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        cold = step("epoch, loader(0), cold", ["-c", EPOCH, out, opts, "0"])[1]
        row["epoch, loader(0), files not in the page cache (s)"] = f"{cold['seconds']:.2f}"
    if moto:
        with tempfile.TemporaryDirectory(prefix="bench-symbols-local-") as folder:
            for when in ("first run", "next run"):
                name = f"epoch, loader(2), cache_dir, {when}"
                row[f"{name} (s)"] = f"{step(name, ['-c', EPOCH, out, opts, '2', folder])[1]['seconds']:.2f}"
    flags = [f"--storage-option={k}={v}" for k, v in (options or {}).items()]
    for command in ("info", "ls", "verify"):
        wall = step(f"shardcache {command}", ["-m", "shardcache.cli", command, out, *flags])[0]
        row[f"shardcache {command} (s)"] = f"{wall:.2f}"
    row.update({f"{name} (requests)": f"{c.total:,}" for name, c in counts.items()})
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


def request_table(requests: dict[str, tuple[dict[str, Counts], dict[str, int]]]) -> str:
    """Every counted step of every layout: total, per symbol/shard/object, by kind (the kinds that occurred)."""
    kinds = [k for k in COLUMNS if any(c.column(k) for counts, _ in requests.values() for c in counts.values())]
    rows = []
    for step, per in STEPS.items():
        for name, (counts, sizes) in requests.items():
            if (c := counts.get(step)) is not None:
                each = [f"{c.total / sizes[u]:.2f}" if u in (per, "symbol") else "" for u in sizes]
                rows.append([step, name, f"{c.total:,}", *each, *(f"{c.column(k):,}" for k in kinds)])
    return table(["step", "layout", "requests", "per symbol", "per shard", "per object", *kinds], rows, left=2)


def symbols_main(argv: list[str]) -> int:
    """Measure every layout in every store and print the table (and the requests on S3)."""
    args = parser(
        *("symbols", __doc__),
        bars=(600_000, "bars of every layout"),
        symbols=("2000,4", "comma-separated symbol counts of the layouts; ratios are to the last"),
        features=(16, "feature columns"),
        stores=("local,s3", "comma-separated: local, s3 (a moto server)"),
        rounds=(1, "local: the layouts measured in turn this many times; medians shown"),
    ).parse_args(argv)
    from shardcache.ingest.sample import make_sample_parquet

    stores = [s for s in ("local", "s3") if s in args.stores.split(",")]
    columns: dict[str, dict[str, str]] = {}
    requests: dict[str, tuple[dict[str, Counts], dict[str, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-symbols-") as work:
        layouts = {}
        for n in (int(x) for x in args.symbols.split(",")):
            names = [f"S{i:05d}" for i in range(n)]
            files = make_sample_parquet(f"{work}/in-{n}", n_bars=args.bars, n_features=args.features, symbols=names)
            layouts[f"{n:,} x {args.bars // n:,}"] = (str(files[0]), n)
        moto = Moto(os.path.join(work, "moto.log")) if "s3" in stores else None
        local: dict[str, list[dict[str, str]]] = {label: [] for label in layouts}
        remote: dict[str, dict[str, str]] = {}
        try:
            for r in range(args.rounds):  # the layouts in turn; every build into a folder of its own
                for label, (src, n) in layouts.items():
                    if "local" in stores:
                        local[label].append(_measure(src, os.path.join(work, f"{n}-{r}.zarr"), None, None)[0])
                        print(f"{label}, local, round {r + 1}", json.dumps(local[label][-1]), file=sys.stderr)
                    if moto and r == 0:  # request counts do not vary: one round
                        import s3fs

                        bucket = f"bench-{n}-{uuid.uuid4().hex[:8]}"
                        s3fs.S3FileSystem(**moto.options).mkdir(bucket)
                        remote[label], counts, sizes = _measure(src, f"s3://{bucket}/c.zarr", moto.options, moto)
                        requests[label] = (counts, sizes)
                        print(f"{label}, S3 (moto)", json.dumps(remote[label]), file=sys.stderr)
        finally:
            if moto:
                moto.stop()
    for label in layouts:
        if "local" in stores:
            columns[f"{label}, local"] = _median(local[label])
        if moto:
            columns[f"{label}, S3 (moto)"] = remote[label]
    names, per = list(columns), len(stores)  # columns are layout by layout, each store in turn
    ratio_names = [f"ratio {n.split(', ', 1)[0]} ({n.split(', ', 1)[1]})" for n in names[:-per]]
    rows = []
    for key in dict.fromkeys(k for c in names for k in columns[c]):
        values = [columns[c].get(key, "-") for c in names]
        ratios = [_ratio(values[j], values[len(names) - per + j % per]) for j in range(len(ratio_names))]
        rows.append([key, *values, *ratios])
    print(f"{args.bars:,} bars x {args.features} features; symbols x bars per symbol; ratio = layout / last layout\n")
    print(table(["", *names, *ratio_names], rows))
    if requests:
        print("\nRequests to the moto S3 server, by kind (PUT: every key class; per: the layout's count):\n")
        print(request_table(requests))
    return 0


# -- s3 --------------------------------------------------------------------------------------
def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The shortest of ``repeat`` timed runs of ``fn`` (the machine is shared) and its last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _s3_column(url: str, options: dict | None, repeat: int, moto: Moto | None) -> dict[str, str]:
    """One column of the table: every measurement for the cache at ``url``, best of ``repeat``."""
    import numpy as np
    import zarr

    from shardcache import WindowStream, open_cache

    bucket, _, key = (url.split("://", 1)[-1] + "/symbols/").partition("/")
    log = moto.request_log if moto else None

    def count() -> int:
        """HEAD and GET requests so far for the cache's symbols."""
        reqs = log.requests() if log else []
        return sum(r.method in ("GET", "HEAD") and r.bucket == bucket and r.key.startswith(key) for r in reqs)

    t_open, cache = _best(lambda: open_cache(url, options), repeat)
    raw, n_reads, row = (
        cache.n_bars * cache.n_features * 4,
        repeat * cache.n_shards,
        {"open (ms)": f"{t_open * 1000:.0f}"},
    )

    def stream(workers: int) -> tuple[float, int]:
        with WindowStream(cache, 60, split="all", batch_size=256) as ds:
            t0, first, n = time.perf_counter(), None, 0
            for x, _y in ds.loader(workers):
                n, first = n + len(x), first if first is not None else time.perf_counter() - t0
            return first or 0.0, n

    per_symbol = f"zarr, one call per symbol, async.concurrency={zarr.config.get('async.concurrency')}"
    reads = {"shard by shard": lambda: [cache.read_rows(a, b) for _, a, b in cache.rows.shard_table.tolist()]}
    reads[per_symbol] = lambda: [np.asarray(cache.array(i, "features")[...]) for i in range(len(cache.symbols))]
    for name, fn in reads.items():
        c0 = count()
        row[f"{name} (MiB/s)"] = f"{raw / MIB / _best(fn, repeat)[0]:.0f}"
        if moto:
            row[f"{name}: requests per shard"] = f"{(count() - c0) / n_reads:.1f}"
    for w in (0, 2):
        c0 = count()
        secs, (first, n) = _best(lambda w=w: stream(w), repeat)
        row[f"stream, {w} workers (windows/s)"] = f"{n / secs:,.0f}"
        row[f"stream, {w} workers: first batch (ms)"] = f"{first * 1000:.0f}"
        if moto:
            row[f"stream, {w} workers: requests per shard"] = f"{(count() - c0) / n_reads:.1f}"
    return row


def s3_main(argv: list[str]) -> int:
    """Build or take a cache, copy it to a loopback S3 server, and print both columns."""
    args = parser(
        *("s3", __doc__),
        cache=(None, "a local cache (default: build the generated sample)"),
        days=(360, "days of the generated sample"),
        repeat=(3, "runs of each measurement; the best is shown"),
    ).parse_args(argv)
    import s3fs

    from shardcache import build_cache, open_cache
    from shardcache.ingest.sample import make_sample

    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        local = args.cache or os.path.join(tmp, "c.zarr")
        if args.cache is None:
            build_cache(make_sample(os.path.join(tmp, "dbn"), days=args.days), local, progress=False)
        moto = Moto(os.path.join(tmp, "moto.log"))
        try:
            fs = s3fs.S3FileSystem(**moto.options)
            fs.mkdir("bench")
            fs.put(local.rstrip("/") + "/", "bench/c.zarr/", recursive=True)
            cols = {"local disk": _s3_column(local, None, args.repeat, None)}
            cols["S3 (moto, loopback)"] = _s3_column("s3://bench/c.zarr", moto.options, args.repeat, moto)
        finally:
            moto.stop()
        cache = open_cache(local)
        print(f"{cache.n_bars:,} bars, {cache.n_shards} shards; seq_len 60, batch 256; best of {args.repeat}\n")
    rows = [[key, *(cols[n].get(key, "-") for n in cols)] for key in cols["S3 (moto, loopback)"]]
    print(table(["measurement", *cols], rows))
    return 0


COMMANDS = {"symbols": symbols_main, "s3": s3_main}
