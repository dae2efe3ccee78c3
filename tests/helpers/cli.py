"""The command line as a test runs it: in this process (a traceback fails the test) or in a new one."""

from __future__ import annotations

import subprocess
import sys

from shardcache.cli import build_cache_main, main

__all__ = ["cli", "run_cli"]


def cli(capsys, *args: str, prog: str = "build-cache") -> tuple[int, str, str]:
    """Run the CLI in this process: a traceback would fail the test, not hide in a return code."""
    rc = build_cache_main(list(args)) if prog == "build-cache" else main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def run_cli(*args: str, prog: str = "build-cache") -> subprocess.CompletedProcess:
    """Run ``build-cache ARGS`` (or ``shardcache ARGS``) in a new interpreter; its exit code and output."""
    code = (
        "import sys; from shardcache.cli import main, build_cache_main; "
        f"sys.exit({'build_cache_main' if prog == 'build-cache' else 'main'}(sys.argv[1:]))"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600, check=False)
