"""Batches from DataLoader workers through reused shared memory (``shardcache.read.ship``):
the same batches as in-process, a slot never overwritten while the caller holds a batch, slots
reused once batches are dropped, and nothing left mapped after ``close()``."""

from __future__ import annotations

import gc

import torch
from torch.utils.data import DataLoader

from shardcache.read import ship
from shardcache.read.options import Batch, MetaBatch
from shardcache.read.stream import WindowStream
from shardcache.tuning import SLOTS

KW = {"seq_len": 10, "horizon": 2, "batch_size": 64, "split": "all"}


def _in_process(cache, **kw) -> list:
    ds = WindowStream(cache, **KW, **kw)
    return [tuple(t.clone() for t in b) for b in ds]


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w)) for g, w in zip(got, want)
    )


def _rings(ds: WindowStream) -> list:
    return [r for k, r in ship._RINGS.items() if k.startswith(ds.resources.ship_id)]


def test_kept_batches_are_never_overwritten(stream_cache):
    """The caller keeps every batch of the epoch (more than a ring's slots): each stays what it
    was when it arrived, equal to the in-process batch, and the ring never grows past SLOTS."""
    want = _in_process(stream_cache, meta=True)
    assert len(want) > 2 * SLOTS + 4  # some batches must come while every slot is held
    ds = WindowStream(stream_cache, **KW, meta=True)
    kept = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert all(type(b) is MetaBatch for b in kept)
    assert _same(kept, want)
    rings = _rings(ds)
    assert len(rings) == 2 and all(len(r.slots) == SLOTS for r in rings)
    ds.close()
    assert _rings(ds) == []
    assert _same(kept, want)  # forgetting the mappings leaves the caller's batches as they were


def test_dropped_batches_give_their_slots_back(stream_cache):
    """A loop that drops each batch (as training does) runs on a few slots, reused many times,
    and reads exactly the in-process batches."""
    want = _in_process(stream_cache)
    ds = WindowStream(stream_cache, **KW)
    got = []
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        assert type(b) is Batch
        got.append(tuple(t.clone() for t in b))
        del b
    assert _same(got, want)
    rings = _rings(ds)
    assert len(rings) == 2
    assert all(len(r.slots) < SLOTS for r in rings)  # never starved: dropped slots came back
    assert sum(int(r.g[0].sum()) for r in rings) == len(want)  # every batch went through a slot
    assert max(int(r.g[0].max()) for r in rings) > 2  # ... and slots were reused
    ds.close()
    gc.collect()
    assert _rings(ds) == []


def test_a_batch_held_across_later_ones_keeps_its_values(stream_cache):
    """One batch kept while the loop runs on (a running average, a logged example) is never a
    slot another batch is written into."""
    want = _in_process(stream_cache)
    ds = WindowStream(stream_cache, **KW)
    held, seen = None, 0
    with ds:
        for i, b in enumerate(ds.loader(num_workers=2)):
            if i == 1:
                held = b
            seen += 1
        assert seen == len(want) and _same([tuple(held)], [want[1]])


def test_a_loan_is_back_only_once_every_tensor_and_view_over_it_is_gone():
    """Reuse is decided by the loan's handles, not by reference counts of the arrays: a view, a
    numpy array or the storage of a lent tensor keeps the loan out; another name for the array
    itself (which a reference count would have taken for a live batch) does not."""
    import numpy as np

    loan = ship.Loan([np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32)])
    same_array = loan.arrays[0]  # held for the whole test
    assert loan.free()
    for keep in (lambda x, y: x[2:4], lambda x, y: y.numpy()[1:], lambda x, y: x.untyped_storage(), lambda x, y: y.T):
        x, y = loan.lend(5)
        assert x.shape == (5, 3) and y.shape == (5, 2) and not loan.free()
        kept = keep(x, y)
        del x, y
        assert not loan.free()
        del kept
        assert loan.free()
    assert same_array is loan.arrays[0]
