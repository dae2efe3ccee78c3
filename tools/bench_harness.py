"""What the benchmarks share: the window shape, one scenario run in its own profiled process
(``run_profiled``, which starts ``tools/bench.py --scenario``), one pass timed (``timed``) and a
scenario's rows over the rounds (``Row``). ``tools/bench.py`` and ``tools/bench_peers.py`` both
import it, and neither imports the other at module level."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from profile_memory import Profile, profile

__all__ = ["BATCH", "GIB", "HORIZON", "SEQ_LEN", "Row", "run_profiled", "timed"]

SEQ_LEN, HORIZON, BATCH = 60, 1, 256
GIB = 2**30
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
BENCH = Path(__file__).resolve().with_name("bench.py")


def timed(open_data: Callable[[], Iterator[tuple]]) -> dict[str, Any]:
    """Open the data and make one pass: time to the first batch, then windows/s after it."""
    t0 = time.perf_counter()
    n, t_first, n_first = 0, 0.0, 0
    for x, _y in open_data():
        if not n:
            t_first, n_first = time.perf_counter(), len(x)
        n += len(x)
    rate = (n - n_first) / (time.perf_counter() - t_first)
    return {"first_batch_s": t_first - t0, "windows_per_s": rate, "windows": n}


class Row:
    """One scenario over the rounds: each round's result and process-tree profile.

    Throughput is the best round's, first batch the worst round's, memory the highest peak.
    """

    def __init__(self, key: str, label: str, spec: dict, disk: int) -> None:
        self.key, self.label, self.spec, self.disk = key, label, spec, disk
        self.results: list[dict] = []
        self.profs: list[Profile] = []

    def add(self, result: dict, prof: Profile) -> None:
        self.results.append(result)
        self.profs.append(prof)

    @property
    def result(self) -> dict:
        return max(self.results, key=lambda r: r["windows_per_s"])

    @property
    def rate(self) -> float:
        return float(self.result["windows_per_s"])

    @property
    def first_s(self) -> float:
        return max(r["first_batch_s"] for r in self.results)

    @property
    def prof(self) -> Profile:
        return max(self.profs, key=lambda p: p.peak_rss_tree)

    @property
    def peak_pss(self) -> int | None:
        return max((p.peak_pss_tree for p in self.profs if p.peak_pss_tree is not None), default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the spec, every round's numbers and profile summary."""
        return {
            "key": self.key,
            "label": self.label,
            "spec": self.spec,
            "disk_bytes": self.disk,
            "windows_per_s": self.rate,
            "first_batch_s": self.first_s,
            "peak_rss_tree_bytes": self.prof.peak_rss_tree,
            "peak_pss_tree_bytes": self.peak_pss,
            "rounds": self.results,
            "profiles": [p.summary() for p in self.profs],
        }


def run_profiled(
    kind: str, label: str, spec: dict, work: Path, env: dict[str, str] | None = None
) -> tuple[dict, Profile]:
    """Run one scenario of ``tools/bench.py`` in a fresh, profiled process; return its result and profile."""
    out = work / "results" / f"{label.replace(' ', '_').replace('/', '-')}.json"
    out.parent.mkdir(exist_ok=True)
    spec = {**spec, "kind": kind, "out": str(out)}
    print(f"bench: {label} ...", file=sys.stderr, flush=True)
    old = {k: os.environ.get(k) for k in {**THREAD_ENV, **(env or {})}}
    os.environ.update({**THREAD_ENV, **(env or {})})
    try:
        prof = profile([sys.executable, str(BENCH), "--scenario", json.dumps(spec)], 0.05, label)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    if prof.exit_code:
        raise SystemExit(f"bench: {label} failed (exit {prof.exit_code})")
    return json.loads(out.read_text()), prof
