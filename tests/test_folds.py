"""Walk-forward folds and embargoes (``shardcache/read/folds.py``, ``cuts.py``): folds as plain data, and the
windows a stream or a dataset serves of each fold or split, against plain zarr's segments and bar times."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch.multiprocessing as mp
import zarr
from helpers import ddp_rank
from helpers.stream import _first_rows as stored_first_rows
from helpers.stream import keys_of
from hypothesis import given
from hypothesis import strategies as st

from shardcache.errors import OptionError, OptionTypeError, StateError
from shardcache.format.cache import Cache
from shardcache.read.dataset import WindowDataset
from shardcache.read.folds import Fold, walk_forward
from shardcache.read.stream import WindowStream

DAY = 86_400_000_000_000


@given(
    days=st.integers(10, 800),
    train=st.integers(1, 200),
    val=st.integers(1, 60),
    step=st.integers(1, 60),
    test=st.integers(0, 30),
    expanding=st.booleans(),
)
def test_folds_tile_the_range_forward(days: int, train: int, val: int, step: int, test: int, expanding: bool) -> None:
    start, stop = 5 * DAY, (5 + days) * DAY
    kw = dict(train=f"{train}D", val=f"{val}d", step=f"{step}D", test=f"{test}D" if test else None, expanding=expanding)
    end = stop - test * DAY
    if start + (train + val) * DAY > end:
        with pytest.raises(OptionError, match="need more time than the range holds"):
            walk_forward((start, stop), **kw)
        return
    folds = walk_forward((start, stop), **kw)
    assert len(folds) == (end - start - (train + val) * DAY) // (step * DAY) + 1
    for k, f in enumerate(folds):
        assert f.index == k
        assert f.train[1] == f.val[0] == start + (train + k * step) * DAY
        assert f.train[0] == (start if expanding else f.train[1] - train * DAY)
        assert f.val[1] - f.val[0] == val * DAY and f.val[1] <= end


def test_a_fold_reads_as_its_spans() -> None:
    (fold,) = walk_forward((0, 40 * DAY), train="30D", val="10D", embargo="1h")
    assert repr(fold) == "Fold 0: train 1970-01-01 .. 1970-01-31, val 1970-01-31 .. 1970-02-10, embargo 1h"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(train="10D", val="5D", embargo="10D"), "embargo='10D': is not shorter than a fold's train span"),
        (dict(train="0D", val="5D"), "train='0D': must be longer than 0"),
        (dict(train="often", val="5D"), "train='often'"),
    ],
)
def test_bad_spans_are_refused_naming_the_option(kw: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        walk_forward((0, 100 * DAY), **kw)


# ---- folds and embargoes served by streams and datasets, against plain zarr -----------------------------------

HOUR = 3_600_000_000_000


@pytest.fixture(scope="module")
def raw(twenty_day_cache) -> str:
    """A cache of raw values (no build-time statistics to leak), without splits."""
    return twenty_day_cache("raw", normalize="none")


@pytest.fixture(scope="module")
def dated(twenty_day_cache) -> str:
    """A z-scored cache split at dates: train before 2023-01-20, then val and test."""
    return twenty_day_cache("dated", split="val=2023-01-20,test=2023-01-25")


def oracle(path: str, seq_len: int, horizon: int, start: int, end: int) -> set[tuple[int, int]]:
    """Every (symbol, row) window start whose bars, targets included, lie in one stored segment and in
    ``[start, end)``, from plain zarr's root segments and time arrays."""
    root = zarr.open_group(path, mode="r")
    times = {}
    out = set()
    for sym, a, b, _ in root["segments"][...].tolist():
        t = times.setdefault(sym, root[f"symbols/{sym}/time"][...])
        span = seq_len + horizon
        for p in range(a, b - span + 1):
            if t[p] >= start and t[p + span - 1] < end:
                out.add((sym, p))
    return out


def served(stream) -> list[tuple[int, int]]:
    keys = keys_of(stream)
    return [tuple(k) for k in keys[:, 1:].tolist()]


