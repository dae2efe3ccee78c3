"""The README and the site's pages (``docs/``) as a reader follows them: every code block runs, as written.

A page's ``python`` and ``bash`` blocks run in order in a fresh folder of their own, as one reader
at one shell would: python blocks share one namespace, bash blocks one environment (what a block
exports, the next one sees; what it starts with ``&`` runs until the page is done). Before the
page, the folder holds ``data/sample/``: the demo sample made by ``shardcache demo`` (the 360-day
sample), or for the pages that train on it ``shardcache demo --days 5``, the form the README shows.
A ``text`` block is not code. A block that cannot run says why in an HTML comment on the line above
it, ``<!-- test: skip: WHY -->``; ``<!-- test: file NAME -->`` writes the block to ``NAME`` (a script a
later block runs). In python blocks a line ``EXPR  # -> VALUE`` must print as ``VALUE`` (its repr).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").rglob("*.md")))]
BIN = Path(sys.executable).parent  # the venv's bin: shardcache, build-cache, dask, torchrun ...
SMALL_DEMO = "shardcache demo --days 5"  # the README shows this form
SMALL_PAGES = {"README.md", "docs/getting-started.md"}  # they train: 3 epochs of the small sample
RUN, TEXT = ("python", "bash"), ("text",)
MARKER = re.compile(r"<!-- test: (?:skip: (?P<why>\S.*?)|file (?P<file>[\w.-]+)) -->")
CHECK = re.compile(r"#\s*->\s*(?P<value>.+?)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it starts (the fence's line), its language and text."""

    page: str
    line: int
    lang: str
    code: str
    skip: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang})"


