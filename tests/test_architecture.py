"""The import contract: data flows one way, format -> read -> inspect, format -> ingest (the builds), the CLI on top.

Read from the source with ``ast`` (nothing is imported to check it): every import of every
module, the ones inside functions and ``if TYPE_CHECKING:`` included, is an edge from one
module to another. Each module belongs to a wing (``WINGS``, the one table to edit when modules
move); each wing may import only the wings below it (``MAY_IMPORT``). Two subprocesses check
what really loads: a training process never loads the builder's stack, and ``verify`` no dask.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardcache"

# module (dotted, without "shardcache."; "" is the package itself) -> wing. A module that is not
# listed belongs to the wing of its nearest listed package ("" excepted: a new top-level module
# must be listed).
WINGS = {
    "": "top",
    "cli": "top",
    "entry": "top",
    "errors": "shared",
    "_version": "shared",
    "tuning": "shared",  # the tuning constants: every wing may import them
    "format": "format",
    "read": "read",
    "inspect": "inspect",
    "ingest": "ingest",
}
MAY_IMPORT = {  # wing -> the wings its modules may import (its own included)
    "shared": {"shared"},
    "format": {"shared", "format"},
    "read": {"shared", "format", "read"},
    "inspect": {"shared", "format", "read", "inspect"},
    "ingest": {"shared", "format", "ingest"},  # the summary counts windows with format.windows, not the read side
    "top": {"shared", "format", "read", "inspect", "ingest", "top"},
}
# What each wing may import from outside the standard library, at module level and in functions.
THIRD_PARTY = {
    "shared": set(),
    "format": {"numpy", "zarr", "numcodecs", "google_crc32c", "fsspec"},
    "read": {"numpy", "torch", "psutil"},  # psutil: memory_budget="auto"
    "inspect": {"numpy", "zarr", "fsspec", "tqdm", "xarray", "dask"},  # xarray, dask: to_xarray, its extra
    "ingest": {"numpy", "zarr", "fsspec", "tqdm", "dask", "distributed", "pyarrow", "databento_dbn", "psutil"},
    "top": {"numpy", "psutil"},
}
EXTRA_OF_WING = {"ingest": "build", "top": "build"}  # the extra whose install a wing's imports may need
OPTIONAL_IMPORTS = {("inspect", "xarray"): "xarray", ("inspect", "dask"): "xarray"}  # (wing, name) -> extra


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def wing(module: str) -> str | None:
    """The wing of a module: its own entry in WINGS, else its nearest listed package's but the root's."""
    parts = module.split(".")
    while parts and module:
        name = ".".join(parts)
        if name in WINGS:
            return WINGS[name]
        parts.pop()
    return WINGS.get(module)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(module: str) -> list[tuple[str, int, str]]:
    """Every import in ``module``: (target, line, kind); target is a shardcache module (dotted, as in
    WINGS) or ``"third:NAME"``; kind is "module", "function" or "typing"."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    typing_lines = _type_checking_lines(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(n) for n in tree.body} | {
        id(n) for s in tree.body if isinstance(s, (ast.If, ast.Try)) for n in ast.walk(s)
    }
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        kind = "typing" if node.lineno in typing_lines else "module" if id(node) in top_level else "function"
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif node.level == 0:
            names = [(node.module, a.name) for a in node.names]
        else:
            base = package.split(".") if package else []
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            name = ".".join(base + ([node.module] if node.module else []))
            names = [("shardcache" + (f".{name}" if name else ""), a.name) for a in node.names]
        for target, attr in names:
            if target == "shardcache" or target.startswith("shardcache."):
                inner = target.removeprefix("shardcache").removeprefix(".")
                sub = f"{inner}.{attr}" if inner and attr else attr or inner
                out.append((sub if attr and sub in MODULES else inner, node.lineno, kind))
            elif target.partition(".")[0] not in sys.stdlib_module_names and target != "__future__":
                out.append((f"third:{target.partition('.')[0]}", node.lineno, kind))
    return out


def test_every_module_has_a_wing():
    assert [m for m in MODULES if wing(m) is None] == [], "add these modules to WINGS"
    assert set(WINGS.values()) <= set(MAY_IMPORT)


