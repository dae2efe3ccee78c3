"""What zarr, fsspec, obstore and icechunk cost per request on a moto S3 server: the measurements
behind issue 21's choices (docs/notes/scale-notes.md), each a section of its own:

* ``zarr``: requests to open a group for writing, create a group and the arrays of one symbol as
  format 3's ``CacheWriter`` did through zarr, write a whole shard, a partial last shard, part of an
  existing shard, rewrite attributes and open an array, through s3fs (``FsspecStore``) and obstore
  (``ObjectStore``);
* ``reads``: one shard read as ``ShardDecoder`` reads it (the whole object; the index and a byte range)
  through s3fs (default, and ``max_concurrency=1``) and obstore: requests and milliseconds per shard;
* ``chained``: ``filecache::``, ``simplecache::`` and ``blockcache::`` URLs through ``open_cache``:
  what fails, and what a second pass over the shards fetches again;
* ``consolidated``: zarr's ``consolidate_metadata`` on a many-symbol cache: its size, its cost, and the
  requests of ``xr.open_zarr(group=...)`` and ``xr.open_datatree`` with and without it;
* ``icechunk``: the same symbols written through an icechunk repository on the server and committed;
  what opening and reading cost, and whether plain zarr reads the repository.

Requests come from the server's log (``s3_requests``); times on loopback are indicative only.
obstore and icechunk are not shardcache dependencies: their columns and section need them installed.

Usage::

    python tools/probe_s3.py [zarr reads chained consolidated icechunk] [--symbols 100] [--features 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from bench_s3 import ENV, Moto
from s3_requests import Counts, RequestLog
from zarr.core.buffer import default_buffer_prototype

from shardcache.format.decode import ShardDecoder
from shardcache.format.layout import compressors, default_chunking

SECTIONS = ("zarr", "reads", "chained", "consolidated", "icechunk")


class Probe:
    """A moto server, its request log and one bucket per section."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.moto = Moto(os.path.join(work, "moto.log"))
        self.log: RequestLog = self.moto.request_log  # type: ignore[assignment]
        import s3fs

        self.fs = s3fs.S3FileSystem(**self.moto.options, skip_instance_cache=True)

    def bucket(self, name: str) -> str:
        self.fs.mkdir(name)
        return name

    def count(self, fn: Callable[[], Any], bucket: str) -> tuple[Counts, float, Any]:
        """Requests to ``bucket`` and seconds of one call of ``fn``, and its result."""
        mark = self.log.mark()
        t0 = time.perf_counter()
        out = fn()
        return self.log.since(mark, bucket), time.perf_counter() - t0, out

    def s3fs_store(self, bucket: str, prefix: str, **options: Any) -> zarr.storage.FsspecStore:
        opts = {**self.moto.options, "skip_instance_cache": True, **options}
        return zarr.storage.FsspecStore.from_url(f"s3://{bucket}/{prefix}", storage_options=opts)

    def obstore_store(self, bucket: str, prefix: str) -> zarr.storage.ObjectStore:
        from obstore.store import S3Store

        s3 = S3Store(
            bucket,
            prefix=prefix,
            endpoint=self.moto.url,
            access_key_id=ENV["AWS_ACCESS_KEY_ID"],
            secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"],
            region=ENV["AWS_DEFAULT_REGION"],
            client_options={"allow_http": True},
        )
        return zarr.storage.ObjectStore(s3)

    def stop(self) -> None:
        self.moto.stop()


def _has(module: str) -> bool:
    """Whether an optional library (obstore, icechunk: not shardcache dependencies) is installed."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _table(headers: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(headers) + " |")
    print("|---" + "|---:" * (len(headers) - 1) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def _symbol_arrays(group: zarr.Group, n: int, f: int, shard_rows: int, chunk_rows: int) -> zarr.Array:
    """The arrays format 3's ``CacheWriter`` created for a symbol (``features``, ``time``, ``feature``); ``features``."""
    feats = group.create_array(
        "features",
        shape=(n, f),
        dtype="float32",
        chunks=(chunk_rows, f),
        shards=(shard_rows, f),
        compressors=compressors("blosc-lz4"),
        fill_value=np.nan,
        dimension_names=("time", "feature"),
    )
    group.create_array("time", shape=(n,), dtype="int64", chunks=(shard_rows,), compressors=compressors("zstd"))
    names = group.create_array("feature", shape=(f,), dtype=str, chunks=(f,))
    names[...] = np.asarray([f"f{i}" for i in range(f)])
    return feats


