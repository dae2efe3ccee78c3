"""WindowStream and WindowDataset in one process: content, coverage, order, budgets, lifetime."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import brute_starts, make_cache, synthetic_bars
from helpers.stream import rows_of, spy_block_reads
from numpy.lib.stride_tricks import sliding_window_view

import shardcache.read.serve as serve_mod
from shardcache.errors import CacheError
from shardcache.format.cache import Cache
from shardcache.read.stream import WindowDataset, WindowStream


def collect(ds):
    """All batches of one pass (``meta=True``), kept (outputs must stay valid), concatenated in
    served order, with each window's start row."""
    batches = list(ds)
    assert all(b.x.dtype == torch.float32 and b.index.dtype == torch.int64 for b in batches)
    xs, ys = (torch.cat([b[k] for b in batches]).numpy() for k in range(2))
    idx = torch.cat(rows_of(ds.cache, batches)).numpy()
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
        stream_cache,
        seq_len,
        horizon=horizon,
        stride=stride,
        split=split or "all",
        batch_size=batch,
        shuffle=shuffle,
        meta=True,
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
    ds = WindowStream(
        stream_cache, 12, horizon=3, split="all", batch_size=50, features=["f3", "f0"], target=["f1"], meta=True
    )
    _, x, y, idx = collect(ds)
    rx, ry = reference(stream_bars, idx, 12, 3, [3, 0], [1])
    assert x.shape[2] == 2 and y.shape[1] == 1
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    _, x, y, idx = collect(
        WindowStream(stream_cache, 12, horizon=3, split="all", batch_size=50, target=["f4", "f2"], meta=True)
    )
    rx, ry = reference(stream_bars, idx, 12, 3, None, [4, 2])
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    with pytest.raises(ValueError, match="nope"):
        WindowStream(stream_cache, 12, split="all", features=["f0", "nope"])
    with pytest.raises(TypeError):
        WindowStream(stream_cache, 12, split="all", target="f1")


@pytest.mark.parametrize("run_bytes", [1, 40_000, 1 << 30])
def test_runs_of_batches_give_the_same_batches(monkeypatch, stream_bars, stream_cache, run_bytes):
    """Single batches, short runs and runs as long as a pool: the same batches, right content."""
    monkeypatch.setattr(serve_mod, "RUN_BYTES", run_bytes)
    batches, x, y, idx = collect(
        WindowStream(stream_cache, 11, horizon=2, split="all", batch_size=64, meta=True, mix=2)
    )
    rx, ry = reference(stream_bars, idx, 11, 2)
    assert np.array_equal(x, rx) and np.array_equal(y, ry)
    monkeypatch.setattr(serve_mod, "RUN_BYTES", 1)
    single = collect(WindowStream(stream_cache, 11, horizon=2, split="all", batch_size=64, meta=True, mix=2))[0]
    assert [b.index.tolist() for b in batches] == [b.index.tolist() for b in single]


def test_the_stream_never_touches_torch_thread_settings(monkeypatch, stream_cache):
    """Not even briefly: every call that could change them fails the test, and a thread started
    while the stream runs sees the caller's default."""

    def refuse(*args):
        raise AssertionError("the stream changed torch's thread settings")

    import shardcache.read.reader as reader_mod
    import shardcache.read.storage as storage_mod

    for name in ("set_num_threads", "set_num_interop_threads"):
        monkeypatch.setattr(torch, name, refuse)
    inside = []
    real = reader_mod.Reader._gather
    monkeypatch.setattr(
        reader_mod.Reader, "_gather", lambda self, run: inside.append(torch.get_num_threads()) or real(self, run)
    )
    before, seen = torch.get_num_threads(), []
    ds = WindowStream(stream_cache, 10, split="all", batch_size=256, features=["f0", "f2"])  # subsets: two arenas
    for i, _ in enumerate(ds):
        if i == 3:
            t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
            t.start()
            t.join()
    assert torch.get_num_threads() == before and seen == [before]
    if storage_mod._omp_set_num_threads() is not None:  # libgomp: the gather thread alone runs on one thread
        assert inside and set(inside) == {1}


