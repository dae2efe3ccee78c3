"""Prove it with numbers: the team's naive loader, memmap and in-RAM baselines and ``WindowStream``.

One run measures, on the same bars, at F=9 (the default features of the ~665K-bar DBN
sample), F=64 and F=256 (665K-bar Parquet tables of that many numeric columns, ``--features raw``):

A  naive: the team's loader, a Python list of ``(torch.tensor(bars[p:p+60]), target)`` pairs
   and ``DataLoader(list, batch_size=256, shuffle=True)``. Run on the first
   ``--naive-windows`` windows only; its memory and time to first batch are extrapolated
   linearly to every window (marked ``~``).
B  memmap, map-style: ``np.memmap`` of the raw float32 rows, ``__getitem__`` returns
   ``torch.from_numpy(mm[p:p+60])`` and the target row, ``DataLoader(shuffle=True, batch_size=256)``.
C  memmap, batched: one numpy fancy index per batch of 256 random starts into a strided
   ``(n, 60, F)`` view of the same memmap (no DataLoader: batches are made whole).
D  in-RAM gather ceiling: the whole array in RAM, preallocated outputs, one thread,
   ``torch.index_select(torch.as_strided(t, (n, 60, F), (F, F, 1)), 0, idx, out=buf)``.
E  shardcache: ``WindowStream`` over the compressed cache: a full epoch iterated in-process
   (``for x, y in ds``, the stream's own reader thread decodes ahead), and ``--worker-batches``
   batches of ``DataLoader(ds, batch_size=None, num_workers=2)``; EL the same batches through
   ``ds.loader(num_workers=2)``. Workers are judged against E in-process (>= 0.7x).
ER E resident: ``memory_budget="auto"`` holds the split's bars, so one stream serves two epochs:
   the first decodes each block once (as E), the second only gathers from the decoded bars
   (no thread, no decode). Its windows/s is the second epoch's; the first is printed beside it.
EM E over a mix: the same bars built as two caches (the DBN sample's two halves of the year, or
   the Parquet table's two pairs of symbols), ``WindowStream([a, b], ...)`` in-process, every
   window of both once. Its epochs alternate, in one process, with epochs of the one cache
   (``--mix-epochs`` pairs a round, each pair with one seed): windows/s is the mix's median
   epoch, and the target (>= 0.9x) the median of the pairs' ratios, which a busy machine moves
   far less than two processes' best rounds.

Every scenario serves the cache's valid windows (60 bars inside one segment, target row
``p + 60``), shuffled (B-D globally, E by shard pools, its design), in batches of 256, for a
full epoch (A: its list; E with workers: ``--worker-batches`` batches). Each
run is its own process under ``tools/profile_memory.py``'s ``profile()``: RSS summed over
the process tree (DataLoader workers included), PSS alongside. The machine is shared, so
the scenarios run in ``--rounds`` interleaved rounds; windows/s is the best round's
(windows after the first batch over the time after it), first batch the worst round's
(from opening the data to the first batch in hand), memory the highest peak. Every process
runs with ``OMP_NUM_THREADS=MKL_NUM_THREADS=1`` and ``torch.set_num_threads(1)``; blosc and
zarr keep their default threads (only E decodes). The consumer only counts windows.

Also measured: the builds (bars/s, peak RSS, size against raw float32), streaming memory at
1x and ``--scale``x the bars (F=256; that cache is built once and reused), zarr's read path
(zarr's own read of a shard under several ``zarr.config`` settings against
``Cache.read_rows``, shardcache's direct shard decoder, and inner chunk sizes) and the cost of handing a batch over from a DataLoader worker.

Usage (from the repository root; about 8 minutes on 2 cores, more on the first run)::

    .venv/bin/python tools/bench.py --json out/bench.json

The first batch phase by phase (open, plan, decode, gather, hand-over), against another checkout:
``tools/bench_first.py``; the stream at 1 and 2 cores: ``tools/bench_cores.py``.

``--peers`` runs instead E against LitData and MosaicML Streaming, one sample per window
(``tools/bench_peers.py``), in the peers' own venv: ``make bench-peers``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
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
from bench_build import (
    BuildResult,
    build_table,
    dir_bytes,
    ensure_mix_caches,
    ensure_scaled_cache,
    prepare_data,
    read_probe,
    read_table,
)
from bench_harness import BATCH, GIB, HORIZON, SEQ_LEN, Row, run_profiled, timed
from profile_memory import MIB, plot

__all__ = ["MemmapWindows", "main", "run_scenario"]

TARGETS = (("E >= 1.0x C", "C", 1.0), ("E >= 3x B", "B", 3.0), ("E >= 0.7x D", "D", 0.7))
RSS_BOUND, SCALE_TOLERANCE, FIRST_BATCH_BOUND = 0.5 * GIB, 0.10, 0.5
WORKERS_BOUND = 0.7  # DataLoader workers against the same stream in-process (issue #14)
MIX_BOUND = 0.9  # a stream of two caches against one cache of the same bars, in-process (issue #23)
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


def _permuted(spec: dict) -> np.ndarray:
    """This round's random order of the valid starts (a full epoch)."""
    starts = np.load(spec["starts"])
    return starts[np.random.default_rng([7, spec["round"]]).permutation(len(starts))]


