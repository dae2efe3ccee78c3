"""Object-store clients that never hang and ride out transient faults.

Every store of a cache on an object store is made here, with S3's timeouts and botocore's standard retries
(``CLIENT_DEFAULTS``) and s3fs's own retry loop bounded (``S3FS_TRIES``). A request that still fails is a
``RemoteError`` (``guarded``); ``reported`` makes it a one-line ``StoreError`` naming the cache, the object
and the endpoint, with what to check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator, Mapping
from typing import Any, TypeVar

import fsspec
from zarr.storage import FsspecStore

from ..errors import StoreError, one_line
from .paths import is_url, layers

__all__ = [
    "CLIENT_DEFAULTS",
    "S3FS_TRIES",
    "RemoteError",
    "client_options",
    "endpoint",
    "filesystem",
    "guarded",
    "open_store",
    "reported",
]

# botocore's client config (s3fs's ``config_kwargs``): a connection within 5 s, never 10 s without a byte,
# and the standard retry mode (backoff with jitter), 3 attempts a request; a key the caller gives wins.
CLIENT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 10,
    "retries": {"mode": "standard", "max_attempts": 3},
}
# s3fs retries a request itself, twice nested for a ranged read (5 x 5 around botocore's 3 by default: over
# 12 minutes of a stalled endpoint); 2 keep one retry of a body cut mid-way, which botocore does not retry:
# at most 2 x 2 x 3 = 12 tries before a ``RemoteError`` (175 s measured on loopback).
S3FS_TRIES = 2
_S3 = ("s3", "s3a")
T = TypeVar("T")


class RemoteError(OSError):
    """A request for the object ``key`` that failed after the client's retries; ``verb`` says which
    (``fetch``, ``store`` or ``delete``), ``cause`` is the client's own error."""

    def __init__(self, verb: str, key: str, cause: BaseException) -> None:
        super().__init__(f"cannot {verb} {key}: {type(cause).__name__}: {one_line(cause)}")
        self.verb, self.key, self.cause = verb, key, cause


async def guarded(verb: str, key: str, request: Awaitable[T]) -> T:
    """Await a store's ``request`` for ``key``; any error of its client becomes a ``RemoteError``."""
    try:
        return await request
    except Exception as exc:  # each store's client raises its own kinds, after its retries
        raise RemoteError(verb, key, exc) from exc


def client_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` for a store of the cache at ``url``: the caller's, with ``CLIENT_DEFAULTS`` in the
    ``config_kwargs`` of each S3 layer, per key the caller leaves out. None or a copy for a local path."""
    if not is_url(url):
        return None if storage_options is None else dict(storage_options)
    out = dict(storage_options or {})
    protocols = layers(url)
    for protocol in protocols:
        if protocol in _S3:
            layer = out if len(protocols) == 1 else dict(out.get(protocol) or {})
            layer["config_kwargs"] = {**CLIENT_DEFAULTS, **dict(layer.get("config_kwargs") or {})}
            if len(protocols) > 1:
                out[protocol] = layer
    return out


def _bounded(fs: Any) -> None:
    """Bound the S3 filesystem under ``fs`` (a wrapper or caching layer holds its target as ``.fs``) to
    ``S3FS_TRIES`` of its own retry loop."""
    for _ in range(4):
        if type(fs).__name__ == "S3FileSystem":
            fs.retries = S3FS_TRIES
            return
        fs = getattr(fs, "fs", None)


def open_store(url: str, storage_options: Mapping[str, Any] | None, *, read_only: bool) -> FsspecStore:
    """The zarr store of the object-store URL ``url``, with ``client_options`` and ``S3FS_TRIES`` (fsspec shares
    a filesystem between equal options: one a caller made with other options keeps its retries)."""
    store = FsspecStore.from_url(url, storage_options=client_options(url, storage_options), read_only=read_only)
    _bounded(store.fs)
    return store


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path on it, with ``open_store``'s timeouts and retries
    (listing, renaming and deleting a cache's objects)."""
    fs, path = fsspec.core.url_to_fs(url, **(client_options(url, storage_options) or {}))
    _bounded(fs)
    return fs, str(path)


def endpoint(url: str, storage_options: Mapping[str, Any] | None) -> str:
    """The endpoint a URL's data layer is read from, for a message: its ``endpoint_url`` (top level, under
    ``client_kwargs``, or under the layer's protocol in a chain), else the scheme's own service."""
    protocols = layers(url)
    options = dict(storage_options or {})
    if len(protocols) > 1:
        options = dict(options.get(protocols[-1]) or {})
    found = options.get("endpoint_url") or dict(options.get("client_kwargs") or {}).get("endpoint_url")
    return str(found) if found else f"the {protocols[-1]}:// service"


@contextlib.contextmanager
def reported(url: str, storage_options: Mapping[str, Any] | None) -> Iterator[None]:
    """Raise a ``RemoteError`` of the block as the ``StoreError`` of one line: the cache ``url``, the
    object, the endpoint and what to check."""
    try:
        yield
    except RemoteError as exc:
        where = "from" if exc.verb == "fetch" else "at"
        raise StoreError(
            f"{url}: cannot {exc.verb} {exc.key} {where} {endpoint(url, storage_options)} after its retries "
            f"({type(exc.cause).__name__}: {one_line(exc.cause)}); check that the endpoint answers and the "
            "network, or allow longer: storage_options={'config_kwargs': {'read_timeout': ..., 'retries': ...}}"
        ) from None
