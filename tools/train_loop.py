"""Does the training loop notice the loader? A real LSTM loop fed by ``WindowStream``, side by side.

The loader is judged alone in ``tools/bench.py``; users see it inside a training loop, whose
own torch ops compete with the loader for the cores. This tool runs the same loop (an LSTM,
hidden 64 at F=9, hidden ``--wide-hidden`` at wider F; Adam over every parameter, MSE on the
next bar; torch's default threads) for ``--batches`` steps, each scenario in its own process
under ``tools/profile_memory.py``'s ``profile()``, interleaved over ``--rounds``:

model      the model alone: the same batches, taken from the stream beforehand into RAM
           (the stream closed before the clock starts)
stream     the stream in-process: ``for x, y in WindowStream(cache, 60, horizon=1,
           split="train", batch_size=256, shuffle=True)``
dataloader a plain ``DataLoader(stream, batch_size=None, num_workers=2)``
loader     ``stream.loader(num_workers=2)``
model-1t   the model alone, the user script having called ``torch.set_num_threads(1)``
stream-1t, dataloader-1t, loader-1t
           the three loaders, likewise with ``torch.set_num_threads(1)``

Every scenario sees the same shuffled batches (same seed) and the same initial weights. Wall s
is the loop's time (from ``iter()``, so the first batch and worker start-up count, to the
last step; first batch s is the part until the first batch was in hand); x model is that round's
wall over the same round's model (model-1t for the -1t scenarios). User s, sys s,
minor faults and involuntary context switches are ``getrusage`` over the loop (the process plus
its reaped DataLoader workers); threads is the process's thread count mid-loop; peak RSS is the
process tree's (the model's includes the batches it holds in RAM).

Data: F=9 is the demo cache ``data/sample/cache.zarr`` (``shardcache demo`` makes it; this tool
runs it when the cache is missing); F=256 is ``data/bench/train-256.zarr`` built from
``tools/bench_build.py``'s 665K-bar, 256-column Parquet table with ``--features raw`` and the
demo's train/val/test split. ``--cache PATH`` uses an existing cache (with a train split) instead.

``--busy N`` runs the whole comparison beside N processes that each spin on one core (another job
sharing the machine), so the thread advice can be measured on a quiet and on a busy machine alike.

Usage (from the repository root; about 8 minutes on 2 cores)::

    .venv/bin/python tools/train_loop.py --batches 150 --rounds 2
    .venv/bin/python tools/train_loop.py --features 9 --batches 60 --busy 1   # a busy machine
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils.data import DataLoader

from shardcache import CacheError, WindowStream, open_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_memory import MIB, profile

__all__ = ["SCENARIOS", "LoopModel", "main", "run_scenario"]

SEQ_LEN, BATCH, WORKERS = 60, 256, 2
SPLIT = "train=0.8,val=0.1,test=0.1"  # the demo's split
SCENARIOS = ("model", "stream", "dataloader", "loader", "model-1t", "stream-1t", "dataloader-1t", "loader-1t")
_RUSAGE = ("ru_utime", "ru_stime", "ru_minflt", "ru_majflt", "ru_nivcsw", "ru_nvcsw")


class LoopModel(nn.Module):
    """An LSTM over the window and a linear head on its last state: the user's first model."""

    def __init__(self, n_features: int, n_targets: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_targets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


# -- scenario processes --------------------------------------------------------------------
def _usage() -> dict[str, float]:
    """This process's and its reaped children's resource usage, summed."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {k: getattr(me, k) + getattr(kids, k) for k in _RUSAGE}


def run_scenario(spec: dict) -> dict[str, Any]:
    """Child process entry: train ``spec["steps"]`` steps fed as ``spec["kind"]`` says; return the figures."""
    kind, steps = spec["kind"], spec["steps"]
    feed = kind.removesuffix("-1t")
    if feed != kind:
        torch.set_num_threads(1)  # the user's choice, made before the stream exists
    stream = WindowStream(spec["cache"], SEQ_LEN, horizon=1, split="train", batch_size=BATCH, shuffle=True)
    if feed == "model":
        source: Any = [(x.clone(), y.clone()) for x, y in itertools.islice(stream, steps)]
        stream.close()
    elif feed == "stream":
        source = stream
    elif feed == "dataloader":
        source = DataLoader(stream, batch_size=None, num_workers=WORKERS)
    elif feed == "loader":
        source = stream.loader(num_workers=WORKERS)
    else:
        raise SystemExit(f"train_loop: unknown scenario {kind!r}")
    gc.collect()
    u0, t0 = _usage(), time.perf_counter()
    it, threads, first_s, loss = iter(source), 0, 0.0, 0.0
    for i in range(steps):
        x, y = next(it)
        if not i:  # the model is made from the first batch's shapes, after the loader took its seeds
            first_s = time.perf_counter() - t0
            torch.manual_seed(0)
            model = LoopModel(x.shape[-1], y.shape[-1], spec["hidden"])
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            loss_fn = nn.MSELoss()
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
    return {
        "kind": kind,
        "F": int(x.shape[-1]),
        "steps": steps,
        "wall_s": wall,
        "first_batch_s": first_s,
        "torch_threads": torch.get_num_threads(),
        "threads": threads,
        "loss": loss,
        **{k[3:]: u1[k] - u0[k] for k in _RUSAGE},
    }


# -- parent: data, runs, tables --------------------------------------------------------------
def _script(name: str) -> str:
    """A console script of this interpreter's environment (``shardcache``, ``build-cache``)."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise SystemExit(f"train_loop: {path} not found: install shardcache into this environment")
    return str(path)


def ensure_caches(features: list[int], sample: Path, work: Path) -> dict[int, str]:
    """The cache for each F: the demo cache at F=9, a raw-feature Parquet build at wider F (built once)."""
    from bench_build import ensure_parquet_sample

    caches = {}
    for f in features:
        path = sample / "cache.zarr" if f == 9 else work / f"train-{f}.zarr"
        try:
            open_cache(path)
        except CacheError:  # missing or incomplete: (re)build it
            print(f"train_loop: building {path} ...", file=sys.stderr, flush=True)
            if f == 9:
                cmd = [_script("shardcache"), "demo", "--dir", str(sample)]
            else:
                src = ensure_parquet_sample(work, f, 1)
                cmd = [
                    _script("build-cache"),
                    str(src),
                    "--out",
                    str(path),
                    "--features",
                    "raw",
                    "--split",
                    SPLIT,
                    "--overwrite",
                    "-q",
                ]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        caches[f] = str(path)
    return caches


def _run(spec: dict, work: Path) -> dict[str, Any]:
    """One scenario in a fresh, profiled process: its figures plus the tree's peak RSS."""
    out = work / "results" / f"train-{spec['kind']}-F{spec['F']}-r{spec['round']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "out": str(out)}
    print(f"train_loop: round {spec['round']} F={spec['F']} {spec['kind']} ...", file=sys.stderr, flush=True)
    prof = profile([sys.executable, os.path.abspath(__file__), "--scenario", json.dumps(spec)], 0.05, spec["kind"])
    if prof.exit_code:
        raise SystemExit(f"train_loop: scenario {spec['kind']} at F={spec['F']} failed (exit {prof.exit_code})")
    return {**json.loads(out.read_text()), "round": spec["round"], "peak_rss": prof.peak_rss_tree}


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


def _uptime() -> str:
    """``uptime``'s line (the machine's load), or the load averages where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def table(results: list[dict]) -> str:
    """The markdown table: one row per (scenario, F), ranges over the rounds, usage of the best round."""
    base = {(r["F"], r["round"], r["kind"]): r["wall_s"] for r in results if r["kind"].startswith("model")}
    lines = [
        (
            "| scenario | F | steps | wall s | x model | first batch s | user s | sys s | minor faults | invol. ctx sw | threads "
            "| torch threads | peak RSS MiB |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in sorted({r["F"] for r in results}):
        for kind in SCENARIOS:
            rows = [r for r in results if r["F"] == f and r["kind"] == kind]
            if not rows:
                continue
            best = min(rows, key=lambda r: r["wall_s"])
            ref = "model-1t" if kind.endswith("-1t") else "model"
            ratios = [r["wall_s"] / base[f, r["round"], ref] for r in rows if (f, r["round"], ref) in base]
            lines.append(
                f"| {kind} | {f} | {best['steps']} | {_span([r['wall_s'] for r in rows], '.1f')} "
                f"| {_span(ratios, '.2f') + 'x' if ratios else '-'} | {best['first_batch_s']:.2f} | {best['utime']:.1f} | {best['stime']:.1f} "
                f"| {best['minflt']:,.0f} | {best['nivcsw']:,.0f} | {best['threads']} | {best['torch_threads']} "
                f"| {max(r['peak_rss'] for r in rows) / MIB:,.0f} |"
            )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, nargs="+", default=[9, 256], help="F of the caches to train on")
    p.add_argument("--cache", help="train on this cache (with a train split) instead of building the F caches")
    p.add_argument("--batches", type=int, default=150, help="training steps per epoch, the same in every scenario")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--wide-hidden", type=int, default=128, help="the LSTM's hidden size at F > 16 (64 below)")
    p.add_argument("--sample", type=Path, default=Path("data/sample"), help="the demo's directory (F=9)")
    p.add_argument("--work", type=Path, default=Path("data/bench"), help="wider caches and the results")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside the runs: a busy machine (0)")
    p.add_argument("--json", type=Path, help="also write every round's figures here")
    p.add_argument("--scenario", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.scenario:
        spec = json.loads(args.scenario)
        Path(spec["out"]).write_text(json.dumps(run_scenario(spec)))
        return 0
    if args.batches < 1 or args.rounds < 1 or args.busy < 0:
        raise SystemExit("train_loop: --batches and --rounds must be at least 1, --busy at least 0")
    if args.cache:
        caches = {open_cache(args.cache).n_features: args.cache}
    else:
        caches = ensure_caches(args.features, args.sample, args.work)
    for path in caches.values():
        with WindowStream(path, SEQ_LEN, horizon=1, split="train", batch_size=BATCH) as stream:
            if len(stream) < args.batches:
                raise SystemExit(
                    f"train_loop: --batches {args.batches} is more than the {len(stream)} "
                    f"batches of an epoch of {path}'s train split"
                )
    load_before, started = _uptime(), datetime.datetime.now(datetime.UTC)
    results = []
    with busy(args.busy):
        for rnd in range(args.rounds):
            for f, path in caches.items():
                for kind in args.scenarios:
                    hidden = 64 if f <= 16 else args.wide_hidden
                    spec = {"kind": kind, "F": f, "cache": path, "steps": args.batches, "hidden": hidden, "round": rnd}
                    results.append(_run(spec, args.work))
        load_after = _uptime()
    print(
        f"train_loop: {started:%Y-%m-%d %H:%M} UTC, {args.rounds} interleaved rounds, {args.batches} steps, "
        f"LSTM hidden 64 at F<=16 and {args.wide_hidden} above, batch {BATCH}x{SEQ_LEN}, Adam"
    )
    print(
        f"torch {torch.__version__}, default threads {torch.get_num_threads()}, "
        f"{len(os.sched_getaffinity(0))} cores usable, {args.busy} spinning processes beside the runs (--busy)"
    )
    print(f"load before: {load_before}")
    print(f"load after:  {load_after}")
    print()
    print(table(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "started": started.isoformat(),
                    "load_before": load_before,
                    "load_after": load_after,
                    "busy": args.busy,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