def blocks(page: str, root: Path = ROOT) -> list[Block]:
    """Every fenced block of ``page`` (a path under ``root``), with the marker on the line above it."""
    out, lines = [], (root / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            above = lines[start - 1].strip() if start else ""
            m = MARKER.fullmatch(above)
            if above.startswith("<!--") and not m:
                raise AssertionError(f"{page}:{start}: unknown marker {above!r}")
            code = "\n".join(lines[start + 1 : end]) + "\n"
            out.append(Block(page, start + 1, lang, code, m and m["why"], m and m["file"]))
            i = end
        i += 1
    return out


def test_every_block_is_code_that_runs_or_says_why_not():
    """A block is python or bash (run) or text; a skip names its reason. No command hides in another fence."""
    seen = 0
    for page in PAGES:
        for b in blocks(page):
            assert b.lang in RUN + TEXT, f"{b}: fence language {b.lang!r}: use python, bash or text"
            assert not (b.file and b.lang != "python"), f"{b}: only a python block is written to a file"
            assert not (b.lang in TEXT and (b.skip or b.file)), f"{b}: a text block needs no marker"
            seen += b.lang in RUN and not b.skip
    assert seen >= 20


def test_every_training_recipe_sets_torchs_threads():
    """The thread rule (getting-started.md, "Workers and threads"): a page's training loop or Trainer runs after
    ``torch.set_num_threads`` in that page, or in a script ``torchrun`` starts (which sets ``OMP_NUM_THREADS=1``)."""
    seen = 0
    for page in PAGES:
        bs = [b for b in blocks(page) if b.lang in RUN and not b.skip]
        torchrun = {
            w for b in bs if b.lang == "bash" for ln in b.code.splitlines() if "torchrun" in ln for w in ln.split()
        }
        threads_set = False
        for b in bs:
            threads_set = threads_set or "torch.set_num_threads(" in b.code
            if b.lang == "python" and ("Trainer(" in b.code or ".backward()" in b.code):
                seen += 1
                assert threads_set or b.file in torchrun, f"{b}: trains before torch.set_num_threads"
    assert seen >= 4


def test_the_readme_is_short_and_its_links_lead_somewhere():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    assert text.index("make demo") < 300 and text.index("make test") < 400  # the two commands at the very top
    assert SMALL_DEMO in text
    from markdown.extensions.toc import slugify

    for target in re.findall(r"\]\(([^)#\s]+\.md|[^)\s]+\.md#[^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.MULTILINE)
            assert anchor in {slugify(h, "-") for h in headings}, target


def test_the_architecture_picture_is_the_code_as_it_stands():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import draw_architecture
    finally:
        sys.path.remove(str(ROOT / "tools"))
    drawn = (ROOT / "docs/img/architecture.svg").read_text()
    assert drawn == draw_architecture.render(), "the code's wings changed: run python tools/draw_architecture.py"


# ---- the pages, run (slow tier: tests/conftest.py) --------------------------------------------


def _demo(tmp_path_factory, *args: str) -> Path:
    work = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [BIN / "shardcache", "demo", *args], cwd=work, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work / "data" / "sample"


@pytest.fixture(scope="session")
def full_demo(tmp_path_factory) -> Path:
    """``shardcache demo``: the 360-day sample and its cache, as ``make demo`` leaves them."""
    return _demo(tmp_path_factory)


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory) -> Path:
    """``shardcache demo --days 5``, exactly as the README shows it."""
    return _demo(tmp_path_factory, *SMALL_DEMO.split()[2:])


class _Checked(ast.NodeTransformer):
    """``EXPR  # -> VALUE`` lines become ``__check__(EXPR, "VALUE", line)``."""

    def __init__(self, expected: dict[int, str]):
        self.expected, self.found = expected, set()

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        value = self.expected.get(node.lineno)
        if value is None:
            return node
        self.found.add(node.lineno)
        call = ast.Call(ast.Name("__check__", ast.Load()), [node.value, ast.Constant(value)], [])
        return ast.copy_location(ast.Expr(ast.copy_location(call, node)), node)


def _check(value: object, expected: str) -> None:
    assert repr(value) == expected, f"printed {value!r}, the page says {expected}"


def _run_python(b: Block, scope: dict, root: Path = ROOT) -> None:
    expected = {i: m["value"] for i, ln in enumerate(b.code.splitlines(), 1) if (m := CHECK.search(ln))}
    tree = ast.parse(b.code)
    checked = _Checked(expected)
    tree = ast.fix_missing_locations(checked.visit(tree))
    assert checked.found == set(expected), f"{b}: a `# ->` on a line that is no expression"
    ast.increment_lineno(tree, b.line)
    scope["__check__"] = _check
    exec(compile(tree, str(root / b.page), "exec"), scope)  # the page's code, as a reader runs it


def _wait_for_ports(code: str, timeout: float = 60) -> None:
    """A block that starts servers with ``&``: wait until the ports it names accept connections."""
    ports = [
        int(p)
        for line in code.splitlines()
        if line.rstrip().split("#")[0].rstrip().endswith("&")
        for p in re.findall(r"(?:-p|--port)\s+(\d+)", line)
    ]
    for port in ports:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nothing listens on port {port} after {timeout} s"
                time.sleep(0.2)


def _run_bash(b: Block, work: Path, env: dict[str, str], groups: list[int]) -> None:
    env_file, log = work / ".doc-env", work / f".doc-block-{b.line}.log"
    script = f"set -eo pipefail\n{b.code}env -0 > {env_file}\n"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        groups.append(proc.pid)
        rc = proc.wait(timeout=600)
    assert rc == 0, f"{b}: exit {rc}\n{log.read_text()[-6000:]}"
    env.clear()
    env.update(kv.split("=", 1) for kv in env_file.read_text().split("\0") if "=" in kv)
    _wait_for_ports(b.code)


def _stop(groups: list[int]) -> None:
    """End what the page's blocks started in the background (moto, a dask cluster), group by group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM:
            time.sleep(1)


def _runnable(page: str) -> bool:
    return any(b.lang in RUN and not b.skip for b in blocks(page))


def _env(work: Path, fresh_shell: bool) -> dict[str, str]:
    """The environment bash blocks start in: the venv on PATH, or with ``fresh_shell`` a shell that never
    activated it (the venv's bin off PATH) in a folder whose ``.venv`` is it, as ``make demo`` leaves a clone."""
    env = {**os.environ, "TMPDIR": str(work / "tmp")}
    if not fresh_shell:
        return {**env, "PATH": f"{BIN}{os.pathsep}{env['PATH']}"}
    (work / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    env.pop("VIRTUAL_ENV", None)
    path = [d for d in env["PATH"].split(os.pathsep) if d and Path(d).resolve() != BIN.resolve()]
    return {**env, "PATH": os.pathsep.join(path)}


def run_page(
    page: str, sample: Path | None, work: Path, monkeypatch, root: Path = ROOT, fresh_shell: bool = False
) -> tuple[dict, str]:
    """Run every block of ``page`` in ``work`` (which gets ``data/sample``); the python scope and bash's output."""
    import torch

    if sample is not None:
        shutil.copytree(sample, work / "data" / "sample")
    (work / "tmp").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(work / "tmp"))  # what the blocks put in temp stays here
    env = _env(work, fresh_shell)
    scope: dict = {"__name__": "__main__"}
    groups: list[int] = []
    threads = torch.get_num_threads()  # a block may set them, as a user's script does
    torch.manual_seed(0)
    try:
        for b in blocks(page, root):
            if b.skip or b.lang in TEXT:
                continue
            if b.file:
                (work / b.file).write_text(b.code)
            elif b.lang == "python":
                _run_python(b, scope, root)
            else:
                _run_bash(b, work, env, groups)
    finally:
        _stop(groups)
        torch.set_num_threads(threads)
    logs = "".join(p.read_text() for p in sorted(work.glob(".doc-block-*.log")))
    return scope, logs


def _check_training_loop(scope: dict, out: str, cache: Path) -> None:
    """The loop trained every parameter and each epoch served every train window once."""
    import torch

    from shardcache import open_cache
    from shardcache.read.plan import n_windows

    torch.manual_seed(0)  # the same modules, untrained: every parameter must have moved
    lstm0, head0 = torch.nn.LSTM(input_size=9, hidden_size=64, batch_first=True), torch.nn.Linear(64, 1)
    for trained, initial in ((scope["lstm"], lstm0), (scope["head"], head0)):
        for (name, p), p0 in zip(trained.named_parameters(), initial.parameters()):
            assert not torch.equal(p, p0), f"{name} was not trained"
    lines = re.findall(r"epoch (\d+): ([\d,]+) windows, train mse ([\d.]+)", out)
    windows = n_windows(open_cache(cache), 60, split="train")
    assert [int(e) for e, _, _ in lines] == [0, 1, 2]
    assert all(int(n.replace(",", "")) == windows for _, n, _ in lines)
    assert all(0 < float(m) < 10 for _, _, m in lines)


@pytest.mark.parametrize(
    "code,error",
    [
        ("```python\nx = 1 + 1\nx  # -> 3\n```\n", "printed 2, the page says 3"),
        ('```bash\nexport A=1\n```\n\n```bash\ntest "$A" = 2\n```\n', "exit 1"),
        ("```bash\nfalse | true\n```\n", "exit 1"),
        ("```python\nx = 1  # -> 1\n```\n", "no expression"),
    ],
)
def test_a_page_that_does_not_do_what_it_says_fails(code, error, tmp_path, monkeypatch):
    """The runner itself: a wrong value, a failing command (in a pipe too) fail the page; exports carry over."""
    (tmp_path / "page.md").write_text(code)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(AssertionError, match=error):
        run_page("page.md", None, work, monkeypatch, root=tmp_path)


def test_a_fresh_shell_has_the_commands_only_once_the_venv_is_activated(tmp_path, monkeypatch):
    """The README's shell: ``shardcache`` is not found until ``.venv`` is activated, and then it is the venv's."""
    bare, activated = tmp_path / "bare", tmp_path / "activated"
    (tmp_path / "bare.md").write_text("```bash\nshardcache --help\n```\n")
    (tmp_path / "activated.md").write_text(
        "```bash\nsource .venv/bin/activate\n```\n\n```bash\nshardcache --help >/dev/null && command -v python\n```\n"
    )
    for work in (bare, activated):
        work.mkdir()
    with pytest.raises(AssertionError, match="exit 127"):
        run_page("bare.md", None, bare, monkeypatch, root=tmp_path, fresh_shell=True)
    _, out = run_page("activated.md", None, activated, monkeypatch, root=tmp_path, fresh_shell=True)
    assert Path(out.split()[-1]).parent.resolve() == BIN.resolve()


@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p)])
def test_blocks_run_as_written(page, request, tmp_path, monkeypatch, capsys):
    sample = request.getfixturevalue("small_demo" if page in SMALL_PAGES else "full_demo")
    scope, logs = run_page(page, sample, tmp_path, monkeypatch, fresh_shell=page == "README.md")  # as a clone has it
    out = capsys.readouterr().out
    assert not (tmp_path / "lightning_logs").exists() and not (tmp_path / "checkpoints").exists()
    if "lstm" in scope:
        _check_training_loop(scope, out, tmp_path / "data/sample/cache.zarr")
    if "trainer" in scope:
        assert re.search(r"^val_mse \d+\.\d{4}$", out, re.MULTILINE), out
    if page == "docs/scaling.md":  # both ranks of the DDP job ran both epochs
        assert sorted(set(re.findall(r"rank (\d) epoch (\d): \d+ batches", logs))) == [
            ("0", "0"),
            ("0", "1"),
            ("1", "0"),
            ("1", "1"),
        ], logs