def section_zarr(p: Probe, args: argparse.Namespace) -> None:
    """Requests of zarr's primitives: what a build pays per symbol before its bytes."""
    f, shard_rows, chunk_rows = args.features, 512, 64
    data = np.random.default_rng(0).standard_normal((2 * shard_rows, f)).astype(np.float32)
    stores = {"s3fs (FsspecStore)": p.s3fs_store}
    if _has("obstore"):
        stores["obstore (ObjectStore)"] = p.obstore_store
    results: dict[str, dict[str, Counts]] = {}
    for name, make in stores.items():
        bucket = p.bucket(f"zarr-{len(results)}")
        store = make(bucket, "c.zarr")
        res: dict[str, Counts] = {}
        res["open_group(mode='w') of the root"], _, root = p.count(
            lambda s=store: zarr.open_group(s, mode="w", zarr_format=3), bucket
        )
        res["root.attrs[...] = manifest"], _, _ = p.count(lambda r=root: r.attrs.update({"m": 1}), bucket)
        res["require_group('symbols')"], _, syms = p.count(lambda r=root: r.require_group("symbols"), bucket)
        res["require_group('0') (a symbol's group)"], _, g = p.count(lambda s=syms: s.require_group("0"), bucket)
        res["a symbol's 3 arrays (features, time, feature + its names)"], _, feats = p.count(
            lambda g=g: _symbol_arrays(g, 2 * shard_rows - 100, f, shard_rows, chunk_rows), bucket
        )
        res["write a whole shard (new)"], _, _ = p.count(
            lambda a=feats: a.__setitem__(slice(0, shard_rows), data[:shard_rows]), bucket
        )
        res["write the partial last shard (new)"], _, _ = p.count(
            lambda a=feats: a.__setitem__(slice(shard_rows, None), data[shard_rows:-100]), bucket
        )
        res["rewrite a whole shard (existing)"], _, _ = p.count(
            lambda a=feats: a.__setitem__(slice(0, shard_rows), data[:shard_rows]), bucket
        )
        res["write 10 rows into an existing shard"], _, _ = p.count(
            lambda a=feats: a.__setitem__(slice(shard_rows, shard_rows + 10), data[:10]), bucket
        )
        res["update_attributes (digests)"], _, _ = p.count(
            lambda a=feats: a.update_attributes({"digests": ["x", "y"]}), bucket
        )
        res["open_array (read its zarr.json)"], _, _ = p.count(
            lambda s=store: zarr.open_array(s, path="symbols/0/features", mode="r"), bucket
        )
        res["open_group(mode='r') of the root, list its members"], _, _ = p.count(
            lambda s=store: list(zarr.open_group(s, mode="r").members(max_depth=None)), bucket
        )
        results[name] = res
    print("### zarr primitives: requests (one symbol, as format 3's CacheWriter wrote it)\n")
    names = list(results)
    _table(
        ["operation", *names],
        [[op] + [results[n][op].summary() for n in names] for op in results[names[0]]],
    )


def _shards(p: Probe, bucket: str, n: int, rows: int, f: int) -> tuple[str, list[str], int]:
    """``n`` one-shard arrays of ``rows`` x ``f`` (shards and chunks as a build chooses them) under
    ``bucket/r.zarr``: their path prefix, keys, bytes each."""
    store = p.s3fs_store(bucket, "r.zarr")
    root = zarr.open_group(store, mode="w", zarr_format=3)
    data = np.random.default_rng(1).standard_normal((rows, f)).astype(np.float32)
    keys = []
    for i in range(n):
        g = root.require_group(str(i))
        arr = _symbol_arrays(g, rows, f, *default_chunking(f))
        arr[...] = data
        keys.append(f"{i}/features")
    size = p.fs.size(f"{bucket}/r.zarr/0/features/c/0/0")
    return "r.zarr", keys, size


