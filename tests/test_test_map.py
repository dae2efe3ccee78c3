"""The map of where a module's tests are (``tests/README.md``, "Package module -> test files") is the
package and the tests as they stand: every module of ``shardcache/`` has a row, every test file is named
in one, and every module and test file named exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardcache"


def _rows() -> list[tuple[str, str]]:
    """(modules, tests) cells of the map's table."""
    text = (ROOT / "tests" / "README.md").read_text()
    table = text.split("## Package module -> test files", 1)[1]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [(a.strip(), b.strip()) for a, b in rows[1:]]  # the header row left out


def mapped(cell: str) -> set[str]:
    """The module paths (relative to ``shardcache/``) a map cell names: ``format/encode.py``, and
    ``metadata.py`` after it in the same folder; ``ingest/sources/`` (base, files) for the modules listed."""
    out, folder = set(), ""
    for item, listed in re.findall(r"`([^`]+)`(?:\s*\(([^)]*)\))?", cell):
        item = item.removeprefix("shardcache/")
        if item.endswith("/"):
            folder = item
            out |= {f"{item}{name.strip()}.py" for name in listed.split(",") if name.strip()}
        elif item.endswith(".py"):
            if "/" in item:
                folder = item.rsplit("/", 1)[0] + "/"
                out.add(item)
            else:
                out.add(folder + item)
    return out


def test_every_module_of_the_package_has_a_row():
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    named = set().union(*(mapped(modules_cell) for modules_cell, _ in _rows()))
    assert sorted(modules - named) == [], "add these modules to tests/README.md's map"
    assert sorted(named - modules - {"__init__.py"}) == [], "the map names modules that are gone"


def test_every_test_file_has_a_row_and_every_one_named_exists():
    named = {name for _, tests in _rows() for name in re.findall(r"`(test_\w+\.py)`", tests)}
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert sorted(files - named) == [], "add these test files to tests/README.md's map"
    assert sorted(named - files) == [], "the map names test files that are gone"


def test_the_cell_reader_follows_folders_and_lists():
    assert mapped("`format/encode.py`, `metadata.py`") == {"format/encode.py", "format/metadata.py"}
    assert mapped("`ingest/sources/` (base, files, table)") == {
        f"ingest/sources/{m}.py" for m in ("base", "files", "table")
    }
    assert mapped("`shardcache/__init__.py`, `_version.py`, packaging") == {"__init__.py", "_version.py"}