def _naive(spec: dict) -> dict[str, Any]:
    """A: every window as its own tensor in a Python list, then a shuffling DataLoader."""
    proc = psutil.Process()
    t0 = time.perf_counter()
    bars = np.fromfile(spec["raw"], np.float32).reshape(-1, spec["F"])  # the naive loader holds every bar
    starts = np.load(spec["starts"])[: spec["naive_windows"]]
    rss0, t1 = proc.memory_info().rss, time.perf_counter()
    windows = [(torch.tensor(bars[p : p + SEQ_LEN]), torch.tensor(bars[p + SEQ_LEN])) for p in starts]
    t2, rss1 = time.perf_counter(), proc.memory_info().rss

    out = timed(lambda: iter(DataLoader(windows, batch_size=BATCH, shuffle=True)))
    out.update(load_s=t1 - t0, list_s=t2 - t1, list_bytes=rss1 - rss0, rss_before_list=rss0, n_windows=len(starts))
    out["first_batch_s"] += t2 - t0
    return out


def _memmap(spec: dict) -> dict[str, Any]:
    """B: map-style Dataset over a memmap with DataLoader's shuffling and collation."""
    starts = np.load(spec["starts"])

    def open_data() -> Iterator[tuple]:
        rows = np.memmap(spec["raw"], np.float32, "c", shape=(spec["n_bars"], spec["F"]))
        return iter(DataLoader(MemmapWindows(rows, starts), batch_size=BATCH, shuffle=True))

    return timed(open_data)


def _batched(spec: dict) -> dict[str, Any]:
    """C: the memmap gathered with one numpy fancy index per batch."""
    perm, n, f = _permuted(spec), spec["n_bars"], spec["F"]

    def open_data() -> Iterator[tuple]:
        rows = np.asarray(np.memmap(spec["raw"], np.float32, "r", shape=(n, f)))
        view = np.lib.stride_tricks.as_strided(rows, (n - SEQ_LEN + 1, SEQ_LEN, f), (4 * f, 4 * f, 4), writeable=False)
        for b in range(0, len(perm), BATCH):
            idx = perm[b : b + BATCH]
            yield torch.from_numpy(view[idx]), torch.from_numpy(rows[idx + SEQ_LEN])

    return timed(open_data)


def _ram(spec: dict) -> dict[str, Any]:
    """D: the gather ceiling, whole array in RAM, preallocated outputs, one thread."""
    perm, n, f = torch.from_numpy(_permuted(spec)), spec["n_bars"], spec["F"]

    def open_data() -> Iterator[tuple]:
        t = torch.from_numpy(np.fromfile(spec["raw"], np.float32).reshape(n, f))
        win = torch.as_strided(t, (n - SEQ_LEN + 1, SEQ_LEN, f), (f, f, 1))
        buf, ybuf = torch.empty(BATCH, SEQ_LEN, f), torch.empty(BATCH, f)
        for b in range(0, len(perm), BATCH):
            idx = perm[b : b + BATCH]
            m = len(idx)
            torch.index_select(win, 0, idx, out=buf[:m])
            torch.index_select(t, 0, idx + SEQ_LEN, out=ybuf[:m])
            yield buf[:m], ybuf[:m]

    return timed(open_data)