def section_reads(p: Probe, args: argparse.Namespace) -> None:
    """A shard read as the stream reads it, through three clients: requests and ms per shard."""
    bucket = p.bucket("reads")
    n, rows = args.shards, args.shard_rows
    _, paths, size = _shards(p, bucket, n, rows, args.features)
    clients = {
        "s3fs (default)": lambda: p.s3fs_store(bucket, "r.zarr"),
        "s3fs max_concurrency=1": lambda: p.s3fs_store(bucket, "r.zarr", max_concurrency=1),
    }
    if _has("obstore"):
        clients["obstore"] = lambda: p.obstore_store(bucket, "r.zarr")
    rows_out = []
    for name, make in clients.items():
        store = make()
        decoders = {}

        def open_all(store: Any = store, decoders: dict = decoders) -> None:
            for path in paths:
                decoders[path] = ShardDecoder.open(store, path)

        c_open, t_open, _ = p.count(open_all, bucket)
        whole = lambda d=decoders: [x.read(0, rows) for x in d.values()]
        part = lambda d=decoders: [x.read(0, 10) for x in d.values()]
        c_whole, t_whole, _ = p.count(whole, bucket)
        t_whole = min(t_whole, p.count(whole, bucket)[1])
        c_part, t_part, _ = p.count(part, bucket)

        async def many(store: Any = store) -> None:  # zarr's concurrent path: every shard at once
            proto = default_buffer_prototype()
            await asyncio.gather(*(store.get(f"{k}/c/0/0", prototype=proto) for k in paths))

        from zarr.core.sync import sync

        c_conc, t_conc, _ = p.count(lambda: sync(many()), bucket)
        rows_out.append(
            [
                name,
                f"{c_open.total / n:.1f}",
                f"{c_whole.total / n:.1f} ({c_whole.summary()})",
                f"{1000 * t_whole / n:.2f}",
                f"{c_part.total / n:.1f}",
                f"{1000 * t_part / n:.2f}",
                f"{c_conc.total / n:.1f}",
                f"{1000 * t_conc / n:.2f}",
                f"{1000 * t_open / n:.2f}",
            ]
        )
    print(
        f"### one shard read as ShardDecoder reads it ({n} shards of {rows} x {args.features}, {size:,} bytes each)\n"
    )
    _table(
        [
            "client",
            "zarr.json: requests/symbol",
            "all rows of each shard: requests/shard",
            "ms/shard",
            "10 rows (index + range): requests",
            "ms/shard",
            "all shards at once (asyncio.gather): requests/shard",
            "ms/shard",
            "decoder open: ms/symbol",
        ],
        rows_out,
    )


def _local_cache(work: str, symbols: int, bars: int, features: int, **kw: Any) -> str:
    from shardcache.ingest.builder import build_cache
    from shardcache.ingest.sample import make_sample_parquet

    names = [f"S{i:05d}" for i in range(symbols)]
    files = make_sample_parquet(os.path.join(work, f"in-{symbols}"), n_bars=bars, n_features=features, symbols=names)
    out = os.path.join(work, f"c-{symbols}.zarr")
    build_cache(str(files[0]), out, progress=False, **kw)
    return out


def _fix_whole_file_cat() -> None:
    """fsspec's ``WholeFileCacheFileSystem._cat_file`` with a negative ``start`` read as an offset from
    the end (what ``cat_file`` documents and s3fs does), the one change simplecache needs here."""
    from fsspec.implementations.cached import WholeFileCacheFileSystem

    async def _cat_file(self: Any, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
        path = self._strip_protocol(path)
        fn = self._check_file(path)
        fn = fn[1] if isinstance(fn, tuple) else fn  # filecache answers (detail, path)
        if not fn:
            fn = os.path.join(self.storage[-1], self._mapper(path))
            await self.fs._get_file(path, fn, **kw)
        with open(fn, "rb") as f:  # noqa: ASYNC230 - as fsspec itself does
            size = os.fstat(f.fileno()).st_size
            lo = 0 if start is None else (max(size + start, 0) if start < 0 else start)
            hi = size if end is None else (size + end if end < 0 else min(end, size))
            f.seek(lo)
            return f.read(max(hi - lo, 0))

    WholeFileCacheFileSystem._cat_file = _cat_file


def section_chained(p: Probe, args: argparse.Namespace) -> None:
    """fsspec's caching URLs through ``open_cache`` and ``read_rows``, on a 3-symbol cache."""
    from shardcache.format.cache import open_cache

    local = _local_cache(p.work, 3, 3000, 4, shard_rows=512, chunk_rows=64)
    bucket = p.bucket("chained")
    p.fs.put(local + "/", f"{bucket}/c.zarr/", recursive=True)
    ref = open_cache(local)
    rows = []
    for proto in ("s3", "filecache", "simplecache", "blockcache", "simplecache+fix"):
        cache_dir = os.path.join(p.work, f"cache-{proto}")
        fixed = proto.endswith("+fix")
        proto = proto.removesuffix("+fix")
        if fixed:
            _fix_whole_file_cat()
        if proto == "s3":
            url, options = f"s3://{bucket}/c.zarr", p.moto.options
        else:
            url, options = f"{proto}::s3://{bucket}/c.zarr", {"s3": p.moto.options, proto: {"cache_storage": cache_dir}}
        steps: list[str] = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                c_open, _, cache = p.count(lambda u=url, o=options: open_cache(u, o), bucket)
            steps.append(c_open.summary() + (" + a warning: not created with asynchronous=True" if caught else ""))
            table = cache.rows.shard_table.tolist()
            for label, width in (("whole", None), ("10 rows", 10)):
                for _ in range(2):

                    def read(c: Any = cache, w: int | None = width, t: list = table) -> None:
                        for _, a, b in t:
                            stop = b if w is None else a + w
                            np.testing.assert_array_equal(c.read_rows(a, stop), ref.read_rows(a, stop))

                    steps.append(p.count(read, bucket)[0].summary())
        except Exception as exc:  # noqa: BLE001 - what a user meets: the error and where it is raised
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} `{frame.line}`"
            steps.append(f"**{type(exc).__name__}: {str(exc)[:60]}** at {where}")
        files = sum(len(f) for _, _, f in os.walk(cache_dir)) if os.path.isdir(cache_dir) else 0
        label = (
            url.split("/")[0]
            + "//"
            + (" with `_cat_file` fixed (a negative start seeks from the end)" if fixed else "")
        )
        rows.append([label, *steps, *[""] * (5 - len(steps)), str(files)])
    print(f"### fsspec caching URLs through open_cache ({ref.n_shards} shards, 3 symbols)\n")
    _table(
        [
            "URL",
            "open",
            "whole shards, pass 1",
            "pass 2",
            "10 rows of each shard, pass 1",
            "pass 2",
            "files in cache_storage",
        ],
        rows,
    )