def test_every_fold_serves_its_train_and_val_windows_once_with_the_embargo_kept(raw) -> None:
    folds = walk_forward(raw, train="8D", val="3D", step="3D", embargo="2h")
    assert len(folds) >= 2
    for fold in folds:
        train = WindowStream(raw, 30, fold=fold, split="train", batch_size=256, meta=True, seed=fold.index)
        got = served(train)
        want = oracle(raw, 30, 1, fold.train[0], fold.val[0] - 2 * HOUR)
        assert len(got) == len(set(got)) and set(got) == want and want
        times = np.concatenate([b.target_time.numpy() for b in train])
        assert times.max() < fold.val[0] - 2 * HOUR  # no train target within the embargo
        val = WindowDataset(raw, 30, fold=fold, split="val", meta=True)
        got = {(int(s), int(r)) for s, r in val[:].index.tolist()}
        assert got == oracle(raw, 30, 1, fold.val[0], fold.val[1])
        assert int(val[:].time.min()) - 29 * 60 * 10**9 >= fold.val[0]  # no val window starts before val


def test_a_fold_through_dataloader_workers_serves_each_window_once(raw) -> None:
    fold = walk_forward(raw, train="8D", val="3D", embargo="1h")[1]
    stream = WindowStream(raw, 30, fold=fold, split="train", batch_size=128, meta=True)
    got = served(stream.loader(2))
    assert len(got) == len(set(got)) and set(got) == oracle(raw, 30, 1, fold.train[0], fold.val[0] - HOUR)


def test_resume_is_exact_within_a_fold_and_another_fold_is_refused_by_name(raw) -> None:
    first, second = walk_forward(raw, train="8D", val="3D", embargo="1h")[:2]
    whole = served(WindowStream(raw, 30, fold=first, split="train", batch_size=64, meta=True))
    stream = WindowStream(raw, 30, fold=first, split="train", batch_size=64, meta=True)
    it = iter(stream)
    head = [tuple(k) for b in (next(it), next(it)) for k in keys_of([b])[:, 1:].tolist()]
    state = stream.state_dict()
    again = WindowStream(raw, 30, fold=first, split="train", batch_size=64, meta=True)
    again.load_state_dict(state)
    assert head + served(again) == whole
    other = WindowStream(raw, 30, fold=second, split="train", batch_size=64, meta=True)
    with pytest.raises(StateError, match=r"fold: saved 'Fold 0: train .*', now 'Fold 1: train "):
        other.load_state_dict(state)


def test_an_embargo_keeps_the_builds_splits_apart(dated) -> None:
    cut = int(np.datetime64("2023-01-20", "ns").astype(np.int64))
    stream = WindowStream(dated, 30, split="train", embargo="3h", meta=True, batch_size=512)
    got = served(stream)
    assert set(got) == oracle(dated, 30, 1, np.iinfo(np.int64).min, cut - 3 * HOUR)
    plain = served(WindowStream(dated, 30, split="train", meta=True, batch_size=512))
    assert len(got) < len(plain)
    val = WindowDataset(dated, 30, split="val", embargo="3h", meta=True)  # ends 3h before test, starts at its cut
    test = int(np.datetime64("2023-01-25", "ns").astype(np.int64))
    assert {(int(s), int(r)) for s, r in val[:].index.tolist()} == oracle(dated, 30, 1, cut, test - 3 * HOUR)
    assert stream.state_dict()["embargo"] == "3h" and "embargo" not in WindowStream(dated, 30, split="val").state_dict()


