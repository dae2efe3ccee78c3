"""The README's training loop runs as written, on a small cache built from the sample generator."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from shardcache import build_cache
from shardcache.build.sample import make_sample
from shardcache.read.plan import n_windows

README = Path(__file__).resolve().parents[1] / "README.md"


def test_training_loop_in_readme_trains_every_parameter_and_reports_each_epoch(tmp_path, monkeypatch, capsys):
    text = README.read_text()
    section = text[text.index("## Training in a dozen lines") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) <= 14
    cache = build_cache(
        make_sample(tmp_path / "dbn", days=3),
        tmp_path / "data/sample/cache.zarr",
        split="train=0.8,val=0.1,test=0.1",
        progress=False,
    )
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code.replace("range(3)", "range(2)"), "README.md", "exec"), scope)
    torch.manual_seed(0)  # the same modules, untrained: every parameter must have moved
    lstm0, head0 = torch.nn.LSTM(input_size=9, hidden_size=64, batch_first=True), torch.nn.Linear(64, 1)
    for trained, initial in ((scope["lstm"], lstm0), (scope["head"], head0)):
        for (name, p), p0 in zip(trained.named_parameters(), initial.parameters()):
            assert not torch.equal(p, p0), f"{name} was not trained"
    lines = re.findall(r"epoch (\d+): ([\d,]+) windows, train mse ([\d.]+)", capsys.readouterr().out)
    windows = n_windows(cache, 60, split="train")
    assert [int(e) for e, _, _ in lines] == [0, 1]  # a line per epoch
    assert all(int(n.replace(",", "")) == windows for _, n, _ in lines)  # each epoch every train window
    assert all(0 < float(m) < 10 for _, _, m in lines)
    assert scope["x"].shape[1:] == (60, 9) and scope["y"].shape[1:] == (1,)
