"""xarray at many symbols: the whole tree against a chosen few, on one local cache.

Builds (or takes ``--cache``) a cache of ``--symbols`` x ``--bars-per-symbol`` bars, then times, each once in
this process: plain ``xr.open_datatree(CACHE, engine="zarr")``, ``shardcache.to_xarray`` (the same tree with
the manifest's labels), ``--pick`` symbols opened one by one with ``open_symbol``, and the same symbols with
``open_symbols`` (the cache and its store opened once). The last two also load each picked symbol's
``features`` (a mean), so the tree is compared with what a user of a few symbols does with them.

Usage::

    python tools/bench_xarray.py [--symbols 2000] [--bars-per-symbol 300] [--features 16] [--pick 50] [--cache PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", type=int, default=2000)
    parser.add_argument("--bars-per-symbol", type=int, default=300)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--pick", type=int, default=50, help="symbols a user wants, spread over the cache")
    parser.add_argument("--cache", help="an existing cache to use instead of building one")
    args = parser.parse_args(argv)

    import xarray as xr

    from shardcache import open_cache, open_symbol, open_symbols, to_xarray

    with tempfile.TemporaryDirectory(prefix="bench-xarray-") as work:
        path = args.cache
        build_s = None
        if path is None:
            from shardcache.ingest.builder import build_cache
            from shardcache.ingest.sample import make_sample_parquet

            names = [f"S{i:05d}" for i in range(args.symbols)]
            files = make_sample_parquet(
                os.path.join(work, "in"),
                n_bars=args.symbols * args.bars_per_symbol,
                n_features=args.features,
                symbols=names,
            )
            path = os.path.join(work, "c.zarr")
            build_s, _ = _timed(lambda: build_cache(str(files[0]), path, progress=False))
        cache = open_cache(path)
        n = len(cache.symbols)
        pick = [cache.symbols[i] for i in range(0, n, max(1, n // args.pick))][: args.pick]
        rows: list[tuple[str, float]] = []
        t, tree = _timed(lambda: xr.open_datatree(path, engine="zarr", consolidated=False))
        rows.append((f"xr.open_datatree, {n:,} symbols", t))
        tree.close()
        t, tree = _timed(lambda: to_xarray(cache))
        rows.append((f"shardcache.to_xarray, {n:,} symbols", t))
        tree.close()
        t, _ = _timed(lambda: [float(open_symbol(cache, s).features.mean()) for s in pick])
        rows.append((f"open_symbol one by one + a mean each, {len(pick)} symbols", t))
        t, _ = _timed(lambda: [float(ds.features.mean()) for ds in open_symbols(cache, pick).values()])
        rows.append((f"open_symbols + a mean each, {len(pick)} symbols", t))
        t, _ = _timed(lambda: open_symbols(cache, pick[:5]))
        rows.append(("open_symbols, 5 symbols", t))
    print(f"{n:,} symbols x {args.bars_per_symbol} bars x {args.features} features (local disk)\n")
    print("| step | s |\n|---|---:|")
    if build_s is not None:
        print(f"| build | {build_s:.1f} |")
    for name, t in rows:
        print(f"| {name} | {t:.2f} |")
    print(json.dumps({"xarray": xr.__version__}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
