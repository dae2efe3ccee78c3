"""``bench.py train``: does a training loop notice the loader? A real LSTM loop fed by ``WindowStream``.

The same loop (an LSTM, hidden 64 at F<=16 and ``--wide-hidden`` above, a linear head, Adam, MSE on the next bar;
torch's default threads) runs ``--batches`` steps per scenario, each in its own profiled process, interleaved over
``--rounds``: **model** the model alone on the same batches taken into RAM first; **stream** ``for x, y in
WindowStream(cache, 60, split="train", batch_size=256, shuffle=True)``; **dataloader** ``DataLoader(stream,
batch_size=None, num_workers=2)``; **loader** ``stream.loader(num_workers=2)``; **-1t** the same after
``torch.set_num_threads(1)``. Same batches and initial weights everywhere. Wall s runs from ``iter()`` (first batch and
worker start-up count); x model is the round's wall over its model's (model-1t for -1t); usage is ``getrusage`` over
the loop (reaped workers included); peak RSS the tree's. F=9 is the demo cache (made when missing), wider F
``WORK/train-<F>.zarr`` from the 665K-bar Parquet table; ``--busy N`` runs beside N processes spinning on a core each.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import itertools
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_harness import MIB, load, parser, run, table, write_json

__all__ = ["CHILDREN", "COMMANDS", "SCENARIOS", "main"]

SEQ_LEN, BATCH, WORKERS = 60, 256, 2
SPLIT = "train=0.8,val=0.1,test=0.1"  # the demo's split
SCENARIOS = ("model", "stream", "dataloader", "loader", "model-1t", "stream-1t", "dataloader-1t", "loader-1t")
_RUSAGE = ("ru_utime", "ru_stime", "ru_minflt", "ru_majflt", "ru_nivcsw", "ru_nvcsw")


def _usage() -> dict[str, float]:
    """This process's and its reaped children's resource usage, summed."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {k: getattr(me, k) + getattr(kids, k) for k in _RUSAGE}


def _loop(spec: dict) -> dict[str, Any]:
    """Train ``spec["steps"]`` steps fed as ``spec["kind"]`` says; return the figures."""
    import psutil
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from shardcache import WindowStream

    class LoopModel(nn.Module):
        """An LSTM over the window and a linear head on its last state: the user's first model."""

        def __init__(self, n_features: int, n_targets: int, hidden: int) -> None:
            super().__init__()
            self.lstm, self.head = nn.LSTM(n_features, hidden, batch_first=True), nn.Linear(hidden, n_targets)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(x)[0][:, -1])

    kind, steps = spec["kind"], spec["steps"]
    feed = kind.removesuffix("-1t")
    if feed != kind:
        torch.set_num_threads(1)  # the user's choice, made before the stream exists
    stream = WindowStream(spec["cache"], SEQ_LEN, horizon=1, split="train", batch_size=BATCH, shuffle=True)
    source: Any = stream
    if feed == "model":
        source = [(x.clone(), y.clone()) for x, y in itertools.islice(stream, steps)]
        stream.close()
    elif feed == "dataloader":
        source = DataLoader(stream, batch_size=None, num_workers=WORKERS)
    elif feed == "loader":
        source = stream.loader(num_workers=WORKERS)
    gc.collect()
    u0, t0 = _usage(), time.perf_counter()
    it, threads, first_s, loss = iter(source), 0, 0.0, 0.0
    for i in range(steps):
        x, y = next(it)
        if not i:  # the model is made from the first batch's shapes, after the loader took its seeds
            first_s = time.perf_counter() - t0
            torch.manual_seed(0)
            model = LoopModel(x.shape[-1], y.shape[-1], spec["hidden"])
            opt, loss_fn = torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss()
        if i == steps // 2:
            threads = psutil.Process().num_threads()
        opt.zero_grad(set_to_none=True)
        out = loss_fn(model(x), y)
        out.backward()
        opt.step()
        loss = float(out.detach())
    wall = time.perf_counter() - t0
    del it  # joins the DataLoader workers, so their usage is counted
    gc.collect()
    stream.close()
    u1 = _usage()
    out = {"kind": kind, "F": int(x.shape[-1]), "steps": steps, "wall_s": wall, "first_batch_s": first_s}
    out |= {"torch_threads": torch.get_num_threads(), "threads": threads, "loss": loss}
    return out | {k[3:]: u1[k] - u0[k] for k in _RUSAGE}


CHILDREN = dict.fromkeys(SCENARIOS, _loop)


