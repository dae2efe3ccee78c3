"""The builds: speed and memory (``bench.py build``), a dask cluster's workers (``cluster``), kills and resumes
(``kill``), and the benchmark data the other scenarios read (``prepare_data`` and the ``ensure_*`` caches).

``build``: each ``build-cache`` a profiled process; its peak RSS the kernel's high-water mark (``ru_maxrss``) or
the sampled tree peak where higher (sampling misses short shard-task peaks more often in short builds). *Flat*
(PASS) when the largest build's peak RSS is within 10% of the smallest's, for ``--scales`` (the days: 10x is 3,600
daily files) and ``--symbols`` (more symbols in the same 360 files) each. ``cluster``: a ``LocalCluster`` of
one-thread workers builds the sample; each worker's peak over its idle footprint (the builder imported, the CLI's
allocator settings) should not grow with the files. ``kill``: builds get SIGKILL at random moments (trial ``i`` of
``N`` in the ``i``-th slice of the quickest clean build, so every stage is hit), resume with ``--resume`` and are
compared array for array with the clean build, then verified; exit 1 unless every trial is identical.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bench_harness import HORIZON, MIB, SEQ_LEN, Profile, parser, profile, table, write_json

__all__ = [
    "COMMANDS",
    "BuildResult",
    "build_table",
    "dir_bytes",
    "ensure_cache",
    "ensure_mix_caches",
    "ensure_parquet_sample",
    "ensure_scaled_cache",
    "prepare_data",
]

FLAT_TOLERANCE = 0.10  # largest-scale peak RSS at most 10 % above the smallest scale's
_QUIET_CLI = (
    "import os, sys; from shardcache.cli import build_cache_main; "
    "sys.stdout = open(os.devnull, 'w'); sys.exit(build_cache_main(sys.argv[1:]))"
)


# -- the benchmark data ----------------------------------------------------------------------
def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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


def ensure_parquet_sample(work: Path, f: int, scale: int = 1, files: int = 1) -> Path:
    """The ``scale`` x 665K-row Parquet table of ``f`` random columns under ``work`` in ``files`` files (once)."""
    from shardcache.ingest.sample import make_sample_parquet

    src = work / (f"parquet-{f}" if scale == 1 else f"parquet-{f}-x{scale}" + ("-single" if files == 1 else ""))
    done = src.with_name(src.name + ".complete")
    if not done.exists():
        make_sample_parquet(src, n_bars=665_000 * scale, n_features=f, rows_per_file=-(-665_000 * scale // files))
        done.write_text("ok\n")
    return src


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


def measure_build(label: str, sources: Path, out: Path, *args: str) -> tuple[BuildResult, Profile]:
    """Run ``build-cache SOURCES --out OUT --overwrite -q ARGS`` in a profiled process."""
    from shardcache import open_cache

    cmd = [sys.executable, "-c", _QUIET_CLI, str(sources), "--out", str(out), "--overwrite", "-q", *args]
    prof = profile(cmd, 0.1, label)
    if prof.exit_code:
        raise SystemExit(f"bench: {label}: build-cache failed with exit code {prof.exit_code}")
    cache = open_cache(out)
    size = cache.manifest.bytes
    inputs = len([p for p in sources.iterdir() if not p.name.startswith(".")]) if sources.is_dir() else 1
    peak, sizes = max(prof.kernel_max_rss, prof.peak_rss_tree), (int(size.stored), int(size.raw))
    shape = (inputs, cache.n_bars, cache.n_features)
    return BuildResult(label, *shape, prof.wall_s, peak, prof.peak_pss_tree, *sizes, prof.exit_code), prof


def prepare_data(work: Path, f: int, builds: list[BuildResult]) -> dict[str, Any]:
    """Bars at F=``f`` for the loaders: the source (generated once), a fresh profiled build (appended to
    ``builds``) into ``WORK/cache-<f>.zarr``, the cache's rows as a raw float32 file and its valid window starts.
    F=9 is the 360-file DBN sample, default features; any other F the 665K-bar Parquet table, ``--features raw``."""
    from shardcache import open_cache
    from shardcache.read.plan import valid_ranges

    if f == 9:
        src, label, extra = ensure_dbn_sample(work, 360), "DBN sample, default features", ()
    else:
        src, label, extra = ensure_parquet_sample(work, f), f"Parquet, {f} raw columns", ("--features", "raw")
    cache_path = work / f"cache-{f}.zarr"
    print(f"bench: build-cache F={f} ...", file=sys.stderr, flush=True)
    builds.append(measure_build(label, src, cache_path, *extra)[0])
    cache = open_cache(cache_path)
    raw, shards = work / f"rows-{f}.f32", cache.rows.shard_table  # (shard, start, stop) of the stored rows
    with open(raw, "wb") as fh:
        fh.writelines(cache.read_rows(a, b).tobytes() for _, a, b in shards.tolist())
    starts, valid = work / f"starts-{f}.npy", valid_ranges(cache, SEQ_LEN, HORIZON)
    cache_starts, lengths = valid.starts(), shards[:, 2] - shards[:, 1]
    k = np.searchsorted(shards[:, 1], cache_starts, side="right") - 1  # the same windows in the raw file
    np.save(starts, cache_starts - shards[k, 1] + (np.cumsum(lengths) - lengths)[k])
    out = {"F": f, "cache": str(cache_path), "raw": str(raw), "starts": str(starts), "n_bars": cache.n_bars}
    return out | {"n_windows": valid.total(), "cache_bytes": dir_bytes(cache_path), "raw_bytes": raw.stat().st_size}


def ensure_cache(work: Path, f: int) -> str:
    """``WORK/cache-<f>.zarr``, built as ``prepare_data`` builds it when it does not open."""
    from shardcache import CacheError, open_cache

    path = work / f"cache-{f}.zarr"
    try:
        open_cache(path)
    except CacheError:  # missing or incomplete: build it
        work.mkdir(parents=True, exist_ok=True)
        prepare_data(work, f, [])
    return str(path)


def _opens(*paths: Path) -> bool:
    from shardcache import CacheError, open_cache

    try:
        return all(open_cache(p) for p in paths)
    except CacheError:
        return False


def ensure_scaled_cache(work: Path, f: int, scale: int) -> Path:
    """The ``scale`` x 665K-bar cache at F=``f``, built once from generated Parquet, then reused."""
    path = work / f"cache-{f}-x{scale}.zarr"
    if not _opens(path):
        print(f"bench: generating and building the {scale}x F={f} cache once (minutes) ...", file=sys.stderr)
        src = ensure_parquet_sample(work, f, scale, files=scale)
        measure_build(f"Parquet {scale}x", src, path, "--features", "raw")
        shutil.rmtree(src)
        src.with_name(src.name + ".complete").unlink()
    return path


def ensure_mix_caches(work: Path, f: int) -> list[str]:
    """``prepare_data``'s bars at F=``f`` as two caches, built once with the same options: the DBN sample's first
    and last 180 days (F=9), or the Parquet table's first two and last two symbols (any other F)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    paths = [work / f"cache-{f}-mix-{part}.zarr" for part in "ab"]
    if _opens(*paths):
        return [str(p) for p in paths]
    print(f"bench: building the F={f} bars as two caches once ...", file=sys.stderr, flush=True)
    if f == 9:
        files = sorted(ensure_dbn_sample(work, 360).glob("*.dbn.zst"))
        halves, extra = [files[: len(files) // 2], files[len(files) // 2 :]], ()
    else:
        pf = pq.ParquetFile(next(iter(sorted(ensure_parquet_sample(work, f).glob("*.parquet")))))
        names = sorted({str(v) for b in pf.iter_batches(columns=["symbol"]) for v in b.column(0).to_pylist()})
        halves, extra = [], ("--features", "raw")
        for part, keep in zip("ab", (names[: len(names) // 2], names[len(names) // 2 :])):
            out = work / f"parquet-{f}-mix-{part}" / "bars.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            with pq.ParquetWriter(out, pf.schema_arrow) as writer:
                for batch in pf.iter_batches():
                    writer.write_batch(batch.filter(pc.is_in(batch.column("symbol"), value_set=pa.array(keep))))
            halves.append([out])
    for part, path in zip(halves, paths):
        cmd = [sys.executable, "-c", _QUIET_CLI, *map(str, part), "--out", str(path), "--overwrite", "-q", *extra]
        if subprocess.run(cmd, check=False).returncode:
            raise SystemExit(f"bench: building {path} failed")
    return [str(p) for p in paths]


# -- build: speed and memory -----------------------------------------------------------------
def build_table(results: list[BuildResult]) -> str:
    """Markdown rows for the builds: bars, speed, peak memory, cache size against raw float32."""
    head = ["build", "input files", "bars", "F", "wall s", "bars/s", "peak RSS MiB", "peak PSS MiB", "cache MiB"]
    rows = []
    for r in results:
        pss = "n/a" if r.peak_pss is None else f"{r.peak_pss / MIB:.0f}"
        row = [r.label, r.inputs, f"{r.bars:,}", r.features, f"{r.wall_s:.1f}", f"{r.bars_per_s:,.0f}"]
        row += [f"{r.peak_rss / MIB:.0f}", pss, f"{r.stored_bytes / MIB:.1f}", f"{r.raw_bytes / MIB:.1f}"]
        rows.append([*row, f"{r.stored_bytes / r.raw_bytes:.3f}"])
    return table([*head, "raw f32 MiB", "cache/raw"], rows)


def flat_verdict(results: list[BuildResult]) -> tuple[bool, str]:
    """PASS when the largest build's peak RSS is within ``FLAT_TOLERANCE`` of the smallest's."""
    small, big = min(results, key=lambda r: r.bars), max(results, key=lambda r: r.bars)
    growth = big.peak_rss / small.peak_rss - 1
    ok = growth <= FLAT_TOLERANCE
    return ok, (
        f"build memory flat: peak RSS {small.peak_rss / MIB:.0f} MiB at {small.bars:,} bars -> "
        f"{big.peak_rss / MIB:.0f} MiB at {big.bars:,} bars ({big.bars / small.bars:.1f}x the bars, "
        f"{growth:+.1%}; bound +{FLAT_TOLERANCE:.0%}): {'PASS' if ok else 'FAIL'}"
    )


def build_main(argv: list[str]) -> int:
    """Build each scale once, print the table and the flatness verdicts; exit 1 on FAIL."""
    args = parser(
        *("build", __doc__, "work", "json"),
        scales=("1,10", "multiples of the 360-file sample's days"),
        symbols=(10, "multiple of the 4 symbols in 360 daily files, 1 for none"),
        parquet_scales=("1", "multiples of the 665K-row Parquet F=256 table (--features raw), '' for none"),
    ).parse_args(argv)
    scales = sorted({int(s) for s in args.scales.split(",")})
    args.work.mkdir(parents=True, exist_ok=True)
    results, wide, pq_results = [], [], []
    for scale in scales:
        print(f"bench: build-cache at {scale}x the days ...", file=sys.stderr, flush=True)
        src = ensure_dbn_sample(args.work, 360 * scale)
        results.append(measure_build(f"DBN sample {scale}x days", src, args.work / f"build-{scale}x.zarr")[0])
    if args.symbols > 1 and 1 in scales:
        print(f"bench: build-cache at {args.symbols}x the symbols ...", file=sys.stderr, flush=True)
        src = ensure_dbn_sample(args.work, 360, 4 * args.symbols)
        label = f"DBN sample {args.symbols}x symbols"
        wide = [results[scales.index(1)], measure_build(label, src, args.work / "build-wide.zarr")[0]]
    for scale in sorted({int(s) for s in args.parquet_scales.split(",") if s.strip()}):
        print(f"bench: build-cache Parquet F=256 at {scale}x ...", file=sys.stderr, flush=True)
        out = args.work / f"build-parquet-256-{scale}x.zarr"
        src = ensure_parquet_sample(args.work, 256, scale)
        pq_results.append(measure_build(f"Parquet F=256 {scale}x", src, out, "--features", "raw")[0])
    print(build_table(results + wide[1:] + pq_results))
    ok = True
    for group in (results, wide, pq_results):
        if len(group) > 1:
            group_ok, text = flat_verdict(group)
            ok = ok and group_ok
            print("\n" + text)
    write_json(args.json, {"builds": [r.to_dict() for r in results + wide[1:] + pq_results], "flat": ok})
    return 0 if ok else 1


# -- cluster: a LocalCluster's workers -------------------------------------------------------
def _warm() -> int:
    """What a worker does with ``--preload shardcache.ingest.tasks``: the builder's imports and the CLI's
    allocator settings; its RSS afterwards is its idle footprint."""
    import shardcache.ingest.builder  # noqa: F401
    from shardcache.ingest.tasks import tune_allocator

    tune_allocator()
    return psutil.Process().memory_info().rss


def cluster_main(argv: list[str]) -> int:
    """Build the sample on a LocalCluster and print each worker's idle and peak RSS."""
    args = parser(
        *("cluster", __doc__),
        days=(360, "days of the generated sample"),
        workers=(2, "worker processes, 1 thread each"),
        interval=(0.01, "seconds between RSS samples"),
    ).parse_args(argv)
    from distributed import Client, LocalCluster

    from shardcache.ingest.builder import build_cache
    from shardcache.ingest.sample import make_sample
    from shardcache.ingest.sources import expand_inputs, open_source

    with tempfile.TemporaryDirectory(prefix="cluster-rss-") as tmp:
        make_sample(f"{tmp}/dbn", days=args.days)
        files = expand_inputs([f"{tmp}/dbn"])
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        with cluster, Client(cluster) as client:
            idle, done = client.run(_warm), threading.Event()
            procs = {w: psutil.Process(p) for w, p in client.run(os.getpid).items()}
            peak = dict.fromkeys(procs, 0)

            def sample() -> None:
                while not done.wait(args.interval):
                    peak.update({w: max(peak[w], p.memory_info().rss) for w, p in procs.items()})

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.perf_counter()
            cache = build_cache(files, f"{tmp}/c.zarr", scheduler=client, progress=False)
            elapsed = time.perf_counter() - t0
            done.set()
            sampler.join()
        biggest = max(Path(f).stat().st_size for f in files)
        bars = max(sum(t.num_rows for t in open_source(f).pieces()) for f in files[:5])
    print(
        f"{len(files)} files (largest {biggest / 1024:.0f} KiB, ~{bars} bars), {cache.n_bars:,} bars, {cache.n_shards} "
        f"shards of {cache.shard_rows * cache.n_features * 4 / MIB:.1f} MiB decoded; build {elapsed:.1f} s on "
        f"{args.workers} workers x 1 thread\n"
    )
    rows = [
        [w, f"{idle[w] / MIB:.0f}", f"{peak[w] / MIB:.0f}", f"{(peak[w] - idle[w]) / MIB:.0f}"] for w in sorted(idle)
    ]
    print(table(["worker", "idle RSS (MiB)", "peak RSS (MiB)", "peak - idle (MiB)"], rows))
    return 0


# -- kill: SIGKILL and resume ----------------------------------------------------------------
STAGES = {"read files": "scan", "sort symbols": "merge", "statistics": "stats", "write shards": "write"}


def _build_cmd(data: Path, out: Path, shard_rows: int) -> list[str]:
    """The build command for ``out`` (the same options for the clean build and every trial)."""
    shards = f"--split train=0.8,val=0.1,test=0.1 --shard-rows {shard_rows} --chunk-rows {max(1, shard_rows // 8)}"
    return [sys.executable, "-m", "shardcache.cli", "build", str(data), "--out", str(out), *shards.split()]


def _stage(log: str) -> str:
    """The build stage named by the last stage log line in ``log``."""
    heads = [line.removeprefix("shardcache: ").split(":")[0] for line in log.splitlines()]
    return next((STAGES[h] for h in reversed(heads) if h in STAGES), "start")


def _clean_build(cmd: list[str]) -> tuple[float, float, dict[str, float]]:
    """The build: seconds from its start to the first stage line and to its exit, and when each stage began."""
    t0, begins = time.perf_counter(), {}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:  # type: ignore[union-attr]
        if _stage(line) != "start":
            begins.setdefault(_stage(line), time.perf_counter() - t0)
    if proc.wait():
        raise SystemExit(f"the clean build failed (exit {proc.returncode})")
    return begins.get("scan", 0.0), time.perf_counter() - t0, begins


def _trial(i: int, n: int, rng: random.Random, args: Any, clean: Path, span: tuple[float, float]) -> dict[str, Any]:
    """One kill and resume: the row of the table."""
    from shardcache.inspect.verify import compare_caches, verify_cache

    out, log_path, (lo, hi) = args.work / f"trial{i:03d}.zarr", args.work / f"trial{i:03d}.log", span
    delay = lo + (i + rng.random()) / n * (hi - lo)
    for _ in range(3):  # a build that ends before its kill (a quieter machine) is retried earlier
        shutil.rmtree(out, ignore_errors=True)
        with open(log_path, "w") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(_build_cmd(args.data, out, args.shard_rows), stderr=log, stdout=subprocess.DEVNULL)
            try:
                killed = proc.wait(delay) is None
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                killed = proc.wait() is not None
        if killed:
            break
        took = time.perf_counter() - t0
        delay = lo * took / hi + (i + rng.random()) / n * (took - lo * took / hi)
    stage = "exited first" if not killed else "published" if out.exists() else _stage(log_path.read_text())
    staging = Path(f"{out}.staging")
    done = Counter(p.name.split("-")[0] for p in (staging / "done").glob("*-*") if p.suffix in (".json", ".npz"))
    parts = [f"{k} {done[k]}" for k in ("scan", "merge", "stats", "write") if done[k]]
    parts += ["staging gone"] * (not staging.exists()) + ["published"] * out.exists()
    t0 = time.perf_counter()
    cmd = [*_build_cmd(args.data, out, args.shard_rows), "--resume", "-q"]
    resumed = subprocess.run(cmd, capture_output=True, text=True, check=False)
    resume_s = time.perf_counter() - t0
    if resumed.returncode:
        result = f"resume failed: {resumed.stderr.strip().splitlines()[-1:]}"
    else:
        problems = compare_caches(clean, out) + [str(p) for p in verify_cache(out).problems]
        result = "identical" if not problems else f"DIFFERS: {problems[:3]}"
    shutil.rmtree(out, ignore_errors=True)
    row = {"trial": i, "kill_s": delay, "stage": stage, "done": ", ".join(parts) or "nothing"}
    return row | {"resume_s": resume_s, "result": result}


def kill_main(argv: list[str]) -> int:
    """Kill and resume ``--trials`` builds; print a table and ``N/N identical``."""
    args = parser(
        *("kill", __doc__),
        trials=(20, "builds killed and resumed"),
        days=(60, "days of the generated sample"),
        shard_rows=(2048, "small shards: many write tasks to land in"),
        seed=(0, "seed of the kill delays"),
    ).parse_args(argv)
    from shardcache.ingest.sample import make_sample

    args.work = Path(tempfile.mkdtemp(prefix="kill-resume-"))
    try:
        args.data, clean = args.work / "dbn", args.work / "clean.zarr"
        if not args.data.is_dir():
            make_sample(args.data, days=args.days)
        runs = []
        for _ in range(3):  # the quickest of three: kills should land inside the build, not after it
            shutil.rmtree(clean, ignore_errors=True)
            runs.append(_clean_build(_build_cmd(args.data, clean, args.shard_rows)))
        lo, hi, begins = min(runs, key=lambda r: r[1])
        stages = ", ".join(f"{k} at {v:.2f} s" for k, v in begins.items())
        files = len(list(args.data.iterdir()))
        print(f"clean build of {files} files: {stages}, exit at {hi:.2f} s; kills spread over {lo:.2f}-{hi:.2f} s")
        rng, rows = random.Random(args.seed), []
        print(f"{'trial':>5}  {'kill at':>8}  {'stage':<12}  {'finished before the kill':<40}  {'resume':>7}  result")
        for i in range(args.trials):
            r = _trial(i, args.trials, rng, args, clean, (lo, hi))
            rows.append(r)
            line = f"{r['trial']:>5}  {r['kill_s']:>7.2f}s  {r['stage']:<12}  {r['done']:<40}  {r['resume_s']:>6.1f}s"
            print(f"{line}  {r['result']}", flush=True)
        ok = sum(r["result"] == "identical" for r in rows)
        print(f"kills per stage: {', '.join(f'{k} {v}' for k, v in Counter(r['stage'] for r in rows).items())}")
        print(f"{ok}/{len(rows)} identical")
        return 0 if ok == len(rows) else 1
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


COMMANDS = {"build": build_main, "cluster": cluster_main, "kill": kill_main}
