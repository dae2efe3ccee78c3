"""Read and stream throughput of one cache from S3 (a moto server on loopback) vs local disk.

Starts ``python -m moto.server`` on a free 127.0.0.1 port (fake credentials; nothing leaves
the machine), uploads the cache with s3fs and measures, for the local copy and the S3 copy:

* **open**: ``open_cache`` (manifest and segment table);
* **shard by shard**: ``Cache.read_rows`` of each shard in turn (shardcache's own decoder), as a
  stream decodes its blocks when ``prefetch=0``;
* **zarr, one call per symbol**: ``symbols/<i>/features[...]``, each symbol's whole array, where
  zarr fetches the shards concurrently, up to ``zarr.config["async.concurrency"]`` (default 10)
  at a time;
* **stream**: one epoch of ``WindowStream`` (``--seq-len``, ``--batch-size``) with 0 and 2
  DataLoader workers (each worker has its own reader thread), in windows/s.

HEAD and GET requests are counted from the moto server's log (``s3_requests``): a whole shard costs
one GET through ``read_rows``, and s3fs sends a HEAD before it (it sizes every unranged read);
a part of one, or a shard with most of its inner chunks beyond its symbol's last row, costs its
index and then one byte range. Loopback has no network latency, so
the S3 column measures the request path (s3fs, aiohttp, moto's Python server sharing the
CPUs) rather than a real network: on real S3, first-byte latency (10-50 ms per GET) adds to
each sequential block read. Prints a markdown table.

Usage::

    python tools/bench_s3.py [--cache PATH] [--days 360] [--seq-len 60] [--batch-size 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from s3_requests import RequestLog

from shardcache.format.cache import Cache, open_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.read.stream import WindowStream

MIB = 1 << 20
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """``python -m moto.server`` on a free loopback port, in a subprocess; its request log in the file
    ``log``, read by ``request_log`` (``s3_requests.RequestLog``; None: discarded)."""

    def __init__(self, log: str | None = None) -> None:
        self.port = _free_port()
        self.log = log
        self.request_log = None if log is None else RequestLog(log)
        with contextlib.ExitStack() as files:
            err = subprocess.DEVNULL if log is None else files.enter_context(open(log, "w"))
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **ENV},
            )  # the server writes to its own copy of the file
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, str]:
        """s3fs storage options for this server."""
        return {"endpoint_url": self.url, "key": ENV["AWS_ACCESS_KEY_ID"], "secret": ENV["AWS_SECRET_ACCESS_KEY"]}

    def requests(self, prefix: str) -> int:
        """HEAD and GET requests so far for keys under ``prefix`` (``bucket/key...``)."""
        if self.request_log is None:
            raise ValueError("this server's log is discarded (Moto(log=None))")
        bucket, _, key = prefix.partition("/")
        return sum(
            r.method in ("GET", "HEAD") and r.bucket == bucket and r.key.startswith(key)
            for r in self.request_log.requests()
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The shortest of ``repeat`` timed runs of ``fn`` (the machine is shared) and its last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _stream(cache: Cache, workers: int, seq_len: int, batch_size: int) -> tuple[float, int]:
    """Seconds to the first batch of one epoch, and its windows."""
    with WindowStream(cache, seq_len, split="all", batch_size=batch_size) as ds:
        t0 = time.perf_counter()
        first, n = None, 0
        for x, _y in ds.loader(workers):
            n += len(x)
            first = first if first is not None else time.perf_counter() - t0
        return first or 0.0, n


def measure(url: str, options: dict | None, args: argparse.Namespace, moto: Moto | None) -> dict[str, str]:
    """One column of the table: every measurement for the cache at ``url``, best of ``--repeat``."""
    prefix = url.split("://", 1)[-1] + "/symbols/"
    count = (lambda: moto.requests(prefix)) if moto else (lambda: 0)
    t_open, cache = _best(lambda: open_cache(url, options), args.repeat)
    raw, n_reads = cache.n_bars * cache.n_features * 4, args.repeat * cache.n_shards
    row = {"open (ms)": f"{t_open * 1000:.0f}"}
    reads = {
        "shard by shard": lambda: [cache.read_rows(a, b) for _, a, b in cache.rows.shard_table.tolist()],
        f"zarr, one call per symbol, async.concurrency={zarr.config.get('async.concurrency')}": lambda: [
            np.asarray(cache.array(i, "features")[...]) for i in range(len(cache.symbols))
        ],
    }
    for name, fn in reads.items():
        c0 = count()
        secs, _ = _best(fn, args.repeat)
        row[f"{name} (MiB/s)"] = f"{raw / MIB / secs:.0f}"
        if moto:
            row[f"{name}: requests per shard"] = f"{(count() - c0) / n_reads:.1f}"
    for workers in (0, 2):
        c0 = count()
        secs, (first, n) = _best(lambda w=workers: _stream(cache, w, args.seq_len, args.batch_size), args.repeat)
        row[f"stream, {workers} workers (windows/s)"] = f"{n / secs:,.0f}"
        row[f"stream, {workers} workers: first batch (ms)"] = f"{first * 1000:.0f}"
        if moto:
            row[f"stream, {workers} workers: requests per shard"] = f"{(count() - c0) / n_reads:.1f}"
    return row


def main(argv: list[str] | None = None) -> int:
    """Build or take a cache, copy it to a loopback S3 server, and print both columns."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=None, help="a local cache (default: build the generated sample)")
    p.add_argument("--days", type=int, default=360)
    p.add_argument("--seq-len", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best is shown")
    args = p.parse_args(argv)
    import s3fs

    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        local = args.cache
        if local is None:
            local = os.path.join(tmp, "c.zarr")
            build_cache(make_sample(os.path.join(tmp, "dbn"), days=args.days), local, progress=False)
        moto = Moto(os.path.join(tmp, "moto.log"))
        try:
            options = moto.options
            fs = s3fs.S3FileSystem(**options)
            fs.mkdir("bench")
            fs.put(local.rstrip("/") + "/", "bench/c.zarr/", recursive=True)
            cols = {
                "local disk": measure(local, None, args, None),
                "S3 (moto, loopback)": measure("s3://bench/c.zarr", options, args, moto),
            }
        finally:
            moto.stop()
    cache = open_cache(args.cache) if args.cache else None
    what = f"{cache.n_bars:,} bars, {cache.n_shards} shards" if cache else f"{args.days}-day sample"
    print(f"{what}; seq_len {args.seq_len}, batch {args.batch_size}; best of {args.repeat}\n")
    names = list(cols)
    print("| measurement | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key in cols[names[-1]]:
        print(f"| {key} | " + " | ".join(cols[n].get(key, "-") for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
