"""The one harness of every ``tools/bench.py`` scenario: processes timed and sampled, rounds, tables.

* ``profile(cmd)`` runs a command and samples the RSS and PSS of its whole process tree while it runs
  (``time -v`` gives one number, the largest single process's, only at the end: a loader that spreads its
  memory over DataLoader workers looks small, and nobody sees when memory grew); ``plot`` draws the
  curves, ``profile_table`` the summary; ``bench.py profile -- CMD`` is the command line (``profile_main``).
* ``run(module, kind, spec)`` runs one scenario function in a fresh ``bench.py --scenario`` process
  (profiled, or plain for short timings), optionally on another source tree's shardcache
  (``PYTHONPATH``); ``timed`` times one pass (first batch, then windows/s after it); ``Row`` keeps a
  scenario's results over interleaved rounds.
* ``parser`` makes a scenario's options, ``table`` its markdown tables, ``machine`` and ``load`` its header.

Scenario modules import this one; only ``bench.py`` imports them: no import circles. Linux is the
target (PSS, pidfd wake-up on exit); elsewhere PSS shows ``n/a``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "BATCH",
    "COMMANDS",
    "GIB",
    "HORIZON",
    "MIB",
    "SEQ_LEN",
    "Profile",
    "ProfileError",
    "Row",
    "child",
    "load",
    "machine",
    "parser",
    "plot",
    "profile",
    "profile_main",
    "profile_table",
    "run",
    "table",
    "timed",
    "write_json",
]

SEQ_LEN, HORIZON, BATCH = 60, 1, 256
MIB, GIB = 2**20, 2**30
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
BENCH = Path(__file__).resolve().with_name("bench.py")
ROOT = BENCH.parents[1]
_PSS_DUTY = 0.1  # at most this share of wall time spent reading PSS (the kernel walks the page tables)
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KiB on Linux, bytes on macOS
_PROG = "bench.py profile"
_PEAKS = ("peak_rss_tree", "peak_pss_tree", "peak_rss_main", "kernel_max_rss")


# -- the sampler -----------------------------------------------------------------------------
class ProfileError(Exception):
    """The command could not be started; ``exit_code`` is the shell's code (127 not found, 126 not runnable)."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Profile:
    """One profiled command: totals from ``wait4`` and aligned series (sample ``i`` at ``t[i]`` s), bytes.

    ``rss_tree``: RSS summed over the tree (shared pages once per process); ``pss_tree``: PSS summed,
    shared pages split between sharers (``None`` where not read); ``kernel_max_rss``: the exact peak of
    the largest single process (``time -v``'s figure; its floor is the profiler's own RSS at spawn)."""

    cmd: list[str]
    label: str
    interval: float
    exit_code: int
    wall_s: float
    user_s: float
    sys_s: float
    major_faults: int
    minor_faults: int
    kernel_max_rss: int
    processes_seen: int
    t: list[float]
    rss_tree: list[int]
    rss_main: list[int]
    pss_tree: list[int | None]
    nprocs: list[int]

    @property
    def peak_rss_tree(self) -> int:
        return max(self.rss_tree, default=0)

    @property
    def peak_rss_main(self) -> int:
        return max(self.rss_main, default=0)

    @property
    def peak_pss_tree(self) -> int | None:
        return max((v for v in self.pss_tree if v is not None), default=None)

    def summary(self) -> dict[str, Any]:
        """The scalar results, keyed by name (bytes, seconds, counts)."""
        out = {k: getattr(self, k) for k in ("exit_code", "wall_s", "user_s", "sys_s")}
        out |= {f"{k}_bytes": getattr(self, k) for k in _PEAKS}
        out |= {k: getattr(self, k) for k in ("major_faults", "minor_faults", "processes_seen")}
        return {**out, "samples": len(self.t)}

    def to_dict(self) -> dict[str, Any]:
        """Summary and time series, ready for ``json.dump``."""
        series = {f"{k}_bytes": getattr(self, k) for k in ("rss_tree", "rss_main", "pss_tree")}
        series = {"t_s": self.t, **series, "nprocs": self.nprocs}
        out = {"label": self.label, "cmd": self.cmd, "interval_s": self.interval}
        return {**out, "summary": self.summary(), "samples": series}


def _check_startable(cmd: Sequence[str]) -> None:
    if not cmd:
        raise ProfileError("empty command", exit_code=2)
    if shutil.which(cmd[0]) is None:
        if os.sep in cmd[0] and os.path.isfile(cmd[0]):
            raise ProfileError(f"cannot run {cmd[0]!r}: not executable", exit_code=126)
        raise ProfileError(f"cannot run {cmd[0]!r}: command not found")


