"""The docs' LightningDataModules (docs/getting-started.md, and over several caches docs/mixing.md) under a real
Lightning Trainer (CPU, a few steps): every validation pass sees the whole val split, successive training epochs see
different orders, and a checkpoint holds the train stream's position."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from shardcache import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.read.plan import n_windows

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"


def _recording(forecaster: type, seen: dict[str, list]) -> type:
    """The page's ``Forecaster`` noting each window it trains and validates on (its last input bar, as a
    fingerprint) in ``seen``: one list per training epoch, ``(sanity check?, list)`` per validation pass."""

    def key(x):
        return [tuple(r) for r in x[:, -1].tolist()]

    class Recording(forecaster):  # type: ignore[misc, valid-type]
        def on_train_epoch_start(self):
            seen["train"].append([])

        def on_validation_epoch_start(self):
            seen["val"].append((self.trainer.sanity_checking, []))

        def training_step(self, batch, i):
            seen["train"][-1].extend(key(batch[0]))
            return super().training_step(batch, i)

        def validation_step(self, batch, i):
            seen["val"][-1][1].extend(key(batch[0]))
            return super().validation_step(batch, i)

    return Recording


@pytest.mark.parametrize("workers", [0, 2])
def test_readme_lightning_recipe_with_limit_train_batches_and_sanity_check(tmp_path, monkeypatch, workers):
    L = pytest.importorskip("lightning")
    section = PAGE.read_text().split("## With Lightning", 1)[1]
    classes, run = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:2]
    cache = build_cache(
        make_sample(tmp_path / "dbn", days=4),
        tmp_path / "data/sample/cache.zarr",
        split="train=0.8,val=0.1,test=0.1",
        progress=False,
    )
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(classes, str(PAGE), "exec"), scope)
    seen: dict[str, list] = {"train": [], "val": []}
    scope["Forecaster"] = _recording(scope["Forecaster"], seen)
    assert 'Bars("data/sample/cache.zarr")' in run and "limit_train_batches=200" in run
    run = run.replace("limit_train_batches=200", "limit_train_batches=3")
    run = run.replace('Bars("data/sample/cache.zarr")', f'Bars("data/sample/cache.zarr", workers={workers})')
    run += "\ntrainer.save_checkpoint('last.ckpt')\n"
    exec(compile(run, str(PAGE), "exec"), {**scope, "L": L})
    val_windows = n_windows(cache, 60, split="val")
    sanity, passes = seen["val"][0], seen["val"][1:]
    assert sanity[0] and len(sanity[1]) == 2 * 256 and len(passes) == 3
    assert all(not s and len(v) == val_windows for s, v in passes)  # every real validation: the whole val split
    assert all(v == passes[0][1] for _, v in passes)  # in the same order
    train = seen["train"]
    assert len(train) == 3 and all(len(t) == 3 * 256 for t in train)
    assert train[0] != train[1] != train[2] and train[0] != train[2]  # a new shuffle every epoch
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)["Bars"]["train"]
    assert state["epoch"] == 2 and state["history"] == [[1, 3]]  # checkpointed: epoch 2, 3 batches in


MIXING = Path(__file__).resolve().parents[1] / "docs" / "mixing.md"


@pytest.mark.parametrize("workers", [0, 2])
def test_mixing_lightning_recipe_validates_both_caches_and_checkpoints_a_resumable_mix(tmp_path, monkeypatch, workers):
    """The mixing page's LightningDataModule over an ES and an NQ cache: every validation pass sees
    every val window of both, training epochs are new shuffles, and the train stream's state in the
    checkpoint (weights, the caches' digests) resumes the epoch where the run left it."""
    L = pytest.importorskip("lightning")
    from shardcache import WindowStream

    section = MIXING.read_text().split("## With Lightning", 1)[1]
    classes, run = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:2]
    split = "val=2023-01-05,test=2023-01-06"
    caches = []
    for sym in ("ESH3", "NQH3"):
        files = make_sample(tmp_path / sym, days=5, symbols=[sym])
        caches.append(build_cache(files, tmp_path / f"data/{sym[:2].lower()}.zarr", split=split, progress=False))
    monkeypatch.chdir(tmp_path)
    scope: dict = {"WindowStream": WindowStream, "torch": torch}
    exec(compile(classes, str(MIXING), "exec"), scope)
    seen: dict[str, list] = {"train": [], "val": []}
    scope["Forecaster"] = _recording(scope["Forecaster"], seen)
    mixed = 'Mixed(["data/es.zarr", "data/nq.zarr"], weights=(0.75, 0.25))'
    assert mixed in run and "limit_train_batches=20" in run
    run = run.replace("limit_train_batches=20", "limit_train_batches=3")
    run = run.replace(mixed, mixed[:-1] + f", workers={workers})")
    run += "\ntrainer.save_checkpoint('last.ckpt')\n"
    exec(compile(run, str(MIXING), "exec"), {**scope, "L": L})
    val_windows = sum(n_windows(c, 60, split="val") for c in caches)
    passes = seen["val"][1:]
    assert len(passes) == 2 and all(not s and len(v) == val_windows for s, v in passes)
    assert all(len(t) == 3 * 256 for t in seen["train"]) and seen["train"][0] != seen["train"][1]
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)["Mixed"]["train"]
    assert state["epoch"] == 1 and state["history"] == [[1, 3]] and state["weights"] == [0.75, 0.25]
    assert len(state["cache"]) == 2  # both caches' digests, in their order
    kw = {"split": "train", "weights": (0.75, 0.25), "batch_size": 256, "target": ["log_return"]}
    whole = WindowStream(caches, 60, **kw)
    whole.set_epoch(1)
    resumed = WindowStream(caches, 60, **kw)
    resumed.load_state_dict(state)
    rest, full = [b.x for b in resumed], [b.x for b in whole]
    assert len(rest) == len(full) - 3 and all(torch.equal(a, b) for a, b in zip(rest, full[3:]))