def section_consolidated(p: Probe, args: argparse.Namespace) -> None:
    """zarr's consolidated metadata on a cache of ``--symbols`` symbols, on S3 and on local disk."""
    import xarray as xr

    n = args.symbols
    local = _local_cache(p.work, n, n * args.bars_per_symbol, args.features)
    bucket = p.bucket("consolidated")
    p.fs.put(local + "/", f"{bucket}/c.zarr/", recursive=True)
    url, so = f"s3://{bucket}/c.zarr", {**p.moto.options, "skip_instance_cache": True}
    group = f"symbols/{n // 2}"
    rows = []

    def reads(label: str, consolidated: bool | None) -> None:
        kw = {"consolidated": consolidated, "storage_options": so}
        c1, t1, _ = p.count(lambda: xr.open_zarr(url, group=group, **kw).close(), bucket)
        c2, t2, _ = p.count(lambda: xr.open_datatree(url, engine="zarr", **kw).close(), bucket)
        t0 = time.perf_counter()
        xr.open_zarr(local, group=group, consolidated=consolidated).close()
        t3 = time.perf_counter() - t0
        t0 = time.perf_counter()
        xr.open_datatree(local, engine="zarr", consolidated=consolidated).close()
        t4 = time.perf_counter() - t0
        rows.append([label, c1.summary(), f"{t1:.2f}", c2.summary(), f"{t2:.1f}", f"{t3:.2f}", f"{t4:.1f}"])

    reads("no consolidated metadata (consolidated=False)", False)
    c_cons, t_cons, _ = p.count(lambda: zarr.consolidate_metadata(p.s3fs_store(bucket, "c.zarr")), bucket)
    t0 = time.perf_counter()
    zarr.consolidate_metadata(local)
    t_local = time.perf_counter() - t0
    size = os.path.getsize(os.path.join(local, "zarr.json"))
    reads("after zarr.consolidate_metadata, consolidated=None (the default)", None)
    reads("after zarr.consolidate_metadata, consolidated=True", True)
    from shardcache.format.cache import open_cache

    c_open, _, _ = p.count(lambda: open_cache(url, p.moto.options), bucket)
    print(
        f"### zarr consolidated metadata, {n:,} symbols x {args.bars_per_symbol} bars, F={args.features}\n\n"
        f"`zarr.consolidate_metadata`: on S3 {c_cons.summary()} requests, {t_cons:.1f} s; on local disk "
        f"{t_local:.2f} s; the root zarr.json grows to {size:,} bytes ({size / n:,.0f} a symbol); "
        f"`open_cache` afterwards: {c_open.summary()} requests.\n"
    )
    _table(
        [
            "metadata",
            f"xr.open_zarr(group='{group}') on S3: requests",
            "s",
            "xr.open_datatree on S3: requests",
            "s",
            "open_zarr(group) local (s)",
            "open_datatree local (s)",
        ],
        rows,
    )


