"""This checkout against another, process by process: ``bench.py first``, ``cores`` and ``copies``.

Each measurement is a fresh interpreter (one torch and OpenMP thread) timing a shuffled ``WindowStream(cache, 60,
split="all", batch_size=256)``; ``--baseline TREE`` runs the same on another source tree's shardcache
(``PYTHONPATH=TREE``), interleaved with this one (the order reversed every other round) so both share the load.

``first``: the first batch by phase, median ms per side and F: *open* ``open_cache``; *stream* the constructor (the
plan); *decode* up to the reader's first gather; *gather* that gather; *hand* from its end to the batch in hand;
*cpu* the process's CPU time over it all. ``cores``: an epoch pinned to 1 and 2 cores (``os.sched_setaffinity``
before torch is imported), default or set ``decoders``: first batch, windows/s after it, CPU s. ``copies``: an epoch
fills a ``cache_dir``, ``--epochs`` more read its checked copies (cache: ``WORK/copies-<F>.zarr``, two symbols).
``first`` and ``cores`` read ``WORK/cache-<F>.zarr`` as ``bench.py loaders`` builds it (built if missing).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench_harness import parser, run, table, write_json

__all__ = ["CHILDREN", "COMMANDS", "PHASES", "VARIANTS"]

PHASES = ("open", "stream", "decode", "gather", "hand")
# (label, cores, decoders): None is the stream's default
VARIANTS = (("1 core", "0", None), ("2 cores", "0,1", None), ("2 cores, decoders=1", "0,1", 1))
VARIANTS += (("1 core, decoders=2", "0", 2),)


# -- scenario processes ----------------------------------------------------------------------
def _first(spec: dict) -> dict[str, float]:
    """One first batch from a fresh stream, each phase in seconds (``Reader._gather`` timed)."""
    from shardcache import WindowStream, open_cache
    from shardcache.read import reader

    marks: list[float] = []
    gather = reader.Reader._gather

    def timed(self: Any, run: Any) -> Any:
        marks.append(time.perf_counter())
        out = gather(self, run)
        marks.append(time.perf_counter())
        return out

    reader.Reader._gather = timed  # type: ignore[method-assign]
    c0, t0 = time.process_time(), time.perf_counter()
    cache = open_cache(spec["cache"])
    t1 = time.perf_counter()
    stream = WindowStream(cache, 60, horizon=1, split="all", batch_size=256, shuffle=True, seed=spec["seed"])
    t2 = time.perf_counter()
    with stream:
        it = iter(stream)  # kept: a dropped iterator closes its reader, which is not the first batch
        next(it)
        t3, c3 = time.perf_counter(), time.process_time()
        del it
    out = {"open": t1 - t0, "stream": t2 - t1, "decode": marks[0] - t2, "gather": marks[1] - marks[0]}
    return out | {"hand": t3 - marks[1], "total": t3 - t0, "cpu": c3 - c0}


def _epoch(spec: dict) -> dict[str, Any]:
    """One shuffled epoch on the cores ``child`` pinned: first batch s, windows/s after it, CPU s, decoders."""
    from shardcache import WindowStream

    kw = {"seed": spec["seed"]} | ({} if spec["decoders"] is None else {"decoders": spec["decoders"]})
    t0 = time.perf_counter()
    stream = WindowStream(spec["cache"], 60, horizon=1, split="all", batch_size=256, shuffle=True, **kw)
    n = n_first = 0
    with stream:
        for x, _y in stream:
            if not n:
                t1, c1, n_first = time.perf_counter(), time.process_time(), len(x)
            n += len(x)
        t2, c2, used = time.perf_counter(), time.process_time(), stream.decoders
    out = {"first_batch_s": t1 - t0, "windows_per_s": (n - n_first) / (t2 - t1), "cpu_s": c2 - c1}
    return out | {"windows": n, "decoders": used}


def _copies(spec: dict) -> dict[str, Any]:
    """One epoch fills ``folder``; the median of ``epochs`` more from its copies, and the windows."""
    from shardcache import WindowStream

    shutil.rmtree(spec["folder"], ignore_errors=True)
    kw = dict(batch_size=256, split="all", cache_dir=spec["folder"])
    with WindowStream(spec["cache"], 60, **kw) as s:
        for _ in s:  # fills the copies
            pass
    with WindowStream(spec["cache"], 60, **kw) as s:
        times = []
        for _ in range(spec["epochs"]):
            t0 = time.perf_counter()
            n = sum(len(x) for x, _ in s)
            times.append(time.perf_counter() - t0)
    return {"epoch_s": sorted(times)[len(times) // 2], "windows": n}


CHILDREN = {"first": _first, "cores": _epoch, "copies": _copies}


# -- the parents -----------------------------------------------------------------------------
def _setup(name: str, argv: list[str], rounds: int, **options: tuple[Any, str]) -> tuple[Any, dict[str, str], str]:
    """The parsed options, the sides (``new``: this tree; ``old``: ``--baseline``) and the start's header."""
    options = {"rounds": (rounds, "processes per side and row"), **options}
    args = parser(name, __doc__, "work", "baseline", "json", **options).parse_args(argv)
    if min(v for v in vars(args).values() if isinstance(v, int)) < 1:
        raise SystemExit(f"bench {name}: --rounds and every count must be at least 1")
    sides = {"new": str(Path(__file__).resolve().parents[1])}
    sides |= {"old": str(Path(args.baseline).resolve())} if args.baseline else {}
    head = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
    head += f"{os.getloadavg()[0]:.2f}"
    return args, sides, head


