"""``RunOptions``: how one build or append runs (threads, cluster, replace or resume, store options,
progress), never recorded in the cache; and the split of ``build_cache``'s keyword arguments
between it and ``BuildOptions``, the options a cache is built with."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError
from ..format.build_options import BuildOptions
from ..format.cache import Cache
from ..format.numbers import whole_number
from ..format.paths import check_storage_options
from ..format.settings import grouped, only_known

__all__ = ["RunOptions", "settings"]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How one build or append runs (never recorded in the cache): threads or a cluster, overwrite or resume,
    fsspec options, progress."""

    workers: int | None = None
    """Local dask threads (None: one per core)."""
    scheduler: Any = None
    """A dask.distributed scheduler address or Client (None: ``DASK_SCHEDULER_ADDRESS``, else local threads)."""
    overwrite: bool = False
    """Replace a cache already at the output (it stays readable until the new one is swapped in)."""
    resume: bool = False
    """Finish an interrupted run from its finished tasks (same inputs and options)."""
    storage_options: dict[str, Any] | None = None
    """fsspec options for the inputs and the output (``{'endpoint_url': ...}``)."""
    progress: bool = True
    """Show a progress display (on stderr)."""

    def __post_init__(self) -> None:
        if self.workers is not None:
            object.__setattr__(self, "workers", whole_number("workers", self.workers, 1))
        check_storage_options(self.storage_options)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))


def settings(
    caller: str,
    options: BuildOptions | None,
    run: RunOptions | None,
    given: dict[str, Any],
    *,
    build: bool = True,
) -> tuple[BuildOptions, RunOptions]:
    """``caller``'s options and run settings from its ``options``/``run`` objects or from keyword arguments
    ``given`` naming their fields; without ``build`` (an append) a build option is refused."""
    fields = dict(given)
    only_known(caller, fields, BuildOptions.names() + RunOptions.names())
    if not build:
        for key in BuildOptions.names():
            if key in fields:
                raise OptionError(key, fields[key], f"{caller} keeps the build options of its cache; drop it")
    if isinstance(fields.get("stats_from"), (Cache, os.PathLike)):
        frozen = fields["stats_from"]
        fields["stats_from"] = frozen.url if isinstance(frozen, Cache) else os.fspath(frozen)
    options = grouped(caller, "options", BuildOptions, options, fields)
    return options, grouped(caller, "run", RunOptions, run, fields)
