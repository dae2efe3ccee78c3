"""Every object the API reference (docs/reference.md) renders, and every member it shows, has a docstring
(shardcache's own text, read by griffe as mkdocstrings reads it): no member renders as its source or
hides for want of text."""

from __future__ import annotations

import re
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(
    r"^::: (?P<path>[\w.]+)\n(?:    options:\n      members: \[(?P<members>[^\]]*)\]\n)?", re.MULTILINE
)


def _directives() -> list[tuple[str, list[str] | None]]:
    text = (ROOT / "docs" / "reference.md").read_text()
    out = []
    for m in DIRECTIVE.finditer(text):
        members = m["members"]
        out.append((m["path"], None if members is None else [s.strip() for s in members.split(",")]))
    return out


@pytest.fixture(scope="module")
def package():
    return griffe.load("shardcache", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)


def _text(obj) -> str:
    return (obj.docstring.value if obj.docstring else "").strip()


def _public(obj) -> list[str]:
    """The members mkdocstrings shows of a class without a members list: public, its own or inherited
    from a shardcache class (not NamedTuple's or the builtins')."""
    names = [n for n in obj.all_members if not n.startswith("_")]
    out = []
    for n in names:
        m = obj.all_members[n]
        try:
            mine = m.canonical_path.startswith("shardcache.")
        except griffe.AliasResolutionError:
            mine = False
        if mine:
            out.append(n)
    return out


def test_every_rendered_object_and_member_has_a_docstring(package):
    missing = []
    for path, members in _directives():
        obj = package[path.removeprefix("shardcache.")]
        if not _text(obj):
            missing.append(path)
        if not obj.is_class:
            continue
        for name in _public(obj) if members is None else members:
            member = obj.all_members.get(name)
            if member is None:
                missing.append(f"{path}.{name} (listed, not found)")
            elif not _text(member):
                missing.append(f"{path}.{name}")
    assert not missing, f"{len(missing)} without a docstring:\n" + "\n".join(missing)
