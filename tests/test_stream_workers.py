"""WindowStream across processes: DataLoader workers, DDP ranks, resume in a new process, leaks, RSS."""

from __future__ import annotations

import gc
import json
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from helpers import brute_starts, make_cache, run_helper, synthetic_bars
from helpers.stream import rows_of
from torch.utils.data import DataLoader, get_worker_info

from shardcache.format.decode import ShardDecoder
from shardcache.read.stream import WindowStream

KW = {"seq_len": 10, "horizon": 2, "batch_size": 64, "split": "all"}


def indices(batches):
    return [b.index for b in batches]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.fixture(scope="module")
def epoch0(stream_cache):
    """Index batches of epoch 0 and 1, in-process: the order every other setup must reproduce."""
    ds = WindowStream(stream_cache, meta=True, **KW)
    first = indices(ds)
    ds.set_epoch(1)
    second = indices(ds)
    return first, second, indices(ds)


def test_order_is_the_same_for_any_number_of_workers(stream_bars, stream_cache, epoch0):
    ref = brute_starts(stream_bars, 10, 2, 1, None)
    ds = WindowStream(stream_cache, meta=True, **KW)
    assert np.array_equal(np.sort(torch.cat(rows_of(ds.cache, ds)).numpy()), ref)
    for workers in (0, 1, 2):
        ds = WindowStream(stream_cache, meta=True, **KW)
        got = indices(ds.loader(workers))
        assert same(got, epoch0[0]), workers
        assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["history"] == []
        plain_ds = WindowStream(stream_cache, meta=True, **KW)
        plain = indices(DataLoader(plain_ds, batch_size=None, num_workers=workers))
        assert same(plain, epoch0[0]), workers
        ds.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_every_pass_of_any_loader_is_a_new_full_epoch(stream_cache, epoch0, persistent):
    """A plain 2-worker DataLoader without set_epoch reshuffles every pass, like loader() and
    in-process iteration; a break never shortens the next pass; set_epoch pins the next one."""
    with WindowStream(stream_cache, meta=True, **KW) as ds:
        plain = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
        assert [same(indices(plain), e) for e in epoch0] == [True, True, True]  # three epochs, three orders
        assert ds.epoch == 3 and ds.state_dict()["epoch"] == 3  # the workers' pass count, seen here
        ds.set_epoch(0)
        for i, _ in enumerate(plain):
            if i == 4:
                break
        assert same(indices(plain), epoch0[1])  # the pass after the break: all of epoch 1
        dl = ds.loader(2, persistent_workers=persistent)
        ds.set_epoch(1)
        head = []
        for b in dl:
            head.append(b.index)
            if len(head) == 4:
                break
        assert same(head, epoch0[1][:4]) and ds.state_dict()["history"] == [[1, 4]]
        assert same(indices(dl), epoch0[2])
        ds.set_epoch(0)
        assert same(indices(dl), epoch0[0])


class _LateSecondWorker(WindowStream):
    """Worker 1 starts each pass late, after the main process has counted worker 0's first batch."""

    def __iter__(self):
        info = get_worker_info()
        if info is not None and info.id == 1:
            time.sleep(0.5)
        return super().__iter__()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_late_worker_starts_at_the_first_batch_of_the_pass(stream_cache, epoch0, persistent):
    """A worker takes its position from the pass start, not from the count that moves as batches
    arrive (it once read consumed=1 after a slow start and served batches 2, 4, ... as 1, 3, ...)."""
    with _LateSecondWorker(stream_cache, meta=True, **KW) as ds:
        dl = ds.loader(2, persistent_workers=persistent)
        head = []
        for b in dl:  # first pass: the workers start
            head.append(b.index)
            if len(head) == 3:
                break
        assert same(head, epoch0[0][:3])
        state = ds.state_dict()
        assert same(indices(dl), epoch0[1])  # the next pass is a whole new epoch
        ds.load_state_dict(state)
        assert same(head + indices(dl), epoch0[0])  # a loaded state resumes at batch 3


def test_spawned_workers_share_the_position(stream_cache, epoch0):
    """With the spawn start method the pickled stream still sees the main process's state."""
    with WindowStream(stream_cache, meta=True, **KW) as ds:
        dl = ds.loader(1, multiprocessing_context="spawn", persistent_workers=True)
        head = []
        for b in dl:
            head.append(b.index)
            if len(head) == 2:
                break
        assert ds.state_dict()["history"] == [[1, 2]]
        ds.load_state_dict(ds.state_dict())
        assert same(head + indices(dl), epoch0[0])
        assert same(indices(dl), epoch0[1])  # a pass after a finished epoch is the next epoch
        assert ds.epoch == 2


