"""Finished-task markers as data, never code: a task's result written as JSON and arrays.

A marker is ``NAME.json`` or ``NAME.npz`` (the JSON, ``{"$npy": k}`` for array k, plus one ``.npy`` per
array, read with ``allow_pickle=False``), with a SHA-256 of it all. It names no type: it is read back as
the caller's expected type (``typed_json``); one damaged or of another shape is :class:`Unreadable` (unfinished).
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import numpy as np

from ..format.typed_json import FieldError, dump, load

__all__ = ["SUFFIXES", "Unreadable", "decode", "encode"]

FORMAT = 1  # the marker format; another number reads as unfinished
SUFFIXES = (".json", ".npz")
_TREE = "value"  # the .npz member holding the JSON (UTF-8 bytes as uint8)


class Unreadable(ValueError):
    """A marker that is damaged, of an unknown format or not of the expected type."""


def encode(value: Any) -> tuple[str, bytes]:
    """``value`` as a marker file: its suffix (``.json`` or ``.npz``) and bytes."""
    arrays: list[np.ndarray] = []
    try:
        tree = dump(value, arrays)
    except TypeError as exc:
        raise TypeError(f"a marker cannot hold this value ({exc})") from None
    canonical = _canonical(tree)  # made once: hashed, then written as the value itself
    digest = _digest(canonical, arrays)
    text = f'{{"marker": {FORMAT}, "digest": "{digest}", "value": {canonical}}}'.encode()
    if not arrays:
        return ".json", text
    buf = io.BytesIO()
    named = {_TREE: np.frombuffer(text, dtype=np.uint8), **{str(k): a for k, a in enumerate(arrays)}}
    # mypy matches **named against savez's allow_pickle: bool (numpy < 2.1 has none, so it is not passed)
    np.savez(buf, **named)  # type: ignore[arg-type]
    return ".npz", buf.getvalue()


def decode(data: bytes, kind: Any = Any) -> Any:
    """The value a marker's bytes hold, checked to be of type ``kind``; :class:`Unreadable` otherwise."""
    try:
        arrays: dict[str, np.ndarray] = {}
        if data[:4] == b"PK\x03\x04":
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            text = arrays.pop(_TREE).tobytes()
        else:
            text = data
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("marker") != FORMAT or "value" not in doc:
            raise Unreadable("unknown marker format")
        if doc.get("digest") != _digest(_canonical(doc["value"]), [arrays[str(k)] for k in range(len(arrays))]):
            raise Unreadable("damaged (digest)")
        return load(doc["value"], kind, arrays)
    except FieldError as exc:
        raise Unreadable(f"not of the expected type: {exc}") from None
    except Unreadable:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: whatever numpy, zipfile, json or the type raise means "damaged"
        raise Unreadable(f"damaged ({type(exc).__name__})") from None


def _canonical(tree: Any) -> str:
    """The JSON text of a marker's value that its digest hashes (sorted keys, no spaces)."""
    return json.dumps(tree, sort_keys=True, separators=(",", ":"))


def _digest(canonical: str, arrays: list[np.ndarray]) -> str:
    """A hash of the value (its ``_canonical`` text) and its arrays: a flipped byte that still parses is caught here."""
    h = hashlib.sha256(canonical.encode())
    for a in arrays:
        h.update(repr((a.dtype.descr, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
