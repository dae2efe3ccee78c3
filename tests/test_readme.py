"""The README's training loop runs as written, on a small cache built from the sample generator."""

from __future__ import annotations

import re
from pathlib import Path

from shardcache import build_cache
from shardcache.sample import make_sample

README = Path(__file__).resolve().parents[1] / "README.md"


def test_training_loop_in_readme_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[text.index("## Training in a dozen lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 14
    build_cache(make_sample(tmp_path / "dbn", days=3), tmp_path / "data/sample/cache.zarr",
                split="train=0.8,val=0.1,test=0.1", progress=False)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.replace("range(3)", "range(1)"), "README.md", "exec"), scope)
    assert scope["loss"].item() >= 0 and scope["x"].shape[1:] == (60, 9)
