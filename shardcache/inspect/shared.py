"""Documents that are one file: ``verify``'s findings in hard-linked ``zarr.json`` documents (a local build
links equal ones, ``format.objects``: an edit in place changes every symbol sharing one) joined into one
problem naming the file, the symbols and the fix; and the text tables ``info``, ``ls`` and a cut print.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verify import Problem

__all__ = ["FIX", "join_shared", "text_table"]

FIX = (
    "rebuild the cache (build-cache --overwrite); to edit one symbol's document, copy it apart first "
    "(cp zarr.json zarr.json.new && mv zarr.json.new zarr.json)"
)
DOCS = ("zarr.json", "features/zarr.json", "time/zarr.json")  # a symbol's documents, under its group


def join_shared(
    problems: list[Problem], root: str | None, groups: Sequence[str], symbols: Sequence[str]
) -> list[Problem]:
    """``problems`` with those in one hard-linked document (a local cache at ``root``) joined into one."""
    if root is None:
        return problems
    owner = {f"{g}/{d}": (s, d) for g, s in zip(groups, symbols) for d in DOCS}
    docs = [p.key if p.key in owner else f"{p.key}/zarr.json" for p in problems]  # a wrong shape is named by its array
    files: dict[tuple[int, int], list[int]] = {}
    for k, doc in enumerate(docs):
        if doc not in owner:
            continue
        try:
            st = os.stat(os.path.join(root, doc))
        except OSError:
            continue
        if st.st_nlink > 1:
            files.setdefault((st.st_dev, st.st_ino), []).append(k)
    drop: set[int] = set()
    joined: dict[int, Problem] = {}
    for members in files.values():
        if len(members) < 2:
            continue
        shared = [docs[k] for k in members]
        names = [owner[d][0] for d in shared]
        kinds = sorted({owner[d][1].removesuffix("zarr.json").strip("/") or "group" for d in shared})
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        first = problems[members[0]]
        joined[members[0]] = replace(
            first,
            key=shared[0],
            problem=f"one file, hard-linked as the {'/'.join(kinds)} document of {len(names)} symbols ({shown}): "
            f"{first.problem}; it was changed in place, which changes every symbol sharing it: {FIX}",
            shared=tuple(shared),
        )
        drop.update(members)
    return [joined.get(k, p) for k, p in enumerate(problems) if k in joined or k not in drop]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str, indent: str = "") -> list[str]:
    """Text columns padded to a common width, each left (``l``) or right (``r``) aligned: the CLI's tables."""
    widths = [max(len(r[j]) for r in [headers, *rows]) for j in range(len(headers))]
    return [
        indent + "  ".join(f"{c:<{w}}" if a == "l" else f"{c:>{w}}" for c, w, a in zip(r, widths, align)).rstrip()
        for r in [headers, *rows]
    ]
