"""The benchmarks' one entry: ``python tools/bench.py SCENARIO [options]`` (``SCENARIO --help``: its options).

Each scenario lives in a module of ``tools/`` that uses ``bench_harness`` (timing, process-tree memory,
tables) and never imports this file, which imports them by name when asked: no tool module imports
another in a circle. ``--scenario SPEC`` is the fresh process a scenario starts (``bench_harness.run``).
The figures of README.md and docs/ name the command that printed each.
"""

from __future__ import annotations

import importlib
import json
import sys

from bench_harness import child

__all__ = ["SCENARIOS", "main"]

SCENARIOS = {  # name: (module, what it measures)
    "loaders": ("bench_loaders", "A-E: the naive list, memmaps, in-RAM and WindowStream on the same bars (make bench)"),
    "peers": ("bench_peers", "WindowStream against LitData and MosaicML Streaming (make bench-peers)"),
    "build": ("bench_builds", "build-cache's speed and peak memory at 1x and 10x the bars"),
    "cluster": ("bench_builds", "each dask worker's peak RSS while a LocalCluster builds the sample"),
    "kill": ("bench_builds", "build-cache killed at random moments, resumed, compared with a clean build"),
    "symbols": ("bench_stores", "the same bars as many symbols and as few, on local disk and a moto S3 server"),
    "s3": ("bench_stores", "one cache read and streamed from a moto S3 server against local disk"),
    "first": ("bench_checkouts", "the first batch phase by phase, in fresh processes (--baseline: another tree)"),
    "cores": ("bench_checkouts", "the in-process stream pinned to 1 and 2 cores (--baseline: another tree)"),
    "copies": ("bench_checkouts", "epochs from a warm cache_dir, each copy checked (--baseline: another tree)"),
    "train": ("bench_train", "an LSTM training loop fed by WindowStream, against the model alone"),
    "gpu": ("gpu_epoch", "two epochs on a GPU, streamed and resident: windows/s and peak device memory"),
    "profile": ("bench_harness", "memory over time of any command's process tree: profile -- CMD"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario (its exit code), or one scenario process (``--scenario SPEC``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 2 and argv[0] == "--scenario":
        spec = json.loads(argv[1])
        child(importlib.import_module(spec["module"]).CHILDREN[spec["kind"]], spec)
        return 0
    if not argv or argv[0] not in SCENARIOS:
        usage = "usage: bench.py SCENARIO [options] (SCENARIO --help for its options)\n\nscenarios:\n"
        usage += "".join(f"  {name:<8} {what}\n" for name, (_, what) in SCENARIOS.items())
        print(usage, file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(SCENARIOS[argv[0]][0])
    return int(module.COMMANDS[argv[0]](argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
