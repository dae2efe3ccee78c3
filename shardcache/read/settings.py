"""A stream's settings as objects, each checked when it is made: ``PlanSettings`` (which batches an epoch
has), ``LoaderSettings`` (how they are read), ``LocalCopy`` (node-local copies of shard objects) and
``CacheSource`` (one cache with its own settings). ``StreamFields`` and ``DatasetFields`` type the keyword
arguments that name their fields instead (``shardcache.format.settings``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

import torch

from ..errors import OptionError, OptionTypeError
from ..format.cache import Cache
from ..format.local_cache import LocalCache
from ..format.numbers import whole_number
from ..format.paths import check_storage_options, is_url, layers
from ..tuning import SURE_TO_FIT
from .folds import Fold
from .options import check_device, default_decoders, parse_budget, parse_size

__all__ = [
    "IDLE_LAYERS",
    "TEMPORARY_LIMIT",
    "CacheInput",
    "CacheSource",
    "DatasetFields",
    "LoaderSettings",
    "LocalCopy",
    "PlanSettings",
    "StreamFields",
    "sources_of",
    "weights_of",
]

CacheInput = Cache | str | os.PathLike[str]
"""One cache as a stream takes it: an open ``Cache``, or a path or fsspec URL to open."""

TEMPORARY_LIMIT = 1 << 30  # bytes of a remote cache's temporary local copy when cache_limit is not given


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What decides an epoch's batches besides the windows, checked when made: ``batch_size``, ``shuffle``,
    ``seed``, ``mix`` (shards whose windows a pool shuffles together) and ``drop_last``."""

    batch_size: int = 256
    """Windows per batch."""
    shuffle: bool = True
    """Whether each epoch is shuffled (shard order and within pools)."""
    seed: int = 0
    """The shuffle's seed: epoch ``e`` of seed ``s`` is the same on every run."""
    mix: int = 4
    """Shards whose windows one pool shuffles together."""
    drop_last: bool = False
    """Whether each rank's last partial batch is dropped."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", whole_number("batch_size", self.batch_size, 1))
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "seed", whole_number("seed", self.seed, 0))
        object.__setattr__(self, "mix", whole_number("mix", self.mix, 1))
        object.__setattr__(self, "drop_last", bool(self.drop_last))

    def signature(self) -> dict[str, Any]:
        """The settings a saved position must be resumed with."""
        return {"seed": self.seed, **asdict(self)}  # seed first, as saved states have always had it


@dataclass(frozen=True, init=False)
class LoaderSettings:
    """How a stream reads its batches: ``prefetch`` blocks decoded ahead of the open pools by ``decoders``
    threads, or ``memory_budget`` bytes of decoded blocks (``"512MiB"``, ``"auto"``), on ``device``. Made
    from the values as a user gives them, and held resolved (bytes, a device)."""

    prefetch: int
    """Blocks decoded ahead of the open pools (the bound on memory without a budget)."""
    decoders: int | None
    """Decoder threads of each reader (None: ``default_decoders``)."""
    memory_budget: int | None
    """Bytes of decoded blocks, shared by the DataLoader workers (None: ``prefetch`` bounds them)."""
    device: torch.device
    """Where blocks live and batches are gathered."""

    def __init__(
        self,
        *,
        prefetch: int = 2,
        decoders: int | None = None,
        memory_budget: int | str | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        dev = check_device(device)
        object.__setattr__(self, "prefetch", whole_number("prefetch", prefetch, 0))
        object.__setattr__(self, "decoders", None if decoders is None else whole_number("decoders", decoders, 0))
        object.__setattr__(self, "memory_budget", parse_budget(memory_budget, dev))
        object.__setattr__(self, "device", dev)

    def decoders_for(self, readers: int) -> int:
        """Decoder threads of each of ``readers`` readers: as given, else ``default_decoders``."""
        return self.decoders if self.decoders is not None else default_decoders(readers)

    def capacity(self, blocks: int, block_bytes: int, readers: int, mix: int) -> int:
        """Bytes each of ``readers`` readers may hold when a batch needs ``blocks`` blocks of up to ``block_bytes``:
        those plus ``prefetch``, or an equal share of the ``memory_budget``, which must hold them."""
        if self.memory_budget is None:
            return (blocks + self.prefetch) * block_bytes
        per = self.memory_budget // readers
        if per < blocks * block_bytes:
            raise OptionError(
                "memory_budget",
                self.memory_budget,
                f"gives each of {readers} reader(s) {per} B, but a reader must hold {blocks} blocks of up to "
                f"{block_bytes} B at once (mix={mix} shards per pool, a batch can straddle two pools): raise "
                f"memory_budget to at least {blocks * block_bytes * readers} B or lower mix",
            )
        return per

    def check_batch(self, batch_size: int, windows: int, window_bytes: int) -> None:
        """Refuse batches of ``windows`` windows of ``window_bytes`` each that the device's memory cannot hold,
        before anything is allocated."""
        nbytes = windows * window_bytes
        if nbytes <= SURE_TO_FIT:
            return
        if self.device.type == "cuda":
            free = int(torch.cuda.mem_get_info(self.device)[0])
        else:
            import psutil

            free = int(psutil.virtual_memory().available)
        if nbytes > free:
            raise OptionError(
                "batch_size",
                batch_size,
                f"a batch of {windows:,} windows is {nbytes / 2**30:,.1f} GiB ({window_bytes:,} B each), more than "
                f"the {free / 2**30:,.1f} GiB of {self.device.type} memory available: lower batch_size",
            )


@dataclass(frozen=True, init=False)
class LocalCopy:
    """Where a stream keeps node-local copies of the shard objects it reads: ``cache_dir`` (a folder,
    shared by every process of the node that names it), with at most ``cache_limit`` bytes (``"50GB"``;
    None: no limit), oldest evicted first. ``apply`` reads caches through it."""

    cache_dir: str | None
    """The folder of the copies (None: a temporary one for a remote cache, none for a local one)."""
    cache_limit: int | None
    """Bytes the copies may take (None: no limit, or 1 GiB for a temporary folder)."""

    def __init__(
        self, *, cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None
    ) -> None:
        if cache_dir is not None and not isinstance(cache_dir, str | os.PathLike):
            raise OptionTypeError(f"cache_dir={cache_dir!r}: must be a folder path (a str or os.PathLike)")
        directory = None if cache_dir is None else os.fspath(cache_dir)
        if directory is not None and not directory.strip():
            raise OptionError("cache_dir", directory, "is empty: give a folder for the node-local copies, or None")
        if directory is not None and os.path.exists(directory) and not os.path.isdir(directory):
            raise OptionError("cache_dir", directory, "is a file, not a folder")
        object.__setattr__(self, "cache_dir", directory)
        object.__setattr__(self, "cache_limit", None if cache_limit is None else parse_size(cache_limit, "cache_limit"))
        object.__setattr__(self, "_limit_given", cache_limit)  # as given: the error of ``check`` names it

    def check(self, sources: Sequence[CacheSource]) -> None:
        """Refuse a limit with neither ``cache_dir`` nor a remote cache: it would bound nothing."""
        if self.cache_limit is None or self.cache_dir is not None or any(is_url(s.url) for s in sources):
            return
        raise OptionError(
            "cache_limit",
            getattr(self, "_limit_given", self.cache_limit),
            "bounds a node-local copy of a remote cache's shards; this cache is local: give {cache_dir} too",
            {"cache_dir": None},
        )

    def apply(self, caches: Sequence[Cache]) -> tuple[list[Cache], LocalCache | None]:
        """``caches`` read through this local copy, and the temporary ``LocalCache`` made for them (the caller
        removes it): ``cache_dir`` when given, else a temporary folder of ``cache_limit`` (default 1 GiB) for
        the caches behind a URL; a local cache stays as it is. A ``filecache::`` or ``blockcache::`` layer,
        which caches nothing under these reads, is named in one warning."""
        for cache in caches:
            _warn_idle_layer(cache.url)
        if self.cache_dir is not None:
            shared = LocalCache(self.cache_dir, self.cache_limit)
            return [c.with_local(shared) for c in caches], None
        remote = [c.local is None and is_url(c.url) for c in caches]
        if not any(remote):
            return list(caches), None
        temporary = LocalCache.temporary_dir(TEMPORARY_LIMIT if self.cache_limit is None else self.cache_limit)
        return [c.with_local(temporary) if r else c for c, r in zip(caches, remote)], temporary


IDLE_LAYERS = ("filecache", "blockcache")
"""fsspec caching layers that keep nothing under a stream's asynchronous reads."""


