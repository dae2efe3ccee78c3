"""Time to the first batch, phase by phase, in fresh processes; optionally against another source tree.

Each measurement is a fresh interpreter with torch and shardcache imported (one torch thread,
``OMP_NUM_THREADS=1``, as in ``tools/bench.py``), which then times, for a shuffled
``WindowStream(cache, 60, split="all", batch_size=256)``:

open     ``open_cache`` (the manifest and the root ``segments`` index)
stream   the ``WindowStream`` constructor on the open cache (valid windows, the epoch's plan)
decode   ``next(iter(stream))`` up to the start of the reader's first gather (the first pool's
         layout, shuffle and block decodes)
gather   the first gather (the first run's windows copied into the batch)
hand     from the end of that gather to the batch in the caller's hand
cpu      CPU time of the whole process (every thread) over the same span: the work, whatever the load

``--baseline TREE`` runs the same in a second source tree (``PYTHONPATH=TREE``), interleaved
with this one, so both sides share the machine's load; the table gives each phase's median
(and the total's maximum) over ``--rounds`` processes per side and F, and new/old ratios.

    python tools/bench_first.py --work data/bench --baseline /path/to/old/checkout --rounds 10

Caches are ``WORK/cache-<F>.zarr`` as ``tools/bench.py`` builds them (built here if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["PHASES", "main", "measure", "tool_parser"]

PHASES = ("open", "stream", "decode", "gather", "hand")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measure(cache_path: str, seed: int) -> dict[str, float]:
    """Child: one first batch from a fresh stream, each phase in seconds (``Reader._gather`` timed)."""
    import torch

    from shardcache import WindowStream, open_cache
    from shardcache.read import reader

    torch.set_num_threads(1)
    marks: list[float] = []
    gather = reader.Reader._gather

    def timed(self: Any, run: Any) -> Any:
        marks.append(time.perf_counter())
        out = gather(self, run)
        marks.append(time.perf_counter())
        return out

    reader.Reader._gather = timed  # type: ignore[method-assign]
    c0, t0 = time.process_time(), time.perf_counter()
    cache = open_cache(cache_path)
    t1 = time.perf_counter()
    stream = WindowStream(cache, 60, horizon=1, split="all", batch_size=256, shuffle=True, seed=seed)
    t2 = time.perf_counter()
    with stream:
        it = iter(stream)  # kept: a dropped iterator closes its reader, which is not the first batch
        next(it)
        t3, c3 = time.perf_counter(), time.process_time()
        del it
    g0, g1 = marks[0], marks[1]
    return {
        "open": t1 - t0,
        "stream": t2 - t1,
        "decode": g0 - t2,
        "gather": g1 - g0,
        "hand": t3 - g1,
        "total": t3 - t0,
        "cpu": c3 - c0,
    }


def _cache(work: Path, f: int) -> str:
    """``WORK/cache-<f>.zarr``, built as ``tools/bench.py`` builds it when it does not open."""
    from shardcache import CacheError, open_cache

    path = work / f"cache-{f}.zarr"
    try:
        open_cache(path)
    except CacheError:  # missing or incomplete: build it
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_build import prepare_data

        work.mkdir(parents=True, exist_ok=True)
        prepare_data(work, f, [])
    return str(path)


def _run(tree: str, cache: str, seed: int) -> dict[str, float]:
    """One fresh process on source tree ``tree`` (also its working directory: ``-c`` puts it first on the path)."""
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": tree}
    code = (
        f"import sys, json; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import bench_first; print(json.dumps(bench_first.measure({cache!r}, {seed})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(results: dict[tuple[str, int], list[dict[str, float]]], sides: list[str]) -> str:
    """Median ms of each phase per side and F, the total's max, and new/old where there is a baseline."""
    head = "| F | tree | " + " | ".join(PHASES) + " | total median | total max | cpu median |"
    lines = [head, "|---|---|" + "---:|" * (len(PHASES) + 3)]
    fs = sorted({f for _, f in results})
    for f in fs:
        med = {}
        for side in sides:
            runs = results[(side, f)]
            med[side] = {k: statistics.median(r[k] for r in runs) for k in (*PHASES, "total", "cpu")}
            cells = " | ".join(f"{1e3 * med[side][k]:.1f}" for k in PHASES)
            lines.append(
                f"| {f} | {side} | {cells} | {1e3 * med[side]['total']:.1f} | "
                f"{1e3 * max(r['total'] for r in runs):.1f} | {1e3 * med[side]['cpu']:.1f} |"
            )
        if len(sides) == 2:
            new, old = med[sides[0]], med[sides[1]]
            cells = " | ".join(f"{new[k] / old[k]:.2f}x" if old[k] > 0 else "-" for k in PHASES)
            lines.append(
                f"| {f} | new/old | {cells} | {new['total'] / old['total']:.2f}x | | {new['cpu'] / old['cpu']:.2f}x |"
            )
    return "\n".join(lines)


def tool_parser(prog: str, doc: str, rounds: tuple[int, str], baseline: str) -> argparse.ArgumentParser:
    """The options this tool and ``bench_cores.py`` share: caches, F, rounds, a baseline tree, JSON."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("data/bench"), help="folder of the caches (default: %(default)s)")
    p.add_argument("--features", default="9,256", help="feature counts (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=rounds[0], help=f"{rounds[1]} (default: %(default)s)")
    p.add_argument("--baseline", metavar="TREE", help=baseline)
    p.add_argument("--json", type=Path, metavar="PATH", help="write every measurement as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = tool_parser(
        "bench_first.py",
        __doc__,
        (10, "processes per side and F"),
        "a second source tree, timed interleaved with this one",
    ).parse_args(argv)
    here = str(Path(__file__).resolve().parents[1])
    trees = {"new": here, **({"old": str(Path(args.baseline).resolve())} if args.baseline else {})}
    caches = {int(f): _cache(args.work, int(f)) for f in args.features.split(",")}
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    load0 = os.getloadavg()
    for rnd in range(args.rounds):
        for f, cache in caches.items():
            for side, tree in trees.items() if rnd % 2 == 0 else reversed(trees.items()):
                results.setdefault((side, f), []).append(_run(tree, cache, rnd))
    load1 = os.getloadavg()
    print(
        f"first batch, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
        f"{load0[0]:.2f} -> {load1[0]:.2f}; {args.rounds} fresh processes per row, interleaved; ms"
    )
    print(_table(results, list(trees)))
    if args.json:
        args.json.write_text(json.dumps({f"{s}-{f}": r for (s, f), r in results.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
