"""Prove it with numbers: the team's naive loader, memmap and in-RAM baselines and ``WindowStream``.

One run measures, on the same bars, at F=9 (the default features of the ~665K-bar DBN
sample) and F=256 (a 665K-bar Parquet table with 256 numeric columns, ``--features raw``):

A  naive: the team's loader, a Python list of ``(torch.tensor(bars[p:p+60]), target)`` pairs
   and ``DataLoader(list, batch_size=256, shuffle=True)``. Run on the first
   ``--naive-windows`` windows only; its memory and time to first batch are extrapolated
   linearly to every window (marked ``~``).
B  memmap, map-style: ``np.memmap`` of the raw float32 rows, ``__getitem__`` returns
   ``torch.from_numpy(mm[p:p+60])`` and the target row, ``DataLoader(shuffle=True, batch_size=256)``.
C  memmap, batched: one numpy fancy index per batch of 256 random starts into a strided
   ``(n, 60, F)`` view of the same memmap.
D  in-RAM gather ceiling: the whole array in RAM, preallocated outputs, one thread,
   ``torch.index_select(torch.as_strided(t, (n, 60, F), (F, F, 1)), 0, idx, out=buf)``.
E  shardcache: ``WindowStream`` over the compressed cache, ``DataLoader(ds, batch_size=None,
   num_workers=0 | 2)``, full epochs.

Every scenario serves the cache's valid windows (60 bars inside one segment, target row
``p + 60``), shuffled, in batches of 256; B-D shuffle globally, E by shard pools (its
design). Each runs in its own process under ``tools/profile_memory.py``'s ``profile()``, so
its peak RSS is clean and covers DataLoader workers (RSS summed over the process tree; PSS,
which counts shared pages once, alongside).

Threads: every scenario process runs with ``OMP_NUM_THREADS=MKL_NUM_THREADS=1`` and
``torch.set_num_threads(1)`` (DataLoader workers run one torch thread anyway); blosc and
zarr keep their default decode threads, which only E uses. windows/s is the best of up to
``--repeats`` passes, each counting the windows after its first batch over the time after
it; first batch is the first pass's time from opening the data (imports done) to the first
batch in hand. The consumer only counts windows.

Also measured: each build (bars/s, peak RSS, cache size against raw float32), streaming
memory at 1x and 10x the bars (F=256), and where zarr's read path spends its time (per-shard
``Cache.read_rows`` against a raw numcodecs decode of the same chunks, inner chunk size,
``zarr.config`` and blosc thread settings). ``tools/bench_build.py`` covers build memory at
1x and 10x.

Usage (from the repository root; about 8 minutes on 2 cores, more on the first run)::

    .venv/bin/python tools/bench.py --json out/bench.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from shardcache import WindowStream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_build import BuildResult, build_table, ensure_dbn_sample, measure_build  # noqa: E402
from profile_memory import MIB, Profile, plot, profile  # noqa: E402

__all__ = ["MemmapWindows", "ProposedStream", "Row", "read_probe", "run_scenario", "main"]

SEQ_LEN, HORIZON, BATCH = 60, 1, 256
GIB = 2**30
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TARGETS = (("E >= 1.0x C", "C", 1.0), ("E >= 3x B", "B", 3.0), ("E >= 0.7x D", "D", 0.7))
RSS_BOUND, SCALE_TOLERANCE, FIRST_BATCH_BOUND = 0.5 * GIB, 0.10, 0.5
PLOT_PATH = Path("docs/img/rss_naive_vs_shardcache.png")


# -- scenario processes --------------------------------------------------------------------
class MemmapWindows(Dataset):
    """B: map-style windows of a memmap, one ``torch.from_numpy`` view per window and target."""

    def __init__(self, rows: np.ndarray, starts: np.ndarray) -> None:
        self.rows, self.starts = rows, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = int(self.starts[i])
        return torch.from_numpy(self.rows[p : p + SEQ_LEN]), torch.from_numpy(self.rows[p + SEQ_LEN])


def _timed(spec: dict, open_data: Callable[[], Callable[[int], Iterator[tuple]]]) -> dict[str, Any]:
    """Open the data, run passes; time to first batch (first pass) and windows/s per pass."""
    t0 = time.perf_counter()
    passes = open_data()
    rates, first_s, windows = [], 0.0, 0
    for k in range(spec["repeats"]):
        n, t_first, n_first = 0, 0.0, 0
        for x, _y in passes(k):
            if not n:
                t_first, n_first = time.perf_counter(), len(x)
                first_s = first_s or t_first - t0
            n += len(x)
        rates.append((n - n_first) / (time.perf_counter() - t_first))
        windows = n
        if time.perf_counter() - t0 > spec["max_s"]:
            break
    return {"first_batch_s": first_s, "rates": rates, "windows_per_s": max(rates), "windows": windows}


def _permuted(starts: np.ndarray, k: int, limit: int | None) -> np.ndarray:
    perm = starts[np.random.default_rng([7, k]).permutation(len(starts))]
    return perm if limit is None else perm[:limit]


def _naive(spec: dict) -> dict[str, Any]:
    """A: every window as its own tensor in a Python list, then a shuffling DataLoader."""
    proc = psutil.Process()
    t0 = time.perf_counter()
    bars = np.fromfile(spec["raw"], np.float32).reshape(-1, spec["F"])  # the naive loader holds every bar
    starts = np.load(spec["starts"])[: spec["naive_windows"]]
    rss0, t1 = proc.memory_info().rss, time.perf_counter()
    windows = [(torch.tensor(bars[p : p + SEQ_LEN]), torch.tensor(bars[p + SEQ_LEN])) for p in starts]
    t2, rss1 = time.perf_counter(), proc.memory_info().rss

    def open_data() -> Callable[[int], Iterator[tuple]]:
        loader = DataLoader(windows, batch_size=BATCH, shuffle=True)
        return lambda k: iter(loader)

    out = _timed(spec, open_data)
    out.update(load_s=t1 - t0, list_s=t2 - t1, list_bytes=rss1 - rss0, rss_before_list=rss0, n_windows=len(starts))
    out["first_batch_s"] += t2 - t0
    return out


def _memmap(spec: dict) -> dict[str, Any]:
    """B: map-style Dataset over a memmap with DataLoader's shuffling and collation."""
    starts = np.load(spec["starts"])

    def open_data() -> Callable[[int], Iterator[tuple]]:
        rows = np.memmap(spec["raw"], np.float32, "c", shape=(spec["n_bars"], spec["F"]))
        loader = DataLoader(MemmapWindows(rows, starts), batch_size=BATCH, shuffle=True)
        return lambda k: itertools.islice(loader, spec["batches"])

    return _timed(spec, open_data)