def section_icechunk(p: Probe, args: argparse.Namespace) -> None:
    """The symbols of a cache written through an icechunk repository on the server, and read back."""
    if not _has("icechunk"):
        print("### icechunk: not installed (`pip install icechunk`)\n")
        return
    import icechunk

    n, f, rows = args.symbols, args.features, args.bars_per_symbol
    bucket = p.bucket("icechunk")
    storage = icechunk.s3_storage(
        bucket=bucket,
        prefix="repo",
        endpoint_url=p.moto.url,
        allow_http=True,
        access_key_id=ENV["AWS_ACCESS_KEY_ID"],
        secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"],
        region=ENV["AWS_DEFAULT_REGION"],
        force_path_style=True,
    )
    data = np.random.default_rng(2).standard_normal((rows, f)).astype(np.float32)
    out = []
    c, t, repo = p.count(lambda: icechunk.Repository.create(storage), bucket)
    out.append(["Repository.create", c.summary(), f"{t:.2f}"])
    session = repo.writable_session("main")

    def write() -> None:
        root = zarr.open_group(session.store, mode="w", zarr_format=3)
        root.attrs["shardcache"] = {"symbols": n}
        syms = root.require_group("symbols")
        for i in range(n):
            arr = _symbol_arrays(syms.require_group(str(i)), rows, f, 512, 64)
            arr[...] = data

    c, t, _ = p.count(write, bucket)
    out.append([f"write {n} symbols (groups, 3 arrays each, their shards)", c.summary(), f"{t:.2f}"])
    c, t, _ = p.count(lambda: session.commit("build"), bucket)
    out.append(["commit", c.summary(), f"{t:.2f}"])
    c, t, reader = p.count(lambda: icechunk.Repository.open(storage).readonly_session("main"), bucket)
    out.append(["Repository.open + readonly_session", c.summary(), f"{t:.2f}"])

    def open_all() -> list[Any]:
        root = zarr.open_group(reader.store, mode="r")
        return [root[f"symbols/{i}/features"] for i in range(n)]

    c, t, arrays = p.count(open_all, bucket)
    out.append([f"open the root and {n} features arrays", c.summary(), f"{t:.2f}"])
    c, t, _ = p.count(lambda: [np.asarray(a[...]) for a in arrays], bucket)
    out.append([f"read every shard ({n})", c.summary(), f"{t:.2f}"])
    session = repo.writable_session("main")

    def append() -> None:
        root = zarr.open_group(session.store, mode="r+")
        arr = root["symbols/0/features"]
        arr.resize((rows + 10, f))
        arr[rows:] = data[:10]
        session.commit("append")

    c, t, _ = p.count(append, bucket)
    out.append(["append 10 rows to one symbol + commit", c.summary(), f"{t:.2f}"])
    try:
        zarr.open_group(f"s3://{bucket}/repo", mode="r", storage_options=p.moto.options)
        plain = "opens"
    except Exception as exc:  # noqa: BLE001 - whichever error a plain zarr user meets
        plain = f"{type(exc).__name__}: {str(exc)[:80]}"
    objects = p.fs.find(f"{bucket}/repo")
    print(f"### icechunk {icechunk.__version__}: {n} symbols x {rows} bars, F={f}, on the moto server\n")
    _table(["step", "requests", "s"], out)
    print(
        f"The repository holds {len(objects)} objects; plain `zarr.open_group('s3://{bucket}/repo')` "
        f"without icechunk: {plain}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", default=list(SECTIONS), help=f"any of {', '.join(SECTIONS)} (all)")
    parser.add_argument("--symbols", type=int, default=100, help="symbols of the consolidated and icechunk caches")
    parser.add_argument("--bars-per-symbol", type=int, default=300)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--shards", type=int, default=50, help="shards the reads section reads")
    parser.add_argument("--shard-rows", type=int, default=300)
    args = parser.parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    os.environ.update(ENV)
    with tempfile.TemporaryDirectory(prefix="probe-s3-") as work:
        p = Probe(work)
        try:
            for name in args.sections:
                globals()[f"section_{name}"](p, args)
                sys.stdout.flush()
        finally:
            p.stop()
    print(json.dumps({"zarr": zarr.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