def _interleave(rounds: int, jobs: list[tuple[tuple, str, dict, str]]) -> dict[tuple, list[dict]]:
    """Each job ``(key, kind, spec, tree)`` once a round in a fresh process, the order reversed every other round."""
    out: dict[tuple, list[dict]] = {}
    for rnd in range(rounds):
        for key, kind, spec, tree in jobs if rnd % 2 == 0 else jobs[::-1]:
            result = run("bench_checkouts", kind, {**spec, "seed": rnd}, profiled=False, env={"PYTHONPATH": tree})[0]
            out.setdefault(key, []).append(result)
    return out


def _caches(args: Any) -> dict[int, str]:
    from bench_builds import ensure_cache

    return {int(f): ensure_cache(args.work, int(f)) for f in args.features.split(",")}


def first_main(argv: list[str]) -> int:
    """The first batch's phases per side and F: medians, the total's maximum, new/old."""
    args, sides, head = _setup("first", argv, 10, features=("9,256", "feature counts"))
    caches = _caches(args)
    jobs = [((side, f), "first", {"cache": c}, tree) for f, c in caches.items() for side, tree in sides.items()]
    results = _interleave(args.rounds, jobs)
    rows = []
    for f in caches:
        med = {}
        for side in sides:
            runs = results[side, f]
            med[side] = {k: statistics.median(r[k] for r in runs) for k in (*PHASES, "total", "cpu")}
            ms = [med[side][k] for k in (*PHASES, "total")] + [max(r["total"] for r in runs), med[side]["cpu"]]
            rows.append([f, side, *(f"{1e3 * v:.1f}" for v in ms)])
        if len(sides) == 2:
            new, old = med["new"], med["old"]
            cells = [f"{new[k] / old[k]:.2f}x" if old[k] > 0 else "-" for k in (*PHASES, "total")]
            rows.append([f, "new/old", *cells, "", f"{new['cpu'] / old['cpu']:.2f}x"])
    print(f"first batch, {head} -> {os.getloadavg()[0]:.2f}; {args.rounds} fresh processes per row, interleaved; ms")
    print(table(["F", "tree", *PHASES, "total median", "total max", "cpu median"], rows, left=2))
    write_json(args.json, {f"{s}-{f}": r for (s, f), r in results.items()})
    return 0


