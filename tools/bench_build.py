"""Build speed and memory: ``build-cache`` on the DBN sample at 1x and 10x the bars.

Each build runs in its own process under ``tools/profile_memory.py``'s ``profile()``, so its
peak RSS is the whole process tree's (dask's local threads included), sampled while it runs.
The table gives bars, wall time, bars/s, peak RSS and PSS, and the cache's size against raw
float32; the build is *flat* (PASS) when the largest scale's peak RSS is within 10 % of the
smallest one's.

Usage (from the repository root)::

    .venv/bin/python tools/bench_build.py                 # 1x (360 files) and 10x (3600 files)
    .venv/bin/python tools/bench_build.py --scales 1 --json build.json

The samples (``make_sample(days=360 * scale)``) are generated once under ``--work`` and
reused; the caches are rebuilt every run. ``tools/bench.py`` uses ``measure_build`` for its
own build rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_memory import MIB, Profile, profile  # noqa: E402

__all__ = ["FLAT_TOLERANCE", "BuildResult", "ensure_dbn_sample", "measure_build", "build_table", "flat_verdict", "main"]

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


def ensure_dbn_sample(work: Path, days: int) -> Path:
    """The ``days``-file DBN sample under ``work`` (generated once, then reused)."""
    from shardcache.sample import make_sample

    out = work / f"dbn-{days}d"
    done = work / f"dbn-{days}d.complete"
    if not done.exists():
        t0 = time.perf_counter()
        files = make_sample(out, days=days)
        done.write_text(f"{len(files)}\n")
        print(f"bench: generated {len(files)} DBN files in {out} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out


def measure_build(label: str, sources: Path, out: Path, *args: str, interval: float = 0.1) -> tuple[BuildResult, Profile]:
    """Run ``build-cache SOURCES --out OUT --overwrite -q ARGS`` in a profiled process."""
    from shardcache import open_cache

    cmd = [sys.executable, "-c", _QUIET_CLI, str(sources), "--out", str(out), "--overwrite", "-q", *args]
    prof = profile(cmd, interval, label)
    if prof.exit_code:
        raise SystemExit(f"bench: {label}: build-cache failed with exit code {prof.exit_code}")
    cache = open_cache(out)
    size = cache.manifest.get("bytes", {})
    inputs = len(list(sources.iterdir())) if sources.is_dir() else 1
    result = BuildResult(
        label=label, inputs=inputs, bars=cache.n_bars, features=cache.n_features, wall_s=prof.wall_s,
        peak_rss=prof.peak_rss_tree, peak_pss=prof.peak_pss_tree,
        stored_bytes=int(size.get("stored", 0)), raw_bytes=int(size.get("raw", cache.n_bars * cache.n_features * 4)),
        exit_code=prof.exit_code,
    )
    return result, prof


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_build.py", description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("data/bench"), help="samples and caches (default: %(default)s)")
    p.add_argument("--scales", default="1,10", help="multiples of the 360-file sample (default: %(default)s)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    return p


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
        results.append(measure_build(f"DBN sample {scale}x", src, out)[0])
    print(build_table(results))
    ok = True
    if len(results) > 1:
        ok, text = flat_verdict(results)
        print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps({"builds": [r.to_dict() for r in results], "flat": ok}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