def _batched(spec: dict) -> dict[str, Any]:
    """C: the memmap gathered with one numpy fancy index per batch."""
    starts, n, f = np.load(spec["starts"]), spec["n_bars"], spec["F"]

    def open_data() -> Callable[[int], Iterator[tuple]]:
        rows = np.asarray(np.memmap(spec["raw"], np.float32, "r", shape=(n, f)))
        view = np.lib.stride_tricks.as_strided(rows, (n - SEQ_LEN + 1, SEQ_LEN, f), (4 * f, 4 * f, 4), writeable=False)

        def one(k: int) -> Iterator[tuple]:
            perm = _permuted(starts, k, spec["batches"] * BATCH)
            for b in range(0, len(perm), BATCH):
                idx = perm[b : b + BATCH]
                yield torch.from_numpy(view[idx]), torch.from_numpy(rows[idx + SEQ_LEN])

        return one

    return _timed(spec, open_data)


def _ram(spec: dict) -> dict[str, Any]:
    """D: the gather ceiling, whole array in RAM, preallocated outputs, one thread."""
    starts, n, f = np.load(spec["starts"]), spec["n_bars"], spec["F"]

    def open_data() -> Callable[[int], Iterator[tuple]]:
        t = torch.from_numpy(np.fromfile(spec["raw"], np.float32).reshape(n, f))
        win = torch.as_strided(t, (n - SEQ_LEN + 1, SEQ_LEN, f), (f, f, 1))
        buf, ybuf = torch.empty(BATCH, SEQ_LEN, f), torch.empty(BATCH, f)

        def one(k: int) -> Iterator[tuple]:
            perm = torch.from_numpy(_permuted(starts, k, spec["batches"] * BATCH))
            for b in range(0, len(perm), BATCH):
                idx = perm[b : b + BATCH]
                m = len(idx)
                torch.index_select(win, 0, idx, out=buf[:m])
                torch.index_select(t, 0, idx + SEQ_LEN, out=ybuf[:m])
                yield buf[:m], ybuf[:m]

        return one

    return _timed(spec, open_data)