def _sample(main: psutil.Process, want_pss: bool, seen: set[psutil.Process]) -> tuple[int, int, int | None, int]:
    """One sample of the tree: (RSS sum, main RSS, PSS sum or None, processes)."""
    try:
        procs = [main, *main.children(recursive=True)]
    except psutil.Error:
        procs = [main]
    rss_tree = rss_main = pss_tree = nprocs = 0
    pss_ok = want_pss
    for proc in procs:
        try:
            if pss_ok:
                try:
                    info = proc.memory_full_info()
                    pss = getattr(info, "pss", None)
                except psutil.AccessDenied:
                    info, pss = proc.memory_info(), None
                pss_ok = pss is not None
                pss_tree += pss or 0
            else:
                info = proc.memory_info()
        except psutil.Error:  # exited, zombie or not ours: not in the tree now
            continue
        seen.add(proc)
        nprocs += 1
        rss_tree += info.rss
        rss_main = info.rss if proc.pid == main.pid else rss_main
    return rss_tree, rss_main, (pss_tree if pss_ok else None), nprocs


def profile(
    cmd: Sequence[str], interval: float = 0.05, label: str | None = None, env: dict[str, str] | None = None
) -> Profile:
    """Run ``cmd`` to completion (its stdin, stdout and stderr inherited), sampling its tree every ``interval`` s.

    Sampling stops when the main process exits. Ctrl-C reaches the command through the terminal and
    the profile is still returned; a SIGTERM sent to this process goes on to the command. The exit code
    is 128+N when killed by signal N. Raises `ProfileError` when the command cannot be started."""
    if interval <= 0:
        raise ValueError(f"interval must be > 0, got {interval}")
    cmd = list(cmd)
    _check_startable(cmd)
    series: list[tuple[float, int, int, int | None, int]] = []
    seen: set[psutil.Process] = set()
    live: list[int] = []  # the command's pid while it runs
    pending: list[int] = []  # signals that came before it started

    def on_signal(signum: int, _frame: object) -> None:
        if not live:
            pending.append(signum)
        elif signum != signal.SIGINT:  # Ctrl-C already reaches the command (same process group)
            with contextlib.suppress(ProcessLookupError):
                os.kill(live[0], signum)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    pidfd = None
    try:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            raise ProfileError(f"cannot run {cmd[0]!r}: {exc.strerror}", code) from None
        live.append(proc.pid)
        for signum in pending:
            os.kill(proc.pid, signum)
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(proc.pid)  # readable once the process exits
        main_proc, next_pss = psutil.Process(proc.pid), 0.0  # exists until reaped below
        while True:
            now = time.perf_counter()
            want_pss = now >= next_pss
            sample = _sample(main_proc, want_pss, seen)
            if want_pss:
                next_pss = now + (time.perf_counter() - now) / _PSS_DUTY
            series.append((now - t0, *sample))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                live.clear()
                break
            wait = max(0.0, now + interval - time.perf_counter())
            if pidfd is None:
                time.sleep(wait)
            else:
                select.select([pidfd], [], [], wait)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = 128 - code if code < 0 else code  # reaped here, not by Popen
    finally:
        if pidfd is not None:
            os.close(pidfd)
        for signum, handler in old.items():
            signal.signal(signum, handler)
    counts = (usage.ru_utime, usage.ru_stime, usage.ru_majflt, usage.ru_minflt, usage.ru_maxrss * _MAXRSS_UNIT)
    label = label or _default_label(cmd)
    return Profile(cmd, label, interval, proc.returncode, wall, *counts, len(seen), *map(list, zip(*series)))


