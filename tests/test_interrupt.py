"""Ctrl-C at any moment of a build, while the command line is still importing its modules too,
prints "interrupted" and exits 130 with no traceback, and leaves no cache that looks complete (issue 30).

A real SIGINT is sent at chosen moments: by the child itself as it starts importing a given module
(deterministic, however loaded the machine), or from here while the build runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from ohlcv_files import ohlcv, write_parquet

from shardcache.format.cache import open_cache

ENTRY = "import sys; from shardcache.entry import build_cache_main; sys.exit(build_cache_main())"
# the child sends itself SIGINT when it first imports MODULE (sys.argv[1]), then runs the entry point
AT_IMPORT = """
import os, signal, sys
MODULE = sys.argv.pop(1)
class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, _Interrupt())
from shardcache.entry import build_cache_main
sys.exit(build_cache_main())
"""


def _check(proc: subprocess.Popen, out: Path) -> None:
    _, err = proc.communicate(timeout=120)
    _check_ended(proc.returncode, err, out)


def _check_ended(returncode: int, err: str, out: Path) -> None:
    """Interrupted: one line, exit 130, nothing published."""
    assert "Traceback" not in err, err
    assert (returncode, err.strip().splitlines()[-1]) == (130, "build-cache: interrupted"), err
    assert not (out / "zarr.json").exists()  # nothing published: a rerun builds or resumes it


@pytest.fixture
def bars(tmp_path) -> str:
    return write_parquet(tmp_path / "ES.parquet", ohlcv(200_000))


@pytest.mark.parametrize("module", ["shardcache.cli", "numpy", "zarr", "shardcache.ingest.builder", "pyarrow", "dask"])
def test_ctrl_c_while_the_command_line_imports(tmp_path, bars, module):
    out = tmp_path / "c.zarr"
    cmd = [sys.executable, "-c", AT_IMPORT, module, bars, "--out", str(out)]
    _check(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out)


@pytest.mark.parametrize("delay", [0.5, 1.0, 1.5])
def test_ctrl_c_during_the_build(tmp_path, bars, delay):
    out = tmp_path / "c.zarr"
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, bars, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:  # the signal came as the finished build shut down: it changed nothing
            assert "Traceback" not in err and open_cache(out).n_bars > 0, err
            return
        _check_ended(proc.returncode, err, out)
    else:  # finished before the signal on a fast machine: nothing was interrupted
        assert proc.returncode == 0


def test_the_console_scripts_are_the_interruptible_entry_points():
    with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert scripts == {"shardcache": "shardcache.entry:main", "build-cache": "shardcache.entry:build_cache_main"}


# Ctrl-C inside a zarr call, after it made its coroutine and before it ran it (what the timed SIGINT
# above can land on): the coroutine is dropped with the interrupt, and the line stays the last one
UNRUN_COROUTINE = """
import sys
from shardcache.cli import _run
async def create_array():
    pass
def sync(coro):
    raise KeyboardInterrupt
sys.exit(_run(lambda args: sync(create_array()), type("Args", (), {"quiet": True})(), "build-cache"))
"""


def test_ctrl_c_before_a_made_coroutine_ran_still_ends_in_one_line():
    run = [sys.executable, "-c", UNRUN_COROUTINE]
    done = subprocess.run(run, check=False, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "build-cache: interrupted\n"), done.stderr