def _warn_idle_layer(url: str) -> None:
    """Warn when ``url``'s outer layer is one of ``IDLE_LAYERS``, naming what to use instead."""
    protocols = layers(url) if is_url(url) else []
    if not protocols or protocols[0] not in IDLE_LAYERS:
        return
    inner = url.split("::", 1)[1]
    warnings.warn(
        f"{url}: fsspec's {protocols[0]}:: caches nothing under a stream's reads (every read goes to "
        f"{protocols[-1]}://); the stream keeps node-local copies itself: read {inner!r} with "
        "cache_dir=FOLDER to keep them across runs, bounded by cache_limit and shared by the node's processes",
        UserWarning,
        stacklevel=5,  # the caller of WindowStream or WindowDataset (through Sources.open and apply)
    )


@dataclass(frozen=True)
class CacheSource:
    """One cache a stream reads, with its own settings (as Mosaic's ``Stream``): ``cache`` (a path, an
    fsspec URL or an open ``Cache``), the fsspec ``storage_options`` of a path or URL, and ``weight``, its
    share of each epoch's windows (every source weighted, or none: see ``WindowStream``'s ``weights``)."""

    cache: CacheInput
    """The cache: a path, an fsspec URL or an open ``Cache``."""
    storage_options: Mapping[str, Any] | None = field(default=None, kw_only=True)
    """fsspec options of a path or URL (``{'endpoint_url': ...}``); an open ``Cache`` keeps its own."""
    weight: float | None = field(default=None, kw_only=True)
    """This cache's share of each epoch's windows, against the other sources' (None: unweighted)."""

    def __post_init__(self) -> None:
        if not isinstance(self.cache, Cache | str | os.PathLike):
            raise OptionTypeError(f"caches: {self.cache!r} is not a cache (a path, an fsspec URL or an open Cache)")
        check_storage_options(self.storage_options)
        if self.storage_options is not None and isinstance(self.cache, Cache):
            raise OptionError(
                "storage_options", self.storage_options, "apply to a path or URL; this cache is already open"
            )

    @property
    def url(self) -> str:
        """The cache's path or URL, as given."""
        return self.cache.url if isinstance(self.cache, Cache) else os.fspath(self.cache)


