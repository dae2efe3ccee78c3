"""Shared test helpers, one package (test files never import each other). What lives where:

* this module: small format-4 caches written straight from numpy arrays with the real ``CacheWriter``
  (``synthetic_bars``, ``make_cache``), ``stored_rows`` read back with plain zarr, the ``brute_starts``
  oracle, the DDP rank ``ddp_rank`` and ``run_helper`` (``python -m helpers COMMAND``, see ``__main__``);
* ``helpers.stream``: window rows from a batch's metadata, a DDP rank given a stream made before init;
* ``helpers.parquet``: bars per symbol written to one Parquet file and built with raw features;
* ``helpers.inputs``: hand-made DBN files (symbol mappings, schemas) and their bars;
* ``helpers.cli``: the CLI run in this process (``cli``) or in a new one (``run_cli``);
* ``helpers.kills``: a function run in a forked child that SIGKILLs itself at a chosen call.
* ``helpers.faults``: ``FaultProxy``, a loopback HTTP proxy in front of moto that sends planned faults.

``synthetic_bars`` makes bars with several symbols, gaps and train/val/test splits whose
feature 0 is the row number (exact in float32 below 2**24), so a window's content names
its rows. Given ``shard_rows`` it lays the rows out as the cache's virtual row space does
(each symbol from a whole shard on, ``layout.symbol_bases``), so stream indices, the oracle
and ``Bars.features`` rows agree. ``brute_starts`` is an independent, loop-based oracle of
the valid windows.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass

import numpy as np

from shardcache.format.cache import Cache
from shardcache.format.index import ShardIndex
from shardcache.format.layout import symbol_bases
from shardcache.format.manifest import Counts, Manifest, Splits
from shardcache.format.writer import CacheWriter

__all__ = ["Bars", "brute_starts", "ddp_rank", "make_cache", "run_helper", "stored_rows", "synthetic_bars"]

SPLITS = ["train", "val", "test"]


@dataclass
class Bars:
    """Arrays for one cache: rows grouped by symbol in time order, and their segment table.

    With ``shard_rows`` the rows are virtual (padding rows between symbols, in no segment,
    hold NaN and time 0); without, symbols are packed one after another.
    """

    features: np.ndarray
    ts: np.ndarray
    segments: np.ndarray
    segment_split: np.ndarray
    split_names: list[str]
    symbols: list[str]
    shard_rows: int | None = None


def synthetic_bars(
    n_bars: int,
    n_features: int,
    n_symbols: int = 3,
    *,
    gaps: int = 6,
    short: int = 3,
    seed: int = 0,
    compressible: bool = False,
    shard_rows: int | None = None,
) -> Bars:
    """Bars of ``n_symbols`` symbols with ``gaps`` random gaps and ``short`` tiny segments each.

    Each symbol's bars are cut into train/val/test at 70 % and 85 % of its time range, so
    segments end at symbol, gap and split boundaries. ``compressible`` makes columns other
    than the row number smooth (cheap to write for the large memory test).
    """
    rng = np.random.default_rng(seed)
    feats = np.empty((n_bars, n_features), dtype=np.float32)
    feats[:, 0] = np.arange(n_bars, dtype=np.float32)
    if n_features > 1:
        if compressible:
            feats[:, 1:] = (np.arange(n_bars)[:, None] % 97).astype(np.float32) + np.arange(1, n_features)
        else:
            feats[:, 1:] = rng.standard_normal((n_bars, n_features - 1), dtype=np.float32)
    cuts = np.sort(rng.choice(np.arange(1, n_bars), n_symbols - 1, replace=False)) if n_symbols > 1 else []
    bounds = np.concatenate([[0], cuts, [n_bars]]).astype(np.int64)
    ts = np.empty(n_bars, dtype=np.int64)
    segments, segment_split = [], []
    for sym in range(n_symbols):
        a, b = int(bounds[sym]), int(bounds[sym + 1])
        n = b - a
        step = np.full(n, 60_000_000_000, dtype=np.int64)
        breaks = set()
        if n > 2:
            breaks.update(int(x) for x in rng.integers(1, n, gaps))
            for _ in range(short):  # a segment of a few bars: too short for most windows
                p = int(rng.integers(1, max(2, n - 5)))
                breaks.update([p, min(n - 1, p + int(rng.integers(1, 5)))])
        for p in breaks:
            step[p] = 3_600_000_000_000
        ts[a:b] = 1_600_000_000_000_000_000 + np.cumsum(step)
        t0, t1 = int(ts[a]), int(ts[b - 1])
        split_at = [int(np.searchsorted(ts[a:b], t0 + f * (t1 - t0), side="right")) for f in (0.7, 0.85)]
        edges = sorted({0, n, *breaks, *split_at})
        for lo, hi in itertools.pairwise(edges):
            if hi > lo:
                segments.append((sym, a + lo, a + hi))
                segment_split.append(int(np.searchsorted(split_at, lo, side="right")))
    segs = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
    if shard_rows is not None:  # move each symbol to its first virtual row
        bases = symbol_bases(np.diff(bounds), shard_rows)
        shift = bases[:-1] - bounds[:-1]
        rows = np.arange(n_bars) + np.repeat(shift, np.diff(bounds))
        vfeats = np.full((int(bases[-1]), n_features), np.nan, dtype=np.float32)
        vfeats[rows] = feats
        vfeats[rows, 0] = rows.astype(np.float32)
        vts = np.zeros(int(bases[-1]), dtype=np.int64)
        vts[rows] = ts
        feats, ts = vfeats, vts
        segs[:, 1:] += shift[segs[:, 0]][:, None]
    return Bars(
        feats,
        ts,
        segs,
        np.asarray(segment_split, dtype=np.int8),
        list(SPLITS),
        [f"SYM{i}" for i in range(n_symbols)],
        shard_rows,
    )


def make_cache(
    path: str | os.PathLike[str],
    bars: Bars,
    *,
    shard_rows: int,
    chunk_rows: int,
    codec: str = "blosc-lz4",
    together: bool = False,
) -> Cache:
    """Write ``bars`` as a complete format-4 cache with the real ``CacheWriter`` and open it.

    Each symbol's rows are those its segments cover. The cache's virtual rows are ``bars``'
    rows when ``bars`` was made with the same ``shard_rows`` (or has one symbol). Shards are written
    one ``write_shard`` at a time, or with ``together`` all in one ``write_shards`` (what a build's task does).
    """
    if bars.shard_rows not in (None, shard_rows):
        raise ValueError(f"bars laid out for {bars.shard_rows}-row shards, not {shard_rows}")
    seg = bars.segments
    n_sym = len(bars.symbols)
    first = np.array([seg[seg[:, 0] == i, 1].min() for i in range(n_sym)], dtype=np.int64)
    last = np.array([seg[seg[:, 0] == i, 2].max() for i in range(n_sym)], dtype=np.int64)
    f = bars.features.shape[1]
    names = [f"f{i}" for i in range(f)]
    writer = CacheWriter(
        path,
        feature_names=names,
        bars_per_symbol=last - first,
        shard_rows=shard_rows,
        chunk_rows=chunk_rows,
        codec=codec,
    )
    items = []
    for s in writer.shard_ids:
        i, a, b = writer.rows.shard_span(s)
        rows = slice(int(first[i]) + a, int(first[i]) + b)
        items.append((s, bars.features[rows], bars.ts[rows]))
    records = writer.write_shards(items) if together else [writer.write_shard(*item) for item in items]
    virtual = seg.copy()
    virtual[:, 1:] += (writer.rows.bases[:-1] - first)[seg[:, 0]][:, None]
    manifest = Manifest(
        feature_names=names,
        symbols=bars.symbols,
        groups=writer.groups,
        bars_per_symbol=writer.bars_per_symbol.tolist(),
        layout=writer.layout,
        splits=Splits(names=bars.split_names),
        counts=Counts(bars=int((last - first).sum()), symbols=n_sym, segments=len(seg)),
    )
    writer.finish(
        virtual, bars.segment_split, manifest, ShardIndex.empty().updated(records, writer.bars_per_symbol, shard_rows)
    )
    return Cache(path)


def stored_rows(cache: Cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stored row, symbol after symbol, read with plain zarr: features, timestamps and the
    segment table renumbered to those rows."""
    n = len(cache.symbols)
    if not n:
        return np.zeros((0, cache.n_features), np.float32), np.zeros(0, np.int64), np.zeros((0, 3), np.int64)
    feats = np.concatenate([cache.array(i, "features")[...] for i in range(n)])
    ts = np.concatenate([cache.array(i, "time")[...] for i in range(n)])
    offset = np.concatenate([[0], np.cumsum(cache.bars_per_symbol)])
    local = cache.local_segments
    seg = np.stack([local[:, 0], local[:, 1] + offset[local[:, 0]], local[:, 2] + offset[local[:, 0]]], axis=1)
    return feats, ts, seg[np.lexsort((seg[:, 1], seg[:, 0]))]


def brute_starts(bars: Bars, seq_len: int, horizon: int, stride: int, split: str | None) -> np.ndarray:
    """Every valid window start, by walking each segment: the oracle for the index and stream."""
    out = []
    for (sym, a, b), sp in zip(bars.segments, bars.segment_split):
        if split is not None and bars.split_names[sp] != split:
            continue
        p = int(a)
        while p + seq_len - 1 + horizon < b:
            out.append(p)
            p += stride
    return np.sort(np.asarray(out, dtype=np.int64))


# ---- code run in other processes: DDP ranks and the ``python -m helpers`` commands ----


def ddp_rank(rank: int, world: int, cache_path: str, init_file: str, out_dir: str, kwargs: dict) -> None:
    """One ``torch.distributed`` (gloo) rank: stream one epoch, check batch counts agree, save indices."""
    import torch
    import torch.distributed as dist

    from helpers.stream import rows_of
    from shardcache.read.stream import WindowStream

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ds = WindowStream(cache_path, meta=True, **kwargs)
        assert (ds.rank, ds.world) == (rank, world), (ds.rank, ds.world)
        idx = rows_of(ds.cache, ds.loader(1))
        counts = [None] * world
        dist.all_gather_object(counts, len(idx))
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), torch.cat(idx).numpy())
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"batches": len(idx), "all": counts, "dropped": ds.plan().dropped, "n_batches": ds.n_batches}, f)
        ds.close()
    finally:
        dist.destroy_process_group()


def run_helper(command: str, *args: object, timeout: float = 120) -> None:
    """Run ``python -m helpers COMMAND ARGS...`` (``helpers/__main__.py``) in a new interpreter; raise if it fails."""
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "helpers", command, *map(str, args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode:
        raise AssertionError(f"{command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
