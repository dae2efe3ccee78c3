"""Rows of the cache's sharded ``features`` array, decoded without zarr's async pipeline.

``ShardDecoder`` reads the layout ``build-cache`` writes (``sharding_indexed``, row-wise inner chunks,
blosc/zstd/none + crc32c, and numcodecs.lz4 of earlier caches) with one request per shard, or the index and then one byte range when few
chunks are needed, checks every chunk's crc32c and decodes it straight into the caller's array. It stays
against zarr's and zarrs' pipelines: the figures and scripts are in ``docs/notes/performance-log.md``.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

import google_crc32c
import numcodecs
import numcodecs.blosc
import numpy as np
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore

from ..tuning import KEEP_BUFFER
from .layout import CHUNK_KEYS
from .remote import guarded
from .zarr_adapter import ArrayV3Metadata, sync

if TYPE_CHECKING:
    from .local_cache import LocalCache

__all__ = ["ChunkError", "MissingShard", "ShardDecoder", "decode_chunk", "decode_shard"]

_EMPTY = 2**64 - 1
_scratch = threading.local()
# numcodecs.lz4: what --codec lz4 wrote before it became Blosc LZ4 (2026-12-07); such caches still read
_DECODERS = {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd, "numcodecs.lz4": numcodecs.LZ4}
_CODECS = {"blosc-lz4": numcodecs.Blosc, "zstd": numcodecs.Zstd, "lz4": numcodecs.Blosc, "none": None}  # the manifest's
_WHOLE = OffsetByteRequest(0)  # a whole object, asked for as a range: one request from s3fs
_CRC = struct.Struct("<I")  # a crc32c as stored after the bytes it checks
_ENTRY = struct.Struct("<QQ")  # a shard index entry: the chunk's offset and size in the shard object


class MissingShard(LookupError):
    """The shard object a read needs is not in the store."""

    shard: int | None = None  # set by ShardDecoder.read: the shard that was read


class ChunkError(ValueError):
    """An inner chunk or shard index failed its crc32c check, was absent or could not be decoded."""

    shard: int | None = None  # set by ShardDecoder.read: the shard that was read


def _check_crc(data: np.ndarray, what: str) -> np.ndarray:
    """``data`` (uint8) without its trailing crc32c, which must match."""
    body = data[:-4]
    if len(data) < 4 or google_crc32c.value(body) != _CRC.unpack_from(data.data, len(data) - 4)[0]:
        raise ChunkError(f"crc32c checksum mismatch in {what}")
    return body


def _layout(metadata: ArrayV3Metadata) -> dict[str, Any]:
    """Shard and chunk shapes and codecs of an array; ValueError for a layout this module does not read."""
    meta: dict[str, Any] = metadata.to_dict()  # a JSON document; its shape is checked below
    shape = metadata.shape
    sharding = meta["codecs"][0]
    if len(meta["codecs"]) != 1 or sharding["name"] != "sharding_indexed":
        raise ValueError(f"not the layout build-cache writes (codecs {meta['codecs']})")
    cfg = sharding["configuration"]
    inner = [c["name"] for c in cfg["codecs"]]
    index = [c["name"] for c in cfg["index_codecs"]]
    rows, f = meta["chunk_grid"]["configuration"]["chunk_shape"]
    chunk_rows, cf = cfg["chunk_shape"]
    ok = (
        np.dtype(meta["data_type"]) == np.float32
        and cf == f
        and len(shape) == 2
        and shape[1] == f
        and rows % chunk_rows == 0
        and inner[0] == "bytes"
        and inner[-1] == "crc32c"
        and len(inner) <= 3
        and (len(inner) == 2 or inner[1] in _DECODERS)
        and index == ["bytes", "crc32c"]
        and all(c.get("configuration", {}).get("endian", "little") == "little" for c in cfg["codecs"][:1])
    )
    if not ok:
        raise ValueError(f"not the layout build-cache writes: {sharding}")
    return {
        "shard_rows": int(rows),
        "chunk_rows": int(chunk_rows),
        "n_features": int(f),
        "codec": _DECODERS[inner[1]]() if len(inner) == 3 else None,
        "index_at_end": cfg["index_location"] == "end",
        "chunk_key": metadata.encode_chunk_key,
    }


_SEP: str = CHUNK_KEYS["separator"]


def _default_key(chunk: tuple[int, ...]) -> str:
    """Zarr v3's default chunk key encoding with ``layout.CHUNK_KEYS``' separator (``c.3.0``)."""
    return "c" + _SEP + _SEP.join(map(str, chunk))


def _ranges_work(store: Store) -> bool:
    """Whether ``store`` serves suffix ranges: not ``simplecache::`` or ``filecache::``, whose ``_cat_file``
    seeks to a negative offset for them (fsspec pull request #2101)."""
    if not isinstance(store, FsspecStore):
        return True
    from fsspec.implementations.cached import WholeFileCacheFileSystem

    return not isinstance(store.fs, WholeFileCacheFileSystem)


def _buffer(n: int) -> np.ndarray:
    """``n`` bytes of this thread's read buffer (valid until its next read), or a new array above ``KEEP_BUFFER``;
    reused because a fresh buffer costs its page faults again on every read."""
    if n > KEEP_BUFFER:
        return np.empty(n, dtype=np.uint8)
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n:
        size = max(n, 1 << 20)
        buf = _scratch.buf = np.empty(size, dtype=np.uint8)
    return buf[:n]


def _read_file(path: str, byte_range: RangeByteRequest | SuffixByteRequest | None) -> np.ndarray | None:
    """Bytes of a local object (``byte_range`` as zarr's ``LocalStore`` reads it) in this thread's read buffer,
    None if absent. Plain descriptor calls: a file object's own work would double a small shard's read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None
        size = st.st_size
        if byte_range is None:
            start, stop = 0, size
        elif isinstance(byte_range, SuffixByteRequest):
            start, stop = max(size - byte_range.suffix, 0), size
        else:
            start, stop = byte_range.start, min(byte_range.end, size)
        out = _buffer(max(stop - start, 0))
        if start:
            os.lseek(fd, start, os.SEEK_SET)
        view, got = out.data, 0
        while got < len(out) and (n := os.readv(fd, [view[got:]])):
            got += n
        return out[:got]
    finally:
        os.close(fd)


class ShardDecoder:
    """Reads rows ``[start, stop)`` of a sharded float32 ``(n, F)`` array into a numpy array.

    ``local`` (a ``LocalCache``) keeps a copy of each shard object read, as ``space/<key>@<rows>``."""

    def __init__(self, array: zarr.Array[Any]) -> None:
        metadata = array.metadata
        if metadata.zarr_format != 3:
            raise ValueError("not the layout build-cache writes (a Zarr v2 array)")
        self._bind(array.store_path.store, array.store_path.path, int(metadata.shape[0]), **_layout(metadata))

    @classmethod
    def from_metadata(cls, store: Store, path: str, metadata: ArrayV3Metadata) -> Self:
        """The decoder of the array at ``path`` in ``store`` whose metadata is known already: no read."""
        dec = cls.__new__(cls)
        dec._bind(store, path, int(metadata.shape[0]), **_layout(metadata))
        return dec

    def like(self, path: str, n_rows: int) -> Self:
        """The decoder of another array of this store and layout, ``n_rows`` long, at ``path``: no parsing."""
        dec = object.__new__(type(self))
        dec.__dict__.update(self.__dict__)  # a shallow copy, without ``copy.copy``'s generic protocol
        dec.prefix, dec.n_rows = path, int(n_rows)
        return dec

    @classmethod
    def from_layout(
        cls,
        store: Store,
        path: str,
        *,
        n_rows: int,
        n_features: int,
        shard_rows: int,
        chunk_rows: int,
        codec: str,
        local: LocalCache | None = None,
        space: str = "",
    ) -> ShardDecoder:
        """The decoder of the ``(n_rows, n_features)`` array at ``path`` of the layout the manifest records, so
        nothing is read to make it. ValueError for an unknown codec or shard rows that are not whole chunks."""
        if codec not in _CODECS or shard_rows % chunk_rows or min(shard_rows, chunk_rows) < 1:
            raise ValueError(f"not the layout build-cache writes (codec {codec!r}, shards {shard_rows}/{chunk_rows})")
        make = _CODECS[codec]
        dec = cls.__new__(cls)
        dec._bind(
            store,
            path,
            n_rows,
            shard_rows=shard_rows,
            chunk_rows=chunk_rows,
            n_features=n_features,
            codec=None if make is None else make(),
            index_at_end=True,
            chunk_key=_default_key,
        )
        dec.local, dec.space = local, space
        return dec

    def _bind(
        self,
        store: Store,
        path: str,
        n_rows: int,
        *,
        shard_rows: int,
        chunk_rows: int,
        n_features: int,
        codec: Any,
        index_at_end: bool,
        chunk_key: Callable[[tuple[int, ...]], str],
    ) -> None:
        self.shard_rows, self.chunk_rows, self.n_features = shard_rows, chunk_rows, n_features
        self.codec, self.index_at_end, self._chunk_key = codec, index_at_end, chunk_key
        self.n_rows = n_rows
        self.chunks = self.shard_rows // self.chunk_rows
        self.index_bytes = 16 * self.chunks + 4
        self.store, self.prefix = store, path
        self.root = str(self.store.root) if isinstance(self.store, LocalStore) else None
        self.ranges = _ranges_work(store)
        self.local: LocalCache | None = None
        self.space = ""

    def key(self, shard: int) -> str:
        """Store key of shard ``shard``, e.g. ``features/c.3.0``."""
        key = self._chunk_key((shard, 0))
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` into ``out`` (C-contiguous float32 ``(stop - start, F)``, new if None).

        Raises ``MissingShard`` or ``ChunkError`` (with ``.shard`` set) for a shard that is absent
        or damaged.
        """
        if not 0 <= start <= stop <= self.n_rows:
            raise IndexError(f"rows [{start}, {stop}) outside [0, {self.n_rows})")
        if out is None:
            out = np.empty((stop - start, self.n_features), dtype=np.float32)
        for shard in range(start // self.shard_rows, -(-stop // self.shard_rows) if stop > start else 0):
            s0 = shard * self.shard_rows
            lo, hi = max(start, s0), min(stop, s0 + self.shard_rows)
            try:
                self._read_shard(shard, lo - s0, hi - s0, out[lo - start : hi - start])
            except (MissingShard, ChunkError) as exc:
                exc.shard = shard
                raise
        return out

    def _get(self, key: str, byte_range: RangeByteRequest | SuffixByteRequest | None = None) -> np.ndarray | None:
        """The bytes of ``key`` (or of ``byte_range`` of it) as uint8, None if absent. A local store is read on
        this thread, not through zarr's event loop (thread switches a busy machine makes milliseconds)."""
        if self.root is not None:
            return _read_file(f"{self.root}/{key}", byte_range)
        request = _WHOLE if byte_range is None else byte_range
        buf = sync(guarded("fetch", key, self.store.get(key, prototype=default_buffer_prototype(), byte_range=request)))
        return None if buf is None else buf.as_numpy_array()

    def _whole(self, key: str, rows: int) -> np.ndarray | None:
        """The whole object ``key`` (a shard of ``rows`` rows), through the local cache when there is one."""
        if self.local is None:
            return self._get(key)
        name = f"{self.space}/{key}@{rows}"
        for _ in range(3):  # a kept copy evicted between the lookup and the read is looked up again
            got = self.local.get(name, lambda: self._get(key))
            if not isinstance(got, str):
                return got
            data = _read_file(got, None)
            body = None if data is None else self.local.checked(name, data)  # None: evicted, or healed
            if body is not None:
                return body
        return self._get(key)

    def _read_shard(self, shard: int, a: int, b: int, out: np.ndarray) -> None:
        """Rows ``[a, b)`` of shard ``shard`` (shard-relative) into ``out``."""
        key = self.key(shard)
        rows = min(self.shard_rows, self.n_rows - shard * self.shard_rows)  # the rows this shard holds
        c0, c1 = a // self.chunk_rows, -(-b // self.chunk_rows)
        whole: np.ndarray | None = None
        raw: np.ndarray | None
        held = -(-rows // self.chunk_rows)
        # most of the chunks it holds (a small symbol's shard: all), no ranges, or a local copy: one request
        if 2 * (c1 - c0) > held or not (self.index_at_end and self.ranges) or self.local is not None:
            whole = self._whole(key, rows)
            if whole is None:
                raise MissingShard(key)
            raw = whole[-self.index_bytes :] if self.index_at_end else whole[: self.index_bytes]
        else:
            raw = self._get(key, SuffixByteRequest(self.index_bytes))
            if raw is None:
                raise MissingShard(key)
        # (offset, size) of each chunk read, as ints: a copy (a local read buffer is reused by the next read)
        index = _check_crc(raw, "the shard index")
        if len(raw) != self.index_bytes:
            raise ChunkError(f"the shard index is {len(raw)} bytes, not {self.index_bytes}")
        need = [_ENTRY.unpack_from(index.data, 16 * c) for c in range(c0, c1)]
        if any(off == _EMPTY for off, _ in need):
            raise ChunkError("an inner chunk is missing from the shard index")
        if whole is None:  # the needed chunks as one byte range
            first, end = min(off for off, _ in need), max(off + n for off, n in need)
            span = self._get(key, RangeByteRequest(first, end))
            if span is None:
                raise MissingShard(key)
            base = first
        else:
            span, base = whole, 0
        for c, (off, n) in enumerate(need, c0):
            off -= base
            r0, r1 = c * self.chunk_rows, (c + 1) * self.chunk_rows
            body = _check_crc(span[off : off + n], f"inner chunk {c}")
            if a <= r0 and r1 <= b:  # the whole chunk: straight into place
                self._decode(body, out[r0 - a : r1 - a], c)
            else:
                scratch = np.empty((self.chunk_rows, self.n_features), dtype=np.float32)
                self._decode(body, scratch, c)
                lo, hi = max(a, r0), min(b, r1)
                out[lo - a : hi - a] = scratch[lo - r0 : hi - r0]

    def _decode(self, body: np.ndarray, dest: np.ndarray, c: int) -> None:
        """Decode one inner chunk into ``dest`` (C-contiguous, exactly one chunk)."""
        try:
            if self.codec is None:
                dest.reshape(-1).view(np.uint8)[:] = body
            elif isinstance(self.codec, numcodecs.Blosc):  # its decode less the checks of its input (done here)
                numcodecs.blosc.decompress(body, dest)
            else:
                self.codec.decode(body, out=dest)
        except (RuntimeError, ValueError) as exc:  # what numcodecs raises for damaged input, and a short copy
            raise ChunkError(f"inner chunk {c} could not be decoded: {exc}") from None


def decode_chunk(data: bytes | np.ndarray, codec: Any | None, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """One chunk as ``encode.encode_chunk`` stores it (``codec``'s bytes and their crc32c), decoded to a
    new ``dtype`` array of ``shape``; ``ChunkError`` when it is damaged."""
    body = _check_crc(np.frombuffer(data, dtype=np.uint8), "the chunk")
    out = np.empty(shape, dtype=np.dtype(dtype).newbyteorder("<"))
    try:
        if codec is None:
            out.reshape(-1).view(np.uint8)[:] = body
        else:
            codec.decode(body, out=out)
    except Exception as exc:  # noqa: BLE001 - each codec raises its own kinds on damaged bytes
        raise ChunkError(f"the chunk could not be decoded: {exc}") from None
    return out.astype(dtype, copy=False)


def decode_shard(data: bytes, rows: int, chunk_rows: int, codec: Any | None, dtype: Any, fill: Any) -> np.ndarray:
    """A whole shard object of a 1-D array as ``encode.encode_shard`` stores it (a symbol's ``time``: inner
    chunks of ``chunk_rows``, each as ``decode_chunk`` reads it, then the index and its crc32c), decoded to
    ``rows`` values, ``fill`` where the index holds no chunk; ``ChunkError`` when it is damaged."""
    raw = np.frombuffer(data, dtype=np.uint8)
    n = rows // chunk_rows
    at = len(raw) - 16 * n - 4  # where the index starts
    if at < 0:
        raise ChunkError(f"the shard is {len(raw)} bytes, shorter than its index")
    index = np.frombuffer(_check_crc(raw[at:], "the shard index"), dtype="<u8").reshape(n, 2)
    out = np.full(rows, fill, dtype=dtype)
    for c, (off, size) in enumerate(index.tolist()):
        if off == _EMPTY:
            continue
        if off + size > at:
            raise ChunkError(f"inner chunk {c} runs past the shard's data")
        out[c * chunk_rows : (c + 1) * chunk_rows] = decode_chunk(raw[off : off + size], codec, dtype, (chunk_rows,))
    return out