def _caches(features: list[int], sample: Path, work: Path) -> dict[int, str]:
    """The cache for each F: the demo cache at F=9, a raw-feature Parquet build at wider F (built once)."""
    from bench_builds import ensure_parquet_sample

    from shardcache import CacheError, open_cache

    caches = {}
    for f in features:
        path = sample / "cache.zarr" if f == 9 else work / f"train-{f}.zarr"
        try:
            open_cache(path)
        except CacheError:  # missing or incomplete: (re)build it
            print(f"bench train: building {path} ...", file=sys.stderr, flush=True)
            bin_ = Path(sys.executable).parent
            cmd = [bin_ / "shardcache", "demo", "--dir", sample]
            if f != 9:
                cmd = [bin_ / "build-cache", ensure_parquet_sample(work, f), "--out", path, "--features", "raw"]
                cmd += ["--split", SPLIT, "--overwrite", "-q"]
            subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)
        caches[f] = str(path)
    return caches


def _spin() -> None:
    """A busy neighbour: one core's worth of pure-Python work, until it is terminated."""
    while True:
        pass


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` spinning processes for the duration (none for 0): a machine another job shares."""
    procs = [multiprocessing.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _table(results: list[dict]) -> str:
    """One row per (scenario, F): ranges over the rounds, usage of the best round."""
    base = {(r["F"], r["round"], r["kind"]): r["wall_s"] for r in results if r["kind"].startswith("model")}
    rows = []
    for f in sorted({r["F"] for r in results}):
        for kind in SCENARIOS:
            if not (runs := [r for r in results if r["F"] == f and r["kind"] == kind]):
                continue
            best, ref = min(runs, key=lambda r: r["wall_s"]), "model-1t" if kind.endswith("-1t") else "model"
            ratios = [r["wall_s"] / base[f, r["round"], ref] for r in runs if (f, r["round"], ref) in base]
            row = [kind, f, best["steps"], _span([r["wall_s"] for r in runs], ".1f")]
            row += [_span(ratios, ".2f") + "x" if ratios else "-", f"{best['first_batch_s']:.2f}"]
            row += [f"{best['utime']:.1f}", f"{best['stime']:.1f}", f"{best['minflt']:,.0f}", f"{best['nivcsw']:,.0f}"]
            rows.append(
                [*row, best["threads"], best["torch_threads"], f"{max(r['peak_rss'] for r in runs) / MIB:,.0f}"]
            )
    head = ["scenario", "F", "steps", "wall s", "x model", "first batch s", "user s", "sys s", "minor faults"]
    return table([*head, "invol. ctx sw", "threads", "torch threads", "peak RSS MiB"], rows)


def main(argv: list[str]) -> int:
    """Every scenario at every F over the rounds; the table (and JSON)."""
    p = parser(
        *("train", __doc__, "work", "json"),
        cache=(None, "train on this cache (with a train split) instead"),
        batches=(150, "training steps, the same in every scenario"),
        rounds=(2, "interleaved rounds"),
        wide_hidden=(128, "the LSTM's hidden size at F > 16 (64 below)"),
        sample=(Path("data/sample"), "the demo's directory (F=9)"),
        busy=(0, "spinning processes beside the runs: a busy machine"),
    )
    p.add_argument("--features", type=int, nargs="+", default=[9, 256], help="F of the caches to train on")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = p.parse_args(argv)
    if args.batches < 1 or args.rounds < 1 or args.busy < 0:
        raise SystemExit("bench train: --batches and --rounds must be at least 1, --busy at least 0")
    import torch

    from shardcache import WindowStream, open_cache

    caches = (
        {open_cache(args.cache).n_features: args.cache}
        if args.cache
        else _caches(args.features, args.sample, args.work)
    )
    for path in caches.values():
        with WindowStream(path, SEQ_LEN, horizon=1, split="train", batch_size=BATCH) as stream:
            if len(stream) < args.batches:
                what = f"the {len(stream)} batches of an epoch of {path}'s train split"
                raise SystemExit(f"bench train: --batches {args.batches} is more than {what}")
    load_before, started, results = load(), datetime.datetime.now(datetime.UTC), []
    with busy(args.busy):
        for rnd in range(args.rounds):
            for f, path in caches.items():
                for kind in args.scenarios:
                    spec = {"F": f, "cache": path, "steps": args.batches, "hidden": 64 if f <= 16 else args.wide_hidden}
                    result, prof = run("bench_train", kind, spec, f"round {rnd} F={f} {kind}", threads=False)
                    results.append({**result, "round": rnd, "peak_rss": prof.peak_rss_tree})
        load_after = load()
    loop = f"LSTM hidden 64 at F<=16 and {args.wide_hidden} above, batch {BATCH}x{SEQ_LEN}, Adam"
    print(f"bench train: {started:%Y-%m-%d %H:%M} UTC, {args.rounds} interleaved rounds, {args.batches} steps, {loop}")
    cores = f"{len(os.sched_getaffinity(0))} cores usable, {args.busy} spinning processes beside the runs (--busy)"
    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}, {cores}")
    print(f"load before: {load_before}\nload after:  {load_after}\n")
    print(_table(results))
    payload = {"started": started.isoformat(), "load_before": load_before, "load_after": load_after}
    write_json(args.json, payload | {"busy": args.busy, "results": results})
    return 0


COMMANDS = {"train": main}
