"""Errors that the CLI turns into one clean line: expected problems with inputs or caches."""

from __future__ import annotations

__all__ = ["ShardcacheError", "SourceError", "CacheError", "one_line"]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for a message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class ShardcacheError(Exception):
    """An expected failure with a message fit for a user (no traceback needed)."""


class SourceError(ShardcacheError):
    """An input file that cannot be read as market data; the message names the file."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class CacheError(ShardcacheError):
    """A cache that is missing, incomplete, corrupt or of an unknown format version."""
