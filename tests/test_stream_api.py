"""WindowStream 1.0's promises: keyword-only settings, window specs and several horizons, batch
metadata, memory budgets, devices, split and empty-stream errors, elastic resume, a sweep."""

from __future__ import annotations

import threading

import numpy as np
import psutil
import pytest
import torch
from helpers import brute_starts, make_cache, synthetic_bars
from helpers.stream import rows_of, window_rows
from numpy.lib.stride_tricks import sliding_window_view
from torch.utils.data import DataLoader

from shardcache.read.plan import WindowSpec, n_windows
from shardcache.read.stream import MetaBatch, WindowDataset, WindowStream, parse_budget


def test_settings_after_seq_len_are_keyword_only(stream_cache):
    with pytest.raises(TypeError):
        WindowStream(stream_cache, 60, 1)
    with pytest.raises(TypeError):
        WindowDataset(stream_cache, 60, 1)
    with pytest.raises(TypeError):
        WindowStream(stream_cache, 60, split="all", return_index=True)  # gone before 1.0: meta=True


def test_a_window_spec_is_shared_by_stream_dataset_and_n_windows(stream_bars, stream_cache):
    spec = WindowSpec(12, horizon=(1, 4), stride=2, features=["f0", "f1"])
    ref = brute_starts(stream_bars, 12, 4, 2, "train")
    assert n_windows(stream_cache, spec, split="train") == len(ref)
    assert n_windows(stream_cache, 12, horizon=4, stride=2, split="train") == len(ref)
    s = WindowStream(stream_cache, spec, split="train", batch_size=100)
    assert s.spec == spec and s.read_spec.ranges.total() == len(ref) == len(
        WindowDataset(stream_cache, spec, split="train")
    )
    with pytest.raises(TypeError):
        WindowStream(stream_cache, spec, horizon=3, split="train")
    with pytest.raises(ValueError, match="int >= 0"):
        WindowSpec(12, horizon=(-1, 2))


@pytest.mark.parametrize("horizon", [(1,), (1, 5, 3), (2, 10)])
def test_several_horizons_against_sliding_window_view(stream_bars, stream_cache, horizon):
    ds = WindowStream(stream_cache, 16, horizon=horizon, split="all", batch_size=64, meta=True)
    batches = list(ds)
    x, y = torch.cat([b.x for b in batches]).numpy(), torch.cat([b.y for b in batches]).numpy()
    p = torch.cat(rows_of(ds.cache, batches)).numpy()
    f = stream_bars.features
    ref = brute_starts(stream_bars, 16, max(horizon), 1, None)  # valid only if the largest horizon fits
    assert np.array_equal(np.sort(p), ref) and y.shape == (len(ref), len(horizon), 5)
    wins = np.moveaxis(sliding_window_view(f, 16, axis=0), -1, 1)
    assert np.array_equal(x, wins[p])
    for j, h in enumerate(horizon):
        assert np.array_equal(y[:, j], f[p + 16 - 1 + h])
    m = WindowDataset(stream_cache, 16, horizon=horizon, split="all", target=["f2"])
    for i in range(0, len(m), 331):
        _xi, yi = m[i]
        assert yi.shape == (len(horizon), 1)
        assert np.array_equal(yi.numpy()[:, 0], f[m.row(i) + 15 + np.asarray(horizon), 2])


