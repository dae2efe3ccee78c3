"""WindowDataset's indexes (shardcache/read/dataset.py): ints of every kind, slices and sequences
stacked into one batch, torch's ``__getitems__`` for a batched DataLoader, and the indexes refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import brute_starts
from numpy.lib.stride_tricks import sliding_window_view
from torch.utils.data import DataLoader

from shardcache.errors import OptionTypeError
from shardcache.read.options import Batch
from shardcache.read.stream import WindowDataset


@pytest.fixture(scope="module")
def ds(stream_cache):
    return WindowDataset(stream_cache, 12, horizon=(1, 3), split="train", features=["f2", "f0"], target=["f4"])


def _want(stream_bars, ds, positions):
    """Windows and targets at ``positions`` (row order of the split), from ``sliding_window_view``."""
    starts = brute_starts(stream_bars, 12, 3, 1, "train")[np.asarray(positions, dtype=np.int64)]
    f = stream_bars.features
    wins = np.moveaxis(sliding_window_view(f, 12, axis=0), -1, 1)[starts][:, :, [2, 0]]
    ys = np.stack([f[starts + 11 + h][:, [4]] for h in (1, 3)], axis=1)
    return wins, ys


def test_ints_of_every_kind_and_negatives_from_the_end(stream_bars, ds):
    n = len(ds)
    for i, want in [(3, 3), (np.int64(3), 3), (np.int32(5), 5), (torch.tensor(7), 7), (np.array(2), 2), (-1, n - 1)]:
        x, y = ds[i]
        wx, wy = _want(stream_bars, ds, [want])
        assert x.shape == (12, 2) and y.shape == (2, 1)
        assert np.array_equal(x.numpy(), wx[0]) and np.array_equal(y.numpy(), wy[0]), i
    assert ds.row(-n) == ds.row(0) == brute_starts(stream_bars, 12, 3, 1, "train")[0]
    one = WindowDataset(ds.cache, 12, split="train")  # a single horizon: y is [T]
    assert one[0].y.shape == (5,) and one[0:4].y.shape == (4, 5)


@pytest.mark.parametrize(
    "index, positions",
    [
        (slice(0, 3), [0, 1, 2]),
        (slice(None, None, 97), "every 97th"),
        (slice(-4, None), "last 4"),
        (slice(10, 2, -3), [10, 7, 4]),
        (slice(5, 2), []),
        ([0, 1], [0, 1]),
        ((4, -1, 4), [4, -1, 4]),
        (range(20, 25), [20, 21, 22, 23, 24]),
        (np.array([9, 3, 200]), [9, 3, 200]),
        (np.arange(3, dtype=np.uint8), [0, 1, 2]),
        (torch.tensor([5, 6, -2]), [5, 6, -2]),
        ([np.int64(1), torch.tensor(2), 3], [1, 2, 3]),
        ([], []),
    ],
)
def test_slices_and_sequences_give_one_stacked_batch(stream_bars, ds, index, positions):
    n = len(ds)
    if positions == "every 97th":
        positions = list(range(0, n, 97))
    elif positions == "last 4":
        positions = list(range(n - 4, n))
    b = ds[index]
    assert isinstance(b, Batch) and b.x.shape == (len(positions), 12, 2) and b.y.shape == (len(positions), 2, 1)
    wx, wy = _want(stream_bars, ds, np.asarray(positions, dtype=np.int64) % n)
    assert np.array_equal(b.x.numpy(), wx) and np.array_equal(b.y.numpy(), wy)
    singles = [ds[int(p)] for p in positions]  # the same windows, one at a time
    assert all(torch.equal(b.x[k], s.x) and torch.equal(b.y[k], s.y) for k, s in enumerate(singles))


@pytest.mark.parametrize(
    "index, named",
    [
        (2.7, "2.7"),
        (1.7, "1.7"),
        (np.float64(1.0), "1.0"),
        (True, "True"),
        (np.bool_(False), "False"),
        (None, "None"),
        ("3", "'3'"),
        (b"3", "b'3'"),
        (torch.tensor(1.5), "tensor"),
        (np.array(1.0), "array"),
        ([0, 1.5], "1.5"),
        ([0, True], "True"),
        ([0, None], "None"),
        (np.array([0.5, 1.0]), "array"),
        (np.array([[0, 1]]), "array"),
        (torch.tensor([True, False]), "tensor"),
        (torch.tensor([0.0, 1.0]), "tensor"),
        (slice(0.5, 3), "slice"),
        ({"a": 1}, "'a'"),
    ],
)
def test_floats_bools_none_and_strings_are_refused_naming_the_index(ds, index, named):
    with pytest.raises(OptionTypeError, match=r"^window index .*: .*give an int, a slice, or a sequence of ints") as e:
        ds[index]
    assert named in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, TypeError)


@pytest.mark.parametrize("index", [10**9, -(10**9), [0, 10**9], np.array([3, -(10**7)]), torch.tensor([10**6])])
def test_out_of_range_is_an_index_error_naming_it(ds, index):
    with pytest.raises(IndexError, match=rf"^window -?\d+ out of range for {len(ds)} windows$"):
        ds[index]
    with pytest.raises(IndexError, match=f"out of range for {len(ds)} windows"):
        ds.row(len(ds))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batched_dataloader_gets_each_batch_at_once(monkeypatch, ds, workers):
    """``DataLoader(ds, batch_size=32)`` calls ``__getitems__`` once per batch (one gather, not 32
    lookups) and collates the same batches as indexing one window at a time."""
    calls = []
    real = WindowDataset.__getitems__
    monkeypatch.setattr(WindowDataset, "__getitems__", lambda self, idx: calls.append(len(idx)) or real(self, idx))
    got = list(DataLoader(ds, batch_size=32, shuffle=False, num_workers=workers))
    n = len(ds)
    assert len(got) == -(-n // 32) and all(isinstance(b, Batch) for b in got)
    x, y = torch.cat([b[0] for b in got]), torch.cat([b[1] for b in got])
    whole = ds[0:n]
    assert torch.equal(x, whole.x) and torch.equal(y, whole.y)
    if workers == 0:  # the patched method runs in this process
        assert calls == [32] * (n // 32) + ([n % 32] if n % 32 else [])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    shuffled = next(iter(DataLoader(ds, batch_size=50, sampler=order.tolist(), num_workers=workers)))
    assert torch.equal(shuffled.x, ds[order[:50]].x) and torch.equal(shuffled.y, ds[order[:50]].y)
