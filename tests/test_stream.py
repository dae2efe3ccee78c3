"""WindowStream and WindowDataset in one process: content, coverage, order, budgets, lifetime."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

import shardcache.stream as stream_mod
from helpers import brute_starts, make_cache, synthetic_bars
from shardcache.errors import CacheError
from shardcache.store import Cache
from shardcache.stream import WindowDataset, WindowStream


def collect(ds):
    """All batches of one pass, kept (outputs must stay valid), concatenated in served order."""
    batches = list(ds)
    assert all(b[0].dtype == torch.float32 and b[-1].dtype == torch.int64 for b in batches)
    xs, ys, idx = (torch.cat([b[k] for b in batches]).numpy() for k in range(3))
    return batches, xs, ys, idx


def reference(bars, idx, seq_len, horizon, xcols=None, ycols=None):
    """Windows and targets at start rows ``idx``, from ``sliding_window_view`` over the same bars."""
    f = bars.features
    wins = np.moveaxis(sliding_window_view(f, seq_len, axis=0), -1, 1)
    x = wins[idx]
    y = f[idx + seq_len - 1 + horizon]
    return (x if xcols is None else x[:, :, xcols]), (y if ycols is None else y[:, ycols])


def reader_threads():
    return [t for t in threading.enumerate() if t.name == "shardcache-reader"]


@pytest.mark.parametrize(
    "seq_len,horizon,stride,split,batch,shuffle",
    [
        (16, 1, 1, None, 64, True),
        (5, 0, 1, "train", 100, True),
        (40, 7, 3, "val", 32, True),
        (1, 1, 2, "test", 7, False),
        (120, 2, 1, None, 256, True),
    ],
)
def test_every_window_once_with_exact_content(
    stream_bars, stream_cache, seq_len, horizon, stride, split, batch, shuffle
):
    ds = WindowStream(
        stream_cache, seq_len, horizon, stride, split, batch_size=batch, shuffle=shuffle, return_index=True
    )
    batches, x, y, idx = collect(ds)
    ref = brute_starts(stream_bars, seq_len, horizon, stride, split)
    assert len(batches) == len(ds) == ds.n_batches == -(-len(ref) // batch)
    assert all(len(b[0]) == batch for b in batches[:-1])
    assert np.array_equal(np.sort(idx), ref) and len(np.unique(idx)) == len(idx)
    rx, ry = reference(stream_bars, idx, seq_len, horizon)
    assert x.shape == (len(ref), seq_len, 5) and np.array_equal(x, rx)
    assert y.shape == (len(ref), 5) and np.array_equal(y, ry)
    seg_of = np.searchsorted(stream_bars.segments[:, 1], np.stack([idx, idx + seq_len - 1 + horizon]), side="right")
    assert np.array_equal(seg_of[0], seg_of[1])  # window and target in one segment
    if not shuffle:
        assert np.array_equal(idx, ref)


def test_feature_and_target_subsets(stream_bars, stream_cache):
    ds = WindowStream(stream_cache, 12, 3, batch_size=50, features=["f3", "f0"], target=["f1"], return_index=True)
    _, x, y, idx = collect(ds)
    rx, ry = reference(stream_bars, idx, 12, 3, [3, 0], [1])
    assert x.shape[2] == 2 and y.shape[1] == 1
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    _, x, y, idx = collect(WindowStream(stream_cache, 12, 3, batch_size=50, target=["f4", "f2"], return_index=True))
    rx, ry = reference(stream_bars, idx, 12, 3, None, [4, 2])
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    with pytest.raises(ValueError, match="nope"):
        WindowStream(stream_cache, 12, features=["f0", "nope"])
    with pytest.raises(TypeError):
        WindowStream(stream_cache, 12, target="f1")


@pytest.mark.parametrize("run_bytes", [1, 40_000, 1 << 30])
def test_runs_of_batches_give_the_same_batches(monkeypatch, stream_bars, stream_cache, run_bytes):
    """Single batches, short runs and runs as long as a pool: the same batches, right content."""
    monkeypatch.setattr(stream_mod, "RUN_BYTES", run_bytes)
    batches, x, y, idx = collect(WindowStream(stream_cache, 11, 2, batch_size=64, return_index=True, mix=2))
    rx, ry = reference(stream_bars, idx, 11, 2)
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    monkeypatch.setattr(stream_mod, "RUN_BYTES", 1)
    single = collect(WindowStream(stream_cache, 11, 2, batch_size=64, return_index=True, mix=2))[0]
    assert [b[2].tolist() for b in batches] == [b[2].tolist() for b in single]


def test_gather_thread_runs_one_torch_thread_and_leaves_the_callers_alone(monkeypatch, stream_cache):
    import shardcache.reader as reader_mod

    seen = []
    real = reader_mod.Reader._gather
    monkeypatch.setattr(reader_mod.Reader, "_gather", lambda self, run: seen.append(torch.get_num_threads()) or real(self, run))
    later = []
    before = torch.get_num_threads()
    for _ in WindowStream(stream_cache, 10, batch_size=256):
        pass
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before and later == [before]


def test_drop_last_and_rank_shares_from_env(monkeypatch, stream_bars, stream_cache):
    ref = brute_starts(stream_bars, 20, 1, 1, None)
    ds = WindowStream(stream_cache, 20, batch_size=128, drop_last=True, return_index=True)
    batches, _, _, idx = collect(ds)
    assert len(batches) == len(ref) // 128 and all(len(b[0]) == 128 for b in batches)
    assert len(idx) == len(np.unique(idx)) > len(ref) - 128
    seen, counts = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ds = WindowStream(stream_cache, 20, batch_size=100, return_index=True)
        assert (ds.rank, ds.world) == (rank, 3)
        batches, _, _, idx = collect(ds)
        seen.append(idx)
        counts.append(len(batches))
    union = np.concatenate(seen)
    assert len(set(counts)) == 1 and len(np.unique(union)) == len(union) == len(ref) - ds.plan().dropped
    assert ds.plan().dropped == len(ref) % 3


def test_order_depends_on_seed_and_epoch(stream_cache):
    def order(ds):
        return collect(ds)[3]

    a = WindowStream(stream_cache, 10, batch_size=64, seed=1, return_index=True)
    first = order(a)
    assert np.array_equal(first, order(WindowStream(stream_cache, 10, batch_size=64, seed=1, return_index=True)))
    assert not np.array_equal(first, order(WindowStream(stream_cache, 10, batch_size=64, seed=2, return_index=True)))
    a.set_epoch(3)
    third = order(a)
    assert not np.array_equal(first, third) and np.array_equal(np.sort(first), np.sort(third))
    a.set_epoch(0)
    assert np.array_equal(first, order(a))


def test_in_process_position_resume_and_epoch_advance(stream_cache):
    full = WindowStream(stream_cache, 10, batch_size=64, return_index=True)
    want = [b[2] for b in full]
    ds = WindowStream(stream_cache, 10, batch_size=64, return_index=True)
    it = iter(ds)
    head = [next(it)[2] for _ in range(3)]
    del it
    assert ds.state_dict()["consumed"] == 3 and ds.epoch == 0
    other = WindowStream(stream_cache, 10, batch_size=64, return_index=True)
    other.load_state_dict(ds.state_dict())
    ds.set_epoch(0)  # the usual call at the top of an epoch keeps the position
    tail = [b[2] for b in ds]
    assert all(torch.equal(u, v) for u, v in zip(head + tail, want)) and len(head + tail) == len(want)
    assert all(torch.equal(u, v) for u, v in zip([b[2] for b in other], want[3:]))
    nxt = [b[2] for b in ds]  # a new pass after a finished epoch is the next epoch
    assert ds.epoch == 1 and not all(torch.equal(u, v) for u, v in zip(nxt, want))


def test_state_dict_rejects_another_stream(stream_cache):
    state = WindowStream(stream_cache, 10, batch_size=64).state_dict()
    assert set(state) >= {
        "epoch", "seed", "consumed", "seq_len", "horizon", "stride", "split", "batch_size", "world", "n_windows"
    }
    with pytest.raises(ValueError, match="batch_size"):
        WindowStream(stream_cache, 10, batch_size=32).load_state_dict(state)
    with pytest.raises(ValueError, match="split"):
        WindowStream(stream_cache, 10, batch_size=64, split="train").load_state_dict(state)
    with pytest.raises(ValueError, match="consumed"):
        WindowStream(stream_cache, 10, batch_size=64).load_state_dict({**state, "consumed": 10**6})


def test_one_zarr_call_per_block(monkeypatch, stream_cache):
    calls = []
    real = Cache.read_rows

    def counted(self, start, stop, out=None):
        calls.append((start, stop))
        return real(self, start, stop, out)

    monkeypatch.setattr(Cache, "read_rows", counted)
    ds = WindowStream(stream_cache, 30, batch_size=16)
    n = sum(len(x) for x, _ in ds)
    plan = ds.plan()
    assert len(calls) == len(plan.shards) < n / 50  # one read per shard piece, never per window
    span = ds.span
    for (start, stop), s in zip(sorted(calls), sorted(plan.shards.tolist())):
        assert start // stream_cache.shard_rows == s and stop - start <= stream_cache.shard_rows + span - 1


def test_memory_budget_bounds_the_reader(monkeypatch, stream_cache):
    ds = WindowStream(stream_cache, 30, batch_size=64, mix=2)
    block = (stream_cache.shard_rows + ds.span - 1) * 5 * 4
    need = ds.plan().max_open_pieces()
    with pytest.raises(ValueError, match="memory_budget"):
        WindowStream(stream_cache, 30, batch_size=64, mix=2, memory_budget=need * block - 1)
    peak = []
    real = stream_mod.Reader._decode

    def watched(self, pool, k):
        real(self, pool, k)
        peak.append((self.used, self.capacity))

    monkeypatch.setattr(stream_mod.Reader, "_decode", watched)
    budget = need * block
    n = sum(len(x) for x, _ in WindowStream(stream_cache, 30, batch_size=64, mix=2, memory_budget=budget))
    assert n == ds.plan().n_windows and max(u for u, _ in peak) <= budget
    assert all(c == budget for _, c in peak)
    loose = WindowStream(stream_cache, 30, batch_size=64, mix=2, memory_budget=budget * 2)
    with pytest.raises(ValueError, match="each of 3 reader"):
        loose.loader(3)  # a budget is shared by the DataLoader workers
    loose.loader(2)


def test_explicit_cpu_device(stream_cache):
    a = WindowStream(stream_cache, 8, batch_size=64, device="cpu", return_index=True)
    b = WindowStream(stream_cache, 8, batch_size=64, return_index=True)
    for (xa, ya, ia), (xb, yb, ib) in zip(a, b):
        assert xa.device.type == "cpu" and torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(ia, ib)


def test_window_dataset_matches_stream(monkeypatch, stream_bars, stream_cache):
    ds = WindowDataset(stream_cache, 25, 2, split="train", features=["f1", "f0"], target=["f4"])
    ref = brute_starts(stream_bars, 25, 2, 1, "train")
    assert len(ds) == len(ref) and ds.row(-1) == ref[-1]
    _, x, y, idx = collect(
        WindowStream(stream_cache, 25, 2, split="train", features=["f1", "f0"], target=["f4"], return_index=True)
    )
    pos = {int(p): k for k, p in enumerate(idx)}
    for i in range(0, len(ds), 97):
        xi, yi = ds[i]
        k = pos[ds.row(i)]
        assert xi.shape == (25, 2) and yi.shape == (1,)
        assert torch.equal(xi, torch.from_numpy(x[k])) and torch.equal(yi, torch.from_numpy(y[k]))
    calls = []
    real = Cache.read_rows
    monkeypatch.setattr(Cache, "read_rows", lambda self, a, b: calls.append(a) or real(self, a, b))
    fresh = WindowDataset(stream_cache, 25, 2, split="train")
    for i in range(400):
        fresh[i]
    assert len(calls) <= 2  # nearby windows come from the decoded-shard LRU
    with pytest.raises(IndexError):
        fresh[len(fresh)]


def test_close_and_garbage_collection_stop_the_reader(stream_cache):
    before = len(reader_threads())
    ds = WindowStream(stream_cache, 10, batch_size=8)
    it = iter(ds)
    next(it)
    assert len(reader_threads()) == before + 1
    del it
    gc.collect()
    assert len(reader_threads()) == before
    with WindowStream(stream_cache, 10, batch_size=8) as ds2:
        it2 = iter(ds2)
        next(it2)
    assert len(reader_threads()) == before
    with pytest.raises(RuntimeError, match="closed"):
        next(it2)
    with pytest.raises(RuntimeError, match="closed"):
        iter(ds2)


def test_reader_error_reaches_the_consumer(tmp_path):
    bars = synthetic_bars(2048, 3, n_symbols=1, seed=0)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=512, chunk_rows=128)
    shard = os.path.join(tmp_path, "c.zarr", "symbols", "0", "features", "c", "2", "0")
    data = bytearray(open(shard, "rb").read())
    data[100:140] = bytes(40)
    open(shard, "wb").write(bytes(data))
    with pytest.raises(CacheError, match="checksum"):  # a crc32c mismatch, raised in the reader thread
        for _ in WindowStream(cache, 10, batch_size=32, shuffle=False):
            pass
    assert not reader_threads()


@pytest.mark.parametrize("run_bytes", [1, None])
def test_batches_kept_in_part_are_never_overwritten(monkeypatch, stream_bars, stream_cache, run_bytes):
    """Output buffers are reused only once nothing refers to them: views kept of every third
    batch (and whole batches of others) still hold their windows at the end of the epoch."""
    if run_bytes:
        monkeypatch.setattr(stream_mod, "RUN_BYTES", run_bytes)
    kept = []
    ds = WindowStream(stream_cache, 12, 1, batch_size=32, return_index=True, mix=2)
    for i, (x, y, idx) in enumerate(ds):
        if i % 3 == 0:
            kept.append((x[:, -2:, 1:3], y[::2], idx[::2], idx.clone()))
        elif i % 7 == 0:
            kept.append((x, y, idx, idx.clone()))
    assert len(kept) > 10
    for xv, yv, iv, idx in kept:
        rx, ry = reference(stream_bars, idx.numpy(), 12, 1)
        step = 2 if len(yv) != len(idx) else 1
        full_x = rx[:, -2:, 1:3] if xv.shape[1] == 2 else rx
        assert np.array_equal(xv.numpy(), full_x) and np.array_equal(yv.numpy(), ry[::step])
        assert np.array_equal(iv.numpy(), idx.numpy()[::step])