def test_meta_gives_each_windows_symbol_row_and_time(stream_bars, stream_cache):
    ds = WindowStream(stream_cache, 20, horizon=2, split="val", batch_size=50, meta=True)
    b = next(iter(ds))
    assert isinstance(b, MetaBatch) and b.index.shape == (50, 2) and b.symbol.dtype == b.time.dtype == torch.int64
    start = b.x[:, 0, 0].numpy().astype(np.int64)  # feature 0 is the bar's row in the sources
    seg = stream_bars.segments
    by_start = seg[np.argsort(seg[:, 1])]  # rows are virtual: each symbol from a whole shard on
    sym_of_bar = by_start[np.searchsorted(by_start[:, 1], np.arange(len(stream_bars.ts)), side="right") - 1, 0]
    first = {s: int(seg[seg[:, 0] == s, 1].min()) for s in np.unique(seg[:, 0])}
    assert np.array_equal(b.symbol.numpy(), sym_of_bar[start])
    assert [stream_cache.symbols[s] for s in b.symbol.tolist()] == [stream_bars.symbols[s] for s in sym_of_bar[start]]
    assert np.array_equal(b.index[:, 0].numpy(), b.symbol.numpy())
    assert np.array_equal(b.index[:, 1].numpy(), start - np.array([first[s] for s in b.symbol.tolist()]))
    assert np.array_equal(b.time.numpy(), stream_bars.ts[start + 19])  # the last input bar's timestamp
    assert np.array_equal(window_rows(stream_cache, b.index), start)
    x, y = next(iter(WindowStream(stream_cache, 20, split="val", batch_size=50)))  # default: Batch(x, y)
    assert x.shape == (50, 20, 5) and y.shape == (50, 5)


def test_memory_budget_takes_bytes_sizes_and_auto(stream_cache):
    cpu = torch.device("cpu")
    assert parse_budget("512MiB", cpu) == 512 * 2**20 and parse_budget("2GB", cpu) == 2 * 10**9
    assert parse_budget(123456, cpu) == 123456 and parse_budget(None, cpu) is None
    avail = psutil.virtual_memory().available
    s = WindowStream(stream_cache, 10, split="all", memory_budget="auto")
    assert 0.2 * avail < s.loading.memory_budget < 0.3 * avail and f"memory_budget={s.loading.memory_budget}" in repr(s)
    assert WindowStream(stream_cache, 10, split="all", memory_budget="64MiB").loading.memory_budget == 64 << 20
    for bad in ("lots", "12 parsecs", -5, 0, 1.5):
        with pytest.raises(ValueError, match="memory_budget"):
            WindowStream(stream_cache, 10, split="all", memory_budget=bad)
    with pytest.raises(ValueError, match="raise memory_budget to at least"):
        WindowStream(stream_cache, 10, split="all", memory_budget="1KiB")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_fails_in_the_constructor(stream_cache):
    with pytest.raises(ValueError, match="no CUDA device"):
        WindowStream(stream_cache, 10, split="all", device="cuda")


def test_cuda_with_worker_processes_is_refused(monkeypatch, stream_cache):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    s = WindowStream(stream_cache, 10, split="all", device="cuda")
    with pytest.raises(ValueError, match="num_workers=0"):
        s.loader(2)
    with pytest.raises(RuntimeError, match="needs num_workers=0"):
        next(iter(DataLoader(s, batch_size=None, num_workers=1)))


def test_a_cache_with_splits_must_be_told_which(stream_bars, stream_cache, tmp_path):
    with pytest.raises(ValueError, match="has splits train, val, test: pass split='train'.*split='all'"):
        WindowStream(stream_cache, 10)
    with pytest.raises(ValueError, match="split='all'"):
        WindowDataset(stream_cache, 10)
    every = WindowStream(stream_cache, 10, split="all").read_spec.ranges.total()
    assert every == len(brute_starts(stream_bars, 10, 1, 1, None))
    one = synthetic_bars(3000, 2, n_symbols=2, seed=1)
    one.segment_split[:] = 0
    one.split_names = ["all"]
    single = make_cache(tmp_path / "one.zarr", one, shard_rows=512, chunk_rows=128)
    assert len(WindowStream(single, 10)) == len(WindowStream(single, 10, split="all"))  # one split: nothing to name


def test_zero_windows_name_the_longest_segment(stream_bars, stream_cache):
    longest = int((stream_bars.segments[:, 2] - stream_bars.segments[:, 1])[stream_bars.segment_split == 0].max())
    with pytest.raises(
        ValueError, match=f"spans {longest + 5} bars.*longest segment in split 'train'.*has {longest} bars"
    ):
        WindowStream(stream_cache, longest, horizon=5, split="train")
    with pytest.raises(ValueError, match="longest segment"):
        WindowDataset(stream_cache, longest + 1, split="train")
    assert len(WindowStream(stream_cache, longest - 1, split="train")) >= 1


