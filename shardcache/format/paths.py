"""Local paths and URLs: one rule for the format, the build and its sources.

A plain path and a ``file://`` URL are local; any other ``scheme://`` (chained ones too, each layer taking
the options under its protocol's name) is read through fsspec with ``storage_options``. ``probe`` asks a
URL's store once, quickly, whether it answers, so a bad scheme, endpoint, credentials or bucket end in one
line; ``read_options`` are the options a cache is read with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import OptionTypeError, one_line

__all__ = ["check_storage_options", "is_local", "is_url", "layers", "local_path", "probe", "read_options"]

# schemes whose first path part is a bucket (or container) that must exist; other schemes are
# only checked to be known (``memory://`` lives in this process, ``http://`` has no bucket)
_BUCKETS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2")
# the probe's own client settings: one attempt and a short connect timeout (s3fs + botocore)
_S3_QUICK = {"connect_timeout": 3, "read_timeout": 10, "retries": {"total_max_attempts": 1}}
_QUICK = {"s3": _S3_QUICK, "s3a": _S3_QUICK}
# a read of a whole object with no range costs s3fs a HEAD first (to split objects above 50 MiB into
# concurrent ranges) unless max_concurrency is 1; shard and metadata objects are far smaller
_READ_DEFAULTS = {"s3": {"max_concurrency": 1}, "s3a": {"max_concurrency": 1}}
# zarr asks the outermost layer of a chain for asynchronous=True; the caching layers ask their target
# whether it is, so the target is made asynchronous too (else zarr warns, and nothing else changes)
_ASYNC_TARGETS = ("s3", "s3a", "gs", "gcs", "http", "https", "abfs", "az")


def is_url(path: str) -> bool:
    """Whether ``path`` is read through fsspec (a URL other than ``file://``)."""
    return "://" in path and not path.startswith("file://")


def is_local(path: str) -> bool:
    """Whether ``path`` is a path on this machine (a plain path or ``file://``)."""
    return not is_url(path)


def local_path(path: str) -> str:
    """The filesystem path of a plain path or a ``file://`` URL."""
    return path.removeprefix("file://")


def layers(url: str) -> list[str]:
    """The protocols of ``url``'s fsspec layers, outermost first: ``["simplecache", "s3"]``."""
    return [part.split("://", 1)[0].lower() if "://" in part else part.lower() for part in url.split("::")]


def read_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` for reading the cache at ``url``: the caller's, with each read default
    (``_READ_DEFAULTS``, and ``asynchronous=True`` for a chain's data layer) where the caller sets none."""
    if not is_url(url):
        return None if storage_options is None else dict(storage_options)
    out = dict(storage_options or {})
    protocols = layers(url)
    for k, protocol in enumerate(protocols):
        defaults = dict(_READ_DEFAULTS.get(protocol, {}))
        if len(protocols) == 1:
            return {**defaults, **out}
        if k == len(protocols) - 1 and protocol in _ASYNC_TARGETS:
            defaults["asynchronous"] = True
        if defaults:
            out[protocol] = {**defaults, **dict(out.get(protocol) or {})}
    return out


def check_storage_options(storage_options: object) -> None:
    """Refuse ``storage_options`` that are not a mapping of fsspec arguments (None means none)."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise OptionTypeError(
            f"storage_options={storage_options!r}: must be a mapping of fsspec options such as "
            f"{{'endpoint_url': 'http://host:9000'}}, not {type(storage_options).__name__}"
        )


def probe(url: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """Why the store holding ``url`` cannot be used, in a few words; None when it answers, or for a local path.
    One request at most, with one attempt and a short timeout."""
    check_storage_options(storage_options)
    if not is_url(url):
        return None
    import fsspec

    for scheme in layers(url):  # a chained URL: every layer's protocol is known; its data layer is probed
        try:
            cls = fsspec.get_filesystem_class(scheme)
        except ValueError:
            return f"unknown URL scheme '{scheme}://' (no fsspec filesystem has it)"
        except ImportError as exc:
            return f"{scheme}:// URLs need a package that is not installed ({one_line(exc)})"
    if scheme not in _BUCKETS:
        return None
    chain = url.split("::")
    options = dict(storage_options or {}) if len(chain) == 1 else dict((storage_options or {}).get(scheme) or {})
    url = chain[-1]
    quick = _QUICK.get(scheme)
    if quick is not None:
        options["config_kwargs"] = {**options.get("config_kwargs", {}), **quick}
    bucket = cls._strip_protocol(url).split("/", 1)[0]
    try:
        fs = cls(**options, skip_instance_cache=True)
        if quick is not None:
            fs.retries = 1  # s3fs's own retry loop, besides botocore's
        fs.info(bucket)
    except FileNotFoundError:
        return f"no bucket '{bucket}' at this endpoint (create it, or check the URL and endpoint_url)"
    except PermissionError as exc:
        return f"access to bucket '{bucket}' denied ({one_line(exc)}); check the credentials"
    except Exception as exc:  # noqa: BLE001 - each client raises its own kinds (botocore: no credentials, no endpoint)
        return f"cannot use its store ({type(exc).__name__}: {one_line(exc)})"
    return None