def _stream(spec: dict) -> dict[str, Any]:
    """E: WindowStream through a DataLoader (``batch_size=None``), full epochs unless ``batches``."""
    holder: dict[str, Any] = {}

    def open_data() -> Callable[[int], Iterator[tuple]]:
        cls = ProposedStream if spec["proposed"] else WindowStream
        ds = holder["ds"] = cls(spec["cache"], SEQ_LEN, HORIZON, batch_size=BATCH, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=None, num_workers=spec["workers"])

        def one(k: int) -> Iterator[tuple]:
            ds.set_epoch(k)
            return itertools.islice(loader, spec["batches"]) if spec["batches"] else iter(loader)

        return one

    out = _timed(spec, open_data)
    holder["ds"].close()
    return out


class ProposedStream(WindowStream):
    """E*: ``WindowStream`` with the gather change proposed for ``stream.py`` (see docs/performance.md).

    With one torch thread there is no intra-op pool to keep out, so each block's windows and
    targets are copied with one ``index_select`` each instead of pieces of ``_GRAIN`` elements.
    """

    def _gather(self, task: Any, shared: bool) -> tuple[torch.Tensor, ...]:
        if self.device.type != "cpu" or torch.get_num_threads() > 1:
            return super()._gather(task, shared)
        fx, fy = task.groups[0].block.x.shape[1], task.groups[0].block.y.shape[1]
        x, y = self._empty((task.n, self.seq_len, fx), shared), self._empty((task.n, fy), shared)
        for g in task.groups:
            torch.index_select(g.block.windows, 0, g.xidx, out=x[g.a : g.b])
            torch.index_select(g.block.y, 0, g.yidx, out=y[g.a : g.b])
        return (x, y, task.index) if self.return_index else (x, y)


def _median_ms(fn: Callable[[int], Any], shards: list[int]) -> float:
    """Median milliseconds of ``fn(shard)`` over two rounds of ``shards``, after one warm-up call."""
    fn(shards[0])
    times = []
    for s in shards * 2:
        t = time.perf_counter()
        fn(s)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def _raw_shard(cache: Any, s: int) -> np.ndarray:
    """Shard ``s`` without zarr: read the object, check the crc32c, blosc-decode each inner chunk."""
    import crc32c
    import numcodecs

    n, rows = cache.shard_rows // cache.chunk_rows, cache.chunk_rows
    data = memoryview(Path(cache.url, "features", *cache.features.metadata.encode_chunk_key((s, 0)).split("/")).read_bytes())
    out = np.empty((cache.shard_rows, cache.n_features), np.float32)
    codec = numcodecs.Blosc()
    for k, (off, size) in enumerate(np.frombuffer(data[-(16 * n + 4) : -4], "<u8").reshape(n, 2).tolist()):
        chunk = data[off : off + size]
        if crc32c.crc32c(chunk[:-4]) != int.from_bytes(chunk[-4:], "little"):
            raise ValueError(f"shard {s} chunk {k}: crc32c mismatch")
        codec.decode(chunk[:-4], out=out[k * rows : (k + 1) * rows])
    return out