@pytest.mark.parametrize("stop_workers,resume_workers", [(0, 2), (2, 0)])
def test_resume_in_a_new_process(tmp_path, stream_cache, epoch0, stop_workers, resume_workers):
    ds = WindowStream(stream_cache, meta=True, **KW)
    head = []
    for b in ds.loader(stop_workers):
        head.append(b)
        if len(head) == 7:
            break
    state = ds.state_dict()
    head = rows_of(ds.cache, head)
    ds.close()
    assert state["history"] == [[1, 7]] and state["epoch"] == 0
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = tmp_path / "rest.npy"
    run_helper("resume", stream_cache.url, tmp_path / "state.json", resume_workers, out, json.dumps(KW))
    whole = torch.cat(head).numpy().tolist() + np.load(out).tolist()
    want = rows_of(stream_cache, [type("B", (), {"index": i})() for i in epoch0[0]])
    assert whole == torch.cat(want).numpy().tolist()  # no repeat, no gap, same order


@pytest.mark.parametrize("decoders", [0, 1, 3])
def test_reader_decodes_up_to_decoders_blocks_at_once(monkeypatch, stream_cache, epoch0, decoders):
    """Slow reads (as from object storage) overlap, at most ``decoders`` at once, in the same order;
    closing the stream mid-epoch joins every decoder."""
    lock, active, peak = threading.Lock(), [0], [0]
    real = ShardDecoder.read  # every block's read, one at a time or grouped (``Cache.read_many``)

    def slow(self, a, b, out=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.05)
            return real(self, a, b, out)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(ShardDecoder, "read", slow)
    with WindowStream(stream_cache, meta=True, prefetch=3, decoders=decoders, **KW) as ds:
        assert same(indices(ds), epoch0[0])
    if decoders < 2:
        assert peak[0] == 1  # one at a time: on the reader thread (0) or one decoder (1)
    else:
        assert 2 <= peak[0] <= decoders
    ds = WindowStream(stream_cache, meta=True, prefetch=3, decoders=decoders, **KW)
    it = iter(ds)
    next(it)
    ds.close()
    assert not _reader_threads() and active[0] == 0


def _lifecycle(cache, i, proc, before):
    """Open a stream and a 2-worker loader, take a few batches, then close or just drop them."""
    ds = WindowStream(cache.url, 16, split="all", batch_size=64, seed=i)
    dl = ds.loader(2)
    it = iter(dl)
    for _ in range(3):
        next(it)
    inproc = iter(ds)
    next(inproc)
    if i % 2:  # explicit close, while the iterators are still referenced
        ds.close()
        _settle(proc, before)
        assert _new_children(proc, before) == [] and not _reader_threads()
        with pytest.raises(RuntimeError, match="closed"):
            next(inproc)
    # the even trials rely on garbage collection alone


def _reader_threads():
    """Reader threads and their block decoders."""
    return [t for t in threading.enumerate() if t.name.startswith(("shardcache-reader", "shardcache-decode"))]


def _new_children(proc, before):
    """Child processes not in ``before`` (multiprocessing's resource tracker may predate the test)."""
    return [c for c in proc.children(recursive=True) if c.pid not in before]


def _settle(proc, before, deadline=10.0):
    end = time.monotonic() + deadline
    while _new_children(proc, before) and time.monotonic() < end:
        time.sleep(0.05)


def test_loader_lifecycles_leave_nothing_behind(stream_cache):
    proc = psutil.Process()
    before = {c.pid for c in proc.children(recursive=True)}
    _lifecycle(stream_cache, 0, proc, before)  # warm-up: zarr's io thread and pools exist from here on
    gc.collect()
    _settle(proc, before)
    threads, fds, rss = proc.num_threads(), proc.num_fds(), proc.memory_info().rss
    for i in range(1, 11):
        _lifecycle(stream_cache, i, proc, before)
        gc.collect()
    _settle(proc, before)
    assert _new_children(proc, before) == []
    assert not _reader_threads()
    assert proc.num_threads() <= threads
    assert proc.num_fds() <= fds
    assert proc.memory_info().rss - rss < 64 << 20  # bound: 64 MiB over 10 trials


@pytest.fixture(scope="module")
def rss_caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("rss")
    out = {}
    for n in (200_000, 2_000_000):
        bars = synthetic_bars(n, 32, n_symbols=4, gaps=3, short=0, seed=1, compressible=True)
        out[n] = make_cache(root / f"{n}.zarr", bars, shard_rows=16384, chunk_rows=2048).url
    return out


def test_streaming_rss_does_not_grow_with_bars(tmp_path, rss_caches):
    kw = {"seq_len": 16, "batch_size": 512, "mix": 4, "prefetch": 2, "split": "all"}
    peaks = {}
    for n, path in rss_caches.items():
        out = tmp_path / f"{n}.json"
        run_helper("stream-rss", path, 380, out, json.dumps(kw))
        peaks[n] = json.loads(out.read_text())
    small, big = peaks[200_000], peaks[2_000_000]
    assert small["windows"] == big["windows"] == 380 * 512
    allowance = 48 << 20  # zarr's decode buffers and allocator arenas, independent of the cache size
    for p in (small, big):
        assert p["peak"] <= p["capacity"] + 4 * p["batch_bytes"] + allowance, p
    assert abs(big["peak"] - small["peak"]) < 16 << 20, peaks