def _stream(spec: dict) -> dict[str, Any]:
    """E: the stream in-process, or through ``DataLoader(batch_size=None)`` workers; a full epoch or ``batches``.

    With ``budget`` (ER: ``memory_budget``, the split's bars resident) it times two epochs of one
    stream: the first decodes, the second only gathers; windows/s is the second's."""
    streams: list[WindowStream] = []

    def open_data() -> Iterator[tuple]:
        ds = WindowStream(
            spec["cache"],
            SEQ_LEN,
            horizon=HORIZON,
            split="all",
            batch_size=BATCH,
            shuffle=True,
            seed=spec["round"],
            memory_budget=spec.get("budget"),
        )
        streams.append(ds)
        if not spec["workers"]:
            loader: Any = ds
        elif spec.get("loader"):
            loader = ds.loader(num_workers=spec["workers"])
        else:
            loader = DataLoader(ds, batch_size=None, num_workers=spec["workers"])
        yield from itertools.islice(loader, spec["batches"] or None)

    out = timed(open_data)
    ds = streams[0]
    with ds:
        if spec.get("budget") is not None:
            assert ds.resident, f"memory_budget {spec['budget']} does not hold the split's bars"
            second = timed(lambda: iter(ds))
            out.update(
                epoch1_windows_per_s=out["windows_per_s"],
                epoch2_windows_per_s=second["windows_per_s"],
                epoch2_first_batch_s=second["first_batch_s"],
                windows_per_s=second["windows_per_s"],
            )
    return out


def _mix(spec: dict) -> dict[str, Any]:
    """EM: epochs over the two caches and over the one cache of the same bars, alternated pair by pair."""

    def epoch(src: Any, seed: int) -> dict[str, Any]:
        ds = WindowStream(src, SEQ_LEN, horizon=HORIZON, split="all", batch_size=BATCH, shuffle=True, seed=seed)
        with ds:
            return timed(lambda: iter(ds))

    pairs = []
    for k in range(spec["epochs"]):
        seed = spec["round"] * spec["epochs"] + k
        pairs.append((epoch(spec["cache"], seed), epoch(spec["one"], seed)))
    two, one = ([p[i]["windows_per_s"] for p in pairs] for i in (0, 1))
    return {
        "windows_per_s": float(np.median(two)),
        "first_batch_s": max(p[0]["first_batch_s"] for p in pairs),
        "windows": pairs[0][0]["windows"],
        "one_windows_per_s": float(np.median(one)),
        "ratios": [a / b for a, b in zip(two, one)],
    }


SCENARIOS: dict[str, Callable[[dict], dict[str, Any]]] = {
    "naive": _naive,
    "memmap": _memmap,
    "batched": _batched,
    "ram": _ram,
    "stream": _stream,
    "mix": _mix,
    "read": read_probe,
}


def run_scenario(spec: dict) -> None:
    """Child process entry: one thread for torch, run the scenario, write its result as JSON."""
    torch.set_num_threads(1)
    if spec["kind"] not in SCENARIOS:  # a peer's scenario: needs the peers' venv (make bench-peers)
        from bench_peers import PEER_SCENARIOS

        SCENARIOS.update(PEER_SCENARIOS)
    result = {"rss_after_imports": psutil.Process().memory_info().rss, **SCENARIOS[spec["kind"]](spec)}
    Path(spec["out"]).write_text(json.dumps(result))


# -- parent: data, runs, tables (the runs and rows: bench_harness.py) ---------------------------
def _scenarios(d: dict, args: argparse.Namespace) -> list[tuple[str, str, str, dict, int]]:
    """(key, kind, label, spec, bytes on disk) of every throughput scenario at one F."""
    base = {k: d[k] for k in ("F", "raw", "starts", "cache", "n_bars")}
    base.update(batches=0, naive_windows=args.naive_windows, workers=0)
    f, raw, cache = d["F"], d["raw_bytes"], d["cache_bytes"]
    w2 = {"batches": args.worker_batches, "workers": 2}
    return [
        ("A", "naive", f"A naive list F={f}", base, raw),
        ("B", "memmap", f"B memmap map-style F={f}", base, raw),
        ("C", "batched", f"C memmap batched F={f}", base, raw),
        ("D", "ram", f"D in-RAM gather F={f}", base, raw),
        ("E0", "stream", f"E WindowStream w=0 F={f}", base, cache),
        ("E2", "stream", f"E WindowStream w=2 F={f}", {**base, **w2}, cache),
        ("EL", "stream", f"E stream.loader(2) F={f}", {**base, **w2, "loader": True}, cache),
        ("ER", "stream", f"E WindowStream resident F={f}", {**base, "budget": "auto"}, cache),
        (
            "EM",
            "mix",
            f"E WindowStream of 2 caches F={f}",
            {**base, "cache": d["mix"], "one": d["cache"], "epochs": args.mix_epochs},
            d["mix_bytes"],
        ),
    ]


