"""Where decoded rows live (``Host``, or a torch ``Device``), and the one ``gather`` that copies windows out.

On the CPU a gather never runs on torch's intra-op pool: spread over threads, an ``index_select`` runs
several times slower once another thread is busy (docs/performance.md), and ``torch.set_num_threads`` is the
caller's. A reader's thread runs one OpenMP thread (``one_thread_here``); elsewhere a gather is cut into
pieces ATen runs inline (``chunk_for``), or uses numpy.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import mmap
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..format.windows import WindowSpec
from ..tuning import HUGE_MAP, MIN_CHUNK, SMALL_ARENA

if TYPE_CHECKING:
    from .normalize import BlockScale

__all__ = [
    "Arena",
    "Device",
    "Host",
    "block_columns",
    "chunk_for",
    "gather",
    "mapped",
    "one_thread_here",
    "storage_for",
    "target_steps",
]

GRAIN = 32768  # at::internal::GRAIN_SIZE: a parallel_for over at most this many elements runs inline
WHOLE = 1 << 62  # a chunk no gather reaches: one index_select


def mapped(shape: tuple[int, ...], dtype: Any, populate: bool = False, huge: bool = True) -> np.ndarray:
    """A new array in a private anonymous memory map of its own, whose pages go back to the OS once it is freed.

    A large map asks for huge pages (windows gather faster from them) unless ``huge=False`` (short-lived maps,
    where fresh huge pages fault in slower); ``populate`` faults every page in at once. Private, since shared
    anonymous memory faults in slower. docs/performance.md has the figures."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    buf = mmap.mmap(-1, max(1, nbytes), flags=flags)
    if huge and nbytes >= HUGE_MAP and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.ndarray(shape, dtype, buffer=buf)  # the root array: views refer to it


class Arena:
    """Decoded rows: inputs ``x`` and targets ``y`` (one tensor when the columns are the same), and every window
    of ``x`` as a view ``windows`` ``[n - seq_len + 1, seq_len, F]``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seq_len: int) -> None:
        self.x, self.y, self.seq_len = x, y, seq_len
        n, f = x.shape
        self.windows = torch.as_strided(x, (max(n - seq_len + 1, 0), seq_len, f), (f, f, 1))

    @property
    def shared(self) -> bool:
        """Inputs and targets are one tensor: every column."""
        return self.y is self.x


def gather(
    src: Arena,
    rows: Any,
    steps: torch.Tensor,
    chunk: int,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows starting at arena rows ``rows`` and their targets (rows ``rows + steps``), copied into ``out``
    or new tensors: one ``index_select`` with ``WHOLE``, else pieces of ``chunk`` windows, or numpy with 0.
    ``steps`` is one offset (0-d) or a row of them ``[1, H]`` for every window, or each window's (``[m]``,
    ``[m, H]``; time horizons)."""
    m, ny, lead = len(rows), src.y.shape[1], (-1,) + (1,) * max(steps.ndim - 1, 0)
    if chunk == WHOLE:  # a device, or a host thread whose torch ops run on it alone
        ys = rows.reshape(lead) + steps
        if out is None:
            out = src.x.new_empty((m, src.seq_len, src.x.shape[1])), src.y.new_empty((*ys.shape, ny))
        torch.index_select(src.windows, 0, rows, out=out[0])
        torch.index_select(src.y, 0, ys.reshape(-1), out=out[1].view(-1, ny))
        return out
    r = rows if isinstance(rows, np.ndarray) else rows.numpy()
    yr = r.reshape(lead) + steps.numpy()
    xn, yn = src.x.numpy(), src.y.numpy()
    if out is None:  # one copy each
        return torch.from_numpy(src.windows.numpy()[r]), torch.from_numpy(yn[yr])
    if chunk:
        t = torch.as_tensor(rows)
        for i in range(0, m, chunk):
            torch.index_select(src.windows, 0, t[i : i + chunk], out=out[0][i : i + chunk])
    else:  # ``mode="clip"``: the output is not buffered
        np.take(xn, r[:, None] + np.arange(src.seq_len), axis=0, out=out[0].numpy(), mode="clip")
    np.take(yn, yr.reshape(-1), axis=0, out=out[1].numpy().reshape(-1, ny), mode="clip")
    return out


