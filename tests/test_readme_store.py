"""The README's plain-zarr, plain-xarray and exploring examples run as written, on a small sample cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardcache import build_cache
from shardcache.build.sample import make_sample

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(heading: str) -> list[str]:
    text = README.read_text()
    start = text.index(heading)
    section = text[start : text.index("\n## ", start + len(heading))]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    build_cache(
        make_sample(work / "dbn", days=10),
        work / "data/sample/cache.zarr",
        split="train=0.8,val=0.1,test=0.1",
        progress=False,
    )
    return work


@pytest.mark.parametrize("heading,blocks", [("## The store: an on-disk contract", 2), ("## Exploring a cache", 1)])
def test_readme_examples_run(sample_dir, monkeypatch, heading, blocks):
    pytest.importorskip("xarray")
    code = python_blocks(heading)
    assert len(code) == blocks
    monkeypatch.chdir(sample_dir)
    scope: dict = {}
    for block in code:
        exec(compile(block, "README.md", "exec"), scope)
    if "es" in scope:
        assert scope["es"]["features"].shape[0] == scope["t"].shape[0] and scope["window"].shape == (60, 9)
    if "tree" in scope and "cache" in scope:
        assert scope["tree"]["symbols/2"].symbol.item() == scope["cache"].symbols[2]