def _fmt_rss(row: Row) -> tuple[str, str]:
    pss = row.peak_pss
    return f"{row.prof.peak_rss_tree / MIB:,.0f}", "n/a" if pss is None else f"{pss / MIB:,.0f}"


def _main_table(rows: list[Row], data: dict[int, dict]) -> str:
    """The scenarios table: windows/s, ratio to C, memory, first batch, bytes on disk."""
    lines = [
        "| scenario | F | windows timed | windows/s | vs C | peak RSS MiB | peak PSS MiB | first batch s | on disk MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        f, res = r.spec["F"], r.result
        c = next(x for x in rows if x.key == "C" and x.spec["F"] == f)
        rss, pss = _fmt_rss(r)
        first = f"{r.first_s:.3f}"
        label = r.label[: -len(f" F={f}")]
        if r.key == "ER":
            e1 = max(x["epoch1_windows_per_s"] for x in r.results)
            label += f", epoch 2 (epoch 1: {e1:,.0f} windows/s, {e1 / c.rate:.2f}x C)"
        if r.key == "A":
            n_all = data[f]["n_windows"]
            full_rss = res["rss_before_list"] + res["list_bytes"] / res["n_windows"] * n_all
            full_first = r.first_s + res["list_s"] * (n_all / res["n_windows"] - 1)
            rss += f" (~{full_rss / GIB:,.1f} GiB for {n_all:,})"
            first += f" (~{full_first:,.0f} for all)"
        lines.append(
            f"| {label} | {f} | {res['windows']:,} | {r.rate:,.0f} | {r.rate / c.rate:.2f}x | "
            f"{rss} | {pss} | {first} | {r.disk / MIB:,.1f} |"
        )
    return "\n".join(lines)


def _targets(rows: list[Row], scaling: list[Row]) -> list[tuple[str, str, str, bool]]:
    """(target, where, measured, passed) for every target and E variant."""
    out = []
    for r in (x for x in rows if x.key.startswith("E")):
        f = r.spec["F"]
        where = f"F={f}, {r.label.split(' F=')[0]}"
        for name, other, bound in TARGETS:
            base = next(x for x in rows if x.key == other and x.spec["F"] == f)
            out.append((name, where, f"{r.rate / base.rate:.2f}x", r.rate / base.rate >= bound))
        if r.key == "EM":  # the median of the pairs' ratios, every round's
            ratio = float(np.median([q for res in r.results for q in res["ratios"]]))
            one = max(res["one_windows_per_s"] for res in r.results)
            out.append(
                (
                    f"2 caches >= {MIX_BOUND}x 1 cache",
                    where,
                    f"{ratio:.2f}x (median of paired epochs; 1 cache {one:,.0f}/s)",
                    ratio >= MIX_BOUND,
                )
            )
        if r.spec["workers"]:
            e0 = next(x for x in rows if x.key == "E0" and x.spec["F"] == f)
            ratio = r.rate / e0.rate
            out.append(
                (f"workers >= {WORKERS_BOUND}x in-process", where, f"{ratio:.2f}x E w=0", ratio >= WORKERS_BOUND)
            )
        first = r.first_s
        out.append((f"first batch <= {FIRST_BATCH_BOUND} s", where, f"{first:.3f} s", first <= FIRST_BATCH_BOUND))
        if f == 256 and r.key != "ER":  # ER holds the split's bars by design (its memory_budget)
            peak = r.prof.peak_rss_tree
            out.append(("peak RSS <= 0.5 GiB (665K x 256)", where, f"{peak / GIB:.3f} GiB RSS", peak <= RSS_BOUND))
            if r.spec["workers"] and r.peak_pss is not None:
                pss = r.peak_pss
                out.append(("peak PSS <= 0.5 GiB (665K x 256)", where, f"{pss / GIB:.3f} GiB PSS", pss <= RSS_BOUND))
    for one, big in zip(scaling[::2], scaling[1::2]):
        growth = big.prof.peak_rss_tree / one.prof.peak_rss_tree - 1
        where = f"F=256, {one.label.split(' 1x')[0]}, 1x vs {big.spec['scale']}x"
        out.append(("peak RSS within 10% at 10x bars", where, f"{growth:+.1%}", abs(growth) <= SCALE_TOLERANCE))
    return out


def _scaling_table(scaling: list[Row], imports: dict[str, int]) -> str:
    """Streaming memory per cache size, and the RSS a process has before it streams anything."""
    lines = [
        "| stream | cache | bars | workers | batches | windows/s | peak RSS MiB | peak PSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in scaling:
        rss, pss = _fmt_rss(r)
        lines.append(
            f"| E WindowStream | {Path(r.spec['cache']).name} | {r.spec['bars']:,} | {r.spec['workers']} | "
            f"{r.spec['batches']} | {r.rate:,.0f} | {rss} | {pss} |"
        )
    lines += ["", "RSS after imports alone: " + ", ".join(f"`{k}` {v / MIB:.0f} MiB" for k, v in imports.items()) + "."]
    return "\n".join(lines)


def _import_rss() -> dict[str, int]:
    """RSS of a fresh interpreter after importing torch, torch with zarr, and torch with shardcache's stream."""
    code = "import psutil, {}; print(psutil.Process().memory_info().rss)"
    mods = ("torch", "torch, zarr, fsspec", "torch, shardcache.read.stream")
    return {
        m: int(
            subprocess.run([sys.executable, "-c", code.format(m)], capture_output=True, text=True, check=True).stdout
        )
        for m in mods
    }


def _plot(naive: Row, stream: Row, n_all: int, path: Path) -> None:
    """RSS over time of the naive list and of WindowStream (their highest-peak rounds), < 150 KB."""
    res = naive.result
    full = (res["rss_before_list"] + res["list_bytes"] / res["n_windows"] * n_all) / GIB
    naive.prof.label = f"A naive list, {res['n_windows']:,} windows"
    stream.prof.label = f"E WindowStream, one epoch of {stream.result['windows']:,} windows"
    fig = plot([naive.prof, stream.prof])
    fig.set_size_inches(8, 4.5)
    ax = fig.axes[0]
    ax.set_title(f"Process RSS over time, F={stream.spec['F']}, seq_len {SEQ_LEN} (tools/bench.py)")
    ax.annotate(
        f"naive, all {n_all:,} windows: ~{full:.1f} GiB (extrapolated)",
        xy=(0.5, 0.9),
        xycoords="axes fraction",
        fontsize="small",
        color="C0",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--work", type=Path, default=Path("data/bench"), help="data, caches and results (default: %(default)s)"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write every measurement as JSON")
    p.add_argument(
        "--plot", type=Path, default=PLOT_PATH, help="RSS-over-time PNG, A vs E at F=256 (default: %(default)s)"
    )
    p.add_argument("--features", default="9,64,256", help="feature counts to run (default: %(default)s)")
    p.add_argument("--naive-windows", type=int, default=20_000, help="windows A builds (default: %(default)s)")
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds over all scenarios, interleaved (default: %(default)s)"
    )
    p.add_argument(
        "--worker-batches", type=int, default=2000, help="batches per E run with 2 workers (default: %(default)s)"
    )
    p.add_argument(
        "--mix-epochs",
        type=int,
        default=5,
        help="epoch pairs (2 caches, 1 cache) per round of EM (default: %(default)s)",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=10,
        help="bars multiple of the F=256 memory-scaling cache; 1 skips it (default: %(default)s)",
    )
    p.add_argument(
        "--scale-batches", type=int, default=600, help="batches streamed per scaling run (default: %(default)s)"
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="instead: E against LitData and MosaicML Streaming (tools/bench_peers.py; make bench-peers)",
    )
    p.add_argument(
        "--peer-windows",
        type=int,
        default=131_072,
        help="windows written to each peer, one sample each; 0: all (default: %(default)s)",
    )
    p.add_argument("--scenario", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run everything, print the report (markdown), write JSON and the plot; exit 1 if a target fails."""
    args = _parser().parse_args(argv)
    if args.scenario:
        run_scenario(json.loads(args.scenario))
        return 0
    if args.peers:
        from bench_peers import peers_main

        return peers_main(args)
    t_start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    builds: list[BuildResult] = []
    data = {
        f: prepare_data(args.work, f, builds, SEQ_LEN, HORIZON)
        for f in sorted(int(x) for x in args.features.split(","))
    }
    for f, d in data.items():  # the same bars as two caches (EM)
        d["mix"] = ensure_mix_caches(args.work, f)
        d["mix_bytes"] = sum(dir_bytes(Path(p)) for p in d["mix"])
    table: dict[tuple[int, str], Row] = {}
    for rnd in range(args.rounds):
        for d in data.values():
            for key, kind, label, spec, disk in _scenarios(d, args):
                row = table.setdefault((d["F"], key), Row(key, label, spec, disk))
                row.add(*run_profiled(kind, f"{label} #{rnd + 1}", {**spec, "round": rnd}, args.work))
    rows = list(table.values())
    scaling: list[Row] = []
    if args.scale > 1 and 256 in data:
        big = ensure_scaled_cache(args.work, 256, args.scale)
        for workers in (0, 2):  # one round: memory varies less than speed
            for path, scale in ((data[256]["cache"], 1), (str(big), args.scale)):
                spec = {
                    "F": 256,
                    "cache": path,
                    "bars": 665_000 * scale,
                    "scale": scale,
                    "workers": workers,
                    "batches": args.scale_batches,
                    "round": 0,
                }
                label = f"E w={workers} {scale}x"
                scaling.append(Row("S", label, spec, dir_bytes(Path(path))))
                scaling[-1].add(*run_profiled("stream", label, spec, args.work))
    probes = {}
    caches = [d["cache"] for d in data.values()]
    variants = {
        "default": {},
        "async.concurrency=1": {"ZARR_ASYNC__CONCURRENCY": "1"},
        "async.concurrency=64": {"ZARR_ASYNC__CONCURRENCY": "64"},
        "threading.max_workers=1": {"ZARR_THREADING__MAX_WORKERS": "1"},
        "codec_pipeline.batch_size=8": {"ZARR_CODEC_PIPELINE__BATCH_SIZE": "8"},
    }
    for name, env in variants.items():
        spec = {"caches": caches, "shards": 10, "full": name == "default", "tmp": str(args.work), "seq_len": SEQ_LEN}
        probes[name] = run_profiled("read", f"read path {name}", spec, args.work, env)[0]

    targets = _targets(rows, scaling)
    report = [
        (
            f"shardcache benchmark, {time.strftime('%Y-%m-%d')}: {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / GIB:.0f} GiB RAM, {platform.python_implementation()} {platform.python_version()}, "
            f"torch {torch.__version__}; seq_len {SEQ_LEN}, batch {BATCH}, shuffle on; 1 torch thread per process; "
            f"total run {time.perf_counter() - t_start:.0f} s."
        ),
        "",
        "### Builds",
        "",
        build_table(builds),
        "",
        "### Loaders (same bars, same run)",
        "",
        _main_table(rows, data),
        "",
        (
            f"A ran on {args.naive_windows:,} windows; `~` extrapolates its memory and first batch linearly to every "
            f"window. {args.rounds} interleaved rounds: windows/s is the best round's, first batch the worst, memory the "
            "highest peak. RSS: process tree (workers included); PSS counts shared pages once. B and C map the raw file: "
            "their RSS includes the page-cache pages they touched. Every process starts with torch and shardcache imported."
        ),
    ]
    if scaling:
        report += [
            "",
            f"### Streaming memory at 1x and {args.scale}x the bars (F=256)",
            "",
            _scaling_table(scaling, _import_rss()),
        ]
    report += [
        "",
        "### Zarr read path",
        "",
        read_table(
            probes, {r.spec["F"]: (r.result["windows"] / r.rate, r.spec["n_bars"]) for r in rows if r.key == "E0"}
        ),
        "",
        "### Targets",
        "",
        "| target | where | measured | result |",
        "|---|---|---:|---|",
    ]
    report += [f"| {name} | {where} | {value} | {'PASS' if ok else 'FAIL'} |" for name, where, value, ok in targets]
    print("\n".join(report))
    pick = {r.key: r for r in rows if r.spec["F"] == max(data) and r.key in ("A", "E0")}
    if len(pick) == 2 and args.plot:
        _plot(pick["A"], pick["E0"], data[max(data)]["n_windows"], args.plot)
        print(f"\nwrote {args.plot} ({args.plot.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "date": time.strftime("%Y-%m-%d"),
            "cpus": psutil.cpu_count(),
            "ram_bytes": psutil.virtual_memory().total,
            "args": {k: str(v) for k, v in vars(args).items()},
            "builds": [b.to_dict() for b in builds],
            "data": data,
            "rows": [r.to_dict() for r in rows],
            "scaling": [r.to_dict() for r in scaling],
            "read_path": probes,
            "targets": [dict(zip(("target", "where", "measured", "pass"), t)) for t in targets],
        }
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0 if all(t[3] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