def _default_label(cmd: Sequence[str], width: int = 40) -> str:
    text = " ".join(shlex.join([os.path.basename(cmd[0]), *cmd[1:]]).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _mib(value: int | None, fmt: str = ".1f") -> str:
    return "n/a" if value is None else f"{value / MIB:{fmt}}"


def profile_table(profiles: Sequence[Profile]) -> str:
    """A markdown table, one row per profile, and its legend."""
    head = ["command", "exit", "wall s", "peak RSS tree MiB", "peak PSS tree MiB", "peak RSS main MiB"]
    head += ["kernel max RSS MiB", "user s", "sys s", "major faults", "minor faults", "procs"]
    rows = []
    for p in profiles:
        row = [" ".join(p.label.split()).replace("|", "\\|"), p.exit_code, f"{p.wall_s:.2f}"]
        row += [_mib(getattr(p, k)) for k in _PEAKS] + [f"{p.user_s:.2f}", f"{p.sys_s:.2f}"]
        rows.append(row + [p.major_faults, p.minor_faults, p.processes_seen])
    interval = ", ".join(sorted({f"{p.interval:g}" for p in profiles}))
    return table(head, rows) + (
        f"\n\nSampled every {interval} s. RSS tree: sum of RSS over the process tree (shared pages counted once "
        "per process). PSS tree: shared pages split between sharers (real footprint). Kernel max RSS: exact peak "
        "of the largest single process (what `time -v` reports; floor: the profiler's own ~20 MiB before exec). "
        "CPU and faults include waited-for descendants."
    )


def plot(profiles: Sequence[Profile], path: str | os.PathLike[str] | None = None) -> Figure:
    """Memory over time, one colour per profile: solid the tree's RSS, dashed its PSS, dotted the main
    process's RSS (where the tree had children); saved to ``path`` when given."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend needed

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for i, p in enumerate(profiles):
        color, rss = f"C{i}", [v / MIB for v in p.rss_tree]
        ax.plot(p.t, rss, color=color, lw=1.8, label=f"{p.label}: RSS, tree sum (peak {p.peak_rss_tree / MIB:.0f} MiB)")
        if rss:
            k = max(range(len(rss)), key=rss.__getitem__)
            ax.plot([p.t[k]], [rss[k]], "o", color=color)
        pss = [(x, v / MIB) for x, v in zip(p.t, p.pss_tree) if v is not None]
        if pss:
            label = f"{p.label}: PSS, tree sum (peak {_mib(p.peak_pss_tree, '.0f')} MiB)"
            ax.plot(*zip(*pss), color=color, lw=1.4, ls="--", label=label)
        if max(p.nprocs, default=0) > 1:
            label = f"{p.label}: RSS, main process (peak {p.peak_rss_main / MIB:.0f} MiB)"
            ax.plot(p.t, [v / MIB for v in p.rss_main], color=color, lw=1.2, ls=":", label=label)
    interval = ", ".join(sorted({f"{p.interval:g}" for p in profiles}))
    names = " vs ".join(p.label for p in profiles)
    ax.set_title(f"Memory over time: {names}\n(process tree sampled every {interval} s)")
    ax.set(xlabel="time since start (s)", ylabel="memory (MiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def profile_main(argv: Sequence[str]) -> int:
    """``bench.py profile [--interval S] [--plot PNG] [--json JSON] [--label NAME ...] -- CMD [::: CMD2 ...]``:
    the summary to stderr (the command's stdout stays clean), its exit code (the first non-zero one)."""
    usage = "%(prog)s [options] -- CMD [ARGS ...] [::: CMD2 [ARGS ...] ...]"
    what = "Sample the memory (RSS and PSS, summed over the process tree) of one or more commands, print a markdown "
    what += "summary to stderr, optionally save a plot and JSON. Commands separated by ':::' run one after the other."
    p = argparse.ArgumentParser(prog=_PROG, usage=usage, description=what)
    p.add_argument("--interval", type=float, default=0.05, metavar="S", help="seconds between samples (%(default)s)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="save a PNG of memory over time (needs matplotlib)")
    p.add_argument("--json", type=Path, metavar="JSON", help="write summaries and time series as JSON")
    p.add_argument("--label", action="append", default=[], metavar="NAME", help="a command's name, once per command")
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, commands = p.parse_args(argv[:cut]), [[]]
    for arg in argv[cut + 1 :]:
        if arg == ":::":
            commands.append([])
        else:
            commands[-1].append(arg)
    if cut == len(argv) or commands == [[]]:
        p.error("no command: put it after '--', e.g. -- python train.py")
    if any(not c for c in commands):
        p.error("empty command around ':::'")
    if args.interval <= 0:
        p.error("--interval must be > 0")
    if args.label and len(args.label) != len(commands):
        p.error(f"got {len(args.label)} --label for {len(commands)} command(s)")
    labels = args.label or [_default_label(c) for c in commands]
    if len(set(labels)) != len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    for out in (args.plot, args.json):
        if out is not None and not out.resolve().parent.is_dir():
            p.error(f"directory of {out} does not exist")
    try:
        for cmd in commands:  # fail before a long first run, not after it
            _check_startable(cmd)
        profiles = []
        for i, (cmd, label) in enumerate(zip(commands, labels)):
            if len(commands) > 1:
                print(f"{_PROG}: [{i + 1}/{len(commands)}] {label}", file=sys.stderr, flush=True)
            profiles.append(profile(cmd, args.interval, label))
    except ProfileError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print("\n" + profile_table(profiles), file=sys.stderr)
    write_json(args.json, {"profiles": [p.to_dict() for p in profiles]})
    if args.plot is not None:
        plot(profiles, args.plot)
    return next((p.exit_code for p in profiles if p.exit_code), 0)


COMMANDS = {"profile": profile_main}


# -- scenarios in fresh processes ------------------------------------------------------------
def run(
    module: str,
    kind: str,
    spec: dict,
    label: str = "",
    *,
    profiled: bool = True,
    threads: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[dict, Profile | None]:
    """``CHILDREN[kind](spec)`` of tool module ``module`` in a fresh ``bench.py --scenario`` process: its result,
    and with ``profiled`` the process tree's `Profile`. ``threads``: one OpenMP and one torch thread; ``env``: more
    environment (``ZARR_*``; ``PYTHONPATH``: the source tree whose shardcache it imports)."""
    fd, out = tempfile.mkstemp(prefix="bench-", suffix=".json")
    os.close(fd)
    spec = {**spec, "module": module, "kind": kind, "out": out, "one_thread": threads}
    cmd = [sys.executable, str(BENCH), "--scenario", json.dumps(spec)]
    full_env = {**os.environ, **(THREAD_ENV if threads else {}), **(env or {})}
    try:
        if profiled:
            print(f"bench: {label or kind} ...", file=sys.stderr, flush=True)
            prof = profile(cmd, 0.05, label or None, full_env)
            code = prof.exit_code
        else:
            prof, code = None, subprocess.run(cmd, env=full_env, check=False).returncode
        if code:
            raise SystemExit(f"bench: {label or kind} failed (exit {code})")
        return json.loads(Path(out).read_text()), prof
    finally:
        os.unlink(out)


def child(fn: Callable[[dict], dict[str, Any]], spec: dict) -> None:
    """The child process's side of ``run``: pin its cores (``spec["cores"]``, before torch is imported), one
    torch thread where asked, then ``fn(spec)`` written as JSON with the RSS the imports left."""
    if spec.get("cores"):
        os.sched_setaffinity(0, {int(c) for c in spec["cores"].split(",")})
    if spec.get("one_thread"):
        import torch

        torch.set_num_threads(1)
    rss = psutil.Process().memory_info().rss
    Path(spec["out"]).write_text(json.dumps({"rss_after_imports": rss, **fn(spec)}))


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
    """One scenario over the rounds: throughput the best round's, first batch the worst's, memory the highest peak."""

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

    def memory(self) -> tuple[str, str]:
        """Peak RSS and PSS of the tree, MiB, as the tables print them."""
        return f"{self.prof.peak_rss_tree / MIB:,.0f}", _mib(self.peak_pss, ",.0f")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the spec, every round's numbers and profile summary."""
        out = {"key": self.key, "label": self.label, "spec": self.spec, "disk_bytes": self.disk}
        out |= {"windows_per_s": self.rate, "first_batch_s": self.first_s}
        out |= {"peak_rss_tree_bytes": self.prof.peak_rss_tree, "peak_pss_tree_bytes": self.peak_pss}
        return out | {"rounds": self.results, "profiles": [p.summary() for p in self.profs]}


# -- options, tables, headers ----------------------------------------------------------------
_PRESETS = {  # the options many scenarios share: name -> (default, help)
    "work": (Path("data/bench"), "data and caches, kept between runs"),
    "json": (None, "write every measurement as JSON to this path"),
    "baseline": (None, "a second source tree (a checkout), run interleaved with this one"),
}


def parser(name: str, doc: str, *presets: str, **options: tuple[Any, str]) -> argparse.ArgumentParser:
    """``bench.py NAME``'s options: the ``presets`` (``work``, ``json``, ``baseline``), then ``--a-b`` from
    ``a_b=(default, help)``, typed as the default (``None``: a string, ``False``: a flag)."""
    prog = name if name.endswith(".py") else f"bench.py {name}"
    p = argparse.ArgumentParser(prog=prog, description=doc.strip().splitlines()[0])
    for key, (default, text) in {**{k: _PRESETS[k] for k in presets}, **options}.items():
        flag = "--" + key.replace("_", "-")
        if default is False:
            p.add_argument(flag, action="store_true", help=text)
        elif default is None:
            p.add_argument(flag, help=text)
        else:
            p.add_argument(flag, type=type(default), default=default, help=f"{text} (default: %(default)s)")
    return p


def table(head: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1) -> str:
    """A markdown table: the first ``left`` columns left-aligned, the others right-aligned."""
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i < left else "---:" for i in range(len(head))) + "|",
    ]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def machine() -> str:
    """Cores, RAM and Python, as a report's first line gives them."""
    ram = psutil.virtual_memory().total / GIB
    return (
        f"{psutil.cpu_count()} cores, {ram:.0f} GiB RAM, {platform.python_implementation()} {platform.python_version()}"
    )


def load() -> str:
    """``uptime``'s line (the machine's load), or the load averages where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def write_json(path: str | os.PathLike[str] | None, payload: Any) -> None:
    """``payload`` as indented JSON at ``path`` (its folder made); nothing for None."""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1, default=str) + "\n")