def test_an_embargo_applies_to_split_times_too(raw) -> None:
    times = "val=2023-01-17,test=2023-01-23"
    cut = int(np.datetime64("2023-01-17", "ns").astype(np.int64))
    stream = WindowStream(raw, 30, split="train", split_times=times, embargo="90min", meta=True, batch_size=512)
    assert set(served(stream)) == oracle(raw, 30, 1, np.iinfo(np.int64).min, cut - 90 * 60 * 10**9)


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        (dict(split="train", embargo="soon"), OptionError, "embargo='soon': use a whole number and a unit"),
        (dict(split="train", embargo="-1h"), OptionError, "embargo='-1h'"),
        (dict(split="train", embargo=3600), OptionTypeError, "embargo=3600: give a duration such as"),
        (dict(embargo="1h"), OptionError, "raw.zarr has no splits to keep apart: pass split_times= or a fold"),
        (dict(split="train", fold="fold 0"), OptionTypeError, "fold='fold 0': give one of the folds"),
    ],
)
def test_bad_cuts_are_refused_naming_the_option(raw, kw, error, message) -> None:
    with pytest.raises(error, match=message):
        WindowStream(raw, 30, **kw)


def test_a_fold_is_refused_beside_split_times_an_embargo_or_without_a_split(raw) -> None:
    fold = walk_forward(raw, train="8D", val="3D")[0]
    with pytest.raises(OptionTypeError, match="fold= and split_times= both cut the splits"):
        WindowStream(raw, 30, fold=fold, split="train", split_times="val=2023-01-17")
    with pytest.raises(OptionTypeError, match="fold= carries its own embargo"):
        WindowDataset(raw, 30, fold=fold, split="train", embargo="1h")
    with pytest.raises(OptionError, match=r"split=None: Fold 0: .*: pass split='train' or split='val'"):
        WindowStream(raw, 30, fold=fold)
    with pytest.raises(OptionError, match=r"split='test': no such split; Fold 0: .* cuts train, val"):
        WindowStream(raw, 30, fold=fold, split="test")


def test_a_fold_with_no_window_says_so(raw) -> None:
    fold = walk_forward(raw, train="8D", val="1h", step="1h")[0]
    with pytest.raises(OptionError, match=r"no window: .* \(as Fold 0: train .* cuts it\)"):
        WindowStream(raw, 2000, fold=fold, split="val")


def test_an_embargo_longer_than_its_split_leaves_no_window_and_says_so(dated) -> None:
    with pytest.raises(OptionError, match=r"no bars in this split \(as embargo 30d cuts it\)"):
        WindowStream(dated, 30, split="train", embargo="30D")


def test_a_fold_of_a_cache_z_scored_over_its_validation_range_is_refused(dated) -> None:
    cut = _cut(dated)
    late = Fold(index=0, train=(cut - 10 * DAY, cut), val=(cut, cut + 2 * DAY), embargo=0)  # statistics end at val
    assert len(WindowStream(dated, 30, fold=late, split="train")) > 0
    early = walk_forward(dated, train="5D", val="3D")[0]
    assert early.val[0] < cut
    with pytest.raises(OptionError, match=r"dated.zarr is z-scored with the statistics of bars before 2023-01-20"):
        WindowStream(dated, 30, fold=early, split="train")


def _cut(path: str) -> int:
    return int(zarr.open_group(path, mode="r").attrs["shardcache"]["splits"]["cuts_ns"][0])


def test_gloo_ranks_serve_a_folds_train_windows_once(raw, tmp_path) -> None:
    fold = walk_forward(raw, train="8D", val="3D", embargo="1h")[1]
    kwargs = {"seq_len": 30, "batch_size": 100, "fold": fold, "split": "train"}
    mp.spawn(ddp_rank, args=(2, raw, str(tmp_path / "init"), str(tmp_path), kwargs), nprocs=2, join=True)
    got = np.concatenate([np.load(tmp_path / f"rank{r}.npy") for r in range(2)])
    dropped = json.loads((tmp_path / "rank0.json").read_text())["dropped"]
    first = stored_first_rows(Cache(raw))
    want = np.asarray(sorted(first[s] + r for s, r in oracle(raw, 30, 1, fold.train[0], fold.val[0] - HOUR)))
    assert len(np.unique(got)) == len(got) == len(want) - dropped and np.isin(got, want).all()
