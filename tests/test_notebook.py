"""The exploration notebook: committed without outputs, and it runs green on a small cache.

The kernel is this interpreter: a ``python3`` kernelspec pointing at ``sys.executable`` is
written to a temporary ``JUPYTER_PATH`` (searched before any user or system kernelspec), so
the notebook imports the shardcache under test whatever kernels the machine has.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_shards.ipynb"


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"


@pytest.fixture
def small_cache(tmp_path) -> Path:
    """Ten days of the DBN sample, split train/val/test, in 4096-row shards (2 per symbol, 8 shards)."""
    from shardcache import build_cache
    from shardcache.ingest.sample import make_sample

    make_sample(tmp_path / "dbn", days=10)
    out = tmp_path / "cache.zarr"
    build_cache(tmp_path / "dbn", out, split="train=0.8,val=0.1,test=0.1", shard_rows=4096, progress=False)
    return out


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch) -> str:
    """A ``python3`` kernelspec for this interpreter, first on the Jupyter path."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def test_notebook_runs_and_draws_its_figures(small_cache, this_python_kernel, monkeypatch):
    monkeypatch.setenv("SHARDCACHE_CACHE", str(small_cache))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name=this_python_kernel, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 4, f"{len(figures)} figures"
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert f"Cache('{small_cache}'" in text and "symbols/1/features/c.1.0" in text  # symbol 1's second shard


def test_notebook_builds_a_small_cache_when_there_is_none(tmp_path, this_python_kernel, monkeypatch):
    monkeypatch.setenv("SHARDCACHE_CACHE", str(tmp_path / "nothing-here.zarr"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the notebook's temporary cache goes
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = nb.cells[: first_code + 1]  # the set-up cell only
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name=this_python_kernel, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in nb.cells[-1].outputs)
    assert "built a 30-day sample cache" in text and "Cache(" in text
    assert not list(tmp_path.glob("shardcache-explore-*"))  # removed when the kernel stopped


def test_jupyter_nbconvert_runs_it_from_another_folder_and_leaves_nothing_behind(tmp_path, this_python_kernel):
    """What people type: ``jupyter nbconvert --to html --execute``, from a folder with no cache, with no
    ``SHARDCACHE_CACHE``: it builds its temporary cache, writes the page, and leaves no file but the page."""
    import os
    import subprocess

    elsewhere, scratch = tmp_path / "elsewhere", tmp_path / "tmp"
    elsewhere.mkdir(), scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SHARDCACHE_CACHE"}
    env.update(TMPDIR=str(scratch), JUPYTER_PATH=os.environ["JUPYTER_PATH"])
    jupyter = Path(sys.executable).with_name("jupyter")
    out = subprocess.run(
        [jupyter, "nbconvert", "--to", "html", "--execute", "--output-dir", str(elsewhere), str(NOTEBOOK)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    page = (elsewhere / "explore_shards.html").read_text()
    assert "built a 30-day sample cache" in page
    assert sorted(p.name for p in elsewhere.iterdir()) == ["explore_shards.html"]
    assert not list(scratch.glob("shardcache-explore-*")), list(scratch.iterdir())
    assert not (NOTEBOOK.parent / "explore_shards.html").exists()