def test_storage_options_open_a_url(stream_cache):
    s = WindowStream("file://" + stream_cache.url, 10, split="all", storage_options={"auto_mkdir": False})
    assert s.cache.storage_options == {"auto_mkdir": False} and len(list(s)) == len(s)
    d = WindowDataset("file://" + stream_cache.url, 10, split="all", storage_options={})
    assert len(d) == s.read_spec.ranges.total()
    with pytest.raises(ValueError, match="already open"):
        WindowStream(stream_cache, 10, split="all", storage_options={})


def _with_rank(monkeypatch, rank, world):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


@pytest.mark.parametrize(
    "w1,w2,done,batch", [(2, 1, 3, 64), (1, 2, 5, 50), (4, 2, 2, 33), (1, 2, 0, 64), (2, 3, 4, 40)]
)
def test_elastic_resume_serves_the_rest_once_on_equal_batches(monkeypatch, stream_cache, w1, w2, done, batch):
    kw = {"split": "all", "batch_size": batch, "seed": 3, "meta": True, "mix": 2}
    whole, delivered, states = [], [], []
    for r in range(w1):  # the checkpointed run: every rank in lockstep, `done` batches each
        _with_rank(monkeypatch, r, w1)
        s = WindowStream(stream_cache, 10, **kw)
        s.set_epoch(2)
        full = WindowStream(stream_cache, 10, **kw)
        full.set_epoch(2)
        whole += rows_of(s.cache, full)
        it = iter(s)
        delivered += rows_of(s.cache, [next(it) for _ in range(done)])
        states.append(s.state_dict())
    assert all(st == states[0] for st in states)  # the state of any one rank is enough
    rest, counts = [], []
    for r in range(w2):
        _with_rank(monkeypatch, r, w2)
        s = WindowStream(stream_cache, 10, **kw)
        s.load_state_dict(states[0])
        s.set_epoch(2)  # the usual call at the top of the epoch keeps the loaded position
        got = list(s)
        counts.append(len(got))
        rest += rows_of(s.cache, got)
        assert s.epoch == 3 and len(list(s)) == s.n_batches  # then a fresh epoch at the new world size
    served = torch.cat(delivered + rest).numpy() if delivered or rest else np.zeros(0)
    assert len(set(counts)) == 1  # equal batches per rank
    assert len(np.unique(served)) == len(served)  # none repeated
    assert np.array_equal(np.sort(served), np.sort(torch.cat(whole).numpy()))  # every window of the epoch


def test_a_resumed_epoch_can_be_checkpointed_again(monkeypatch, stream_cache):
    kw = {"split": "all", "batch_size": 64, "seed": 1, "meta": True}
    _with_rank(monkeypatch, 0, 1)
    ref = WindowStream(stream_cache, 10, **kw)
    want = torch.cat(rows_of(ref.cache, ref)).numpy()
    a = WindowStream(stream_cache, 10, **kw)
    it = iter(a)
    head = rows_of(a.cache, [next(it) for _ in range(4)])
    served = []
    for r in range(2):
        _with_rank(monkeypatch, r, 2)
        b = WindowStream(stream_cache, 10, **kw)
        b.load_state_dict(a.state_dict())
        it2 = iter(b)
        served += rows_of(b.cache, [next(it2) for _ in range(3)])
        state = b.state_dict()
    assert state["history"] == [[1, 4], [2, 3]]
    _with_rank(monkeypatch, 0, 1)
    c = WindowStream(stream_cache, 10, **kw)
    c.load_state_dict(state)
    served = torch.cat(head + served + rows_of(c.cache, c)).numpy()
    assert len(np.unique(served)) == len(served) and np.array_equal(np.sort(served), np.sort(want))


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith(("shardcache-reader", "shardcache-decode"))]


