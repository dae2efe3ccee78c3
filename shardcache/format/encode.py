"""Shard and chunk bytes of the layout ``build-cache`` writes: the exact inverse of ``decode.py``.

zarr writes a shard through its async pipeline and reads a partial last shard first (a GET before every
PUT); these make the same bytes in one pass (``bytes``, the codec and a crc32c per padded inner chunk, fill
chunks left out, then the index and its crc32c), checked bit for bit against zarr by ``tests/test_encode.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import google_crc32c
import numpy as np

__all__ = ["encode_chunk", "encode_shard"]

_EMPTY = np.uint64(2**64 - 1)


def _with_crc(body: bytes) -> bytes:
    return body + np.uint32(google_crc32c.value(body)).tobytes()


def _all_fill(values: np.ndarray, fill: Any) -> bool:
    """Whether every value equals ``fill`` as zarr's ``NDBuffer.all_equal`` decides it: NaN equals NaN,
    and a float zero fill compares bit patterns (-0.0 is not 0.0)."""
    fill = np.asarray(fill, dtype=values.dtype)
    if values.dtype.kind == "f" and np.isnan(fill):
        return bool(np.isnan(values).all())
    if values.dtype.kind == "f" and fill == 0:
        return bool((values.view(f"u{values.itemsize}") == fill.view(f"u{values.itemsize}")).all())
    return bool((values == fill).all())


def encode_chunk(values: np.ndarray, rows: int, fill: Any, codec: Any | None) -> bytes | None:
    """One chunk of ``rows`` rows (``values`` padded with ``fill``) as stored: the codec's bytes and their
    crc32c; None when every value equals ``fill`` (NaN equal to NaN), which zarr does not store."""
    values = np.asarray(values)
    if _all_fill(values, fill):  # the padding is the fill value: the rows given decide
        return None
    if len(values) == rows and values.flags.c_contiguous:
        return _encoded(values, codec)
    full = _filled(rows, values.shape[1:], values.dtype, fill)
    full[: len(values)] = values
    try:
        return _encoded(full, codec)
    finally:
        full[: len(values)] = fill  # the buffer holds the fill value only, for the next chunk


def _encoded(full: np.ndarray, codec: Any | None) -> bytes:
    raw = full.astype(full.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8)
    return _with_crc(raw.tobytes() if codec is None else bytes(codec.encode(raw)))


_BUFFERS = threading.local()


def _filled(rows: int, shape: tuple[int, ...], dtype: np.dtype, fill: Any) -> np.ndarray:
    """A chunk of ``rows`` rows of ``fill``, this thread's own, made once per shape and fill: writing a small
    symbol's padding again for each symbol cost 11% of a build of 2,000 small symbols."""
    key = (rows, shape, dtype.str, np.asarray(fill, dtype=dtype).tobytes())
    made: dict[tuple[Any, ...], np.ndarray] = _BUFFERS.__dict__.setdefault("made", {})
    full = made.get(key)
    if full is None:
        if len(made) >= 8:
            made.clear()
        full = made[key] = np.full((rows, *shape), fill, dtype=dtype)
    return full


def encode_shard(
    block: np.ndarray, shard_rows: int, chunk_rows: int, codec: Any | None, fill: Any = np.nan
) -> bytes | None:
    """The shard object of ``block`` (the shard's first rows, ``rows <= shard_rows``: float32 ``(rows, F)``
    features, or int64 ``(rows,)`` bar times; ``fill`` below them): its encoded inner chunks in order,
    then the index; None when every inner chunk is empty (zarr then stores no object)."""
    block = np.ascontiguousarray(block)
    n_chunks = shard_rows // chunk_rows
    index = np.full((n_chunks, 2), _EMPTY, dtype="<u8")
    parts: list[bytes] = []
    offset = 0
    for c in range(min(n_chunks, -(-len(block) // chunk_rows))):
        data = encode_chunk(block[c * chunk_rows : (c + 1) * chunk_rows], chunk_rows, fill, codec)
        if data is None:
            continue
        parts.append(data)
        index[c] = (offset, len(data))
        offset += len(data)
    if not parts:
        return None
    parts.append(_with_crc(index.tobytes()))
    return b"".join(parts)
