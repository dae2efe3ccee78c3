"""Resident passes (shardcache/read/resident.py): a stream whose memory_budget covers the split's
bars decodes each block once and later passes only gather, with the streamed passes' batches."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
import torch

from shardcache.read.resident import BlockTable, resident_bytes
from shardcache.read.stream import WindowStream

BIG = 1 << 30


def passes(ds, n):
    """``n`` whole passes of ``ds``: per pass, every batch as numpy arrays (x, y and meta if any)."""
    return [[tuple(t.numpy() for t in b) for b in ds] for _ in range(n)]


def same(a, b):
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert len(pa) == len(pb) > 0
        for ba, bb in zip(pa, pb):
            assert all(np.array_equal(u, v) for u, v in zip(ba, bb, strict=True))


@pytest.mark.parametrize(
    "kw",
    [
        {"seq_len": 16, "batch_size": 64, "meta": True},
        {"seq_len": 9, "horizon": (1, 4), "batch_size": 50, "features": ["f3", "f0"], "target": ["f1"], "mix": 2},
        {"seq_len": 30, "stride": 3, "split": "train", "batch_size": 7, "shuffle": False, "decoders": 0},
    ],
)
def test_resident_passes_give_the_streamed_batches(stream_cache, reads, kw):
    """Three epochs, batch for batch: the first decodes, the later ones only gather; the same
    batches as a stream without a budget, which reads every block every epoch."""
    kw = {"split": "all", **kw}
    seq_len = kw.pop("seq_len")
    resident = WindowStream(stream_cache, seq_len, memory_budget=BIG, **kw)
    streamed = WindowStream(stream_cache, seq_len, **kw)
    assert resident.resident and not streamed.resident
    got = passes(resident, 3)
    assert 0 < len(reads) <= len(resident.resources.resident.table.shards)  # epoch 0: each block once
    del reads[:]
    want = passes(streamed, 3)
    assert len(reads) >= 3 * len(streamed.plan().shards)
    same(got, want)
    if kw.get("shuffle", True):  # each resident epoch shuffles anew
        assert not np.array_equal(got[1][0][0], got[2][0][0])


def test_a_complete_pass_reads_nothing_and_starts_no_thread(stream_cache, reads):
    ds = WindowStream(stream_cache, 12, split="all", batch_size=32, memory_budget="auto")
    assert ds.resident
    for _ in ds:
        break  # a peek: its blocks are decoded, the rest are not
    n_peek = len(reads)
    sum(len(x) for x, _ in ds)  # the rest of the blocks
    table = ds.resources.resident.table
    assert n_peek < len(reads) and len(set(reads)) == len(reads) <= len(table.shards) + n_peek
    assert ds.resources.resident.complete
    del reads[:]
    others = set(threading.enumerate())  # threads of other tests' streams not yet collected are not this pass's
    it = iter(ds)
    next(it)
    assert not [r for r in ds.resources.readers if r.thread.is_alive()]  # the peek's reader is stopped
    assert not [t for t in threading.enumerate() if t.name.startswith("shardcache") and t not in others]
    assert sum(len(x) for x, _ in it) > 0 and reads == []


def test_the_budget_chooses_resident_or_streamed(stream_cache, reads):
    """Resident exactly when the budget holds every block; a budget one byte short streams."""
    ds = WindowStream(stream_cache, 20, split="train", batch_size=64)
    need = resident_bytes(ds.read_spec)
    table = BlockTable.of(ds.read_spec.ranges, stream_cache.shard_rows)
    assert need == table.n_rows * 5 * 4 and table.n_rows < stream_cache.n_rows  # the split's rows, not the cache's
    on = WindowStream(stream_cache, 20, split="train", batch_size=64, mix=1, memory_budget=need)
    off = WindowStream(stream_cache, 20, split="train", batch_size=64, mix=1, memory_budget=need - 1)
    assert on.resident and not off.resident and not ds.resident
    two = WindowStream(
        stream_cache,
        20,
        split="train",
        batch_size=64,
        features=["f0"],
        target=["f1", "f2"],
        memory_budget=table.n_rows * 3 * 4,
    )
    assert two.resident and two._resident_bytes == table.n_rows * 3 * 4  # inputs and targets: two arenas
    same(passes(on, 2), passes(off, 2))
    assert on.resources.resident is not None and off.resources.resident is None
    with pytest.raises(ValueError, match="memory_budget"):  # a worker streams: the budget must hold its pools
        WindowStream(stream_cache, 20, split="train", batch_size=64, memory_budget=need).loader(1)


def test_ranks_and_elastic_resume_keep_their_windows(monkeypatch, stream_cache):
    """Two ranks (RANK/WORLD_SIZE) cover each window once per resident epoch, as streamed; a
    checkpoint taken mid-epoch at world 2 resumes at world 1 with the streamed batches."""
    kw = {"split": "all", "batch_size": 40, "meta": True, "seed": 3}
    monkeypatch.setenv("WORLD_SIZE", "2")
    rows = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        res, ref = WindowStream(stream_cache, 14, memory_budget=BIG, **kw), WindowStream(stream_cache, 14, **kw)
        got = passes(res, 2)
        same(got, passes(ref, 2))
        rows[rank] = np.concatenate([b[2][:, 0] * 10**6 + b[2][:, 1] for b in got[1]])  # (symbol, row) keys
        it = iter(res)
        for _ in range(3):
            next(it)
        state = res.state_dict()
    both = np.concatenate([rows[0], rows[1]])
    assert len(np.unique(both)) == len(both) == 2 * len(rows[0])
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    res, ref = WindowStream(stream_cache, 14, memory_budget=BIG, **kw), WindowStream(stream_cache, 14, **kw)
    passes(res, 1)  # decodes every block: the resumed pass below is a gathering one
    assert res.resources.resident.complete
    res.load_state_dict(state)
    ref.load_state_dict(state)
    same(passes(res, 2), passes(ref, 2))


def test_close_and_dropping_the_stream_free_the_arena(stream_cache):
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, memory_budget=BIG)
    sum(len(x) for x, _ in ds)
    it = iter(ds)
    next(it)
    arena = weakref.ref(ds.resources.resident.arena.x)
    ds.close()
    gc.collect()
    assert arena() is None
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, memory_budget=BIG)
    sum(len(x) for x, _ in ds)
    arena = weakref.ref(ds.resources.resident.arena.x)
    del ds
    gc.collect()
    assert arena() is None


def test_a_newer_pass_supersedes_a_resident_one(stream_cache):
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, memory_budget=BIG)
    sum(len(x) for x, _ in ds)
    old = iter(ds)
    next(old)
    assert sum(len(x) for x, _ in ds) == ds.plan(0).n_windows
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


def test_workers_stream_as_before_with_the_same_batches(stream_cache):
    """A DataLoader worker never holds the arena: it streams, and serves the resident batches."""
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, memory_budget=BIG, meta=True)
    inproc = passes(ds, 2)
    assert ds.resources.resident.complete
    ds.set_epoch(0)
    workers = [tuple(t.numpy() for t in b) for b in ds.loader(1)]
    same(inproc[:1], [workers])
    ds.close()


def test_resident_batches_are_new_tensors_the_caller_may_keep(stream_cache):
    ds = WindowStream(stream_cache, 10, split="all", batch_size=64, memory_budget=BIG, shuffle=False)
    first = [b.x for b in ds]
    kept = [b.x for b in ds]
    again = [b.x.clone() for b in ds]
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, kept, again))
    assert len({t.data_ptr() for t in kept}) == len(kept)
