"""The ``zarr.json`` documents of a cache, made by zarr once and stamped per symbol.

Every symbol's ``features`` and ``time`` documents differ only in their length, so zarr makes each once, in
memory, for a sentinel length (``SymbolDocuments``) and a symbol's is that template with its length: zarr's
own bytes (``tests/test_encode.py``), without its existence checks and read-backs, one PUT each.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from zarr.storage import MemoryStore

from .layout import CHUNK_KEYS, TIME_ATTRS, compressors, group_path
from .zarr_adapter import ArrayV3Metadata

__all__ = ["SymbolDocuments", "group_document", "indented_json", "symbol_documents", "zarr_objects"]

_SENTINEL = 987654321987  # the template's length; appears nowhere else in a document
_ATTRIBUTE = "shardcache-attribute-9f1c2e"  # the template's attribute value, likewise
_ENCODE = json.JSONEncoder(allow_nan=True).encode  # one line, in C


def zarr_objects(make: Callable[[zarr.Group], Any]) -> dict[str, bytes]:
    """The objects (key -> bytes) zarr writes for what ``make`` creates in an empty root group, made in
    memory: zarr's own documents and chunks, to copy into a store with one PUT each."""
    objects: dict[str, Any] = {}
    make(zarr.open_group(MemoryStore(objects), mode="w", zarr_format=3))
    return {key: buf.to_bytes() for key, buf in objects.items()}


def _stamp(document: bytes) -> Callable[[int], bytes]:
    """``document``'s bytes with a length in place of the sentinel."""
    head, sep, tail = document.partition(str(_SENTINEL).encode())
    if not sep or str(_SENTINEL).encode() in tail:
        raise AssertionError("the sentinel length must appear once in a template document")
    return lambda n: b"%b%d%b" % (head, int(n), tail)


def indented_json(value: Any, indent: int, level: int = 0) -> str:
    """``json.dumps(value, indent=indent, allow_nan=True)`` as it reads nested ``level`` deep in a document, with
    the containers that hold no container encoded by the C encoder, not item by item by the Python one."""
    if not isinstance(value, (list, tuple, dict)) or not value:
        return _ENCODE(value)
    inner = "\n" + " " * (indent * (level + 1))
    close = "\n" + " " * (indent * level)
    items = value.values() if isinstance(value, dict) else value
    if not any(isinstance(v, (list, tuple, dict)) for v in items):
        body = _flat(inner)(value)
        return body[0] + inner + body[1:-1] + close + body[-1]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):  # json's own key conversions
            return json.dumps(value, indent=indent, allow_nan=True).replace("\n", close)
        parts = [f"{_ENCODE(k)}: {indented_json(v, indent, level + 1)}" for k, v in value.items()]
        return "{" + inner + ("," + inner).join(parts) + close + "}"
    return "[" + inner + ("," + inner).join(indented_json(v, indent, level + 1) for v in value) + close + "]"


@functools.lru_cache(maxsize=64)
def _flat(separator: str) -> Callable[[Any], str]:
    """The C encoder of a container of scalars with its items on lines of their own (``separator``: a
    comma, a newline and the items' indentation)."""
    return json.JSONEncoder(allow_nan=True, separators=("," + separator, ": ")).encode


@functools.lru_cache(maxsize=8)
def _group_template(name: str, indent: int) -> tuple[bytes, bytes]:
    """zarr's document of a group whose only attribute ``name`` is a placeholder (two levels deep): the
    bytes before the placeholder and after it."""
    made = zarr_objects(lambda g: g.attrs.put({name: _ATTRIBUTE}))["zarr.json"]
    head, sep, tail = made.partition(_ENCODE(_ATTRIBUTE).encode())
    line = head[head.rfind(b"\n") + 1 :]
    if not sep or _ATTRIBUTE.encode() in tail or len(line) - len(line.lstrip(b" ")) != 2 * indent:
        raise AssertionError("the attribute placeholder must appear once, two levels deep")
    return head, tail


def group_document(name: str, value: Any) -> bytes:
    """The ``zarr.json`` zarr writes for a group whose only attribute is ``name`` (``value``, plain JSON), made
    from zarr's document for a placeholder without zarr's deep copies (the manifest is 1.5 MB at 2,000 symbols)."""
    indent = zarr.config.get("json_indent")
    if type(indent) is not int or indent < 0:  # json's other indents (None, a string): zarr's own way
        return zarr_objects(lambda g: g.attrs.put({name: value}))["zarr.json"]
    head, tail = _group_template(name, indent)
    return head + indented_json(value, indent, 2).encode() + tail


class SymbolDocuments:
    """The ``zarr.json`` of a symbol's group, ``features`` and ``time``, for any length, as zarr writes them."""

    def __init__(self, n_features: int, shard_rows: int, chunk_rows: int, codec: str) -> None:
        f = max(n_features, 1)

        def make(root: zarr.Group) -> None:
            g = root.create_group("s")
            g.create_array(
                "features",
                shape=(_SENTINEL, n_features),
                dtype="float32",
                chunks=(chunk_rows, f),
                shards=(shard_rows, f),
                compressors=compressors(codec),
                fill_value=np.nan,
                dimension_names=("time", "feature"),
                chunk_key_encoding=CHUNK_KEYS,
            )
            g.create_array(
                "time",
                shape=(_SENTINEL,),
                dtype="int64",
                chunks=(chunk_rows,),
                shards=(shard_rows,),
                compressors=compressors("zstd"),
                fill_value=0,
                dimension_names=("time",),
                attributes=dict(TIME_ATTRS),
                chunk_key_encoding=CHUNK_KEYS,
            )

        made = zarr_objects(make)
        self.group: bytes = made["s/zarr.json"]
        self.features = _stamp(made["s/features/zarr.json"])
        self.time = _stamp(made["s/time/zarr.json"])
        self._features_meta = ArrayV3Metadata.from_dict(json.loads(made["s/features/zarr.json"]))
        self.n_features = n_features

    def features_metadata(self, n: int) -> ArrayV3Metadata:
        """The parsed metadata of a ``features`` array of ``n`` rows (what a decoder needs), without a read."""
        return self._features_meta.update_shape((int(n), self.n_features))

    def symbol(self, i: int, n: int, *, group: bool = True) -> dict[str, bytes]:
        """Symbol ``i``'s documents for ``n`` bars, by store key (its group's only with ``group``)."""
        path = group_path(i)
        out = {f"{path}/zarr.json": self.group} if group else {}  # parents first: a folder made per miss
        out[f"{path}/features/zarr.json"] = self.features(n)
        out[f"{path}/time/zarr.json"] = self.time(n)
        return out


@functools.lru_cache(maxsize=64)
def symbol_documents(n_features: int, shard_rows: int, chunk_rows: int, codec: str) -> SymbolDocuments:
    """The documents of a layout, made once per process."""
    return SymbolDocuments(n_features, shard_rows, chunk_rows, codec)
