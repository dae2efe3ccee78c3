"""Profile the memory of a command and its whole process tree over time.

Successor of the ``profile_memory.sh`` wrapper around GNU ``/usr/bin/time -v``.
``time -v`` reports one number, the peak RSS of the *largest single process*,
and only once the command has finished: a loader that hangs at 40 GB shows
nothing until it is killed, a DataLoader that spreads its memory over eight
workers looks small, and nobody sees *when* memory grew.  This tool samples
the command and all its descendants while they run, and reports:

* **peak RSS, tree** - the largest sum of RSS over the process tree seen in
  one sample.  Pages shared between processes (copy-on-write memory of forked
  DataLoader workers, shared libraries) are counted once per process, so this
  over-states the real footprint of multi-process commands;
* **peak PSS, tree** - the same sum with proportional set size, where each
  shared page is split between the processes sharing it: the honest footprint
  of the tree.  Reading PSS makes the kernel walk the page tables (about
  8 ms per GiB), so it is read at most at a 10 % duty cycle: every sample for
  small trees, less often for huge ones (its peak is then a lower bound).
  ``n/a`` where the kernel does not expose it;
* **peak RSS, main** - the sampled peak of the command's own process;
* **kernel max RSS** - what ``time -v`` calls "Maximum resident set size":
  the exact (unsampled) peak of the largest single process, from ``wait4``.
  The kernel counts the memory a process had before ``exec``, so its floor is
  the profiler's own RSS at spawn (about 20 MiB);
* user and system CPU time, major and minor page faults (``wait4``; they
  include descendants that their parent waited for), wall time, the number of
  distinct processes seen, and the exit code.

Sampling stops when the command's main process exits; descendants it leaves
running are not followed.  A command shorter than one interval is barely
sampled: its kernel max RSS is still exact.  Ctrl-C reaches the
command through the terminal and the profiler still reports what it saw, so a
hung job can be interrupted and its curve kept; a SIGTERM sent to the profiler
is forwarded to the command.  The command's exit code becomes the profiler's
(128+N when killed by signal N, 127 when it cannot be found, 126 when it
cannot be executed).

The report goes to stderr, like ``time -v``, so the command's stdout stays
clean for pipes: a markdown table, one row per command.  ``--json`` writes the
summaries and the time series, ``--plot`` a PNG of memory over time.

Usage::

    python tools/profile_memory.py [--interval S] [--plot PNG] [--json JSON]
                                   [--label NAME ...] -- CMD [ARGS ...]
                                   [::: CMD2 [ARGS ...] ...]

Examples::

    # one command, curve and summary saved
    python tools/profile_memory.py --plot mem.png --json mem.json -- \\
        python train.py --epochs 1

    # compare two loaders on one plot: commands separated by ':::', run one
    # after the other (never concurrently), one --label per command
    python tools/profile_memory.py --plot cmp.png \\
        --label naive --label shardcache -- \\
        python bench.py --loader naive ::: python bench.py --loader shardcache

The functions are importable as well (run from the repository root, or add
``tools/`` to ``sys.path``): ``profile(cmd, interval)`` returns a `Profile`,
`markdown_table` and `plot` render a list of them.

Linux is the target (PSS, pidfd wake-up on exit); elsewhere PSS shows ``n/a``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Profile", "ProfileError", "main", "markdown_table", "plot", "profile"]

MIB = 2**20
SEPARATOR = ":::"
_PSS_DUTY = 0.1  # at most this fraction of wall time spent reading PSS
_PROG = "profile_memory"
# ru_maxrss is in KiB on Linux, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


class ProfileError(Exception):
    """The command could not be started; ``exit_code`` is the shell's code."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Profile:
    """Time series and totals of one profiled command.

    Memory is in bytes.  The series are aligned: sample ``i`` was taken
    ``t[i]`` seconds after the command started.  ``pss_tree[i]`` is ``None``
    where PSS was not read (throttled) or not available.
    """

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
        return {
            "exit_code": self.exit_code,
            "wall_s": self.wall_s,
            "user_s": self.user_s,
            "sys_s": self.sys_s,
            "peak_rss_tree_bytes": self.peak_rss_tree,
            "peak_pss_tree_bytes": self.peak_pss_tree,
            "peak_rss_main_bytes": self.peak_rss_main,
            "kernel_max_rss_bytes": self.kernel_max_rss,
            "major_faults": self.major_faults,
            "minor_faults": self.minor_faults,
            "processes_seen": self.processes_seen,
            "samples": len(self.t),
        }

    def to_dict(self) -> dict[str, Any]:
        """Summary and time series, ready for ``json.dump``."""
        return {
            "label": self.label,
            "cmd": self.cmd,
            "interval_s": self.interval,
            "summary": self.summary(),
            "samples": {
                "t_s": self.t,
                "rss_tree_bytes": self.rss_tree,
                "rss_main_bytes": self.rss_main,
                "pss_tree_bytes": self.pss_tree,
                "nprocs": self.nprocs,
            },
        }