def read_probe(spec: dict) -> dict[str, Any]:
    """Zarr's read path per cache: ms per whole shard via ``read_rows``; with ``full`` also the
    stream's block (shard + overhang), a raw numcodecs decode and other inner chunk sizes."""
    import shutil

    import zarr
    from numcodecs import blosc

    from shardcache import open_cache
    from shardcache.store import CacheWriter

    blosc.use_threads = False  # as inside zarr, which decodes in worker threads
    out: dict[str, Any] = {}
    for path in spec["caches"]:
        cache = open_cache(path)
        rows, f = cache.shard_rows, cache.n_features
        shards = list(range(min(spec["shards"], cache.n_shards - 1)))
        res = {"F": f, "shard_rows": rows, "chunk_rows": cache.chunk_rows, "shard_mib": rows * f * 4 / MIB,
               "read_rows_ms": _median_ms(lambda s: cache.read_rows(s * rows, (s + 1) * rows), shards)}
        if spec["full"]:
            span = SEQ_LEN + HORIZON - 1
            res["block_ms"] = _median_ms(lambda s: cache.read_rows(s * rows, (s + 1) * rows + span), shards)
            res["raw_ms"] = _median_ms(lambda s: _raw_shard(cache, s), shards)
            data, res["chunk_ms"] = cache.read_rows(0, len(shards) * rows), {}
            for chunk in sorted({max(1, rows // 32), rows // 8, rows}):
                tmp = Path(spec["tmp"]) / f"chunks-{f}-{chunk}.zarr"
                w = CacheWriter(tmp, n_bars=len(data), feature_names=cache.feature_names, shard_rows=rows, chunk_rows=chunk)
                for s in shards:
                    w.write_shard(s, data[s * rows : (s + 1) * rows], np.zeros(rows, np.int64))
                arr = zarr.open_group(str(tmp), mode="r")["features"]
                res["chunk_ms"][chunk] = _median_ms(lambda s: np.asarray(arr[s * rows : (s + 1) * rows]), shards)
                shutil.rmtree(tmp)
        out[str(f)] = res
    return {"caches": out, "windows_per_s": 0.0}


SCENARIOS: dict[str, Callable[[dict], dict[str, Any]]] = {
    "naive": _naive, "memmap": _memmap, "batched": _batched, "ram": _ram, "stream": _stream, "read": read_probe,
}


def run_scenario(spec: dict) -> None:
    """Child process entry: one thread for torch, run the scenario, write its result as JSON."""
    torch.set_num_threads(1)
    result = {"rss_after_imports": psutil.Process().memory_info().rss, **SCENARIOS[spec["kind"]](spec)}
    Path(spec["out"]).write_text(json.dumps(result))


# -- parent: data, runs, tables --------------------------------------------------------------
class Row:
    """One scenario's measurement: its result JSON plus the profile of its process tree."""

    def __init__(self, key: str, label: str, spec: dict, result: dict, prof: Profile, disk: int) -> None:
        self.key, self.label, self.spec, self.result, self.prof, self.disk = key, label, spec, result, prof, disk

    @property
    def rate(self) -> float:
        return float(self.result["windows_per_s"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the spec, the scenario's own numbers and the profile summary."""
        return {"key": self.key, "label": self.label, "spec": self.spec, "result": self.result,
                "profile": self.prof.summary(), "disk_bytes": self.disk}


def _run(kind: str, label: str, spec: dict, work: Path, env: dict[str, str] | None = None) -> tuple[dict, Profile]:
    """Run one scenario in a fresh, profiled process; return its result and profile."""
    out = work / "results" / f"{label.replace(' ', '_').replace('/', '-')}.json"
    out.parent.mkdir(exist_ok=True)
    spec = {**spec, "kind": kind, "out": str(out)}
    print(f"bench: {label} ...", file=sys.stderr, flush=True)
    old = {k: os.environ.get(k) for k in {**THREAD_ENV, **(env or {})}}
    os.environ.update({**THREAD_ENV, **(env or {})})
    try:
        prof = profile([sys.executable, os.path.abspath(__file__), "--scenario", json.dumps(spec)], 0.05, label)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    if prof.exit_code:
        raise SystemExit(f"bench: {label} failed (exit {prof.exit_code})")
    return json.loads(out.read_text()), prof


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _prepare(work: Path, f: int, builds: list[BuildResult]) -> dict[str, Any]:
    """Source data (reused), a fresh profiled build, the raw float32 export and the valid starts."""
    from shardcache import open_cache
    from shardcache.index import valid_ranges
    from shardcache.sample import make_sample_parquet

    if f == 9:
        src, label, extra = ensure_dbn_sample(work, 360), "DBN sample, default features", ()
    else:
        src = work / f"parquet-{f}"
        if not (work / f"parquet-{f}.complete").exists():
            make_sample_parquet(src, n_bars=665_000, n_features=f)
            (work / f"parquet-{f}.complete").write_text("ok\n")
        label, extra = f"Parquet, {f} raw columns", ("--features", "raw")
    cache_path = work / f"cache-{f}.zarr"
    print(f"bench: build-cache F={f} ...", file=sys.stderr, flush=True)
    builds.append(measure_build(label, src, cache_path, *extra)[0])
    cache = open_cache(cache_path)
    raw = work / f"rows-{f}.f32"
    with open(raw, "wb") as fh:
        for s in range(cache.n_shards):
            fh.write(cache.read_rows(s * cache.shard_rows, min((s + 1) * cache.shard_rows, cache.n_bars)).tobytes())
    starts = work / f"starts-{f}.npy"
    np.save(starts, valid_ranges(cache, SEQ_LEN, HORIZON).starts())
    return {"F": f, "cache": str(cache_path), "raw": str(raw), "starts": str(starts), "n_bars": cache.n_bars,
            "n_windows": cache.n_windows(SEQ_LEN, HORIZON), "cache_bytes": _dir_bytes(cache_path),
            "raw_bytes": raw.stat().st_size}


def _ensure_scaled(work: Path, f: int, scale: int) -> Path:
    """The ``scale``x F=``f`` cache, built once from a generated Parquet table by build-cache, then reused."""
    from shardcache import open_cache
    from shardcache.errors import CacheError
    from shardcache.sample import make_sample_parquet

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
    for p in src.iterdir():
        p.unlink()
    src.rmdir()
    return path


def _scenarios(d: dict, args: argparse.Namespace) -> list[tuple[str, str, str, dict, int]]:
    """(key, kind, label, spec, bytes on disk) of every throughput scenario at one F."""
    base = {k: d[k] for k in ("F", "raw", "starts", "cache", "n_bars")}
    base.update(repeats=args.repeats, max_s=args.max_seconds, batches=args.batches, naive_windows=args.naive_windows,
                workers=0, proposed=False)
    f, raw, cache = d["F"], d["raw_bytes"], d["cache_bytes"]
    epoch = {"batches": 0, "max_s": 2 * args.max_seconds}
    return [
        ("A", "naive", f"A naive list F={f}", base, raw),
        ("B", "memmap", f"B memmap map-style F={f}", base, raw),
        ("C", "batched", f"C memmap batched F={f}", base, raw),
        ("D", "ram", f"D in-RAM gather F={f}", base, raw),
        ("E0", "stream", f"E WindowStream w=0 F={f}", {**base, **epoch}, cache),
        ("E2", "stream", f"E WindowStream w=2 F={f}", {**base, **epoch, "repeats": 1}, cache),
        ("E0*", "stream", f"E* proposed gather w=0 F={f}", {**base, **epoch, "proposed": True}, cache),
    ]


def _fmt_rss(row: Row) -> tuple[str, str]:
    p = row.prof
    rss, pss = f"{p.peak_rss_tree / MIB:,.0f}", "n/a" if p.peak_pss_tree is None else f"{p.peak_pss_tree / MIB:,.0f}"
    return rss, pss


def _main_table(rows: list[Row], data: dict[int, dict]) -> str:
    """The scenarios table: windows/s, ratio to C, memory, first batch, bytes on disk."""
    lines = ["| scenario | F | windows timed | windows/s | vs C | peak RSS MiB | peak PSS MiB | first batch s | on disk MiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, res = r.spec["F"], r.result
        c = next(x for x in rows if x.key == "C" and x.spec["F"] == f)
        rss, pss = _fmt_rss(r)
        first = f"{res['first_batch_s']:.3f}"
        if r.key == "A":
            n_all = data[f]["n_windows"]
            full_rss = res["rss_before_list"] + res["list_bytes"] / res["n_windows"] * n_all
            full_first = res["first_batch_s"] + res["list_s"] * (n_all / res["n_windows"] - 1)
            rss += f" (~{full_rss / GIB:,.1f} GiB for {n_all:,})"
            first += f" (~{full_first:,.0f} for all)"
        lines.append(f"| {r.label[:-len(f' F={f}')]} | {f} | {res['windows']:,} | {r.rate:,.0f} | {r.rate / c.rate:.2f}x | "
                     f"{rss} | {pss} | {first} | {r.disk / MIB:,.1f} |")
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _targets(rows: list[Row], scaling: list[Row]) -> list[tuple[str, str, str, bool]]:
    """(target, where, measured, passed) for every target and E variant."""
    out = []
    for r in (x for x in rows if x.key.startswith("E")):
        f = r.spec["F"]
        where = f"F={f}, {r.label.split(' F=')[0]}"
        for name, other, bound in TARGETS:
            base = next(x for x in rows if x.key == other and x.spec["F"] == f)
            out.append((name, where, f"{r.rate / base.rate:.2f}x", r.rate / base.rate >= bound))
        first = r.result["first_batch_s"]
        out.append((f"first batch <= {FIRST_BATCH_BOUND} s", where, f"{first:.3f} s", first <= FIRST_BATCH_BOUND))
        if f == 256:
            peak = r.prof.peak_rss_tree
            out.append(("peak RSS <= 0.5 GiB (665K x 256)", where, f"{peak / GIB:.3f} GiB RSS", peak <= RSS_BOUND))
            if r.key == "E2" and r.prof.peak_pss_tree is not None:
                pss = r.prof.peak_pss_tree
                out.append(("peak PSS <= 0.5 GiB (665K x 256)", where, f"{pss / GIB:.3f} GiB PSS", pss <= RSS_BOUND))
    for one, big in zip(scaling[::2], scaling[1::2]):
        growth = big.prof.peak_rss_tree / one.prof.peak_rss_tree - 1
        where = f"F=256, w={one.spec['workers']}, 1x vs {big.spec['scale']}x bars"
        out.append(("peak RSS within 10% at 10x bars", where, f"{growth:+.1%}", abs(growth) <= SCALE_TOLERANCE))
    return out


def _scaling_table(scaling: list[Row]) -> str:
    lines = ["| cache | bars | workers | batches | windows/s | peak RSS MiB | peak PSS MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in scaling:
        rss, pss = _fmt_rss(r)
        lines.append(f"| {Path(r.spec['cache']).name} | {r.spec['bars']:,} | {r.spec['workers']} | {r.spec['batches']} | "
                     f"{r.rate:,.0f} | {rss} | {pss} |")
    return "\n".join(lines)


def _read_table(probes: dict[str, dict], rows: list[Row]) -> str:
    """Zarr's read path: ms per shard under each setting, and decode's share of an E epoch."""
    base = probes["default"]["caches"]
    fs = sorted(base, key=int)
    lines = ["| read path (ms per whole shard, median) | " + " | ".join(f"F={f} ({base[f]['shard_rows']:,} rows, "
             f"{base[f]['shard_mib']:.1f} MiB)" for f in fs) + " |", "|---|" + "---:|" * len(fs)]

    def add(name: str, values: list[float]) -> None:
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")

    add(f"`Cache.read_rows`, default zarr config (inner chunks {'/'.join(str(base[f]['chunk_rows']) for f in fs)} rows)",
        [base[f]["read_rows_ms"] for f in fs])
    add("stream block: shard + 60-row overhang (reads 2 shards)", [base[f]["block_ms"] for f in fs])
    add("raw numcodecs: read object, crc32c, blosc-decode chunks (no zarr)", [base[f]["raw_ms"] for f in fs])
    for name, probe in probes.items():
        if name != "default":
            add(f"`read_rows` with {name}", [probe["caches"][f]["read_rows_ms"] for f in fs])
    for k in range(3):
        add("`read_rows`, inner chunk " + "/".join(f"{list(base[f]['chunk_ms'])[k]}" for f in fs) + " rows",
            [list(base[f]["chunk_ms"].values())[k] for f in fs])
    shares = []
    for f in fs:
        e0 = next(r for r in rows if r.key == "E0" and r.spec["F"] == int(f))
        n_blocks = -(-e0.spec["n_bars"] // base[f]["shard_rows"])
        shares.append(100 * n_blocks * base[f]["block_ms"] / 1e3 / (e0.result["windows"] / e0.rate))
    add("decode time of one epoch's blocks, % of an E w=0 epoch (in the reader thread)", shares)
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("data/bench"), help="data, caches and results (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every measurement as JSON")
    p.add_argument("--plot", type=Path, default=PLOT_PATH, help="RSS-over-time PNG, A vs E at F=256 (default: %(default)s)")
    p.add_argument("--features", default="9,256", help="feature counts to run (default: %(default)s)")
    p.add_argument("--naive-windows", type=int, default=20_000, help="windows A builds (default: %(default)s)")
    p.add_argument("--batches", type=int, default=600, help="batches per pass of B, C, D (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="passes per scenario, best one kept (default: %(default)s)")
    p.add_argument("--max-seconds", type=float, default=15.0, help="no new pass after this long (E: twice) (default: %(default)s)")
    p.add_argument("--scale", type=int, default=10, help="bars multiple of the F=256 memory-scaling cache; 1 skips it (default: %(default)s)")
    p.add_argument("--scale-batches", type=int, default=1000, help="batches streamed per scaling run (default: %(default)s)")
    p.add_argument("--scenario", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run everything, print the report (markdown), write JSON and the plot; exit 1 if a target fails."""
    args = _parser().parse_args(argv)
    if args.scenario:
        run_scenario(json.loads(args.scenario))
        return 0
    t_start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    builds: list[BuildResult] = []
    data = {f: _prepare(args.work, f, builds) for f in sorted(int(x) for x in args.features.split(","))}
    rows = []
    for d in data.values():
        for key, kind, label, spec, disk in _scenarios(d, args):
            rows.append(Row(key, label, spec, *_run(kind, label, spec, args.work), disk))
    scaling: list[Row] = []
    if args.scale > 1 and 256 in data:
        big = _ensure_scaled(args.work, 256, args.scale)
        for workers in (0, 2):
            for path, scale in ((data[256]["cache"], 1), (str(big), args.scale)):
                spec = {"F": 256, "cache": path, "bars": 665_000 * scale, "scale": scale, "workers": workers,
                        "batches": args.scale_batches, "repeats": 1, "max_s": 0, "proposed": False}
                label = f"E scaling w={workers} {scale}x"
                scaling.append(Row("S", label, spec, *_run("stream", label, spec, args.work), _dir_bytes(Path(path))))
    probes = {}
    caches = [d["cache"] for d in data.values()]
    variants = {"default": {}, "async.concurrency=1": {"ZARR_ASYNC__CONCURRENCY": "1"},
                "async.concurrency=64": {"ZARR_ASYNC__CONCURRENCY": "64"},
                "threading.max_workers=1": {"ZARR_THREADING__MAX_WORKERS": "1"},
                "codec_pipeline.batch_size=8": {"ZARR_CODEC_PIPELINE__BATCH_SIZE": "8"}}
    for name, env in variants.items():
        spec = {"caches": caches, "shards": 10, "full": name == "default", "tmp": str(args.work)}
        probes[name] = _run("read", f"read path {name}", spec, args.work, env)[0]

    targets = _targets(rows, scaling)
    report = [
        f"shardcache benchmark, {time.strftime('%Y-%m-%d')}: {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / GIB:.0f} GiB RAM, {platform.python_implementation()} {platform.python_version()}, "
        f"torch {torch.__version__}; seq_len {SEQ_LEN}, batch {BATCH}, shuffle on; 1 torch thread per process; "
        f"total run {time.perf_counter() - t_start:.0f} s.",
        "", "### Builds", "", build_table(builds),
        "", "### Loaders (same bars, same run)", "", _main_table(rows, data),
        "", f"A ran on {args.naive_windows:,} windows; `~` extrapolates its memory and first batch linearly to every "
        "window. B-D: best of the passes over the batches shown; E: full epochs. RSS: process tree (workers included); "
        "PSS counts shared pages once. B and C map the raw file: their RSS includes the page-cache pages they touched.",
    ]
    if scaling:
        report += ["", "### Streaming memory at 1x and 10x the bars (F=256)", "", _scaling_table(scaling)]
    report += ["", "### Zarr read path", "", _read_table(probes, rows),
               "", "### Targets", "", "| target | where | measured | result |", "|---|---|---:|---|"]
    report += [f"| {name} | {where} | {value} | {_verdict(ok)} |" for name, where, value, ok in targets]
    print("\n".join(report))
    pick = [r for r in rows if r.spec["F"] == max(data) and r.key in ("A", "E0", "E2")]
    if pick and args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        for r in pick:
            r.prof.label = r.label
        fig = plot([r.prof for r in pick])
        fig.set_size_inches(8, 4.5)
        fig.savefig(args.plot, dpi=80)
        print(f"\nwrote {args.plot} ({args.plot.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"date": time.strftime("%Y-%m-%d"), "cpus": psutil.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
                   "args": {k: str(v) for k, v in vars(args).items()}, "builds": [b.to_dict() for b in builds],
                   "data": data, "rows": [r.to_dict() for r in rows], "scaling": [r.to_dict() for r in scaling],
                   "read_path": probes, "targets": [dict(zip(("target", "where", "measured", "pass"), t)) for t in targets]}
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0 if all(t[3] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