def target_steps(storage: Host, window: WindowSpec) -> torch.Tensor:
    """A window's target offsets as ``gather`` takes them: 0-d for one horizon, ``[1, H]`` for a sequence of them
    (row horizons; a time horizon's differ by window: ``ReadSpec.window_steps``)."""
    steps = window.target_steps
    return storage.index(steps.reshape(1, -1) if window.multi else steps[:1].reshape(()))


@functools.lru_cache(maxsize=1)
def _omp_set_num_threads() -> Any:
    """``omp_set_num_threads`` of the libgomp torch has loaded, or None."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in [*sorted(glob.glob(os.path.join(lib, "libgomp*.so*"))), "libgomp.so.1"]:
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    return None


def one_thread_here() -> bool:
    """Run the calling thread's torch CPU ops on it alone, every other thread as it was; False where not possible."""
    setter = _omp_set_num_threads()
    if setter is None:
        return False
    torch.get_num_threads()  # torch's per-thread initialisation first: it would undo the setting below
    setter(1)
    return torch.get_num_threads() == 1


def chunk_for(storage: Host, seq_len: int, nx: int, own_thread: bool) -> int:
    """Windows per ``index_select`` that ATen runs inline (0: ``numpy.take``); ``WHOLE`` on a device or ``own_thread``."""
    if not storage.on_host or own_thread:
        return WHOLE
    chunk = GRAIN // (seq_len * nx)
    return chunk if chunk >= MIN_CHUNK else 0


Read = Callable[[np.ndarray | None], np.ndarray]
"""A block's read: its rows of every column, into the given array (or a new one with None)."""


Cols = tuple[list[int] | None, list[int] | None]
"""A block's input and target columns (None: every column)."""


