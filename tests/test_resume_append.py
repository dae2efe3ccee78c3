"""A saved stream position resumes on the appended cache when the append added no window to the split
streamed (shardcache/read/identity.py), for one cache of several symbols and for a mixture: the windows
before the checkpoint and after the resume are exactly an uninterrupted epoch's, bars included."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.parquet import SourceBars, build_raw, make_bars, write_parquet

from shardcache import append_cache
from shardcache.errors import StateError
from shardcache.read.stream import WindowStream

KW = {"split": "train", "batch_size": 16, "seed": 3, "meta": True}


def _two_symbols(tmp_path, name, seed):
    """Two symbols' minute bars: a first file of 900 bars each, a later one of 300 more (one shard and more)."""
    bars = make_bars({"ES": 1200, "NQ": 1200}, n_features=2, seed=seed, gaps=0)
    first = {s: SourceBars(b.ts[:900], b.values[:900]) for s, b in bars.items()}
    later = {s: SourceBars(b.ts[900:], b.values[900:]) for s, b in bars.items()}
    a = write_parquet(tmp_path / f"{name}-a.parquet", first)
    b = write_parquet(tmp_path / f"{name}-b.parquet", later)
    out = tmp_path / f"{name}.zarr"
    build_raw(a, out, shard_rows=128, chunk_rows=64, split="train=0.7,val=0.15,test=0.15")
    return out, b


def _windows(batches):
    return [(b.x.clone(), b.index.clone()) for b in batches]


@pytest.mark.parametrize("mixed", [False, True], ids=["one cache", "two caches"])
def test_a_state_resumes_after_an_append_that_landed_in_a_later_split(tmp_path, mixed):
    es, es_later = _two_symbols(tmp_path, "es", 1)
    caches = [es]
    if mixed:
        nq, _ = _two_symbols(tmp_path, "nq", 2)
        caches = [es, nq]
    target = caches if mixed else es
    whole = _windows(WindowStream(target, 20, **KW))  # the epoch before the append
    s = WindowStream(target, 20, **KW)
    it = iter(s)
    head = _windows(next(it) for _ in range(7))
    state = json.loads(json.dumps(s.state_dict()))
    t = WindowStream(es, 20, **{**KW, "split": "test"})
    next(iter(t))
    test_state = t.state_dict()
    n_rows = WindowStream(target, 20, **KW).sources.n_rows
    append_cache([es_later], es, progress=False)  # 300 bars a symbol: all in the test split
    r = WindowStream(target, 20, **KW)
    assert r.sources.n_rows > n_rows  # the first cache's symbols now span more shards: later rows moved
    r.load_state_dict(state)
    rest = _windows(r)
    got, want = head + rest, whole
    assert len(got) == len(want)
    for (gx, gi), (wx, wi) in zip(got, want):
        assert torch.equal(gi, wi) and torch.equal(gx, wx)
    grown = WindowStream(es, 20, **{**KW, "split": "test"})
    with pytest.raises(
        StateError, match=r"es\.zarr: the 'test' split's windows changed since it was saved \(\d[\d,]* then, "
    ):
        grown.load_state_dict(test_state)  # the bars appended are in its windows: it does not resume
