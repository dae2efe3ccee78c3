"""Draw the package's wings and the imports between them as an SVG, from the code as it stands.

``python tools/draw_architecture.py [OUT]`` (default ``docs/img/architecture.svg``; ``-`` prints it).
Each wing is a box listing its modules; an arc above the boxes says that some module of the wing
on its left imports one of the wing on its right (imports inside functions included), so every arc
runs one way: from the CLI down to the shared errors. Only modules and arcs are drawn, not their
sizes, so the picture changes when the structure does. The arcs below the
boxes are the data: bars from the sources are written once into the store, whose shards the read
side decodes into batches and the inspect side shows. Read with ``ast``: nothing is imported.
``tests/test_docs.py`` checks that the committed picture is this tool's output for today's code.
"""

from __future__ import annotations

import argparse
import ast
import sys
from html import escape
from pathlib import Path

__all__ = ["WINGS", "render", "wing_imports"]

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardcache"

# left to right: a wing imports only wings to its right
WINGS = (  # (name, title, what it is, its files and folders)
    ("top", "on top", "cli.py, entry.py, the package face", ("cli.py", "entry.py", "__init__.py")),
    ("inspect", "inspect/", "views of a cache, verify", ("inspect/",)),
    ("ingest", "ingest/", "sources -> one cache", ("ingest/",)),
    ("read", "read/", "windows: numpy + torch", ("read/",)),
    ("format", "format/", "the on-disk contract", ("format/",)),
    ("shared", "shared", "errors, the version, tuning", ("errors.py", "_version.py", "tuning.py")),
)
DATA = (  # (from, to, label): the flow of bars, drawn under the boxes; None is outside the package
    (None, "ingest", "DBN, Parquet, CSV files"),
    ("ingest", "format", "each bar written once"),
    ("format", "read", "shards decoded"),
    ("read", None, "batches to the model"),
    ("format", "inspect", "info, ls, verify, xarray"),
)
BOX_W, GAP, ROW, TOP_PAD, ARC_ROOM, DATA_ROOM = 182, 26, 15, 50, 160, 140


def _wing_of(rel: str) -> str:
    for name, _, _, members in WINGS:
        if any(rel == m or rel.startswith(m) for m in members if m.endswith("/")) or rel in members:
            return name
    raise SystemExit(f"{rel}: in no wing of tools/draw_architecture.py's WINGS")