def block_columns(
    rows: np.ndarray, cols: Cols, shared: bool, scale: BlockScale | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoded block's inputs and targets (``cols``; one tensor when ``shared``), scaled by ``scale``: they
    may share ``rows``' memory, never each other's unless ``shared``."""
    xcols, ycols = cols
    x = rows if xcols is None else np.ascontiguousarray(rows[:, xcols])  # a list index: a copy
    if shared:
        y = x
    elif ycols is not None:
        y = np.ascontiguousarray(rows[:, ycols])
    else:
        y = rows.copy() if xcols is None else rows
    if scale is not None:
        scale.x(x)
        if not shared:
            scale.y(y)
    return torch.from_numpy(x), torch.from_numpy(y)


class Host:
    """The host storage strategy, and ``Device``'s base: arenas in host memory, blocks read straight into them."""

    device = torch.device("cpu")
    on_host = True

    def arena(self, rows: int, cols: int, *, keep: bool = False) -> torch.Tensor:
        """An arena of ``rows`` x ``cols`` float32: a pool's is a map of its own (freed at once), or heap memory when
        small (reused without page faults); a resident arena (``keep``) is a map with huge pages."""
        if keep:
            return torch.from_numpy(mapped((rows, cols), np.float32))
        if rows * cols * 4 < SMALL_ARENA:
            return torch.from_numpy(np.empty((rows, cols), np.float32))
        return torch.from_numpy(mapped((rows, cols), np.float32, huge=False))

    def index(self, rows: np.ndarray) -> torch.Tensor:
        """Row numbers as the gathers take them."""
        return torch.from_numpy(rows)

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A new batch tensor."""
        return torch.empty(shape, dtype=torch.float32)

    def fill(self, arena: Arena, at: int, n: int, read: Read, cols: Cols, scale: BlockScale | None = None) -> Any:
        """Read a block of ``n`` rows into arena rows ``at:at + n`` (only ``cols``' input and target columns),
        scaled there by ``scale`` (a read-time normalization)."""
        x = arena.x[at : at + n].numpy()
        if arena.shared:  # every column: straight into the arena
            read(x)
            if scale is not None:
                scale.x(x)
            return None
        arr, (xcols, ycols) = read(None), cols
        y = arena.y[at : at + n].numpy()
        x[:] = arr if xcols is None else arr[:, xcols]
        y[:] = arr if ycols is None else arr[:, ycols]
        if scale is not None:
            scale.x(x)
            scale.y(y)
        return None

    def copying(self) -> contextlib.AbstractContextManager[Any]:
        """Where a block's transfer runs."""
        return contextlib.nullcontext()

    def gathering(self) -> contextlib.AbstractContextManager[Any]:
        """Where a reader's gathers run."""
        return contextlib.nullcontext()

    def mark(self) -> Any:
        """An event marking the work queued so far in ``gathering``; None on the host (it is done)."""
        return None

    def wait(self, events: list[Any]) -> None:
        """Make the gathers wait for ``events`` (block copies)."""

    def here(self, tensors: list[torch.Tensor], events: list[Any]) -> None:
        """Use ``tensors`` on the caller's (current) stream from now on, once ``events`` are done."""


class Device(Host):
    """A torch device: blocks decoded on the host and copied over, on CUDA from pinned memory on a copy stream,
    each marked by an event the gather stream waits for. ``Device(cpu)`` runs this code in the tests."""

    on_host = False

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"

    @functools.cached_property
    def _streams(self) -> tuple[Any, Any]:
        """The copy and the gather stream (None, None off CUDA), made on first use."""
        if not self.cuda:
            return None, None
        return torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def arena(self, rows: int, cols: int, *, keep: bool = False) -> torch.Tensor:
        """An arena on the device, made on the copy stream; the allocator waits for the gathers too before reuse."""
        with self.copying():
            t = torch.empty((rows, cols), dtype=torch.float32, device=self.device)
        if self.cuda:
            t.record_stream(self._streams[1])
        return t

    def index(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows).to(self.device)

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def fill(self, arena: Arena, at: int, n: int, read: Read, cols: Cols, scale: BlockScale | None = None) -> Any:
        """Decode the block on the host, scale it there, and copy it to arena rows ``at:at + n``: ``(event, host
        buffers)`` on CUDA."""
        hx, hy = block_columns(read(None), cols, arena.shared, scale)
        host = [t.pin_memory() for t in dict.fromkeys([hx, hy])] if self.cuda else [hx, hy]
        with self.copying():
            arena.x[at : at + n].copy_(host[0], non_blocking=self.cuda)
            if not arena.shared:
                arena.y[at : at + n].copy_(host[-1], non_blocking=self.cuda)
            event = self._event(self._streams[0])
        return None if event is None else (event, host)

    def copying(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self._streams[0]) if self.cuda else contextlib.nullcontext()

    def gathering(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self._streams[1]) if self.cuda else contextlib.nullcontext()

    def mark(self) -> Any:
        return self._event(self._streams[1])

    def wait(self, events: list[Any]) -> None:
        for event in events:
            self._streams[1].wait_event(event)

    def here(self, tensors: list[torch.Tensor], events: list[Any]) -> None:
        if not self.cuda:
            return
        current = torch.cuda.current_stream(self.device)
        for t in dict.fromkeys(tensors):  # the allocator waits for the current stream's work before freeing them
            t.record_stream(current)
        for event in events:
            current.wait_event(event)

    def _event(self, stream: Any) -> Any:
        """An event recorded on ``stream`` (None off CUDA)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        return event


def storage_for(device: torch.device) -> Host:
    """The storage of a stream's device: ``Host`` for the CPU, ``Device`` for any other."""
    return Host() if device.type == "cpu" else Device(device)
