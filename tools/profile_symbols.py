"""Where the per-symbol cost goes: cProfile of a build, one epoch, verify, ls, info and ``open_datatree``
of the same bars laid out as many or as few symbols (issue 21's "profile where the 40-75 ms per symbol goes").

Each step runs in this process under ``cProfile``, with call counts:

* **build**: each stage in a profiler of its own (scan, merge, place, stats, write, finish, the rest);
  the dask stages run inline (``scheduler="sync"``) so that one profiler sees every call: the real
  build runs the same tasks on threads, so these are proportions and counts, not the wall time;
* **epoch**: one pass of ``WindowStream.loader(0)``; the reader's decode and gather threads are
  profiled too (a profiler per thread, merged);
* **verify / ls / info**: ``verify_cache``, ``inspect.views.shards`` and ``info``; **datatree**:
  ``xr.open_datatree(cache, engine="zarr")``.

For each it prints the seconds (under the profiler, which inflates many small calls), the
functions with the most own time, and the calls of interest counted (``WATCH``: zarr array
creation, event-loop hops, JSON, file opens, Arrow spills, markers, digests, shard decodes).

Usage::

    python tools/profile_symbols.py [--symbols 2000] [--bars 600000] [--features 16]
        [--steps build,epoch,verify,ls,info,datatree] [--top 12]
    python tools/profile_symbols.py --wall [--symbols 2000]   # the build's stages, wall time, no profiler
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

STEPS = ("build", "epoch", "verify", "ls", "info", "datatree")
# label -> (file path fragment, function name): summed over every match
WATCH = {
    "zarr create_array": ("zarr/core/group.py", "create_array"),
    "zarr require_group": ("zarr/core/group.py", "require_group"),
    "zarr update_attributes": ("zarr/core/array.py", "update_attributes"),
    "zarr Array setitem (shard writes)": ("zarr/core/array.py", "_set_selection"),
    "encode_shard (the writer's shards)": ("format/encode.py", "encode_shard"),
    "Objects.put / put_many (object writes)": ("format/objects.py", "put_many"),
    "zarr sync (an event-loop hop)": ("zarr/core/sync.py", "sync"),
    "zarr metadata to_buffer_dict (JSON docs)": ("zarr/core/metadata/v3.py", "to_buffer_dict"),
    "json.dumps": ("json/__init__.py", "dumps"),
    "json.loads": ("json/__init__.py", "loads"),
    "open() (files)": ("~", "<built-in method io.open>"),
    "os.replace / rename": ("~", "<built-in method posix.replace>"),
    "Arrow spill of a scanned piece": ("ingest/scan.py", "_spill"),
    "Arrow spill of a merged cluster": ("ingest/merge.py", "add"),
    "Arrow spill files opened (_Spill; Spills, one a task)": ("ingest/compute.py", "__init__"),
    "staging marker _write_marker": ("ingest/staging.py", "_write_marker"),
    "staging marker _read_marker": ("ingest/staging.py", "_read_marker"),
    "release_memory (per task)": ("ingest/tasks.py", "release_memory"),
    "shard_digest": ("format/layout.py", "shard_digest"),
    "ShardDecoder.open (a zarr.json read)": ("format/decode.py", "open"),
    "ShardDecoder._read_shard": ("format/decode.py", "_read_shard"),
    "Cache.array (zarr array open)": ("format/cache.py", "array"),
    "dask compute": ("dask/base.py", "compute"),
}
# a thread waiting for another (not work): left out of the own-time ranking and of its total
IDLE = (
    "acquire' of '_thread.lock",
    "poll' of 'select.epoll",
    "get' of '_queue.SimpleQueue",
    "_lsprof.Profiler",
    "sleep",
)
# the build's stages: (object path, attribute, stage label); Staging.run's label is its prefix argument
STAGES = [
    ("shardcache.ingest.staging.Staging", "run", None),
    ("shardcache.ingest.builder", "_place", "place (every symbol's documents)"),
    ("shardcache.format.writer.CacheWriter", "finish", "finish (root index, manifest)"),
    ("shardcache.format.writer.CacheWriter", "write_history", "history"),
    ("shardcache.format.writer.CacheWriter", "sweep", "sweep (stray temporary files)"),
    ("shardcache.ingest.staging.Staging", "publish", "publish"),
    ("shardcache.ingest.staging.Staging", "remove", "remove staging"),
    ("shardcache.ingest.builder", "open_cache", "open_cache"),
    ("shardcache.ingest.builder", "prepare", "prepare (staging, lock)"),
]


def _resolve(path: str) -> Any:
    mod, _, name = path.rpartition(".")
    import importlib

    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError):
        return importlib.import_module(path)


class StageProfiles:
    """One ``cProfile.Profile`` and wall time per build stage, by wrapping each stage's function
    (wall time only when not ``profile``)."""

    def __init__(self, profile: bool = True) -> None:
        self.profiles: dict[str, tuple[cProfile.Profile, cProfile.Profile]] = {}  # this thread, zarr's loop
        self.seconds: dict[str, float] = {}
        self.profile = profile
        self._active = False

    def wrap(self, fn: Callable[..., Any], label: str | None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            name = label or str(
                args[3] if len(args) > 3 else kwargs.get("prefix")
            )  # Staging.run(self, fn, jobs, prefix)
            if self._active:
                return fn(*args, **kwargs)
            if not self.profile:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            main, loop = self.profiles.setdefault(name, (cProfile.Profile(), cProfile.Profile()))
            self._active = True
            t0 = time.perf_counter()
            with on_zarr_loop(loop):
                main.enable()
                try:
                    return fn(*args, **kwargs)
                finally:
                    main.disable()
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                    self._active = False

        return run

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = []
        for path, attr, label in STAGES:
            owner = _resolve(path)
            fn = getattr(owner, attr)
            saved.append((owner, attr, fn))
            setattr(owner, attr, self.wrap(fn, label))
        try:
            yield
        finally:
            for owner, attr, fn in saved:
                setattr(owner, attr, fn)


@contextlib.contextmanager
def sync_dask() -> Iterator[None]:
    """``dask.compute`` with ``scheduler="sync"``: the build's tasks inline, seen by one profiler."""
    import dask

    real = dask.compute

    def inline(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(scheduler="sync")
        kwargs.pop("num_workers", None)
        return real(*args, **kwargs)

    dask.compute = inline
    try:
        yield
    finally:
        dask.compute = real


@contextlib.contextmanager
def on_zarr_loop(prof: cProfile.Profile) -> Iterator[None]:
    """``prof`` enabled on zarr's event-loop thread while inside (it runs every zarr store call)."""
    from zarr.core.sync import sync

    async def switch(on: bool) -> None:
        prof.enable() if on else prof.disable()

    sync(switch(True))
    try:
        yield
    finally:
        sync(switch(False))


@contextlib.contextmanager
def new_threads() -> Iterator[list[cProfile.Profile]]:
    """A profiler in each thread started while inside (the reader's threads, zarr's codec threads)."""
    profiles: list[cProfile.Profile] = []

    def start(frame: Any, event: str, arg: Any) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        sys.setprofile(None)
        prof.enable()

    threading.setprofile(start)
    try:
        yield profiles
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


@contextlib.contextmanager
def every_thread() -> Iterator[list[cProfile.Profile]]:
    """A profiler in this thread, on zarr's loop and in each thread started while inside."""
    main, loop = cProfile.Profile(), cProfile.Profile()
    with new_threads() as others, on_zarr_loop(loop):
        profiles = [main, loop]
        main.enable()
        try:
            yield profiles
        finally:
            main.disable()
            profiles += others


def _stats(profiles: list[cProfile.Profile]) -> pstats.Stats:
    stats = pstats.Stats(profiles[0], stream=io.StringIO())
    for prof in profiles[1:]:
        with contextlib.suppress(TypeError):  # a thread's profiler that never ran
            stats.add(prof)
    return stats


def _watched(stats: pstats.Stats) -> list[tuple[str, int, float]]:
    """(label, calls, cumulative s) of ``WATCH``, calls summed over every matching function."""
    out = []
    for label, (frag, name) in WATCH.items():
        calls, cum = 0, 0.0
        for (file, _, func), (_, ncalls, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
            if func == name and (frag in file if frag != "~" else file == "~"):
                calls += ncalls
                cum = max(cum, ct)  # nested matches (recursion, wrappers): the outermost's time
        if calls:
            out.append((label, calls, cum))
    return out


def _top(stats: pstats.Stats, n: int) -> list[tuple[str, int, float, float]]:
    rows = []
    for (file, line, func), (_, ncalls, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(w in func for w in IDLE):
            continue
        where = file.split("site-packages/")[-1].split("shardcache/")[-1] if file != "~" else ""
        rows.append((f"{where}:{line} {func}" if where else func, ncalls, tt, ct))
    return sorted(rows, key=lambda r: -r[2])[:n]


def report(title: str, seconds: float, stats: pstats.Stats, top: int, per: dict[str, int]) -> None:
    total = sum(
        tt
        for (_, _, func), (_, _, tt, _, _) in stats.stats.items()  # type: ignore[attr-defined]
        if not any(w in func for w in IDLE)
    )
    print(f"#### {title}: {seconds:.2f} s under the profiler (busy time of every thread {total:.2f} s)\n")
    print("| function (most own time; waits left out) | calls | own s | share of busy | cumulative s |")
    print("|---|---:|---:|---:|---:|")
    for name, calls, tt, ct in _top(stats, top):
        print(f"| `{name}` | {calls:,} | {tt:.2f} | {100 * tt / max(total, 1e-9):.0f}% | {ct:.2f} |")
    print()
    watched = _watched(stats)
    if watched:
        units = ", ".join(f"per {k}" for k in per)
        print(f"| calls of interest | calls | {units} | cumulative s |")
        print("|---|---:|" + "---:|" * len(per) + "---:|")
        for label, calls, cum in watched:
            each = " | ".join(f"{calls / v:,.1f}" for v in per.values())
            print(f"| {label} | {calls:,} | {each} | {cum:.2f} |")
        print()


def _built(stages: StageProfiles, src: str, out: str, how: str) -> float:
    """Build ``src`` into ``out`` with ``stages`` installed, print each stage's seconds; the build's."""
    from shardcache.ingest.builder import build_cache

    with stages.installed():
        t0 = time.perf_counter()
        build_cache(src, out, progress=False, overwrite=True)
        wall = time.perf_counter() - t0
    print(f"### build: {wall:.1f} s ({how})\n")
    print("| stage | s | share |")
    print("|---|---:|---:|")
    for name, s in sorted(stages.seconds.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {s:.2f} | {100 * s / wall:.0f}% |")
    rest = wall - sum(stages.seconds.values())
    print(f"| the rest (options, inputs, manifest) | {rest:.2f} | {100 * rest / wall:.0f}% |\n")
    return wall


def time_build(src: str, out: str) -> None:
    """Each stage's wall time in a real build (dask's threads, no profiler): the seconds, not the calls."""
    _built(StageProfiles(profile=False), src, out, "wall time, dask's threads, no profiler")


def profile_build(src: str, out: str, top: int, per: dict[str, int]) -> None:
    stages = StageProfiles()
    with sync_dask(), new_threads() as others:
        wall = _built(stages, src, out, "dask inline, under the profiler")
    for name, s in sorted(stages.seconds.items(), key=lambda kv: -kv[1]):
        if s >= 0.05 * wall:
            report(f"build stage {name}", s, _stats(list(stages.profiles[name])), top, per)
    if others:
        report("build: threads zarr or dask started (every stage)", wall, _stats(others), top, per)


def profile_step(step: str, cache_path: str, top: int, per: dict[str, int]) -> None:
    from shardcache.format.cache import open_cache
    from shardcache.read.stream import WindowStream  # torch's import, outside the profile

    def epoch() -> None:
        cache = open_cache(cache_path)
        with WindowStream(cache, 60, split=cache.split_names[0], batch_size=256) as stream:
            sum(len(x) for x, _ in stream.loader(0))

    def verify() -> None:
        from shardcache.inspect.verify import verify_cache

        assert verify_cache(cache_path).ok

    def ls() -> None:
        from shardcache.inspect.views import shards

        shards(cache_path)

    def info() -> None:
        from shardcache.inspect.views import info as info_of

        info_of(cache_path)

    import xarray as xr

    def datatree() -> None:
        xr.open_datatree(cache_path, engine="zarr").close()

    fn = {"epoch": epoch, "verify": verify, "ls": ls, "info": info, "datatree": datatree}[step]
    with every_thread() as profiles:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    report(step, wall, _stats(profiles), top, per)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", type=int, default=2000)
    parser.add_argument("--bars", type=int, default=600_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--top", type=int, default=12, help="functions shown per step")
    parser.add_argument("--cache", default=None, help="profile this cache's reads (no build)")
    parser.add_argument(
        "--wall", action="store_true", help="build: each stage's wall time in a real build (no profiler), then stop"
    )
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    if set(steps) - set(STEPS):
        parser.error(f"--steps: choose from {', '.join(STEPS)}")
    from shardcache.ingest.sample import make_sample_parquet

    load = os.getloadavg()
    print(
        f"## {args.symbols:,} symbols x {args.bars // args.symbols:,} bars, F={args.features} "
        f"(load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores)\n"
    )
    with tempfile.TemporaryDirectory(prefix="profile-symbols-") as work:
        cache = args.cache or os.path.join(work, "c.zarr")
        if args.cache is None:
            names = [f"S{i:05d}" for i in range(args.symbols)]
            files = make_sample_parquet(
                os.path.join(work, "in"), n_bars=args.bars, n_features=args.features, symbols=names
            )
        per = {"symbol": args.symbols}
        if args.wall:
            time_build(str(files[0]), cache)
            return 0
        if args.cache is None and "build" in steps:
            profile_build(str(files[0]), cache, args.top, per)
        elif args.cache is None:
            from shardcache.ingest.builder import build_cache

            build_cache(str(files[0]), cache, progress=False)
        for step in steps:
            if step == "build":
                continue
            from shardcache.format.cache import open_cache

            per = {"symbol": len(open_cache(cache).symbols), "shard": open_cache(cache).n_shards}
            profile_step(step, cache, args.top, per)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