def _assigned(module: str) -> dict[str, int]:
    """The names ``module`` assigns at module level (``X = ...``, ``X: T = ...``), with their lines."""
    out = {}
    for node in ast.parse(MODULES[module].read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        out.update({t.id: node.lineno for t in targets if isinstance(t, ast.Name)})
    return out


def test_the_tuning_constants_are_defined_in_tuning_alone():
    """Each of ``shardcache.tuning``'s constants is defined there, beside its figure, and imported by name
    where it is used: no module of any wing defines one of them again. ``tuning`` is a leaf."""
    tree = ast.parse(MODULES["tuning"].read_text())
    tuned = set(next(ast.literal_eval(n.value) for n in tree.body if ast.unparse(n).startswith("__all__ = ")))
    assert tuned and tuned <= set(_assigned("tuning"))
    assert [t for t, _, _ in imports("tuning") if not t.startswith("third:")] == []
    again = [
        f"{m}:{line} {name}"
        for m in MODULES
        if m != "tuning" and wing(m) in {"format", "read", "inspect", "ingest"}
        for name, line in _assigned(m).items()
        if name in tuned
    ]
    assert again == [], "defined again outside shardcache/tuning.py: " + ", ".join(again)


def test_each_wing_imports_only_the_wings_below_it():
    """format below read below inspect; format below ingest; read and ingest never import each other; the CLI on top."""
    bad = [
        f"{m or 'shardcache'}:{line} ({wing(m)}) imports {t or 'shardcache'} ({wing(t)})"
        + " in a function" * (k == "function")
        for m in MODULES
        for t, line, k in imports(m)
        if not t.startswith("third:") and wing(t) not in MAY_IMPORT[wing(m)]
    ]
    assert bad == [], "\n".join(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_circles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_import_circles_function_level_imports_included():
    """Imports under ``if TYPE_CHECKING:`` never run and type checkers resolve circles: they do not count."""
    edges = {
        m: {t for t, _, k in imports(m) if not t.startswith("third:") and k != "typing" and t != m} for m in MODULES
    }
    cycles = _cycles(edges)
    assert cycles == [], "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def _third_party(module: str, typing: bool = True) -> set[str]:
    return {
        t.removeprefix("third:") for t, _, k in imports(module) if t.startswith("third:") and (typing or k != "typing")
    }


def test_each_wing_imports_only_its_own_libraries():
    bad = [
        f"{m} ({wing(m)}) imports {sorted(_third_party(m) - THIRD_PARTY[wing(m)])}"
        for m in MODULES
        if _third_party(m) - THIRD_PARTY[wing(m)]
    ]
    assert bad == [], "\n".join(bad)


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", req).group().lower().replace("_", "-") for req in requirements}


def test_the_core_install_has_what_format_read_and_inspect_import():
    """A training box installs the core only; the build's libraries come with ``[build]``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = {k: _requirement_names(v) for k, v in project["optional-dependencies"].items()}
    dists = packages_distributions()
    missing = []
    for m in MODULES:
        for name in _third_party(m, typing=False):  # annotations only: never imported at run time
            need = {d.lower().replace("_", "-") for d in dists.get(name, [name])}
            extra = OPTIONAL_IMPORTS.get((wing(m), name)) or EXTRA_OF_WING.get(wing(m))
            have = core | (extras.get(extra, set()) if extra else set())
            if not need & have:
                missing.append(
                    f"{m} imports {name} ({', '.join(sorted(need))}): not in the core"
                    + (f" or [{extra}]" if extra else "")
                )
    assert missing == [], "\n".join(missing)
    assert not {"dask", "distributed", "pyarrow", "databento-dbn", "lz4"} & core


# ---- what a process really loads ---------------------------------------------------------------

BUILD_STACK = ("dask", "distributed", "pyarrow", "databento_dbn")
LOADED = "import json, sys; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"


def _loaded(code: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-c", f"{code}\n{LOADED}"], capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def test_a_training_process_loads_neither_dask_nor_pyarrow(stream_cache):
    code = f"""
import shardcache
from shardcache import WindowStream
with WindowStream({stream_cache.url!r}, seq_len=9, batch_size=64, split="train") as ds:
    x, y = next(iter(ds))
    assert x.shape == (64, 9, 5), x.shape
"""
    loaded = _loaded(code)
    assert "torch" in loaded and "zarr" in loaded  # it did stream
    assert sorted(loaded & set(BUILD_STACK)) == []


@pytest.mark.parametrize("command", ["verify", "info", "ls"])
def test_reading_commands_load_no_dask(stream_cache, command):
    code = f"""
import contextlib, io
from shardcache.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main([{command!r}, {stream_cache.url!r}])
assert code == 0, code
"""
    assert sorted(_loaded(code) & set(BUILD_STACK)) == []