def test_drop_last_and_rank_shares_from_env(monkeypatch, stream_bars, stream_cache):
    ref = brute_starts(stream_bars, 20, 1, 1, None)
    ds = WindowStream(stream_cache, 20, split="all", batch_size=128, drop_last=True, meta=True)
    batches, _, _, idx = collect(ds)
    assert len(batches) == len(ref) // 128 and all(len(b[0]) == 128 for b in batches)
    assert len(idx) == len(np.unique(idx)) > len(ref) - 128
    seen, counts = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        ds = WindowStream(stream_cache, 20, split="all", batch_size=100, meta=True)
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

    a = WindowStream(stream_cache, 10, split="all", batch_size=64, seed=1, meta=True)
    first = order(a)
    assert np.array_equal(first, order(WindowStream(stream_cache, 10, split="all", batch_size=64, seed=1, meta=True)))
    assert not np.array_equal(
        first, order(WindowStream(stream_cache, 10, split="all", batch_size=64, seed=2, meta=True))
    )
    a.set_epoch(3)
    third = order(a)
    assert not np.array_equal(first, third) and np.array_equal(np.sort(first), np.sort(third))
    a.set_epoch(0)
    assert np.array_equal(first, order(a))


def _idx(batches):
    return [b.index for b in batches]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


def test_every_pass_is_a_full_new_epoch_and_state_resumes(stream_cache):
    full = WindowStream(stream_cache, 10, split="all", batch_size=64, meta=True)
    want = _idx(full)
    assert full.epoch == 1 and len(want) == full.n_batches
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, meta=True)
    it = iter(ds)
    head = [next(it).index for _ in range(3)]
    assert ds.state_dict()["history"] == [[1, 3]] and ds.state_dict()["epoch"] == 0
    other = WindowStream(stream_cache, 10, split="all", batch_size=64, meta=True)
    other.load_state_dict(ds.state_dict())
    other.set_epoch(0)  # the usual call at the top of an epoch keeps the loaded position
    assert _same(head + _idx(other), want)
    del it
    again = _idx(ds)  # a new pass after a break: a whole epoch (epoch 1), not the rest of epoch 0
    assert len(again) == len(want) and not _same(again, want)
    ds.set_epoch(0)  # back to epoch 0, from its first batch, even though it is "the current epoch"
    assert _same(_idx(ds), want)
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["history"] == []


def test_a_peek_never_shortens_the_next_pass(stream_cache):
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, meta=True)
    next(iter(ds))  # a peek at the first batch
    ds.set_epoch(0)
    assert len(list(ds)) == len(ds) == ds.n_batches
    peeked = WindowStream(stream_cache, 10, split="all", batch_size=64)
    _x, _y = next(iter(peeked))  # default batches unpack as (x, y)
    assert len(list(peeked)) == peeked.n_batches


def test_break_in_validation_then_full_pass_same_order(stream_cache):
    val = WindowStream(stream_cache, 10, split="val", batch_size=32, shuffle=False, meta=True)
    whole = _idx(val)
    for i, _ in enumerate(val):
        if i == 4:
            break
    assert _same(_idx(val), whole) and _same(_idx(val), whole)  # every pass: the same windows, same order


def test_a_newer_iterator_supersedes_the_older(stream_cache):
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, meta=True)
    first = iter(ds)
    next(first)
    second = iter(ds)
    got = _idx(second)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    assert len(got) == ds.n_batches and ds.state_dict()["history"] == []  # the count is the newer pass's


def test_state_dict_rejects_another_stream(stream_cache):
    state = WindowStream(stream_cache, 10, split="all", batch_size=64).state_dict()
    assert set(state) >= {
        "epoch",
        "seed",
        "history",
        "seq_len",
        "horizon",
        "stride",
        "split",
        "batch_size",
        "n_windows",
    }
    with pytest.raises(ValueError, match="batch_size"):
        WindowStream(stream_cache, 10, split="all", batch_size=32).load_state_dict(state)
    with pytest.raises(ValueError, match="split"):
        WindowStream(stream_cache, 10, batch_size=64, split="train").load_state_dict(state)
    with pytest.raises(ValueError, match="history"):
        WindowStream(stream_cache, 10, split="all", batch_size=64).load_state_dict({**state, "history": [[0, 1]]})


def test_one_zarr_call_per_block(reads, stream_cache):
    calls = reads
    ds = WindowStream(stream_cache, 30, split="all", batch_size=16)
    n = sum(len(x) for x, _ in ds)
    plan = ds.plan()
    assert len(calls) == len(plan.shards) < n / 50  # one read per shard piece, never per window
    span = ds.span
    for (start, stop), s in zip(sorted(calls), sorted(plan.shards.tolist())):
        assert start // stream_cache.shard_rows == s and stop - start <= stream_cache.shard_rows + span - 1