def _check_startable(cmd: Sequence[str]) -> None:
    if not cmd:
        raise ProfileError("empty command", exit_code=2)
    if shutil.which(cmd[0]) is None:
        if os.sep in cmd[0] and os.path.isfile(cmd[0]):
            raise ProfileError(f"cannot run {cmd[0]!r}: not executable", exit_code=126)
        raise ProfileError(f"cannot run {cmd[0]!r}: command not found")


def _sample(main: psutil.Process, want_pss: bool, seen: set[psutil.Process]) -> tuple[int, int, int | None, int]:
    """One sample of the tree: (RSS sum, main RSS, PSS sum or None, nprocs)."""
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
                if pss is None:
                    pss_ok = False
                else:
                    pss_tree += pss
            else:
                info = proc.memory_info()
        except psutil.Error:  # exited, zombie or not ours: not in the tree now
            continue
        seen.add(proc)
        nprocs += 1
        rss_tree += info.rss
        if proc.pid == main.pid:
            rss_main = info.rss
    return rss_tree, rss_main, (pss_tree if pss_ok else None), nprocs


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # readable once the process exits
    except (AttributeError, OSError):
        return None


def _wait_exit(pidfd: int | None, timeout: float) -> None:
    """Sleep up to ``timeout`` seconds, waking early when the command exits."""
    if pidfd is None:
        time.sleep(timeout)
    else:
        select.select([pidfd], [], [], timeout)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def profile(cmd: Sequence[str], interval: float = 0.05, label: str | None = None) -> Profile:
    """Run ``cmd`` to completion, sampling its process tree every ``interval`` s.

    The command inherits stdin, stdout and stderr.  Raises `ProfileError`
    when it cannot be started; its own failures show in ``exit_code``.
    """
    if interval <= 0:
        raise ValueError(f"interval must be > 0, got {interval}")
    cmd = list(cmd)
    _check_startable(cmd)
    t: list[float] = []
    rss_tree: list[int] = []
    rss_main: list[int] = []
    pss_tree: list[int | None] = []
    nprocs: list[int] = []
    seen: set[psutil.Process] = set()

    live: list[int] = []  # the command's pid while it runs (not yet reaped)
    pending: list[int] = []  # signals that came before it started

    def on_signal(signum: int, _frame: object) -> None:
        # Ctrl-C already reaches the command (same process group): survive it
        # to report.  A SIGTERM aimed at the profiler goes on to the command.
        if not live:
            pending.append(signum)
        elif signum != signal.SIGINT:
            with contextlib.suppress(ProcessLookupError):
                os.kill(live[0], signum)

    old_handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            old_handlers[signum] = signal.signal(signum, on_signal)
    pidfd = None
    try:
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd)
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            raise ProfileError(f"cannot run {cmd[0]!r}: {exc.strerror}", code) from None
        live.append(proc.pid)
        for signum in pending:
            os.kill(proc.pid, signum)
        pidfd = _open_pidfd(proc.pid)
        main_proc = psutil.Process(proc.pid)  # exists until reaped below
        next_pss = 0.0
        while True:
            now = time.perf_counter()
            want_pss = now >= next_pss
            sample = _sample(main_proc, want_pss, seen)
            if want_pss:
                next_pss = now + (time.perf_counter() - now) / _PSS_DUTY
            t.append(now - t0)
            rss_tree.append(sample[0])
            rss_main.append(sample[1])
            pss_tree.append(sample[2])
            nprocs.append(sample[3])
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                live.clear()
                break
            _wait_exit(pidfd, max(0.0, now + interval - time.perf_counter()))
        wall = time.perf_counter() - t0
        proc.returncode = _exit_code(status)  # reaped here, not by Popen
    finally:
        if pidfd is not None:
            os.close(pidfd)
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)

    return Profile(
        cmd=cmd,
        label=label or _default_label(cmd),
        interval=interval,
        exit_code=proc.returncode,
        wall_s=wall,
        user_s=usage.ru_utime,
        sys_s=usage.ru_stime,
        major_faults=usage.ru_majflt,
        minor_faults=usage.ru_minflt,
        kernel_max_rss=usage.ru_maxrss * _MAXRSS_UNIT,
        processes_seen=len(seen),
        t=t,
        rss_tree=rss_tree,
        rss_main=rss_main,
        pss_tree=pss_tree,
        nprocs=nprocs,
    )


