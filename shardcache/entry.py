"""The console scripts ``shardcache`` and ``build-cache``: Ctrl-C at any moment, while the command
line's modules are still being imported too, prints "interrupted" and exits 130, never a traceback."""

from __future__ import annotations

import signal
import sys

__all__ = ["build_cache_main", "main"]


def _interruptible(name: str, prog: str) -> int:
    """Import the command line and run its entry point ``name``, answering Ctrl-C in one line."""
    try:
        from . import cli

        entry: int = getattr(cli, name)()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        entry = 130
    # the command is done (its cache published, or its staging left to --resume): a Ctrl-C while the
    # interpreter joins its threads on the way out changes nothing, so it must not kill the process
    # with SIGINT (exit -2) after the command said how it ended; this process is the console script's own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return entry


def main() -> int:
    """Entry point of ``shardcache``."""
    return _interruptible("main", "shardcache")


def build_cache_main() -> int:
    """Entry point of ``build-cache``."""
    return _interruptible("build_cache_main", "build-cache")
