"""The command line: ``build-cache`` and ``shardcache {build,info,ls,verify,sample,demo}``.

Expected problems (bad inputs, an existing output, an incomplete cache) end with one line
on stderr naming the file and the problem, and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import OptionError, ShardcacheError
from .format.build_options import NORMALIZE, BuildOptions
from .format.layout import CODECS

if TYPE_CHECKING:
    from .ingest.run import RunOptions
    from .inspect.views import ShardInfo

__all__ = ["build_cache_main", "format_info", "format_shards", "main"]

log = logging.getLogger("shardcache")


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error rule: a malformed argument is one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_storage_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs, e.g. endpoint_url=http://host:9000 or "
        "anon=true (repeatable; VALUE is parsed as JSON when it can be)",
    )


def _storage_options(pairs: Sequence[str]) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` pairs as fsspec ``storage_options`` (None when there are none)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ShardcacheError(f"--storage-option {pair!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options or None


def _add_build_args(p: argparse.ArgumentParser) -> None:
    """``build-cache``'s arguments, in ``--help``'s order: inputs and output, what is built, how it runs."""
    default = BuildOptions.defaults()  # the build options' defaults are BuildOptions' own
    p.add_argument("sources", nargs="+", help="DBN (.dbn, .dbn.zst), Parquet or CSV files, directories or globs")
    p.add_argument("--out", "-o", required=True, help="cache location: a directory or an fsspec URL (s3://...)")
    _add_recorded_args(p, default)
    _add_run_args(p, default)


def _add_recorded_args(p: argparse.ArgumentParser, default: dict[str, Any]) -> None:
    """Build options ``build-cache`` records in the cache (``BuildOptions``), ``default`` their defaults."""
    p.add_argument(
        "--features",
        help="comma-separated feature names; 'default' (OHLCV set, else all columns) or 'raw', "
        "alone or with names (default,close)",
    )
    p.add_argument(
        "--normalize",
        choices=NORMALIZE,
        default=default["normalize"],
        help="z-score with train-split statistics (default) or none",
    )
    p.add_argument(
        "--split",
        default=default["split"],
        help="none, fractions (train=0.8,val=0.1,test=0.1) or dates (val=2024-06-01,test=2024-09-01)",
    )
    p.add_argument(
        "--max-gap",
        default=default["max_gap"],
        help="cut a segment where bars are further apart than this (5m, 1h; 0 = never); auto = max(1h, 5 bars)",
    )
    p.add_argument(
        "--bar",
        help="bar size for tick schemas (trades, tbbo, mbp-1, bbo): 1s, 1m, 5m ...; resamples DBN OHLCV "
        "bars to a multiple of their interval",
    )
    p.add_argument("--ts-column", help="Parquet/CSV timestamp column (default: detected)")
    p.add_argument("--symbol-column", help="Parquet/CSV symbol column (default: detected)")
    p.add_argument(
        "--csv-delimiter",
        metavar="CHAR",
        help="CSV delimiter: one character, or comma, semicolon, tab, pipe (default: sniffed from each header)",
    )
    p.add_argument("--columns", help="value columns to read (comma-separated)")
    p.add_argument("--shard-rows", type=int, help="rows per shard (default: ~8 MiB of features)")
    p.add_argument("--chunk-rows", type=int, help="rows per inner chunk (default: shard/8)")
    p.add_argument(
        "--codec",
        choices=CODECS,
        default=default["codec"],
        help="the features' compression: blosc-lz4 (default: Blosc shuffle + LZ4), zstd, lz4 (Blosc LZ4 without shuffle) or none",
    )


def _add_run_args(p: argparse.ArgumentParser, default: dict[str, Any]) -> None:
    """The rest, in ``--help``'s order: how a run goes (``RunOptions``), the summary, resumes and appends."""
    p.add_argument("--workers", type=int, help="local dask threads (default: one per core)")
    p.add_argument("--scheduler", help="dask.distributed scheduler address tcp://HOST:PORT (or DASK_SCHEDULER_ADDRESS)")
    _add_storage_arg(p)
    p.add_argument(
        "--seq-len", type=int, default=default["seq_len"], help="window length for the summary's window count"
    )
    p.add_argument(
        "--horizon",
        type=_horizon,
        default=default["horizon"],
        help="target bars ahead (1) or a time ahead (5min) for the summary's window count",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the shardcache cache at --out (atomically, once the new one is complete); never a file, "
        "another folder or an input",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted build of --out from its finished tasks (same inputs and options)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add SOURCES (bars after each symbol's last one) to the existing cache at --out, with its build options",
    )
    p.add_argument(
        "--stats",
        choices=["frozen", "recompute"],
        help="with --append: keep the cache's normalization statistics (frozen, default) or "
        "rebuild everything with statistics over all bars (recompute)",
    )
    p.add_argument(
        "--stats-from",
        metavar="CACHE",
        help="normalize with CACHE's statistics and split at its cut times instead of computing them",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--quiet", "-q", action="store_true", help="print nothing but warnings and errors: no progress, no summary"
    )


def _explicit(argv: Sequence[str]) -> set[str]:
    """The build options that ``argv`` names itself, whatever their values (``--split none`` included)."""
    parser = argparse.ArgumentParser(add_help=False)
    _add_build_args(parser)  # the options, from the one place that declares them
    unset = object()  # not a string, so argparse does not convert it
    appended = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    for action in parser._actions:  # an append action extends its default, so it starts from None
        action.default = None if action.dest in appended else unset
    given = vars(parser.parse_known_args(argv)[0]).items()
    return {k for k, v in given if v is not (None if k in appended else unset)}


def _horizon(text: str) -> int | str:
    """``--horizon``'s value: bars ahead (an int) or a duration (``5min``), each checked by ``WindowSpec``."""
    return int(text) if text.strip().removeprefix("-").isdigit() else text


def _options(args: argparse.Namespace) -> tuple[BuildOptions, RunOptions]:
    """The command line's build options and run settings, each checked by its own class (a time ``--horizon``
    sizes the summary only: the manifest's window count stays at the default row horizon)."""
    from .format.windows import WindowSpec
    from .ingest.run import RunOptions

    if isinstance(args.horizon, str):
        WindowSpec(1, args.horizon)  # a malformed duration is refused here, before any input is read

    run = RunOptions(
        workers=args.workers,
        scheduler=args.scheduler,
        overwrite=args.overwrite,
        resume=args.resume,
        storage_options=_storage_options(args.storage_option),
        progress=not args.quiet,
    )
    given = {k: getattr(args, k) for k in BuildOptions.names() if hasattr(args, k)}
    if isinstance(args.horizon, str):
        given["horizon"] = BuildOptions.defaults()["horizon"]
    return BuildOptions(**given), run


def _cmd_append(args: argparse.Namespace, run: RunOptions) -> int:
    from .ingest.append import append_cache
    from .inspect.views import info

    build_only = (*BuildOptions.names(), "overwrite")  # what --append refuses: the cache has them
    if given := [k for k in build_only if k in args.explicit]:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ShardcacheError(f"--append keeps the build options of {args.out}; drop {flags}")
    cache = append_cache(args.sources, args.out, stats=args.stats or "frozen", run=run)
    windows = cache.manifest.counts.windows
    if args.json or not args.quiet:
        _print_info(info(cache, windows.seq_len, windows.horizon), args.json)
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from .ingest.builder import build_cache
    from .ingest.tasks import tune_allocator
    from .inspect.views import info

    tune_allocator()  # this process is the CLI's own: the allocator settings the build memory figures use
    options, run = _options(args)  # checked before any input is read
    if args.append:
        return _cmd_append(args, run)
    if args.stats is not None:
        raise ShardcacheError("--stats applies to --append; for a new build use --stats-from CACHE")
    cache = build_cache(args.sources, args.out, options, run=run)
    if args.json or not args.quiet:  # --json asks for the summary as a document: -q does not drop it
        _print_info(info(cache, options.seq_len, args.horizon), args.json)
    return 0


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _utc(ts_ns: int) -> str:
    """A nanosecond timestamp as ``YYYY-MM-DD hh:mm:ss`` (UTC)."""
    return str(np.datetime64(int(ts_ns), "ns").astype("datetime64[s]")).replace("T", " ")


def _some(names: Sequence[str], shown: int = 12) -> str:
    """The first ``shown`` names, then how many more: a cache may hold thousands of symbols."""
    more = f", ... ({len(names) - shown:,} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def format_info(info: dict[str, Any]) -> str:
    """A cache summary for people: counts, splits, drops, features with their statistics."""
    from .inspect.shared import text_table

    c, size = info["counts"], info.get("bytes", {})
    lines = [
        f"cache     {info['path']}  (format {info['format_version']}, built {info.get('created')})",
        f"bars      {info['bars']:,} in {len(info['symbols'])} symbols, {info['segments']:,} segments",
        f"symbols   {_some(info['symbols'])}",
        f"windows   {info['windows']:,} at seq_len {info['seq_len']}, horizon {info['horizon']}, stride 1",
        (
            f"size      {_fmt_bytes(size.get('stored'))} on disk for {_fmt_bytes(size.get('raw'))} of float32 "
            f"(ratio {size.get('ratio')}x, codec {info['layout'].get('codec')}, "
            f"{info['shards']:,} shards of {info['layout']['shard_rows']:,} rows)"
        ),
    ]
    splits = info["splits"]
    per = info.get("windows_per_split", {})
    split_desc = ", ".join(
        f"{n}: {splits.get('bars', {}).get(n, 0):,} bars / {per.get(n, 0):,} windows" for n in splits["names"]
    )
    cut_times = [_utc(t) for t in splits["cuts_ns"]] if splits.get("cuts_ns") else splits.get("cuts")
    cuts = f" (cuts at {', '.join(cut_times)} UTC)" if cut_times else ""
    lines.append(f"splits    {split_desc}{cuts}")
    dropped = c.get("dropped") or {}
    drop_desc = ", ".join(f"{k}: {v:,}" for k, v in dropped.items()) or "none"
    lines.append(
        f"records   {c.get('records_read', 0):,} read; dropped {drop_desc}; "
        f"{c.get('reordered', 0):,} out of order (sorted)"
    )
    if resampled := c.get("resampled"):
        lines.append(f"resampled {', '.join(resampled['from'])} bars into {resampled['to']} bars (--bar)")
    if rolls := c.get("rolls") or 0:
        lines.append(
            f"rolls     {rolls:,} contract roll(s) in continuous symbols; each cuts its segment "
            "(the manifest's rolls have their times and instruments)"
        )
    if unmapped := c.get("unmapped") or {}:
        lines.append(
            f"unmapped  {unmapped.get('records', 0):,} records of {unmapped.get('instruments', 0)} "
            f"instrument(s) without a symbol mapping, {unmapped.get('outside_mapping_dates', 0):,} "
            "outside their mapping dates"
        )
    stats = info["stats"]
    source = "all bars" if info["splits"].get("stats_from") == "all" else "the train split"
    lines.append(
        f"features  {len(info['features'])} (normalize: {info.get('normalize')}"
        + (f"; mean and std of {source}, in source units)" if stats else ")")
    )
    if stats:
        rows = [(n, f"{stats[n]['mean']:+.6g}", f"{stats[n]['std']:.6g}") for n in info["features"]]
        lines += text_table(("feature", "mean", "std"), rows, "lrr", indent="  ")
    else:
        lines.append("  " + ", ".join(info["features"]))
    if "cut" in info:
        from .inspect.cut_stats import format_cut

        lines += format_cut(info["cut"])
    return "\n".join(lines)


def format_shards(shards: Sequence[ShardInfo], url: str = "") -> str:
    """The per-shard table for people: symbol, object key, rows, time range, stored bytes and ratio."""
    from .inspect.shared import text_table

    rows = [
        (
            s.symbol,
            str(s.shard),
            s.key,
            f"{s.rows:,}",
            _utc(s.first_ts),
            _utc(s.last_ts),
            "missing" if s.missing else _fmt_bytes(s.stored_bytes),
            "-" if s.ratio is None else f"{s.ratio:.2f}x",
        )
        for s in shards
    ]
    headers = ("symbol", "shard", "key", "rows", "first bar (UTC)", "last bar (UTC)", "stored", "ratio")
    n_symbols = len({s.symbol_id for s in shards})
    lines = [f"{url + ': ' if url else ''}{len(shards)} shards of {n_symbols} symbols"]
    lines += text_table(headers, rows, "lrlrllrr")
    stored = sum(s.stored_bytes or 0 for s in shards)
    raw = sum(s.raw_bytes for s in shards)
    ratio = f"ratio {raw / stored:.2f}x" if stored else "ratio -"
    lines.append(
        f"total: {sum(s.rows for s in shards):,} rows, {_fmt_bytes(stored)} stored for "
        f"{_fmt_bytes(raw)} of float32 ({ratio})"
    )
    if missing := [s.key for s in shards if s.missing]:
        lines.append(f"MISSING: {len(missing)} shard object(s): {', '.join(missing)}")
    return "\n".join(lines)


def _print_info(info: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(info, indent=2, default=str) if as_json else format_info(info))


def _cmd_info(args: argparse.Namespace) -> int:
    from .format.cache import open_cache
    from .format.windows import WindowSpec
    from .inspect.cut_stats import InfoCut
    from .inspect.views import info

    _at_least(1, seq_len=args.seq_len)
    if isinstance(args.horizon, int):
        _at_least(0, horizon=args.horizon)
    WindowSpec(args.seq_len, args.horizon)
    asked = InfoCut(split_times=args.split_times, embargo=args.embargo, walk_forward=args.walk_forward, fold=args.fold)
    cache = open_cache(args.cache, _storage_options(args.storage_option))
    _print_info(info(cache, args.seq_len, args.horizon, asked.of(cache)), args.json)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    """Re-read every shard; exit 1 if anything is corrupt or missing (each named by its key)."""
    from .inspect.verify import verify_cache

    report = verify_cache(args.cache, _storage_options(args.storage_option), progress=not args.json)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.ok else 1


def _cmd_ls(args: argparse.Namespace) -> int:
    """Print the shard table; exit 1 when a shard object is missing."""
    from .format.cache import open_cache
    from .inspect.views import shards

    cache = open_cache(args.cache, _storage_options(args.storage_option))
    table = shards(cache)
    if args.json:
        doc = dict(path=cache.url, shard_rows=cache.shard_rows, n_features=cache.n_features, symbols=len(cache.symbols))
        print(json.dumps({**doc, "shards": [s.to_dict() for s in table]}, indent=2))
    else:
        print(format_shards(table, cache.url))
    return 1 if any(s.missing for s in table) else 0


def _at_least(minimum: int, **options: int) -> None:
    """Refuse a count option below ``minimum`` in one line, before anything is written."""
    for name, value in options.items():
        if value < minimum:
            raise ShardcacheError(f"--{name.replace('_', '-')} {value}: must be at least {minimum}")


def _cmd_sample(args: argparse.Namespace) -> int:
    from .ingest.sample import make_sample

    _at_least(1, days=args.days)
    t0 = time.perf_counter()
    files = make_sample(args.out, days=args.days, seed=args.seed)
    print(f"wrote {len(files)} DBN files to {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """Generate the sample, build it, stream one epoch at stride 1 and say what happened."""
    import psutil

    from .ingest.builder import build_cache
    from .ingest.sample import make_sample, sample_files
    from .ingest.tasks import tune_allocator
    from .inspect.views import info
    from .read.plan import valid_ranges
    from .read.stream import WindowStream

    _at_least(1, days=args.days, seq_len=args.seq_len)
    tune_allocator()
    data, out = os.path.join(args.dir, "dbn"), os.path.join(args.dir, "cache.zarr")
    files = sample_files(data, days=args.days)  # a shorter sample is the longer one's first days
    if all(f.is_file() for f in files):
        there = len(list(Path(data).glob("*.dbn.zst")))
        print(f"1. using the sample's first {len(files)} days of the {there} daily DBN files already in {data}")
    else:
        t0 = time.perf_counter()
        files = make_sample(data, days=args.days)
        print(f"1. generated {len(files)} daily DBN files in {data} ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    cache = build_cache([str(f) for f in files], out, split="train=0.8,val=0.1,test=0.1", overwrite=True)
    build_s = time.perf_counter() - t0
    print(f"2. built {out} in {build_s:.1f} s ({cache.n_bars / build_s:,.0f} bars/s)")
    print(format_info(info(cache, args.seq_len)))
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    with WindowStream(cache, seq_len=args.seq_len, split="train", batch_size=256) as ds:
        t0, n, first, peak = time.perf_counter(), 0, 0.0, rss0
        for batch in ds:
            n += batch.x.shape[0]
            first = first or time.perf_counter() - t0
            peak = max(peak, proc.memory_info().rss)
        secs = time.perf_counter() - t0
    expected = valid_ranges(cache, args.seq_len, 1, 1, "train").total()
    print(
        f"3. streamed one epoch of the train split at stride 1: {n:,} windows of shape "
        f"({args.seq_len}, {cache.n_features}) (expected {expected:,}) in {secs:.1f} s = "
        f"{n / secs:,.0f} windows/s; first batch after {first * 1000:.0f} ms; "
        f"RSS grew by {(peak - rss0) / 2**20:.0f} MiB while streaming"
    )
    return 0 if n == expected else 1


def _add_reader(
    sub: Any, name: str, help: str, func: Callable[[argparse.Namespace], int], what: str, counts: Sequence[Any] = ()
) -> None:
    """A command that reads one cache (``info``, ``ls``, ``verify``), with ``counts``' (flag, type, default, help)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("cache", help="the cache: a directory or an fsspec URL (s3://...)")
    for flag, kind, default, text in counts:
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--json", action="store_true", help=f"print the {what} as JSON")
    _add_storage_arg(p)
    p.set_defaults(func=func, quiet=True)


def _add_cut_args(p: argparse.ArgumentParser) -> None:
    """``info``'s read-time cut: its splits' ranges and windows, its train range's statistics."""
    p.add_argument(
        "--split-times", metavar="DATES", help="cut the splits at these times: val=2023-05-15,test=2023-06-01"
    )
    p.add_argument("--embargo", metavar="DURATION", help="end each split this long before the next one starts (1h)")
    p.add_argument(
        "--walk-forward",
        metavar="SPANS",
        help="walk-forward folds: train=180D,val=30D[,step=30D][,embargo=1h][,test=30D][,expanding]",
    )
    p.add_argument("--fold", type=int, metavar="K", help="with --walk-forward: show fold K (0 is the first)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardcache",
        description="Build, inspect and check shardcache caches (shardcache build is build-cache); "
        "COMMAND --help for each command's options.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    b = sub.add_parser("build", help="build a cache (same as build-cache)")
    _add_build_args(b)
    b.set_defaults(func=_cmd_build)
    windows = (
        ("--seq-len", int, 60, "input bars per window, for the window counts (60)"),
        ("--horizon", _horizon, 1, "target bars (1) or a time (5min) ahead, for the window counts"),
    )
    _add_reader(sub, "info", "summarize a cache", _cmd_info, "summary", windows)
    _add_cut_args(sub.choices["info"])
    _add_reader(sub, "ls", "list the shards: rows, symbols, time range, stored bytes, ratio", _cmd_ls, "table")
    _add_reader(sub, "verify", "re-read every shard: checksums, digests, timestamps, segments", _cmd_verify, "report")
    s = sub.add_parser("sample", help="generate the synthetic DBN sample (360 daily OHLCV-1m files)")
    s.add_argument("out", help="folder to write the daily .dbn.zst files into")
    s.add_argument("--days", type=int, default=360, help="trading days to generate, from 2023-01-02 (360)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the synthetic prices (0)")
    s.set_defaults(func=_cmd_sample, quiet=False)
    d = sub.add_parser("demo", help="generate the sample, build it, stream one epoch and report")
    d.add_argument("--dir", default="data/sample", help="folder for the DBN files and cache.zarr (data/sample)")
    d.add_argument("--days", type=int, default=360, help="trading days of the sample (360)")
    d.add_argument("--seq-len", type=int, default=60, help="input bars per window of the streamed epoch (60)")
    d.set_defaults(func=_cmd_demo, quiet=False)
    return p


_BUILD_EXTRA = frozenset({"dask", "distributed", "pyarrow", "databento_dbn"})  # pyproject's [build]


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace, prog: str) -> int:
    level = logging.WARNING if getattr(args, "quiet", False) else logging.INFO
    logging.basicConfig(level=level, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        return func(args)
    except ShardcacheError as exc:
        print(f"{prog}: error: {exc.flag() if isinstance(exc, OptionError) else exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _BUILD_EXTRA:
            raise
        print(f"{prog}: error: needs the build extra: pip install 'shardcache[build]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted", file=sys.stderr)
        with warnings.catch_warnings():  # a zarr call Ctrl-C stopped before it ran its coroutine: not news
            warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
            traceback.clear_frames(exc.__traceback__)  # the coroutine goes now, inside this filter
        return 130
    except BrokenPipeError:  # e.g. `shardcache ls CACHE | head`: stop quietly, like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


# options whose value may start with "-" (argparse takes "-5m" for a flag)
_DURATIONS = ("--max-gap", "--bar", "--horizon", "--embargo")


def _attach_values(argv: Sequence[str]) -> list[str]:
    """``--max-gap -5m`` as ``--max-gap=-5m``, so the option's own check says what is wrong with the value."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in _DURATIONS and len(arg) > 1 and arg[0] == "-" and arg[1].isdigit():
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``shardcache``."""
    argv = _attach_values(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "build":
        args.explicit = _explicit(argv[argv.index("build") + 1 :])
    return _run(args.func, args, "shardcache")


def build_cache_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``build-cache``."""
    p = _Parser(prog="build-cache", description="Build a shardcache from DBN, Parquet or CSV files.")
    _add_build_args(p)
    argv = _attach_values(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.explicit = _explicit(argv)
    return _run(_cmd_build, args, "build-cache")


if __name__ == "__main__":
    sys.exit(main())