def _default_label(cmd: Sequence[str], width: int = 40) -> str:
    text = " ".join(shlex.join([os.path.basename(cmd[0]), *cmd[1:]]).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}"


_COLUMNS = (
    "command",
    "exit",
    "wall s",
    "peak RSS tree MiB",
    "peak PSS tree MiB",
    "peak RSS main MiB",
    "kernel max RSS MiB",
    "user s",
    "sys s",
    "major faults",
    "minor faults",
    "procs",
)


def markdown_table(profiles: Sequence[Profile]) -> str:
    """A markdown table, one row per profile, followed by a legend."""

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = [
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|",
    ]
    for p in profiles:
        row = [
            cell(p.label),
            str(p.exit_code),
            f"{p.wall_s:.2f}",
            _mib(p.peak_rss_tree),
            _mib(p.peak_pss_tree),
            _mib(p.peak_rss_main),
            _mib(p.kernel_max_rss),
            f"{p.user_s:.2f}",
            f"{p.sys_s:.2f}",
            str(p.major_faults),
            str(p.minor_faults),
            str(p.processes_seen),
        ]
        lines.append("| " + " | ".join(row) + " |")
    interval = ", ".join(sorted({f"{p.interval:g}" for p in profiles}))
    lines += [
        "",
        (
            f"Sampled every {interval} s. RSS tree: sum of RSS over the process tree "
            "(shared pages counted once per process). PSS tree: shared pages split "
            "between sharers (real footprint). Kernel max RSS: exact peak of the "
            "largest single process (what `time -v` reports; floor: the profiler's own "
            "~20 MiB before exec). CPU and faults include "
            "waited-for descendants."
        ),
    ]
    return "\n".join(lines)


