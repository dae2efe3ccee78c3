"""Kill real ``build-cache`` processes with SIGKILL at random moments, resume them, compare the results.

Generates the synthetic sample (``make_sample``, ``--days`` daily DBN files), builds it once
cleanly while timing its stages from the build's own log lines, then for each trial:

1. starts ``build-cache SAMPLE --out TRIAL ...`` as a separate process;
2. sends it SIGKILL after a random delay inside the measured build (the quickest of three clean
   builds, from the moment it starts reading files to its exit). Trial ``i`` of ``N`` draws its
   delay uniformly from the ``i``-th of ``N`` equal slices of that span, so kills land in every
   stage; a build that ends before its kill is run again with the span scaled to its own time;
3. records the stage it was in (its last log line, or ``published`` once the cache was renamed
   into place) and what the staging folder says was finished;
4. runs the same command with ``--resume`` and compares the cache, array for array and manifest
   less build times (``shardcache.inspect.verify.compare_caches``), with the clean build, then runs
   ``verify_cache`` on it.

Prints a table and ``N/N identical``; exits 1 unless every trial is identical and verifies.

    python tools/kill_resume.py                      # 20 trials on 60 days
    python tools/kill_resume.py --trials 50 --days 90 --keep /tmp/kr
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from shardcache.ingest.sample import make_sample
from shardcache.inspect.verify import compare_caches, verify_cache

__all__ = ["main"]

STAGES = {"read files": "scan", "sort symbols": "merge", "statistics": "stats", "write shards": "write"}
BUILD = [sys.executable, "-m", "shardcache.cli", "build"]


def build_args(data: Path, out: Path, shard_rows: int) -> list[str]:
    """The build command for ``out`` (the same options for the clean build and every trial)."""
    return [
        *BUILD,
        str(data),
        "--out",
        str(out),
        "--split",
        "train=0.8,val=0.1,test=0.1",
        "--shard-rows",
        str(shard_rows),
        "--chunk-rows",
        str(max(1, shard_rows // 8)),
    ]


def stage_of(log: str) -> str:
    """The build stage named by the last stage log line in ``log``."""
    last = "start"
    for line in log.splitlines():
        head = line.removeprefix("shardcache: ").split(":")[0]
        if head in STAGES:
            last = STAGES[head]
    return last


def timed_build(cmd: list[str]) -> tuple[float, float, dict[str, float]]:
    """Run the build; seconds from its start to the first stage line and to its exit, and when
    each stage began."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    begins: dict[str, float] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        stage = stage_of(line)
        if stage != "start":
            begins.setdefault(stage, time.perf_counter() - t0)
    if proc.wait():
        raise SystemExit(f"the clean build failed (exit {proc.returncode})")
    end = time.perf_counter() - t0
    return begins.get("scan", 0.0), end, begins


def finished(staging: Path, out: Path) -> str:
    """What the staging folder records as done when the build was killed."""
    done = Counter(p.name.split("-")[0] for p in (staging / "done").glob("*-*") if p.suffix in (".json", ".npz"))
    parts = [f"{k} {done[k]}" for k in ("scan", "merge", "stats", "write") if done[k]]
    if not staging.exists():
        parts.append("staging gone")
    if out.exists():
        parts.append("published")
    return ", ".join(parts) or "nothing"


def trial(
    i: int, n: int, rng: random.Random, data: Path, clean: Path, work: Path, span: tuple[float, float], shard_rows: int
) -> dict[str, object]:
    """One kill and resume; the row of the table."""
    out = work / f"trial{i:03d}.zarr"
    lo, hi = span
    delay = lo + (i + rng.random()) / n * (hi - lo)
    log_path = work / f"trial{i:03d}.log"
    for _ in range(3):  # a build that ends before its kill (a quieter machine) is retried earlier
        shutil.rmtree(out, ignore_errors=True)
        with open(log_path, "w") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(build_args(data, out, shard_rows), stderr=log, stdout=subprocess.DEVNULL)
            try:
                proc.wait(delay)
                killed = False
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed = True
        if killed:
            break
        took = time.perf_counter() - t0
        delay = lo * took / hi + (i + rng.random()) / n * (took - lo * took / hi)
    stage = "exited first" if not killed else "published" if out.exists() else stage_of(log_path.read_text())
    state = finished(Path(f"{out}.staging"), out)
    t0 = time.perf_counter()
    resumed = subprocess.run(
        [*build_args(data, out, shard_rows), "--resume", "-q"], capture_output=True, text=True, check=False
    )
    resume_s = time.perf_counter() - t0
    if resumed.returncode:
        result = f"resume failed: {resumed.stderr.strip().splitlines()[-1:]}"
    else:
        diffs = compare_caches(clean, out)
        report = verify_cache(out)
        problems = diffs + [str(p) for p in report.problems]
        result = "identical" if not problems else f"DIFFERS: {problems[:3]}"
    shutil.rmtree(out, ignore_errors=True)
    return {"trial": i, "kill_s": delay, "stage": stage, "done": state, "resume_s": resume_s, "result": result}


def main(argv: list[str] | None = None) -> int:
    """Entry point: see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--days", type=int, default=60, help="days of the generated sample")
    p.add_argument("--shard-rows", type=int, default=2048, help="small shards: many write tasks to land in")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill delays")
    p.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temp folder)")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = work / "dbn"
        if not data.is_dir():
            make_sample(data, days=args.days)
        clean = work / "clean.zarr"
        shutil.rmtree(clean, ignore_errors=True)
        runs = []
        for _ in range(3):  # the quickest of three: kills should land inside the build, not after it
            shutil.rmtree(clean, ignore_errors=True)
            runs.append(timed_build(build_args(data, clean, args.shard_rows)))
        lo, hi, begins = min(runs, key=lambda r: r[1])
        stages = ", ".join(f"{k} at {v:.2f} s" for k, v in begins.items())
        print(
            f"clean build of {len(list(data.iterdir()))} files: {stages}, exit at {hi:.2f} s; "
            f"kills spread over {lo:.2f}-{hi:.2f} s"
        )
        rng = random.Random(args.seed)
        rows = []
        print(f"{'trial':>5}  {'kill at':>8}  {'stage':<12}  {'finished before the kill':<40}  {'resume':>7}  result")
        for i in range(args.trials):
            r = trial(i, args.trials, rng, data, clean, work, (lo, hi), args.shard_rows)
            rows.append(r)
            print(
                f"{r['trial']:>5}  {r['kill_s']:>7.2f}s  {r['stage']:<12}  {r['done']:<40}  "
                f"{r['resume_s']:>6.1f}s  {r['result']}",
                flush=True,
            )
        ok = sum(r["result"] == "identical" for r in rows)
        hit = Counter(r["stage"] for r in rows)
        print(f"kills per stage: {', '.join(f'{k} {v}' for k, v in hit.items())}")
        print(f"{ok}/{len(rows)} identical")
        return 0 if ok == len(rows) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
