"""A cache's objects by key, written and read with one request each, many at once.

A local cache's objects are plain files: a new one written in place, an existing one replaced by a rename
(a reader sees the old object or the new one, and a hard link into another cache is never written through:
see ``shardcache.ingest.append``); any other URL goes through zarr's ``Store`` API on its event loop.
Nothing is checked or read back before a write: the writer knows what it writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zarr.abc.store import OffsetByteRequest, Store
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from ..tuning import FILE_BATCH, FILE_THREADS
from .layout import gather
from .paths import check_storage_options, is_url, local_path
from .remote import guarded, open_store, reported
from .zarr_adapter import sync

__all__ = ["STRAY", "Objects", "get_whole"]

# what a killed local write leaves: ``<name>.<32 hex digits>.partial`` (zarr's LocalStore names its own the same way)
STRAY = re.compile(r"\.[0-9a-f]{32}\.partial$")

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _make_folder(path: str) -> None:
    """The folder ``path`` and any missing parent: one ``mkdir`` when the parent is there."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        _make_folder(os.path.dirname(path))
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)


def _create(path: str, data: bytes) -> bool:
    """Write ``data`` to a new file ``path`` (open, write, close); False, nothing written, if one is there."""
    try:
        try:
            fd = os.open(path, _NEW, 0o666)
        except FileNotFoundError:  # its folder is new: the first object of a symbol, an array or a shard
            _make_folder(os.path.dirname(path))
            fd = os.open(path, _NEW, 0o666)
    except FileExistsError:
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return True


def _write_file(path: str, data: bytes) -> None:
    """``data`` as the file ``path``: a new file in place (a kill leaves a part only where no object was, and a
    resume writes every such key again), an existing one replaced by a rename, never written through."""
    if _create(path, data):
        return
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _link(source: str, path: str) -> bool:
    """``path`` as a hard link to the file ``source`` (an existing ``path`` replaced by a rename); False, nothing
    changed, where the file system refuses the link (no hard links, too many links, ``source`` gone)."""
    try:
        try:
            os.link(source, path)
        except FileNotFoundError:  # its folder is new (or ``source`` is gone: then the retry fails too)
            _make_folder(os.path.dirname(path))
            os.link(source, path)
    except FileExistsError:
        tmp = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            os.link(source, tmp)
        except OSError:
            return False
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def get_whole(store: Store, keys: Iterable[str], limit: int = 64) -> dict[str, bytes | None]:
    """The whole objects ``keys`` of ``store`` (None for an absent one), ``limit`` at a time: one request each,
    an open-ended byte range (s3fs sends a plain read as a HEAD and a GET). A ``RemoteError`` when one fails."""
    proto, out = default_buffer_prototype(), {}

    async def one(key: str) -> None:
        buf = await guarded("fetch", key, store.get(key, prototype=proto, byte_range=OffsetByteRequest(0)))
        out[key] = None if buf is None else buf.to_bytes()

    gather([one(key) for key in keys], limit)
    return out


class Objects:
    """The objects of the cache at ``url``: ``put``/``put_many`` and ``get_many`` by key. Picklable
    (an object store's client is made again in each process). A request that fails after the client's
    retries is a ``StoreError`` of one line (``remote.reported``): a build stops there, resumably."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        check_storage_options(storage_options)
        self.url = os.fspath(url)
        self.storage_options = storage_options
        self.root = None if is_url(self.url) else local_path(self.url)
        self._store: Store | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def store(self) -> Store:
        """The zarr store of the cache (a ``LocalStore`` for a local path)."""
        if self._store is None or self._pid != os.getpid():  # fsspec's async clients do not survive a fork
            if self.root is not None:
                self._store = LocalStore(self.root)
            else:
                self._store = open_store(self.url, self.storage_options, read_only=False)
            self._pid = os.getpid()
        return self._store

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` as the object ``key`` (a whole object: never partly written)."""
        if self.root is not None:
            _write_file(os.path.join(self.root, key), data)
        else:
            with reported(self.url, self.storage_options):
                sync(guarded("store", key, self.store.set(key, default_buffer_prototype().buffer.from_bytes(data))))

    def put_many(self, objects: Mapping[str, bytes], limit: int = 64, *, share: bool = False) -> None:
        """``put`` every object of ``objects``: on an object store ``limit`` requests at a time, locally
        ``FILE_THREADS`` threads for each ``FILE_BATCH`` objects (mostly kernel time, which runs side by side).

        With ``share``, a local object whose bytes equal an earlier one's of its thread is a hard link to that
        one's file, saving the inode that is most of a file's cost. Only for objects always replaced whole by
        a rename, never written in place: the ``zarr.json`` documents.
        """
        if self.root is not None:
            items = list(objects.items())
            n = max(1, min(FILE_THREADS, len(items) // FILE_BATCH))
            step = -(-len(items) // n)
            parts = [items[k : k + step] for k in range(0, len(items), step)]
            if len(parts) == 1:
                self._put_files(parts[0], share)
                return
            with ThreadPoolExecutor(len(parts), thread_name_prefix="shardcache-files") as pool:
                list(pool.map(self._put_files, parts, [share] * len(parts)))
            return
        store, buffer = self.store, default_buffer_prototype().buffer
        with reported(self.url, self.storage_options):
            gather(
                [guarded("store", key, store.set(key, buffer.from_bytes(data))) for key, data in objects.items()], limit
            )

    def _put_files(self, items: list[tuple[str, bytes]], share: bool) -> None:
        """``put_many``'s local objects ``items``, one after the other (see ``share`` there)."""
        assert self.root is not None
        first: dict[bytes, str] = {}
        for key, data in items:
            path = os.path.join(self.root, key)
            source = first.get(data) if share else None
            if source is not None and _link(source, path):
                continue
            _write_file(path, data)
            if share:
                first[data] = path

    def delete(self, key: str) -> None:
        """Remove the object ``key`` if there is one."""
        if self.root is not None:
            try:
                os.unlink(os.path.join(self.root, key))
            except FileNotFoundError:
                pass
        else:
            with reported(self.url, self.storage_options):
                sync(guarded("delete", key, self.store.delete(key)))

    def get_many(self, keys: Iterable[str], limit: int = 64) -> dict[str, bytes | None]:
        """The whole objects ``keys`` (None for an absent one): one request each, ``limit`` at a time."""
        keys = list(keys)
        if self.root is not None:
            return {key: _read_file(os.path.join(self.root, key)) for key in keys}
        with reported(self.url, self.storage_options):
            return get_whole(self.store, keys, limit)