def plot(profiles: Sequence[Profile], path: str | os.PathLike[str] | None = None) -> Figure:
    """Plot memory over time for each profile on one axes; save to ``path``.

    Per command, one colour: solid is the tree's RSS sum, dashed its PSS sum,
    dotted the main process's RSS (drawn only when the tree had children).
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI backend needed

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for i, p in enumerate(profiles):
        color = f"C{i}"
        rss = [v / MIB for v in p.rss_tree]
        ax.plot(p.t, rss, color=color, lw=1.8, label=f"{p.label}: RSS, tree sum (peak {p.peak_rss_tree / MIB:.0f} MiB)")
        if rss:
            k = max(range(len(rss)), key=rss.__getitem__)
            ax.plot([p.t[k]], [rss[k]], "o", color=color)
        pss = [(x, v / MIB) for x, v in zip(p.t, p.pss_tree) if v is not None]
        if pss and p.peak_pss_tree is not None:
            ax.plot(
                *zip(*pss),
                color=color,
                lw=1.4,
                ls="--",
                label=f"{p.label}: PSS, tree sum (peak {p.peak_pss_tree / MIB:.0f} MiB)",
            )
        if max(p.nprocs, default=0) > 1:
            ax.plot(
                p.t,
                [v / MIB for v in p.rss_main],
                color=color,
                lw=1.2,
                ls=":",
                label=f"{p.label}: RSS, main process (peak {p.peak_rss_main / MIB:.0f} MiB)",
            )
    names = " vs ".join(p.label for p in profiles)
    interval = ", ".join(sorted({f"{p.interval:g}" for p in profiles}))
    ax.set_title(f"Memory over time: {names}\n(process tree sampled every {interval} s)")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("memory (MiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _split_commands(argv: Sequence[str]) -> list[list[str]]:
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == SEPARATOR:
            commands.append([])
        else:
            commands[-1].append(arg)
    return commands


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profile_memory.py",
        usage="%(prog)s [options] -- CMD [ARGS ...] [::: CMD2 [ARGS ...] ...]",
        description="Sample the memory (RSS and PSS, summed over the whole process "
        "tree) of one or more commands, print a markdown summary to stderr, and "
        "optionally save a plot and a JSON file. Commands separated by ':::' run "
        "one after the other and are compared on one plot. Exits with the "
        "command's exit code (the first non-zero one when comparing).",
        epilog="example: %(prog)s --plot cmp.png --label naive --label shardcache "
        "-- python bench.py --naive ::: python bench.py",
    )
    parser.add_argument(
        "--interval", type=float, default=0.05, metavar="S", help="seconds between samples (default: %(default)s)"
    )
    parser.add_argument("--plot", type=Path, metavar="PNG", help="save a PNG of memory over time (needs matplotlib)")
    parser.add_argument("--json", type=Path, metavar="JSON", help="write summaries and time series as JSON")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="name of a command in the table and plot; repeat once per command, in order (default: the command line)",
    )
    return parser


def _fail(message: str, code: int) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if "--" in argv:
        cut = argv.index("--")
        args, rest = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    else:
        args, rest = parser.parse_known_args(argv)[0], []
    if not rest:
        parser.error("no command: put it after '--', e.g. -- python train.py")
    commands = _split_commands(rest)
    if any(not c for c in commands):
        parser.error(f"empty command around '{SEPARATOR}'")
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    if args.label and len(args.label) != len(commands):
        parser.error(f"got {len(args.label)} --label for {len(commands)} command(s)")
    labels = args.label or [_default_label(c) for c in commands]
    if len(set(labels)) != len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    for out in (args.plot, args.json):
        if out is not None and not out.resolve().parent.is_dir():
            parser.error(f"directory of {out} does not exist")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib (pip install matplotlib)", 2)

    try:
        for cmd in commands:  # fail before a long first run, not after it
            _check_startable(cmd)
        profiles = []
        for i, (cmd, label) in enumerate(zip(commands, labels)):
            if len(commands) > 1:
                print(f"{_PROG}: [{i + 1}/{len(commands)}] {label}", file=sys.stderr, flush=True)
            profiles.append(profile(cmd, args.interval, label))
    except ProfileError as exc:
        return _fail(str(exc), exc.exit_code)

    print("\n" + markdown_table(profiles), file=sys.stderr)
    try:
        if args.json is not None:
            payload = {"profiles": [p.to_dict() for p in profiles]}
            args.json.write_text(json.dumps(payload, indent=1) + "\n")
            print(f"{_PROG}: wrote {args.json}", file=sys.stderr)
        if args.plot is not None:
            plot(profiles, args.plot)
            print(f"{_PROG}: wrote {args.plot}", file=sys.stderr)
    except OSError as exc:
        return _fail(f"cannot write output: {exc}", 1)
    return next((p.exit_code for p in profiles if p.exit_code != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
