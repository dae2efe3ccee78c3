"""``ReadSpec``: what a reader reads, made once by a ``WindowStream`` (or a ``WindowDataset``): the valid
windows, the columns, the storage, whether batches carry metadata, and the shapes and sizes that follow."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..format.cache import Cache
from ..format.windows import Ranges, WindowSpec
from .normalize import Normalization, Scaler, Stats
from .options import columns
from .sources import Sources
from .storage import Arena, Host, storage_for

__all__ = ["ReadSpec", "ReadsWindows"]


@dataclass(frozen=True, kw_only=True)
class ReadSpec:
    """What a reader needs to know of its stream: the caches and their valid windows, the window, the
    input/target columns (None: every column), the ``storage`` of decoded rows and batches, and whether
    batches carry each window's place and times (``meta``), and the ``scaler`` of a read-time normalization
    (None: the stored values). Made by ``ReadSpec.of``."""

    sources: Sources
    ranges: Ranges
    window: WindowSpec
    xcols: list[int] | None
    ycols: list[int] | None
    nx: int
    ny: int
    storage: Host
    meta: bool
    scaler: Scaler | None = None

    @classmethod
    def of(
        cls, sources: Sources, spec: WindowSpec, device: torch.device, meta: bool, norm: Normalization | None = None
    ) -> ReadSpec:
        """What a stream of ``sources`` reads: columns checked first, then the split's valid windows, then the
        statistics of ``norm`` (read from the train range's bars)."""
        xcols = columns(sources.caches[0], spec.features, "features")  # every cache has the same features
        ycols = columns(sources.caches[0], spec.target, "target")
        ranges = sources.ranges(spec)
        stats = None if norm is None else norm.stats(sources)
        targets = norm is not None and norm.normalize_targets
        return cls(
            sources=sources,
            ranges=ranges,
            window=spec,
            xcols=xcols,
            ycols=ycols,
            nx=len(xcols) if xcols is not None else sources.n_features,
            ny=len(ycols) if ycols is not None else sources.n_features,
            storage=storage_for(device),
            meta=bool(meta),
            scaler=None if stats is None else Scaler(stats, sources, (xcols, ycols), targets),
        )

    @property
    def device(self) -> torch.device:
        """Where batches are made: the storage's device."""
        return self.storage.device

    @property
    def same_columns(self) -> bool:
        """Inputs and targets are every column, scaled alike: one arena serves both."""
        return self.xcols is None and self.ycols is None and (self.scaler is None or self.scaler.targets)

    def arena(self, rows: int, *, keep: bool = False) -> Arena:
        """An arena of ``rows`` rows on the storage (``Host.arena``), one tensor when the columns are the same."""
        x = self.storage.arena(rows, self.nx, keep=keep)
        return Arena(x, x if self.same_columns else self.storage.arena(rows, self.ny, keep=keep), self.window.seq_len)

    @property
    def row_bytes(self) -> int:
        """Bytes of one decoded bar in a pool's arena(s)."""
        return 4 * (self.nx if self.same_columns else self.nx + self.ny)

    def x_shape(self, n: int) -> tuple[int, int, int]:
        """The shape of ``n`` windows' inputs."""
        return (n, self.window.seq_len, self.nx)

    def y_shape(self, n: int) -> tuple[int, ...]:
        """The shape of ``n`` windows' targets."""
        return self.window.y_shape(n, self.ny)

    @property
    def window_bytes(self) -> int:
        """Bytes of one window in a batch: its inputs and its targets (float32)."""
        return 4 * (self.window.seq_len * self.nx + len(self.window.horizons) * self.ny)

    def target_rows(self, starts: np.ndarray) -> np.ndarray:
        """The target rows of the (valid) windows starting at ``starts``, in ``y``'s layout; a time horizon's
        found from the bar times of those windows alone (no per-window array outlives a batch)."""
        return self.window.target_rows_at(starts, self.ranges, self.sources.bar_times)

    def window_steps(self, starts: np.ndarray) -> torch.Tensor:
        """Each window's target offsets from its start, as ``gather`` takes them (time horizons)."""
        steps = self.target_rows(starts) - (starts[:, None] if self.window.multi else starts)
        return self.storage.index(np.ascontiguousarray(steps, dtype=np.int64))

    def window_meta(self, starts: np.ndarray) -> tuple[torch.Tensor, ...]:
        """``MetaBatch``'s fields after ``y`` for the windows starting at rows ``starts``."""
        source, symbol, local = self.sources.locate(starts)
        index = np.stack([symbol, local], axis=1)
        targets = self.target_rows(starts)
        both = self.sources.bar_times(np.concatenate([starts + self.window.last_step, targets.reshape(-1)]))
        time, target_time = both[: len(starts)], both[len(starts) :].reshape(targets.shape)
        return tuple(torch.from_numpy(m) for m in (index, symbol, time, target_time, source))


class ReadsWindows:
    """The window and cache properties a stream and a dataset both show."""

    spec: WindowSpec
    sources: Sources
    read_spec: ReadSpec

    @property
    def seq_len(self) -> int:
        """Input bars per window."""
        return self.spec.seq_len

    @property
    def horizon(self) -> int | str | tuple[int, ...] | tuple[str, ...]:
        """Target rows after a window's last input bar, or a duration after its time (a tuple: one target each)."""
        return self.spec.horizon

    @property
    def stride(self) -> int:
        """Rows between consecutive window starts."""
        return self.spec.stride

    @property
    def span(self) -> int:
        """Rows one window reads: its inputs and its furthest target (time horizons: the most any valid window reads)."""
        return self.read_spec.ranges.span

    @property
    def caches(self) -> tuple[Cache, ...]:
        """The caches read, in the order given."""
        return self.sources.caches

    @property
    def split(self) -> str | None:
        """The split read (``None``: every bar)."""
        return self.sources.split

    @property
    def stats(self) -> Stats | None:
        """The statistics applied to served values (``Stats``: ``mean`` and ``std`` per feature, per cache or
        per symbol as ``normalize`` says), None without a read-time normalization."""
        scaler = self.read_spec.scaler
        return None if scaler is None else scaler.stats

    @property
    def meta(self) -> bool:
        """Whether batches are ``MetaBatch`` (each window's place and times: ``meta=True``)."""
        return self.read_spec.meta
