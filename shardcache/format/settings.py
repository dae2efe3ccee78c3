"""Settings objects given whole or as their fields, one way in every wing: ``grouped`` takes the object or
makes one of the keyword arguments naming its fields, never both; ``only_known`` refuses an unknown one."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from ..errors import OptionTypeError

__all__ = ["field_names", "grouped", "only_known"]

T = TypeVar("T")


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """The fields of dataclass ``cls``, in order."""
    return tuple(f.name for f in dataclasses.fields(cls))


def grouped(caller: str, param: str, cls: type[T], given: T | None, fields: dict[str, Any]) -> T:
    """``given`` (a ``cls`` passed as ``param``), or a ``cls`` made of the entries of ``fields`` that
    name its fields, which are taken out of ``fields``; both at once is refused, naming them."""
    mine = {k: fields.pop(k) for k in field_names(cls) if k in fields}
    if given is None:
        return cls(**mine)
    if mine:
        raise OptionTypeError(
            f"{caller}(): pass {param}={cls.__name__}(...) or its fields ({', '.join(mine)}), not both"
        )
    if not isinstance(given, cls):
        raise OptionTypeError(f"{caller}(): {param}={given!r} is not a {cls.__name__}")
    return given


def only_known(caller: str, fields: Mapping[str, Any], names: Collection[str]) -> None:
    """Refuse a keyword argument in ``fields`` that is none of ``names``, as Python refuses an unexpected one."""
    unknown = next((k for k in fields if k not in names), None)
    if unknown is not None:
        raise OptionTypeError(f"{caller}() got an unexpected keyword argument {unknown!r}")
