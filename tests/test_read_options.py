"""Read options refused or taken the same way wherever they are given: horizons (an int or a
sequence, 0 allowed in both), settings beside a ``WindowSpec``, integer counts, and the bounded
bar times behind ``meta=True``."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import numpy.ma
import pytest
import torch
from helpers import make_cache, synthetic_bars

from shardcache.errors import OptionError, OptionTypeError
from shardcache.read import options
from shardcache.read.options import default_decoders
from shardcache.read.plan import WindowSpec, n_windows, valid_ranges
from shardcache.read.stream import WindowDataset, WindowStream
from shardcache.tuning import TIME_CHUNKS


def test_horizon_zero_is_the_last_input_bar_as_an_int_or_in_a_sequence(stream_cache):
    one = WindowStream(stream_cache, 16, horizon=0, split="all", batch_size=64, shuffle=False, target=["f2"])
    many = WindowStream(stream_cache, 16, horizon=(0, 3), split="all", batch_size=64, shuffle=False, target=["f2"])
    assert WindowSpec(16, horizon=(0,)).horizon == (0,) and WindowSpec(16, horizon=0).horizon == 0
    x, y = next(iter(one))
    assert torch.equal(y[:, 0], x[:, -1, 2])  # the target column at the window's last input bar
    xm, ym = next(iter(many))
    assert ym.shape == (64, 2, 1) and torch.equal(ym[:, 0, 0], xm[:, -1, 2])
    assert n_windows(stream_cache, 16, horizon=(0,)) == n_windows(stream_cache, 16, horizon=0)


@pytest.mark.parametrize("bad", [-1, (-1,), (1, -2), (), 1.5, (1.5,), True, (True,)])
def test_a_bad_horizon_gets_the_same_one_line_error_as_int_or_sequence(stream_cache, bad):
    with pytest.raises(
        ValueError,
        match=r'^horizon=.*: must be an int >= 0, a duration such as "5min", or a non-empty sequence of either$',
    ):
        WindowSpec(16, horizon=bad)
    with pytest.raises(ValueError, match=r"^horizon="):
        WindowStream(stream_cache, 16, horizon=bad, split="all")


@pytest.mark.parametrize("beside", [{"horizon": 1}, {"stride": 1}, {"horizon": 4, "stride": 2}, {"features": ["f0"]}])
def test_a_setting_beside_a_window_spec_is_refused_even_at_its_default(stream_cache, beside):
    spec = WindowSpec(12, horizon=4, stride=2)
    names = ", ".join(beside)
    with pytest.raises(TypeError, match=rf"^{names} given beside a WindowSpec: pass them inside the WindowSpec$"):
        WindowStream(stream_cache, spec, split="all", **beside)
    with pytest.raises(TypeError, match="beside a WindowSpec"):
        WindowDataset(stream_cache, spec, split="all", **beside)
    if "features" not in beside:
        with pytest.raises(TypeError, match="beside a WindowSpec"):
            n_windows(stream_cache, spec, **beside)
        with pytest.raises(TypeError, match="beside a WindowSpec"):
            valid_ranges(stream_cache, spec, beside.get("horizon"), beside.get("stride"))
    assert WindowStream(stream_cache, spec, split="all").spec == spec  # alone it is taken as it is


@pytest.mark.parametrize(
    "name,value",
    [
        ("batch_size", 2.5),
        ("batch_size", True),
        ("batch_size", "256"),
        ("batch_size", 0),
        ("mix", 2.0),
        ("prefetch", 1.5),
        ("prefetch", -1),
        ("decoders", 1.5),
        ("seq_len", 16.0),
        ("stride", 2.5),
    ],
)
def test_counts_are_refused_unless_whole_numbers(stream_cache, name, value):
    """One checker (``format.numbers.whole_number``): a float, a bool or a string is a wrong type, never
    truncated; a whole number below the option's least a bad value naming the option."""
    kwargs = {"seq_len": 16, "split": "all", name: value}
    minimum = 0 if name in ("prefetch", "decoders") else 1
    if isinstance(value, int) and not isinstance(value, bool):
        error, message = OptionError, f"must be at least {minimum}"
    else:
        error, message = OptionTypeError, "expected a whole number"
    with pytest.raises(error, match=rf"^{name}={value!r}: {message}$"):
        WindowStream(stream_cache, **kwargs)


def test_counts_given_as_numpy_ints_are_taken(stream_cache):
    s = WindowStream(stream_cache, np.int64(16), split="all", batch_size=np.int32(100), mix=np.int64(2))
    assert (s.seq_len, s.order.batch_size, s.order.mix) == (16, 100, 2) and len(next(iter(s)).x) == 100


def test_meta_keeps_only_a_few_chunks_of_bar_times(tmp_path):
    """A whole epoch with ``meta=True`` over a long symbol: every time is right, and the cache holds
    at most ``TIME_CHUNKS`` chunks of its ``time`` array, not the whole array."""
    bars = synthetic_bars(120_000, 2, n_symbols=1, gaps=2, short=0, seed=3, shard_rows=2048)
    cache = make_cache(tmp_path / "long.zarr", bars, shard_rows=2048, chunk_rows=512)
    whole = cache.bars_per_symbol[0] * 8
    plain = WindowStream(cache, 8, split="all", batch_size=2048, mix=2)
    for _ in plain:  # opens the arrays and decoders first, so only the times differ below
        pass
    plain.close()
    del plain
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        stream = WindowStream(cache, 8, split="all", batch_size=2048, mix=2, meta=True)
        served = 0
        for b in stream:
            start = b.x[:, 0, 0].numpy().astype(np.int64)  # feature 0 is the bar's row
            assert np.array_equal(b.time.numpy(), bars.ts[start + 7])
            served += len(start)
        stream.close()
        del stream, b
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert served == n_windows(cache, 8)
    assert held < TIME_CHUNKS * 2048 * 8 + whole // 4 < whole, (held, whole)


@pytest.mark.parametrize(
    "cores,readers,want", [({0}, 1, 1), ({0, 1}, 1, 2), (set(range(16)), 1, 8), (set(range(16)), 4, 4), ({0, 1}, 4, 1)]
)
def test_default_decoders_follow_the_cpu_affinity(monkeypatch, stream_cache, cores, readers, want):
    """Unset ``decoders`` is one per core the process may run on (``taskset``, cpusets), not the
    machine's count, shared among DataLoader workers, 1 to ``MAX_DECODERS``."""
    monkeypatch.setattr(options.os, "sched_getaffinity", lambda pid: cores)
    monkeypatch.setattr(options.os, "cpu_count", lambda: 64)
    assert default_decoders(readers) == want
    if readers == 1:
        assert WindowStream(stream_cache, 16, split="all").decoders == want
        assert WindowStream(stream_cache, 16, split="all", decoders=3).decoders == 3


def test_a_pinned_process_streams_with_one_decoder(stream_cache):
    """A real process pinned to one core (as ``taskset -c 0``) gets one decoder and every window."""
    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from shardcache import WindowStream; s = WindowStream(sys.argv[1], 16, split='all', batch_size=97); "
        "print(s.decoders, sum(len(b.x) for b in s), s.read_spec.ranges.total())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, stream_cache.url],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    decoders, served, total = map(int, out.stdout.split())
    assert decoders == 1 and served == total
