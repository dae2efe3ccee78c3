"""The console scripts ``shardcache`` and ``build-cache``: Ctrl-C at any moment, while the command
line's modules are still being imported too, prints "interrupted" and exits 130, never a traceback."""

from __future__ import annotations

import sys

__all__ = ["build_cache_main", "main"]


def _interruptible(name: str, prog: str) -> int:
    """Import the command line and run its entry point ``name``, answering Ctrl-C in one line."""
    try:
        from . import cli

        entry: int = getattr(cli, name)()
        return entry
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main() -> int:
    """Entry point of ``shardcache``."""
    return _interruptible("main", "shardcache")


def build_cache_main() -> int:
    """Entry point of ``build-cache``."""
    return _interruptible("build_cache_main", "build-cache")
