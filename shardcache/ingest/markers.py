"""Finished-task markers as data, never code: a task's result written as JSON and arrays.

A marker is ``NAME.json`` (a result without arrays) or ``NAME.npz`` (its JSON plus one ``.npy``
member per array, read with ``allow_pickle=False``), with a SHA-256 of the value and its arrays
(a flipped byte that still parses must not pass for a result). The file never names a type: it is read
back against the type the caller expects (a task's annotated return type: dataclasses, lists,
tuples, dicts with string keys, Counters, arrays, scalars, None, unions of these), and a file
that is damaged, of another marker format or of another shape is :class:`Unreadable`, which
the build treats as "task not finished". Loading one can never run code.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import types
import typing
from typing import Any

import numpy as np

__all__ = ["SUFFIXES", "Unreadable", "decode", "encode"]

FORMAT = 1  # the marker format; another number reads as unfinished
SUFFIXES = (".json", ".npz")
_ARRAY = "$npy"  # {"$npy": k}: the k-th array of an .npz marker
_TREE = "value"  # the .npz member holding the JSON (UTF-8 bytes as uint8)


class Unreadable(ValueError):
    """A marker that is damaged, of an unknown format or not of the expected type."""


def encode(value: Any) -> tuple[str, bytes]:
    """``value`` as a marker file: its suffix (``.json`` or ``.npz``) and bytes."""
    arrays: list[np.ndarray] = []
    canonical = _canonical(_tree(value, arrays))  # made once: hashed, then written as the value itself
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
        return _value(doc["value"], kind, arrays)
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


def _tree(value: Any, arrays: list[np.ndarray]) -> Any:
    """``value`` as JSON-able data, its arrays appended to ``arrays``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("a marker cannot hold an object array")
        arrays.append(value)
        return {_ARRAY: len(arrays) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _tree(getattr(value, f.name), arrays) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (list, tuple)):
        return [_tree(v, arrays) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and _ARRAY not in value:
        return {k: _tree(v, arrays) for k, v in value.items()}
    raise TypeError(f"a marker cannot hold {type(value).__name__}")


def _value(tree: Any, kind: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``tree`` rebuilt as ``kind``, or :class:`Unreadable` if it is not one."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return _any(tree, arrays)
    if origin in (typing.Union, types.UnionType):
        for alt in args:
            try:
                return _value(tree, alt, arrays)
            except Unreadable:
                continue
        raise Unreadable(f"not any of {kind}")
    if kind is type(None) or kind is None:
        return _check(tree, tree is None, kind)
    if kind is bool:
        return _check(tree, isinstance(tree, bool), kind)
    if kind is int:
        return _check(tree, isinstance(tree, int) and not isinstance(tree, bool), kind)
    if kind is float:
        return float(_check(tree, isinstance(tree, (int, float)) and not isinstance(tree, bool), kind))
    if kind is str:
        return _check(tree, isinstance(tree, str), kind)
    if kind is np.ndarray or origin is np.ndarray:
        return _array(tree, arrays)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(tree, kind, arrays)
    base = origin or kind
    if base is list:
        _check(tree, isinstance(tree, list), kind)
        return [_value(v, args[0] if args else Any, arrays) for v in tree]
    if base is tuple:
        _check(tree, isinstance(tree, list), kind)
        kinds = [args[0]] * len(tree) if len(args) == 2 and args[1] is Ellipsis else list(args or [Any] * len(tree))
        _check(tree, len(kinds) == len(tree), kind)
        return tuple(_value(v, k, arrays) for v, k in zip(tree, kinds))
    if base in (dict, collections.Counter):
        _check(tree, isinstance(tree, dict) and _ARRAY not in tree, kind)
        of = int if base is collections.Counter else args[-1] if args else Any  # a Counter counts: int values
        items = {k: _value(v, of, arrays) for k, v in tree.items()}
        return collections.Counter(items) if base is collections.Counter else items
    raise Unreadable(f"no marker holds a {kind}")


def _check(tree: Any, ok: bool, kind: Any) -> Any:
    if not ok:
        raise Unreadable(f"{type(tree).__name__} where a {kind} was expected")
    return tree


def _array(tree: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
    ref = tree.get(_ARRAY) if isinstance(tree, dict) and len(tree) == 1 else None
    if not isinstance(ref, int) or str(ref) not in arrays:
        raise Unreadable("a missing array")
    return arrays[str(ref)]


def _dataclass(tree: Any, cls: type, arrays: dict[str, np.ndarray]) -> Any:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    _check(tree, isinstance(tree, dict) and set(tree) == {f.name for f in fields}, cls)
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _value(tree[f.name], hints[f.name], arrays) for f in fields})


def _any(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``tree`` as plain data: JSON values, with array references resolved."""
    if isinstance(tree, list):
        return [_any(v, arrays) for v in tree]
    if isinstance(tree, dict):
        return _array(tree, arrays) if _ARRAY in tree else {k: _any(v, arrays) for k, v in tree.items()}
    return tree