def test_readme_figures_are_a_run_of_the_full_sample(full_demo, small_demo):
    """Each number the README quotes about the demo is what a run of ``shardcache demo`` gives."""
    from shardcache import open_cache
    from shardcache.read.plan import n_windows

    text = (ROOT / "README.md").read_text()
    full, small = open_cache(full_demo / "cache.zarr"), open_cache(small_demo / "cache.zarr")
    every = n_windows(full, 60, split="all")
    figures = {
        "bars": full.n_bars,
        "windows at seq_len 60, every split": every,
        "windows of one train epoch": n_windows(full, 60, split="train"),
        "bars of the 5-day sample": small.n_bars,
    }
    for what, value in figures.items():
        assert f"{value:,}" in text, f"{what}: {value:,} is not in the README"
    assert f"{every * 60 * 256 * 4 / 1e9:.1f} GB" in text  # every window as 60 x 256 float32 tensors


def test_the_docs_gate_fails_on_a_broken_anchor(tmp_path):
    """``make docs`` itself (the Makefile's command, strict mode) fails once a page links to an anchor
    that is not there, and passes on the pages as they are."""
    for name in ("Makefile", "mkdocs.yml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "shardcache").symlink_to(ROOT / "shardcache")  # the reference pages read its docstrings
    venv = Path(sys.prefix)
    make = ["make", "-s", "docs", f"VENV={venv}"]
    if not (venv / ".installed").exists():
        make.insert(1, "-o")
        make.insert(2, f"{venv}/.installed")
    clean = subprocess.run(make, check=False, cwd=tmp_path, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    page = tmp_path / "docs" / "scaling.md"
    page.write_text(page.read_text() + "\nSee [nowhere](performance.md#no-such-heading).\n")
    broken = subprocess.run(make, check=False, cwd=tmp_path, capture_output=True, text=True)
    assert broken.returncode != 0
    assert "no-such-heading" in broken.stdout + broken.stderr