@pytest.mark.parametrize("fast", [True, False])
def test_small_blocks_that_read_fast_are_read_on_the_gather_thread(monkeypatch, stream_cache, fast):
    """Decoder threads are for reads that wait (object storage): once small blocks are seen to read in
    well under FAST_READ, the gather thread reads each itself (issue 21: handing
    thousands of small symbols' shards to decoders cost more in thread switches than the reads), and
    the batches are the same wherever a block was read."""
    import shardcache.read.reader as reader_mod

    kw = dict(split="all", batch_size=16, meta=True, mix=2)
    want = [b.index for b in WindowStream(stream_cache, 10, decoders=0, **kw)]
    monkeypatch.setattr(reader_mod, "FAST_READ", 60.0 if fast else 0.0)
    threads = []
    spy_block_reads(monkeypatch, lambda cache, a, b: threads.append(threading.current_thread().name))
    with WindowStream(stream_cache, 10, decoders=2, **kw) as ds:
        got = [b.index for b in ds]
    assert len(got) == len(want) and all(torch.equal(u, v) for u, v in zip(got, want))
    here = [name.startswith("shardcache-reader") for name in threads]
    if fast:  # the first pool's blocks go to the decoders while no read was timed yet, then none does
        assert not here[0] and sum(not h for h in here) <= ds.order.mix and all(here[ds.order.mix :])
    else:
        assert not any(here)