def cores_main(argv: list[str]) -> int:
    """The stream by cores: first batch, windows/s, against 1 core, CPU s per epoch."""
    args, sides, head = _setup("cores", argv, 2, features=("9,256", "feature counts"))
    variants = [("new", sides["new"], *v) for v in VARIANTS]
    variants += [("old", sides["old"], label, c, d) for label, c, d in VARIANTS if d is None] if "old" in sides else []
    jobs = []
    for f, cache in _caches(args).items():
        for side, tree, label, cores, decoders in variants:
            jobs.append(((f, side, label), "cores", {"cache": cache, "cores": cores, "decoders": decoders}, tree))
    results, rows = _interleave(args.rounds, jobs), []
    for (f, side, label), runs in results.items():
        best = max(runs, key=lambda r: r["windows_per_s"])
        one = max(r["windows_per_s"] for r in results[f, side, "1 core"])
        first, cpu = statistics.median(r["first_batch_s"] for r in runs), statistics.median(r["cpu_s"] for r in runs)
        rate = best["windows_per_s"]
        row = [f, side, label, best["decoders"], f"{1e3 * first:.0f}"]
        rows.append([*row, f"{rate:,.0f}", f"{rate / one:.2f}x", f"{cpu:.2f}"])
    end = f"{os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds: windows/s the best, first batch the median"
    print(f"in-process stream by cores, {head} -> {end}")
    head_row = ["F", "tree", "cores", "decoders", "first batch ms", "windows/s", "vs 1 core", "CPU s per epoch"]
    print(table(head_row, rows, left=3))
    write_json(args.json, {"|".join(map(str, k)): v for k, v in results.items()})
    return 0


def copies_main(argv: list[str]) -> int:
    """Each side's median epoch from a warm ``cache_dir``, and the pairs' ratio."""
    epochs = (11, "timed epochs per process (the median counts)")
    args, sides, head = _setup("copies", argv, 4, epochs=epochs, bars=(200_000, "bars"), features=(64, "features"))
    from shardcache import CacheError, build_cache, open_cache
    from shardcache.ingest.sample import make_sample_parquet

    args.work.mkdir(parents=True, exist_ok=True)
    cache, folder = args.work / f"copies-{args.features}.zarr", args.work / "copies-folder"
    try:
        open_cache(cache)
    except CacheError:
        src = args.work / f"copies-{args.features}-in"
        src = make_sample_parquet(src, n_bars=args.bars, n_features=args.features, symbols=["A", "B"])
        build_cache(str(src[0]), cache, normalize="none", overwrite=True, progress=False)
    spec = {"cache": str(cache), "folder": str(folder), "epochs": args.epochs}
    runs = _interleave(args.rounds, [((side,), "copies", spec, tree) for side, tree in sides.items()])
    shutil.rmtree(folder, ignore_errors=True)
    what = f"{args.bars:,} bars x {args.features} features, {args.rounds} rounds of {args.epochs} epochs"
    print(f"bench copies: {head} -> {os.getloadavg()[0]:.2f}; {what} from a warm cache_dir\n")
    rows = []
    for side in sides:
        ep, ratio = [r["epoch_s"] for r in runs[side,]], "-"
        if side == "new" and "old" in sides:
            pairs = [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs["new",], runs["old",])]
            ratio = f"{statistics.median(pairs):.3f}x ({min(pairs):.3f}-{max(pairs):.3f})"
        epoch = f"{statistics.median(ep):.3f} ({min(ep):.3f}-{max(ep):.3f})"
        rows.append([side, f"{runs[side,][0]['windows']:,}", epoch, ratio])
    print(table(["side", "windows", "median epoch s (range over rounds)", "x old (pairs)"], rows))
    return 0


COMMANDS = {"first": first_main, "cores": cores_main, "copies": copies_main}