def sources_of(caches: Any, storage_options: Any = None) -> list[CacheSource]:
    """``caches`` (one, or a sequence) as one ``CacheSource`` each, with ``storage_options`` (one mapping, or one
    per cache), checked before any cache is opened."""
    single = isinstance(caches, Cache | str | os.PathLike | CacheSource)
    items = [caches] if single else _items(caches)
    options = [storage_options] if single else _per_cache(storage_options, items)
    out = []
    for item, so in zip(items, options):
        if not isinstance(item, CacheSource):
            out.append(CacheSource(item, storage_options=so))
        elif so is None:
            out.append(item)
        elif item.storage_options is not None:
            raise OptionTypeError(
                f"storage_options: {item.url} is a CacheSource with its own; give them there or here, not both"
            )
        else:
            out.append(replace(item, storage_options=so))
    return out


def weights_of(sources: Sequence[CacheSource], weights: Any) -> Any:
    """``weights`` as given, or each ``CacheSource``'s ``weight`` (every one or none), not both."""
    own = [s.weight for s in sources]
    if all(w is None for w in own):
        return weights
    if weights is not None:
        raise OptionTypeError("weights: give each CacheSource its weight, or weights=, not both")
    missing = [s.url for s in sources if s.weight is None]
    if missing:
        raise OptionError("weights", own, f"{', '.join(missing)} has no weight: weight every CacheSource, or none")
    return tuple(own)


def _items(caches: Any) -> list[Any]:
    """A sequence of caches as a list, each a cache or a ``CacheSource``."""
    if not isinstance(caches, Sequence) or isinstance(caches, bytes):
        raise OptionTypeError(
            f"caches={caches!r}: give a cache (a path, an fsspec URL or an open Cache) or a list of them"
        )
    items = list(caches)
    if not items:
        raise OptionError("caches", items, "give at least one cache")
    bad = next((c for c in items if not isinstance(c, Cache | str | os.PathLike | CacheSource)), None)
    if bad is not None:
        raise OptionTypeError(f"caches: {bad!r} is not a cache (a path, an fsspec URL or an open Cache)")
    return items


def _per_cache(options: Any, items: list[Any]) -> list[dict[str, Any] | None]:
    """Each of several caches' ``storage_options``: one mapping for every path or URL, or one (or None) per cache."""
    if options is None:
        return [None] * len(items)
    if isinstance(options, Mapping):
        opened = [isinstance(c.cache if isinstance(c, CacheSource) else c, Cache) for c in items]
        if all(opened):
            raise OptionError("storage_options", options, "apply to paths or URLs; every cache given is already open")
        return [None if o else dict(options) for o in opened]
    if isinstance(options, Sequence) and not isinstance(options, str | bytes) and len(options) == len(items):
        return [_mapping(o) for o in options]
    raise OptionTypeError(
        f"storage_options={options!r}: give one mapping for every path or URL, or a list of "
        f"{len(items)} (a mapping or None per cache)"
    )


def _mapping(options: Any) -> dict[str, Any] | None:
    """One cache's ``storage_options``: a mapping or None."""
    if options is None or isinstance(options, Mapping):
        return None if options is None else dict(options)
    raise OptionTypeError(f"storage_options={options!r}: one cache takes one mapping of fsspec options")


class _WindowFields(TypedDict, total=False):
    horizon: int | str | Sequence[int] | Sequence[str] | None
    stride: int | None
    features: Sequence[str] | None
    target: Sequence[str] | None


class DatasetFields(_WindowFields, total=False):
    """The keyword arguments ``WindowDataset`` takes by name: ``WindowSpec``'s, ``Cut``'s, ``LocalCopy``'s,
    ``Normalization``'s and ``storage_options``."""

    split: str | None
    split_times: str | Mapping[str, str] | None
    fold: Fold | None
    embargo: str | None
    storage_options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None
    cache_dir: str | os.PathLike[str] | None
    cache_limit: int | str | None
    normalize: str | None
    normalize_targets: bool
    pool_caches: bool


class StreamFields(DatasetFields, total=False):
    """The keyword arguments ``WindowStream`` takes by name beyond ``DatasetFields``: ``PlanSettings``',
    ``LoaderSettings``' and ``weights``."""

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    mix: int
    prefetch: int
    decoders: int | None
    memory_budget: int | str | None
    device: str | torch.device | None
    weights: Sequence[float] | None