def test_small_blocks_are_read_ahead_before_a_run_is_handed_over(monkeypatch, tmp_path):
    """The gather thread reads small blocks of later pools before it hands over the run it gathered, as far as
    the capacity allows, not only when a run needs them: the consumer is then waiting for the run, not
    working through batches and wanting the GIL (issue 21)."""
    import shardcache.read.reader as reader_mod

    bars = synthetic_bars(2400, 3, n_symbols=12, seed=5, shard_rows=128)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=128, chunk_rows=32)
    monkeypatch.setattr(reader_mod, "FAST_READ", 60.0)  # every small block read here, however busy the machine
    events, gather = [], reader_mod.Reader._gather

    def gathering(self, run):
        events.append(("gather", run.pools[-1]))
        return gather(self, run)

    ds = WindowStream(cache, 10, split="all", batch_size=16, decoders=2)
    plan = ds.plan()  # the pool of each shard, in the pass below
    pool_of = dict(
        zip(plan.shards.tolist(), np.repeat(np.arange(len(plan.pool_bounds) - 1), np.diff(plan.pool_bounds)))
    )
    spy_block_reads(monkeypatch, lambda c, a, b: events.append(("read", int(pool_of[a // c.shard_rows]))))
    monkeypatch.setattr(reader_mod.Reader, "_gather", gathering)
    with ds:
        n = sum(len(b.x) for b in ds)
    assert n == ds.read_spec.ranges.total()
    gathers = [i for i, e in enumerate(events) if e[0] == "gather"]
    assert len(gathers) > 4
    ahead = [
        any(e[0] == "read" and e[1] > events[i][1] for e in events[:i]) for i in gathers[1:-1]
    ]  # before a run is gathered, blocks of pools after its own were read
    assert sum(ahead) >= len(ahead) // 2, events


def test_small_blocks_are_read_in_groups_and_checked_once_per_group(monkeypatch, tmp_path):
    """Small blocks the gather thread reads go to ``Cache.read_many`` many at a time, and the caches are checked
    for a replacement once per group, not once per pool (issue 21: thousands of small symbols' pools); the
    batches are those of a reader that reads one block at a time."""
    import shardcache.read.reader as reader_mod

    bars = synthetic_bars(6000, 3, n_symbols=100, seed=5, shard_rows=128)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=128, chunk_rows=32)
    kw = dict(split="all", batch_size=16, mix=2)
    want = [b.x for b in WindowStream(cache, 10, decoders=2, **kw)]
    monkeypatch.setattr(reader_mod, "FAST_READ", 60.0)  # every small block read here, however busy the machine
    groups, checks, many, same = [], [], Cache.read_many, Cache.check_same
    monkeypatch.setattr(
        Cache, "read_many", lambda self, a, b, outs, **k: groups.append(len(a)) or many(self, a, b, outs, **k)
    )
    monkeypatch.setattr(Cache, "check_same", lambda self: checks.append(1) or same(self))
    with WindowStream(cache, 10, decoders=2, **kw) as ds:
        got = [b.x for b in ds]
        pools = len(ds.plan(0).pool_bounds) - 1
    assert len(got) == len(want) and all(torch.equal(u, v) for u, v in zip(got, want))
    assert pools > 20 and max(groups) > 4 and sum(groups) >= pools  # most blocks read in groups of several
    assert len(checks) <= len(groups) + ds.order.mix + 2 < pools  # once per group (and per pool read by the decoders)


def test_an_epoch_never_scans_every_symbol_per_shard(monkeypatch, tmp_path):
    """A symbol's decoder is made from what the cache read at opening, without a pass over every symbol's
    entries (issue 21: per-shard time grew with the symbol count, 10,000 symbols against 2,000)."""
    bars = synthetic_bars(2400, 3, n_symbols=12, seed=5, shard_rows=128)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=128, chunk_rows=32)
    from shardcache.format.index import ShardIndex

    scans, chunk_rows = [], ShardIndex.symbol_chunk_rows
    monkeypatch.setattr(ShardIndex, "symbol_chunk_rows", lambda self, n: scans.append(n) or chunk_rows(self, n))
    copies, groups = [], Cache.groups
    monkeypatch.setattr(Cache, "groups", property(lambda self: copies.append(1) or groups.fget(self)))
    with WindowStream(cache, 10, split="all", batch_size=16, meta=True) as ds:
        n = sum(len(b.x) for b in ds)
    assert n == ds.read_spec.ranges.total() and len(cache.symbols) == 12
    assert not scans and not copies  # found at opening: once per cache, not once per symbol


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="the OS takes no read-ahead hints")
def test_an_epoch_asks_the_os_for_its_shard_files_before_reading_them(monkeypatch, tmp_path):
    """A local cache's shard files are asked of the OS (``POSIX_FADV_WILLNEED``) a batch of pools at a time,
    before any of them is read, so small symbols' files gone cold in the page cache come from disk together
    rather than one read at a time (issue 21); the batches are those of an epoch without the hints."""
    bars = synthetic_bars(2400, 3, n_symbols=12, seed=5, shard_rows=128)
    cache = make_cache(tmp_path / "c.zarr", bars, shard_rows=128, chunk_rows=32)
    want = [b.index for b in WindowStream(cache, 10, split="all", batch_size=16, meta=True)]
    events, real_hint = [], os.posix_fadvise

    def hint(fd, offset, length, advice):
        events.append(("hint", os.fstat(fd).st_ino, advice))
        return real_hint(fd, offset, length, advice)

    def read(self, a, b):
        events.append(("read", os.stat(tmp_path / "c.zarr" / self.shard_key(a // self.shard_rows)).st_ino, None))

    monkeypatch.setattr(os, "posix_fadvise", hint)
    spy_block_reads(monkeypatch, read)
    with WindowStream(cache, 10, split="all", batch_size=16, meta=True) as ds:
        got = [b.index for b in ds]
    assert len(got) == len(want) and all(torch.equal(u, v) for u, v in zip(got, want))
    reads = [k for kind, k, _ in events if kind == "read"]
    assert len(set(reads)) > len(cache.symbols)  # shards of every symbol, each a file of its own
    for i, (kind, ino, advice) in enumerate(events):
        if kind == "hint":
            assert advice == os.POSIX_FADV_WILLNEED
        else:  # every file read was hinted before
            assert ("hint", ino, os.POSIX_FADV_WILLNEED) in events[:i]
    hints = [k for kind, k, _ in events if kind == "hint"]
    assert sorted(set(hints)) == sorted(set(reads)) and len(hints) == len(set(hints))  # each hinted once


def test_memory_budget_bounds_the_reader(monkeypatch, stream_cache):
    ds = WindowStream(stream_cache, 30, split="all", batch_size=64, mix=2)
    block = (stream_cache.shard_rows + ds.span - 1) * 5 * 4
    need = ds.plan().max_open_pieces()
    with pytest.raises(ValueError, match="memory_budget"):
        WindowStream(stream_cache, 30, split="all", batch_size=64, mix=2, memory_budget=need * block - 1)
    peak = []
    real, group = serve_mod.Reader._decode, serve_mod.Reader._read_group

    def watched(self, pool, k):
        real(self, pool, k)
        peak.append((self.used, self.capacity))

    def watched_group(self):
        group(self)
        peak.append((self.used, self.capacity))

    monkeypatch.setattr(serve_mod.Reader, "_decode", watched)
    monkeypatch.setattr(serve_mod.Reader, "_read_group", watched_group)
    budget = need * block
    n = sum(len(x) for x, _ in WindowStream(stream_cache, 30, split="all", batch_size=64, mix=2, memory_budget=budget))
    assert n == ds.plan().n_windows and max(u for u, _ in peak) <= budget
    assert all(c == budget for _, c in peak)
    loose = WindowStream(stream_cache, 30, split="all", batch_size=64, mix=2, memory_budget=budget * 2)
    with pytest.raises(ValueError, match="each of 3 reader"):
        loose.loader(3)  # a budget is shared by the DataLoader workers
    loose.loader(2)


def test_explicit_cpu_device(stream_cache):
    a = WindowStream(stream_cache, 8, split="all", batch_size=64, device="cpu", meta=True)
    b = WindowStream(stream_cache, 8, split="all", batch_size=64, meta=True)
    got, want = list(a), list(b)
    assert len(got) == len(want) == a.n_batches > 0
    for (xa, ya, ia, *_), (xb, yb, ib, *_) in zip(got, want):
        assert xa.device.type == "cpu" and torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(ia, ib)


def test_window_dataset_matches_stream(monkeypatch, stream_bars, stream_cache):
    ds = WindowDataset(stream_cache, 25, horizon=2, split="train", features=["f1", "f0"], target=["f4"])
    ref = brute_starts(stream_bars, 25, 2, 1, "train")
    assert len(ds) == len(ref) and ds.row(-1) == ref[-1]
    _, x, y, idx = collect(
        WindowStream(stream_cache, 25, horizon=2, split="train", features=["f1", "f0"], target=["f4"], meta=True)
    )
    pos = {int(p): k for k, p in enumerate(idx)}
    for i in range(0, len(ds), 97):
        xi, yi = ds[i]
        k = pos[ds.row(i)]
        assert xi.shape == (25, 2) and yi.shape == (1,)
        assert torch.equal(xi, torch.from_numpy(x[k])) and torch.equal(yi, torch.from_numpy(y[k]))
    calls = []
    real = Cache.read_rows
    monkeypatch.setattr(
        Cache, "read_rows", lambda self, a, b, *rest, **kw: calls.append(a) or real(self, a, b, *rest, **kw)
    )
    fresh = WindowDataset(stream_cache, 25, horizon=2, split="train")
    for i in range(400):
        fresh[i]
    assert len(calls) <= 2  # nearby windows come from the decoded-shard LRU
    with pytest.raises(IndexError):
        fresh[len(fresh)]


def test_close_and_garbage_collection_stop_the_reader(stream_cache):
    before = len(reader_threads())
    ds = WindowStream(stream_cache, 10, split="all", batch_size=8)
    it = iter(ds)
    next(it)
    assert len(reader_threads()) == before + 1
    del it
    gc.collect()
    assert len(reader_threads()) == before
    with WindowStream(stream_cache, 10, split="all", batch_size=8) as ds2:
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
    shard = os.path.join(tmp_path, "c.zarr", "symbols", "0", "features", "c.2.0")
    data = bytearray(Path(shard).read_bytes())
    data[100:140] = bytes(40)
    Path(shard).write_bytes(bytes(data))
    with pytest.raises(CacheError, match="checksum"):  # a crc32c mismatch, raised in the reader thread
        for _ in WindowStream(cache, 10, split="all", batch_size=32, shuffle=False):
            pass
    assert not reader_threads()


@pytest.mark.parametrize("run_bytes", [1, None])
def test_batches_kept_in_part_are_never_overwritten(monkeypatch, stream_bars, stream_cache, run_bytes):
    """Output buffers are reused only once nothing refers to them: views kept of every third
    batch (and whole batches of others) still hold their windows at the end of the epoch."""
    if run_bytes:
        monkeypatch.setattr(serve_mod, "RUN_BYTES", run_bytes)
    kept = []
    ds = WindowStream(stream_cache, 12, split="all", batch_size=32, meta=True, mix=2)
    for i, b in enumerate(ds):
        x, y, idx = b.x, b.y, rows_of(ds.cache, [b])[0]
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
