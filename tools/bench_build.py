"""The cache side of the benchmark: build speed and memory, the benchmark's data, zarr's read path.

Each build runs in its own process under ``tools/profile_memory.py``'s ``profile()``. Its peak
RSS is the kernel's high-water mark of that process (``ru_maxrss``; dask's local threads
included), or the sampled process-tree peak where that is higher: sampling every 0.1 s misses
the short peaks of a shard task more often in a 4 s build than in a 40 s one, which made
longer builds look bigger. PSS is sampled.
The table gives bars, wall time, bars/s, peak RSS and PSS, and the cache's size against raw
float32; the build is *flat* (PASS) when the largest scale's peak RSS is within 10 % of the
smallest one's. Bars grow two ways: ``--scales`` multiplies the days (10x: 3,600 daily files
of 4 symbols), ``--symbols`` the symbols in the same 360 daily files (10x: 40 symbols); each
gets its own verdict, so growth with the bar count and growth with the file count show apart.

Usage (from the repository root)::

    .venv/bin/python tools/bench_build.py                 # 1x; 10x days (3,600 files); 10x symbols (360 files)
    .venv/bin/python tools/bench_build.py --scales 1 --json build.json

The samples (``make_sample(days=360 * scale)``) are generated once under ``--work`` and
reused; the caches are rebuilt every run. ``tools/bench.py`` prepares its data here
(``prepare_data``, ``ensure_scaled_cache``, ``ensure_mix_caches``: the same bars as two caches),
reports its builds with ``build_table`` and
probes the read path with ``read_probe`` (one fresh process per zarr setting) and ``read_table``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import itertools

from profile_memory import MIB, Profile, profile

__all__ = [
    "FLAT_TOLERANCE",
    "BuildResult",
    "build_table",
    "dir_bytes",
    "ensure_dbn_sample",
    "ensure_mix_caches",
    "ensure_scaled_cache",
    "flat_verdict",
    "main",
    "measure_build",
    "prepare_data",
    "read_probe",
    "read_table",
]

FLAT_TOLERANCE = 0.10  # largest-scale peak RSS at most 10 % above the smallest scale's
_QUIET_CLI = (
    "import os, sys; from shardcache.cli import build_cache_main; "
    "sys.stdout = open(os.devnull, 'w'); sys.exit(build_cache_main(sys.argv[1:]))"
)


@dataclass
class BuildResult:
    """One profiled ``build-cache`` run and the cache it made."""

    label: str
    inputs: int
    bars: int
    features: int
    wall_s: float
    peak_rss: int
    peak_pss: int | None
    stored_bytes: int
    raw_bytes: int
    exit_code: int

    @property
    def bars_per_s(self) -> float:
        return self.bars / self.wall_s if self.wall_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, with bars/s."""
        return {**asdict(self), "bars_per_s": self.bars_per_s}