def _modules() -> dict[str, Path]:
    """Each module's path relative to the package (``read/plan.py``) -> its file."""
    return {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(rel: str, tree: ast.Module) -> list[str]:
    """The package modules an import of ``rel`` names, as relative paths (a package as its folder)."""
    package = rel.rpartition("/")[0].split("/") if "/" in rel else []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = [".".join(["shardcache", *base, *([node.module] if node.module else [])])]
            else:
                names = [node.module or ""]
        else:
            continue
        out += [n.removeprefix("shardcache").lstrip(".").replace(".", "/") for n in names if n.startswith("shardcache")]
    return out


def wing_imports() -> set[tuple[str, str]]:
    """Every (wing, another wing it imports)."""
    mods = _modules()
    pairs: set[tuple[str, str]] = set()
    for rel, path in mods.items():
        src = _wing_of(rel)
        for target in _targets(rel, ast.parse(path.read_text(), str(path))):
            hit = next((m for m in (f"{target}.py", f"{target}/__init__.py") if m in mods), None)
            dst = _wing_of(hit) if hit else _wing_of(f"{target}/") if target else "top"
            if dst != src:
                pairs.add((src, dst))
    return pairs


def render() -> str:
    """The SVG text: boxes, import arcs above, data arcs below."""
    mods = _modules()
    names = [w[0] for w in WINGS]
    folder = {w[0]: w[3][0] if w[3][0].endswith("/") else "" for w in WINGS}
    listed = {n: [r.removeprefix(folder[n]) for r in mods if _wing_of(r) == n] for n in names}
    height = max(len(v) for v in listed.values()) * ROW + TOP_PAD + 12
    x = {n: GAP + i * (BOX_W + GAP) for i, n in enumerate(names)}
    y0 = ARC_ROOM
    width = GAP + len(names) * (BOX_W + GAP)
    total_h = y0 + height + DATA_ROOM + 30
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
            f'viewBox="0 0 {width} {total_h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
        ),
        "<defs>",
        (
            '<marker id="imp" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>'
        ),
        (
            '<marker id="dat" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#1f6fb2"/></marker>'
        ),
        "</defs>",
        f'<rect width="{width}" height="{total_h}" fill="#ffffff"/>',
        (
            f'<text x="{GAP}" y="22" font-size="15" font-weight="bold">shardcache: its wings, the imports between '
            "them (above) and the flow of bars (below)</text>"
        ),
    ]
    edges = sorted(wing_imports(), key=lambda e: (names.index(e[1]) - names.index(e[0]), e))
    for src, dst in edges:
        a, b = names.index(src), names.index(dst)
        if b < a:
            raise SystemExit(f"{src} imports {dst}, a wing to its left: reorder WINGS or fix the import")
        x1 = x[src] + BOX_W * (0.55 + 0.06 * (len(names) - b))
        x2 = x[dst] + BOX_W * (0.2 + 0.06 * a)
        lift = 16 + 19 * (b - a) + 4 * a
        path = f"M{x1:.0f},{y0} C{x1:.0f},{y0 - lift} {x2:.0f},{y0 - lift} {x2:.0f},{y0 - 2}"
        out.append(f'<path d="{path}" fill="none" stroke="#777" stroke-width="1.3" marker-end="url(#imp)"/>')
    for name, title, what, _ in WINGS:
        bx = x[name]
        out.append(
            f'<rect x="{bx}" y="{y0}" width="{BOX_W}" height="{height}" rx="6" fill="#eef3f8" stroke="#4a6b8a"/>'
        )
        out.append(f'<text x="{bx + 8}" y="{y0 + 19}" font-size="13" font-weight="bold">{escape(title)}</text>')
        out.append(f'<text x="{bx + 8}" y="{y0 + 35}" font-size="10.5" fill="#444">{escape(what)}</text>')
        for i, rel in enumerate(listed[name]):
            ty = y0 + TOP_PAD + 8 + i * ROW
            out.append(f'<text x="{bx + 10}" y="{ty}" font-size="10.5" font-family="DejaVu Sans Mono, monospace">')
            out.append(f"{escape(rel)}</text>")
    yb = y0 + height
    for src, dst, label in DATA:
        if src is None or dst is None:  # into the package from below, or out of it
            bx = x[dst or src] + BOX_W * (0.3 if src is None else 0.5)
            y1, y2 = (yb + DATA_ROOM - 18, yb + 2) if src is None else (yb, yb + DATA_ROOM - 18)
            out.append(
                f'<path d="M{bx:.0f},{y1} L{bx:.0f},{y2}" stroke="#1f6fb2" stroke-width="2" marker-end="url(#dat)"/>'
            )
            out.append(
                f'<text x="{bx:.0f}" y="{yb + DATA_ROOM - 4}" font-size="10.5" fill="#1f6fb2" '
                f'text-anchor="middle">{escape(label)}</text>'
            )
            continue
        a, b = names.index(src), names.index(dst)
        x1, x2 = x[src] + BOX_W * (0.62 if b > a else 0.75), x[dst] + BOX_W * (0.45 if b > a else 0.8)
        drop = 22 + 26 * abs(b - a)
        path = f"M{x1:.0f},{yb} C{x1:.0f},{yb + drop} {x2:.0f},{yb + drop} {x2:.0f},{yb + 2}"
        out.append(f'<path d="{path}" fill="none" stroke="#1f6fb2" stroke-width="2" marker-end="url(#dat)"/>')
        out.append(
            f'<text x="{(x1 + x2) / 2:.0f}" y="{yb + 0.75 * drop + 13:.0f}" font-size="10.5" fill="#1f6fb2" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    out.append(
        f'<text x="{GAP}" y="{total_h - 10}" font-size="10" fill="#555">grey arc: a wing imports the one it points '
        "to; blue: the bars. Drawn from the code by tools/draw_architecture.py.</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(ROOT / "docs/img/architecture.svg"), help="SVG file, or - for stdout")
    args = p.parse_args(argv)
    svg = render()
    if args.out == "-":
        sys.stdout.write(svg)
    else:
        Path(args.out).write_text(svg)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