def test_a_five_trial_sweep_in_one_process_leaves_nothing_behind(stream_cache):
    """Each trial makes a train and a val stream, trains a little through a 2-worker loader,
    validates in-process, and closes both: no thread, process, or descriptor stays."""
    proc = psutil.Process()
    children = {c.pid for c in proc.children(recursive=True)}
    fds = None
    for trial in range(5):
        model = torch.nn.Linear(5, 5)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        with (
            WindowStream(stream_cache, 8, split="train", batch_size=64, seed=trial) as train,
            WindowStream(stream_cache, 8, split="val", batch_size=64, shuffle=False) as val,
        ):
            for i, (x, y) in enumerate(train.loader(2)):
                loss = torch.nn.functional.mse_loss(model(x[:, -1]), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i == 5:
                    break
            with torch.no_grad():
                sum(torch.nn.functional.mse_loss(model(x[:, -1]), y).item() for x, y in val)
        assert not _threads()
        assert {c.pid for c in proc.children(recursive=True)} <= children
        if trial == 1:
            fds = proc.num_fds()
        elif fds is not None:
            assert proc.num_fds() <= fds


@pytest.mark.parametrize("features", [None, ["f3", "f1"]])
def test_every_cpu_copy_gives_the_same_batches(monkeypatch, stream_bars, stream_cache, features):
    """One index_select per pool on a one-thread gather thread (libgomp), inline index_select
    pieces, or numpy.take: forced each way, the batches are the same, and right."""
    import shardcache.read.reader as reader_mod
    import shardcache.read.storage as storage_mod

    def run():
        ds = WindowStream(stream_cache, 14, horizon=(1, 2), split="all", batch_size=64, features=features, meta=True)
        batches = list(ds)
        return (
            torch.cat([b.x for b in batches]),
            torch.cat([b.y for b in batches]),
            torch.cat(rows_of(ds.cache, batches)).numpy(),
        )

    x, y, p = run()
    monkeypatch.setattr(reader_mod, "one_thread_here", lambda: False)
    pieces = run()
    monkeypatch.setattr(storage_mod, "MIN_CHUNK", 10**9)
    assert storage_mod.chunk_for(storage_mod.Host(), 14, 1, own_thread=False) == 0  # seen where it is used
    taken = run()
    for x2, y2, p2 in (pieces, taken):
        assert torch.equal(x, x2) and torch.equal(y, y2) and np.array_equal(p, p2)
    cols = [3, 1] if features else slice(None)
    wins = np.moveaxis(sliding_window_view(stream_bars.features, 14, axis=0), -1, 1)[p]
    assert np.array_equal(x.numpy(), wins[:, :, cols])


@pytest.mark.parametrize("horizon", [2, (1, 5)])
def test_meta_gives_the_target_bars_time_beside_the_last_input_bars(stream_bars, stream_cache, horizon):
    """``time`` is the last input bar's, ``target_time`` each target bar's: ``horizon`` counts stored
    rows, so the target bar is read, not computed from ``time``. The same in-process, from a
    resident arena, and through DataLoader workers (``ship``)."""
    hs = horizon if isinstance(horizon, tuple) else (horizon,)

    def check(batches):
        n = 0
        for b in batches:
            assert type(b).__name__ == "MetaBatch" and b._fields[-3:] == ("time", "target_time", "source")
            assert b.source.dtype == torch.int64 and not b.source.any()  # one cache: source 0
            start = b.x[:, 0, 0].numpy().astype(np.int64)  # feature 0 is the bar's row in the sources
            want = np.stack([stream_bars.ts[start + 19 + h] for h in hs], axis=1)
            assert b.target_time.dtype == torch.int64 and b.target_time.shape == (len(start), *b.y.shape[1:-1])
            assert np.array_equal(b.target_time.numpy(), want if isinstance(horizon, tuple) else want[:, 0])
            assert np.array_equal(b.time.numpy(), stream_bars.ts[start + 19])
            assert (b.target_time.numpy().reshape(len(start), -1) > b.time.numpy()[:, None]).all()
            n += len(start)
        return n

    kw = {"horizon": horizon, "split": "val", "batch_size": 50, "meta": True}
    total = check(WindowStream(stream_cache, 20, **kw))
    resident = WindowStream(stream_cache, 20, memory_budget="1GiB", **kw)
    assert check(resident) == check(resident) == total  # decoding, then gathering from the arena
    with WindowStream(stream_cache, 20, **kw) as s:
        assert check(DataLoader(s, batch_size=None, num_workers=1)) == total