def ensure_dbn_sample(work: Path, days: int, symbols: int = 4) -> Path:
    """The ``days``-file DBN sample of ``symbols`` symbols under ``work`` (generated once, then reused)."""
    from shardcache.ingest.sample import CONTRACTS, make_sample

    name = f"dbn-{days}d" + (f"-{symbols}s" if symbols != 4 else "")
    out, done = work / name, work / f"{name}.complete"
    if not done.exists():
        t0 = time.perf_counter()
        names = [c.symbol for c in CONTRACTS][:symbols] + [f"SYM{i:03d}" for i in range(symbols - len(CONTRACTS))]
        files = make_sample(out, days=days, symbols=names)
        done.write_text(f"{len(files)}\n")
        print(f"bench: generated {len(files)} DBN files in {out} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out


def measure_build(
    label: str, sources: Path, out: Path, *args: str, interval: float = 0.1
) -> tuple[BuildResult, Profile]:
    """Run ``build-cache SOURCES --out OUT --overwrite -q ARGS`` in a profiled process."""
    from shardcache import open_cache

    cmd = [sys.executable, "-c", _QUIET_CLI, str(sources), "--out", str(out), "--overwrite", "-q", *args]
    prof = profile(cmd, interval, label)
    if prof.exit_code:
        raise SystemExit(f"bench: {label}: build-cache failed with exit code {prof.exit_code}")
    cache = open_cache(out)
    size = cache.manifest.bytes
    inputs = len([p for p in sources.iterdir() if not p.name.startswith(".")]) if sources.is_dir() else 1
    result = BuildResult(
        label=label,
        inputs=inputs,
        bars=cache.n_bars,
        features=cache.n_features,
        wall_s=prof.wall_s,
        peak_rss=max(prof.kernel_max_rss, prof.peak_rss_tree),
        peak_pss=prof.peak_pss_tree,
        stored_bytes=int(size.stored),
        raw_bytes=int(size.raw),
        exit_code=prof.exit_code,
    )
    return result, prof


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare_data(work: Path, f: int, builds: list[BuildResult], seq_len: int = 60, horizon: int = 1) -> dict[str, Any]:
    """Bars at F=``f`` for the loaders: the source (generated once), a fresh profiled build
    (appended to ``builds``), the cache's rows as a raw float32 file and its valid window starts.

    F=9 is the 360-file DBN sample with the default features; any other F a 665K-bar
    Parquet table of ``f`` random columns built with ``--features raw``.
    """
    from shardcache import open_cache
    from shardcache.ingest.sample import make_sample_parquet
    from shardcache.read.plan import valid_ranges

    if f == 9:
        src, label, extra = ensure_dbn_sample(work, 360), "DBN sample, default features", ()
    else:
        src, label, extra = work / f"parquet-{f}", f"Parquet, {f} raw columns", ("--features", "raw")
        if not (work / f"parquet-{f}.complete").exists():
            make_sample_parquet(src, n_bars=665_000, n_features=f)
            (work / f"parquet-{f}.complete").write_text("ok\n")
    cache_path = work / f"cache-{f}.zarr"
    print(f"bench: build-cache F={f} ...", file=sys.stderr, flush=True)
    builds.append(measure_build(label, src, cache_path, *extra)[0])
    cache = open_cache(cache_path)
    raw, table = work / f"rows-{f}.f32", cache.rows.shard_table  # (shard, start, stop) of the stored rows
    with open(raw, "wb") as fh:
        fh.writelines(cache.read_rows(a, b).tobytes() for _, a, b in table.tolist())
    starts, cache_starts = work / f"starts-{f}.npy", valid_ranges(cache, seq_len, horizon).starts()
    k = np.searchsorted(table[:, 1], cache_starts, side="right") - 1  # the same windows in the raw file
    np.save(
        starts, cache_starts - table[k, 1] + (np.cumsum(table[:, 2] - table[:, 1]) - (table[:, 2] - table[:, 1]))[k]
    )
    return {
        "F": f,
        "cache": str(cache_path),
        "raw": str(raw),
        "starts": str(starts),
        "n_bars": cache.n_bars,
        "n_windows": valid_ranges(cache, seq_len, horizon).total(),
        "cache_bytes": dir_bytes(cache_path),
        "raw_bytes": raw.stat().st_size,
    }


def ensure_scaled_cache(work: Path, f: int, scale: int) -> Path:
    """The ``scale`` x 665K-bar cache at F=``f``, built once by build-cache from generated Parquet, then reused."""
    from shardcache import open_cache
    from shardcache.errors import CacheError
    from shardcache.ingest.sample import make_sample_parquet

    path = work / f"cache-{f}-x{scale}.zarr"
    try:
        open_cache(path)
        return path
    except CacheError:
        pass
    src = work / f"parquet-{f}-x{scale}"
    print(f"bench: generating and building the {scale}x F={f} cache once (minutes) ...", file=sys.stderr, flush=True)
    make_sample_parquet(src, n_bars=665_000 * scale, n_features=f, rows_per_file=665_000)
    measure_build(f"Parquet {scale}x", src, path, "--features", "raw")
    shutil.rmtree(src)
    return path


def ensure_mix_caches(work: Path, f: int) -> list[str]:
    """The bars of ``prepare_data``'s cache at F=``f`` as two caches, built once with the same options
    and then reused: the DBN sample's first and last 180 days (F=9), or the Parquet table's first
    two and last two symbols (any other F)."""
    import pyarrow.parquet as pq

    from shardcache import open_cache
    from shardcache.errors import CacheError

    paths = [work / f"cache-{f}-mix-{part}.zarr" for part in "ab"]
    try:
        for path in paths:
            open_cache(path)
        return [str(p) for p in paths]
    except CacheError:
        pass
    print(f"bench: building the F={f} bars as two caches once ...", file=sys.stderr, flush=True)
    if f == 9:
        files = sorted(ensure_dbn_sample(work, 360).glob("*.dbn.zst"))
        halves, extra = [files[: len(files) // 2], files[len(files) // 2 :]], ()
    else:
        table = pq.ParquetFile(next(iter(sorted((work / f"parquet-{f}").glob("*.parquet")))))
        names = sorted({str(v) for b in table.iter_batches(columns=["symbol"]) for v in b.column(0).to_pylist()})
        halves, extra = [], ("--features", "raw")
        for part, keep in zip("ab", (names[: len(names) // 2], names[len(names) // 2 :])):
            out = work / f"parquet-{f}-mix-{part}" / "bars.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            with pq.ParquetWriter(out, table.schema_arrow) as writer:
                for batch in table.iter_batches():
                    rows = batch.filter(_is_in(batch.column("symbol"), keep))
                    writer.write_batch(rows)
            halves.append([out])
    for part, path in zip(halves, paths):
        cmd = [sys.executable, "-c", _QUIET_CLI, *map(str, part), "--out", str(path), "--overwrite", "-q", *extra]
        if subprocess.run(cmd, check=False).returncode:
            raise SystemExit(f"bench: building {path} failed")
    return [str(p) for p in paths]


def _is_in(column: Any, values: list[str]) -> Any:
    """``pyarrow.compute.is_in`` of ``column`` in ``values``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(column, value_set=pa.array(values))


def build_table(results: list[BuildResult]) -> str:
    """Markdown rows for the builds: bars, speed, peak memory, cache size against raw float32."""
    lines = [
        "| build | input files | bars | F | wall s | bars/s | peak RSS MiB | peak PSS MiB | cache MiB | raw f32 MiB | cache/raw |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        pss = "n/a" if r.peak_pss is None else f"{r.peak_pss / MIB:.0f}"
        lines.append(
            f"| {r.label} | {r.inputs} | {r.bars:,} | {r.features} | {r.wall_s:.1f} | {r.bars_per_s:,.0f} | "
            f"{r.peak_rss / MIB:.0f} | {pss} | {r.stored_bytes / MIB:.1f} | {r.raw_bytes / MIB:.1f} | "
            f"{r.stored_bytes / r.raw_bytes:.3f} |"
        )
    return "\n".join(lines)


def flat_verdict(results: list[BuildResult]) -> tuple[bool, str]:
    """PASS when the largest build's peak RSS is within ``FLAT_TOLERANCE`` of the smallest's."""
    small, big = min(results, key=lambda r: r.bars), max(results, key=lambda r: r.bars)
    growth = big.peak_rss / small.peak_rss - 1
    ok = growth <= FLAT_TOLERANCE
    text = (
        f"build memory flat: peak RSS {small.peak_rss / MIB:.0f} MiB at {small.bars:,} bars -> "
        f"{big.peak_rss / MIB:.0f} MiB at {big.bars:,} bars ({big.bars / small.bars:.1f}x the bars, "
        f"{growth:+.1%}; bound +{FLAT_TOLERANCE:.0%}): {'PASS' if ok else 'FAIL'}"
    )
    return ok, text


def _zarr_rows(cache: Any, start: int, n: int) -> np.ndarray:
    """Virtual rows ``[start, start + n)`` read with plain zarr from their symbol's ``features``."""
    sym, local = (int(x[0]) for x in cache.rows.locate(np.array([start])))
    return np.asarray(cache.array(sym, "features")[local : local + n])


def _median_ms(fn: Callable[[int], Any], shards: list[int]) -> float:
    """Median milliseconds of ``fn(shard)`` over two rounds of ``shards``, after one warm-up call."""
    fn(shards[0])
    times = []
    for s in shards * 2:
        t = time.perf_counter()
        fn(s)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def read_probe(spec: dict) -> dict[str, Any]:
    """The read path per cache (run in a fresh process): ms per whole shard through zarr
    (``features[a:b]``, under whatever ``ZARR_*`` settings the process has) and through
    ``Cache.read_rows`` (shardcache's ``ShardDecoder``); with ``full`` also the stream's block
    (shard + overhang), other inner chunk sizes and a batch written into new plain and new
    shared memory."""
    out: dict[str, Any] = {}
    for path in spec["caches"]:
        res = _probe_cache(path, spec)
        out[str(res["F"])] = res
    return {"caches": out, "windows_per_s": 0.0}


def _probe_cache(path: str, spec: dict) -> dict[str, Any]:
    """``read_probe``'s figures for the cache at ``path``."""
    import torch
    import zarr

    from shardcache import open_cache
    from shardcache.format.decode import ShardDecoder
    from shardcache.format.layout import compressors

    cache = open_cache(path)
    rows, f, seq_len, table = cache.shard_rows, cache.n_features, spec["seq_len"], cache.rows.shard_table
    # whole shards followed by another in the same region (so a block's overhang exists)
    firsts = [int(a) for (_, a, b), (_, c, _) in itertools.pairwise(table) if b - a == rows and c == b]
    firsts = firsts[: spec["shards"]]
    res = {
        "F": f,
        "shard_rows": rows,
        "chunk_rows": cache.chunk_rows,
        "shard_mib": rows * f * 4 / MIB,
        "zarr_ms": _median_ms(lambda a: _zarr_rows(cache, a, rows), firsts),
    }
    if spec["full"]:
        res["read_rows_ms"] = _median_ms(lambda a: cache.read_rows(a, a + rows), firsts)
        batch = torch.randn(256, seq_len, f)
        res["batch_plain_ms"] = _median_ms(lambda a: torch.empty(batch.shape).copy_(batch), firsts)
        res["batch_shared_ms"] = _median_ms(
            lambda a: (
                torch.empty(0).set_(torch.UntypedStorage._new_shared(4 * batch.numel()), 0, batch.shape).copy_(batch)
            ),
            firsts,
        )
        res["block_ms"] = _median_ms(lambda a: cache.read_rows(a, a + rows + seq_len), firsts)
        data, res["chunk_ms"] = np.concatenate([cache.read_rows(a, a + rows) for a in firsts]), {}
        for chunk in sorted({max(1, rows // 32), rows // 8, rows}):
            tmp = Path(spec["tmp"]) / f"chunks-{f}-{chunk}.zarr"
            arr = zarr.create_array(
                str(tmp),
                shape=data.shape,
                dtype="float32",
                chunks=(chunk, f),
                shards=(rows, f),
                compressors=compressors(cache.manifest.layout.codec),
                fill_value=np.nan,
                zarr_format=3,
            )
            for k in range(len(firsts)):  # whole shards, as build-cache writes them
                arr[k * rows : (k + 1) * rows] = data[k * rows : (k + 1) * rows]
            dec = ShardDecoder(arr)
            res["chunk_ms"][chunk] = _median_ms(
                lambda k, dec=dec: dec.read(k * rows, (k + 1) * rows), list(range(len(firsts)))
            )
            shutil.rmtree(tmp)
    return res


def read_table(probes: dict[str, dict], epochs: dict[int, tuple[float, int]]) -> str:
    """Zarr's read path: ms per shard under each setting (``probes``: name -> ``read_probe``
    result), and decode's share of an in-process epoch (``epochs``: F -> (seconds, bars))."""
    base = probes["default"]["caches"]
    fs = sorted(base, key=int)
    lines = [
        "| read path and batch hand-off (ms, median) | "
        + " | ".join(f"F={f} ({base[f]['shard_rows']:,} rows, {base[f]['shard_mib']:.1f} MiB)" for f in fs)
        + " |",
        "|---|" + "---:|" * len(fs),
    ]

    def add(name: str, values: list[float]) -> None:
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")

    chunks = "/".join(str(base[f]["chunk_rows"]) for f in fs)
    add(f"zarr `features[a:b]`, default config (inner chunks {chunks} rows)", [base[f]["zarr_ms"] for f in fs])
    for name, probe in probes.items():
        if name != "default":
            add(f"zarr `features[a:b]` with {name}", [probe["caches"][f]["zarr_ms"] for f in fs])
    add(
        "`Cache.read_rows` (shardcache's ShardDecoder: one request, crc32c, decode in place)",
        [base[f]["read_rows_ms"] for f in fs],
    )
    add("stream block: shard + 60-row overhang (reads into the next shard)", [base[f]["block_ms"] for f in fs])
    for k in range(3):
        add(
            "`Cache.read_rows`, inner chunk " + "/".join(f"{list(base[f]['chunk_ms'])[k]}" for f in fs) + " rows",
            [list(base[f]["chunk_ms"].values())[k] for f in fs],
        )
    add("one batch (256 x 60 x F) into new memory: plain (w=0)", [base[f]["batch_plain_ms"] for f in fs])
    add("one batch into new shared memory (what a DataLoader worker sends)", [base[f]["batch_shared_ms"] for f in fs])
    shares = []
    for f in fs:
        seconds, bars = epochs[int(f)]
        shares.append(100 * -(-bars // base[f]["shard_rows"]) * base[f]["block_ms"] / 1e3 / seconds)
    add("decoding one epoch's blocks, % of an in-process E epoch (done by the decoder threads)", shares)
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_build.py", description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("data/bench"), help="samples and caches (default: %(default)s)")
    p.add_argument("--scales", default="1,10", help="multiples of the 360-file sample (default: %(default)s)")
    p.add_argument(
        "--symbols",
        type=int,
        default=10,
        help="multiple of the 4 symbols in 360 daily files, 1 for none (default: %(default)s)",
    )
    p.add_argument(
        "--parquet-scales",
        default="1",
        help="multiples of the 665K-row Parquet F=256 table (--features raw), '' for none "
        "(default: %(default)s; 10x is a 6.8 GB file)",
    )
    p.add_argument("--parquet-features", type=int, default=256, help="Parquet columns (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    return p


def ensure_parquet_sample(work: Path, f: int, scale: int) -> Path:
    """The ``scale`` x 665K-row, ``f``-column Parquet table under ``work`` (one file, generated once)."""
    from shardcache.ingest.sample import make_sample_parquet

    src = work / (f"parquet-{f}" if scale == 1 else f"parquet-{f}-x{scale}-single")
    done = src.with_name(src.name + ".complete")
    if not done.exists():
        make_sample_parquet(src, n_bars=665_000 * scale, n_features=f)
        done.write_text("ok\n")
    return src


def main(argv: list[str] | None = None) -> int:
    """Build each scale once, print the table and the flatness verdict; exit 1 on FAIL."""
    args = _parser().parse_args(argv)
    scales = sorted({int(s) for s in args.scales.split(",")})
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for scale in scales:
        src = ensure_dbn_sample(args.work, 360 * scale)
        out = args.work / f"build-{scale}x.zarr"
        print(f"bench: build-cache at {scale}x ({src}) ...", file=sys.stderr, flush=True)
        results.append(measure_build(f"DBN sample {scale}x days", src, out)[0])
    wide = []
    if args.symbols > 1 and 1 in scales:
        src = ensure_dbn_sample(args.work, 360, 4 * args.symbols)
        print(f"bench: build-cache at {args.symbols}x the symbols ({src}) ...", file=sys.stderr, flush=True)
        wide = [
            results[scales.index(1)],
            measure_build(f"DBN sample {args.symbols}x symbols", src, args.work / "build-wide.zarr")[0],
        ]
    pq_results = []
    for scale in sorted({int(s) for s in args.parquet_scales.split(",") if s.strip()}):
        f = args.parquet_features
        src = ensure_parquet_sample(args.work, f, scale)
        out = args.work / f"build-parquet-{f}-{scale}x.zarr"
        print(f"bench: build-cache Parquet F={f} at {scale}x ({src}) ...", file=sys.stderr, flush=True)
        pq_results.append(measure_build(f"Parquet F={f} {scale}x", src, out, "--features", "raw")[0])
    print(build_table(results + wide[1:] + pq_results))
    ok = True
    for group in (results, wide, pq_results):
        if len(group) > 1:
            group_ok, text = flat_verdict(group)
            ok = ok and group_ok
            print("\n" + text)
    if args.json:
        args.json.write_text(
            json.dumps({"builds": [r.to_dict() for r in results + wide[1:] + pq_results], "flat": ok}, indent=1) + "\n"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
