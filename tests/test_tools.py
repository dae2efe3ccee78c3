"""``tools/``: one bench whose scenario modules share one harness, with no import circles among them
(imports inside functions included), each module with a docstring and an ``__all__``, and every scenario
``tools/bench.py`` names reachable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
MODULES = {p.stem: ast.parse(p.read_text()) for p in sorted(TOOLS.glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    """The tool modules ``tree`` imports, anywhere in it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names & set(MODULES)


def test_no_tool_module_imports_another_in_a_circle():
    edges = {m: _imports(t) - {m} for m, t in MODULES.items()}
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(edges[m]):
            assert seen.get(n) != 1, "tool modules import each other: " + " -> ".join([*path, m, n])
            if n not in seen:
                visit(n, [*path, m])
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            visit(m, [])
    assert not any("bench" in edges[m] for m in edges), "only the entry imports the scenario modules, by name"


def test_every_module_says_what_it_is_exports_by_name_and_stays_short():
    for name, tree in MODULES.items():
        assert ast.get_docstring(tree), f"tools/{name}.py has no module docstring"
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert "__all__" in assigned, f"tools/{name}.py has no __all__"
        assert (TOOLS / f"{name}.py").read_text().count("\n") <= 600, f"tools/{name}.py is over 600 lines"


def _commands(tree: ast.Module) -> set[str]:
    """The keys of a module's ``COMMANDS = {...}``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets):
            return {k.value for k in node.value.keys}
    return set()


def test_every_scenario_the_entry_names_has_its_command():
    scenarios = next(
        n.value for n in MODULES["bench"].body if isinstance(n, ast.Assign) and n.targets[0].id == "SCENARIOS"
    )
    named = {k.value: v.elts[0].value for k, v in zip(scenarios.keys, scenarios.values)}
    assert {"loaders", "peers", "build", "profile", "gpu"} <= set(named)
    for name, module in named.items():
        assert name in _commands(MODULES[module]), f"tools/{module}.py's COMMANDS lacks {name!r}"


def test_the_entry_lists_its_scenarios_and_refuses_an_unknown_one():
    run = [sys.executable, str(TOOLS / "bench.py")]
    listed = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and "loaders" in listed.stdout and "profile" in listed.stdout
    unknown = subprocess.run([*run, "nope"], capture_output=True, text=True, timeout=60, check=False)
    assert unknown.returncode == 2 and "usage: bench.py SCENARIO" in unknown.stderr
