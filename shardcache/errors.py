"""The errors shardcache raises: one root a caller can catch, each also the builtin it would expect.

Modelled on zarr's ``BaseZarrError(ValueError)``: ``except ValueError`` and ``except ShardcacheError`` both
work. The CLI turns any ``ShardcacheError`` into one line on stderr and exit status 2; an ``OptionError`` is
phrased there with the command line's flag. Each class's docstring says when it is raised.
"""

from __future__ import annotations

__all__ = [
    "CacheError",
    "OptionError",
    "OptionTypeError",
    "SeveralCachesError",
    "ShardcacheError",
    "SourceError",
    "StateError",
    "StoreError",
    "StreamClosedError",
    "one_line",
]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for a message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class ShardcacheError(Exception):
    """An expected failure with a message fit for a user (no traceback needed)."""


class OptionError(ShardcacheError, ValueError):
    """An option with a value it cannot take: ``option`` is the parameter's name (``max_gap``).

    ``str()`` names the parameter (``max_gap='-5m': ...``); ``flag()`` names the CLI flag
    (``--max-gap '-5m': ...``), which the command line prints instead. Other options the problem
    names are written ``{name}`` in it, with their values in ``mentions`` (None: the name alone),
    so each reader sees them as it would write them: ``normalize='none'`` or ``--normalize none``.
    """

    def __init__(self, option: str, value: object, problem: str, mentions: dict[str, object] | None = None) -> None:
        self.option, self.value, self.problem, self.mentions = option, value, problem, dict(mentions or {})
        super().__init__(f"{option}={value!r}: {self._problem(cli=False)}")

    def __reduce__(self) -> tuple[type, tuple[str, object, str, dict[str, object]]]:  # picklable across dask workers
        return (type(self), (self.option, self.value, self.problem, self.mentions))

    def _problem(self, *, cli: bool) -> str:
        text = self.problem
        for name, value in self.mentions.items():
            if cli:
                shown = _flag(name) + ("" if value is None else f" {value}")
            else:
                shown = name + ("" if value is None else f"={value!r}")
            text = text.replace("{" + name + "}", shown)
        return text

    def flag(self) -> str:
        """The message as the command line says it, with the option's flag."""
        return f"{_flag(self.option)} {self.value!r}: {self._problem(cli=True)}"


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


class OptionTypeError(ShardcacheError, TypeError):
    """An option, argument or index of a type it cannot take; the message names it."""


class SourceError(ShardcacheError, ValueError):
    """An input file that cannot be read as market data; the message names the file."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        """The input file."""
        self.problem = problem
        """What is wrong with it."""
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # picklable across dask workers
        return (type(self), (self.path, self.problem))


class CacheError(ShardcacheError, ValueError):
    """A cache that is missing, incomplete, corrupt or of an unknown format version."""


class StoreError(CacheError):
    """A request to a cache's object store that failed after the client's retries (an endpoint that
    stalls, drops or refuses): the cache itself may be intact, and a build it stopped resumes."""


class StateError(ShardcacheError, ValueError):
    """A ``state_dict`` from another stream, or one that does not describe a position in its epoch."""


class StreamClosedError(ShardcacheError, RuntimeError):
    """A stream or iterator used after ``close()``, or an iterator superseded by a newer ``iter()``."""


class SeveralCachesError(ShardcacheError, AttributeError):
    """The one cache of a stream (``stream.cache``) asked of a stream of several (``stream.caches``)."""
