"""``WindowDataset(meta=True)`` (shardcache/read/dataset.py) gives each window's metadata exactly as the
stream does, and a non-shuffled stream serves the dataset's windows in the dataset's order: for one
cache, for two, one window at a time, by slices and through a real DataLoader with worker processes."""

from __future__ import annotations

import pytest
import torch
from helpers import make_cache, synthetic_bars
from torch.utils.data import DataLoader

from shardcache import WindowDataset, WindowStream
from shardcache.read.options import Batch, MetaBatch

KW = {"split": "train", "horizon": (1, 4)}


@pytest.fixture(scope="module")
def two(tmp_path_factory, stream_cache):
    other = synthetic_bars(3000, 5, n_symbols=2, seed=11, shard_rows=512)
    return [
        stream_cache,
        make_cache(tmp_path_factory.mktemp("meta") / "other.zarr", other, shard_rows=512, chunk_rows=128),
    ]


def _fields(batches):
    """Every field of ``batches`` concatenated along the batch."""
    return [torch.cat([b[k] for b in batches]) for k in range(len(MetaBatch._fields))]


@pytest.mark.parametrize("n_caches", [1, 2])
def test_meta_equals_the_stream_and_the_order_is_the_streams(two, n_caches):
    caches = two[0] if n_caches == 1 else two
    ds = WindowDataset(caches, 12, meta=True, **KW)
    stream = WindowStream(caches, 12, shuffle=False, batch_size=100, meta=True, **KW)
    served = list(stream)
    assert all(isinstance(b, MetaBatch) for b in served) and ds.meta
    whole = ds[0 : len(ds)]
    assert isinstance(whole, MetaBatch)
    for k, (got, want) in enumerate(zip(whole, _fields(served))):
        assert torch.equal(got, want), MetaBatch._fields[k]
    assert len(whole.x) == len(ds) == stream.plan(0).n_windows
    if n_caches == 2:
        assert set(whole.source.tolist()) == {0, 1}
    one = ds[-1]  # one window: every field without the batch dimension
    assert isinstance(one, MetaBatch) and all(torch.equal(a, b[-1]) for a, b in zip(one, whole))


def test_meta_through_a_dataloader_with_workers(two):
    ds = WindowDataset(two, 12, meta=True, **KW)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:500].tolist()
    want = ds[order]
    loader = DataLoader(ds, batch_size=64, sampler=order, num_workers=2)
    got = list(loader)
    assert all(isinstance(b, MetaBatch) for b in got)
    for g, w in zip(_fields(got), want):
        assert torch.equal(g, w)


def test_without_meta_items_stay_batches(stream_cache):
    ds = WindowDataset(stream_cache, 12, **KW)
    assert not ds.meta and type(ds[0]) is Batch and type(ds[0:3]) is Batch
    assert torch.equal(ds[0:3].x, WindowDataset(stream_cache, 12, meta=True, **KW)[0:3].x)
