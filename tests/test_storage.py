"""The one gather and its storage strategies (shardcache/read/storage.py): every copy mode equals numpy's
windows, the device strategy, run on the CPU, serves exactly the host's batches streamed and resident, and
the map-style gather answers in the order asked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from shardcache import WindowDataset, WindowStream
from shardcache.read.storage import WHOLE, Arena, Device, gather


@pytest.mark.parametrize("chunk", [WHOLE, 3, 0])
@pytest.mark.parametrize("steps", [4, [[4]], [[3, 6]], "each", "each of two"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("into", [True, False])
def test_every_copy_mode_gathers_numpys_windows(chunk, steps, shared, into):
    """One ``index_select``, pieces of 3 windows, or numpy, into given tensors or new ones: each equals
    numpy's windows and targets, ``[m, ny]`` for one horizon and ``[m, len(steps), ny]`` for a sequence:
    one offset for every window (row horizons) or each window's own (``[m]``, ``[m, H]``: time horizons)."""
    rng = np.random.default_rng(3)
    bars = rng.standard_normal((200, 5)).astype(np.float32)
    x = torch.from_numpy(bars) if shared else torch.from_numpy(bars[:, :3].copy())
    y = x if shared else torch.from_numpy(bars[:, 3:].copy())
    seq_len, rows = 4, rng.integers(0, 200 - 7, 37)
    if isinstance(steps, str):
        steps = rng.integers(0, 7, (37,) if steps == "each" else (37, 2))
    wins = np.moveaxis(sliding_window_view(x.numpy(), seq_len, axis=0), -1, 1)[rows]
    want_y = y.numpy()[rows.reshape((-1,) + (1,) * max(np.ndim(steps) - 1, 0)) + np.asarray(steps)]
    out = (torch.empty(wins.shape), torch.empty(want_y.shape)) if into else None
    given = torch.from_numpy(rows) if chunk or not into else rows  # numpy's copies take a numpy array too
    got_x, got_y = gather(Arena(x, y, seq_len), given, torch.tensor(steps), chunk, out=out)
    assert out is None or (got_x is out[0] and got_y is out[1])
    assert np.array_equal(got_x.numpy(), wins) and np.array_equal(got_y.numpy(), want_y)


def _on_device_cpu(reads):
    """``reads`` (a stream or a dataset) switched to the device strategy on the CPU."""
    reads.read_spec = dataclasses.replace(reads.read_spec, storage=Device(torch.device("cpu")))
    return reads


@pytest.mark.parametrize("features", [None, ["f3", "f1"]])
@pytest.mark.parametrize("budget", [None, "1GiB"])
@pytest.mark.parametrize("horizon", [(1, 3), ("1min", "3min")])
def test_the_device_strategy_on_the_cpu_serves_the_hosts_batches(stream_cache, features, budget, horizon):
    """Streamed (``memory_budget=None``) and resident (two epochs: the second gathered on this thread from
    the arena), the device strategy's arenas, transfers and gathers give the host's batches, in order."""

    def epochs(device_strategy):
        ds = WindowStream(
            stream_cache,
            12,
            horizon=horizon,
            split="all",
            batch_size=50,
            features=features,
            meta=True,
            memory_budget=budget,
        )
        if device_strategy:
            _on_device_cpu(ds)
            assert isinstance(ds.read_spec.storage, Device)
        assert ds.resident == (budget is not None)
        with ds:
            return [[(b.x, b.y, b.index) for b in ds] for _ in range(2)]

    host, device = epochs(False), epochs(True)
    assert len(host[0]) > 10
    for a_epoch, b_epoch in zip(host, device):
        assert len(a_epoch) == len(b_epoch)
        for a, b in zip(a_epoch, b_epoch):
            assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_the_map_style_gather_in_any_order(stream_cache):
    """``WindowDataset`` asked out of shard order gives each window as asked alone."""
    ds = WindowDataset(stream_cache, 9, horizon=2, split="all", features=["f2", "f0"], target=["f4"])
    idx = np.random.default_rng(5).permutation(len(ds))[:300]
    batch = ds[idx]
    for k in range(0, 300, 7):
        one = ds[int(idx[k])]
        assert torch.equal(batch.x[k], one.x) and torch.equal(batch.y[k], one.y)
