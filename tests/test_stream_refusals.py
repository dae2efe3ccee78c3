"""WindowStream's refusals (shardcache/read/stream.py, options.py, passes.py): epochs, saved states
from another stream or outside their epoch, a world larger than the windows, a batch that cannot
be allocated, memory budgets as numbers; and read/ raising the package's error classes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_cache, synthetic_bars
from helpers.parquet import SourceBars, build_raw, make_bars, write_parquet
from helpers.stream import rows_of

from shardcache import append_cache
from shardcache.errors import OptionError, OptionTypeError, ShardcacheError, StateError, StreamClosedError
from shardcache.read.plan import n_windows
from shardcache.read.stream import WindowStream

KW = {"split": "all", "batch_size": 64, "seed": 1, "meta": True}


def test_set_epoch_takes_non_negative_ints_only(stream_cache):
    s = WindowStream(stream_cache, 10, **KW)
    for bad in (1.7, -1, True, np.bool_(True), 10**30, 2**62, "1", None, np.float64(2.0)):
        number = isinstance(bad, int) and not isinstance(bad, bool)
        error = OptionError if number else OptionTypeError  # a bad value, or a wrong type
        with pytest.raises(
            error, match=r"^epoch=.*: (must be at least 0|must be below 2\*\*62|expected a whole number)$"
        ):
            s.set_epoch(bad)
        if bad is not None:  # plan(None) is the next pass's
            with pytest.raises(error, match="^epoch="):
                s.plan(bad)
        assert s.epoch == 0  # nothing changed
    other = WindowStream(stream_cache, 10, **KW)
    s.set_epoch(np.int64(3))
    other.set_epoch(3)
    assert s.epoch == 3 and [t.index.tolist() for t in s] == [t.index.tolist() for t in other]
    big = 2**62 - 1  # the largest epoch: its shuffle is as good as any
    s.set_epoch(big)
    assert s.epoch == big and sum(len(t.x) for t in s) == s.plan(0).n_windows


def _head(stream, n):
    it = iter(stream)
    return rows_of(stream.cache, [next(it) for _ in range(n)])


@pytest.mark.parametrize(
    "field, other",
    [
        ("seed", {"seed": 2}),
        ("shuffle", {"shuffle": False}),
        ("mix", {"mix": 2}),
        ("batch_size", {"batch_size": 32}),
        ("drop_last", {"drop_last": True}),
        ("seq_len", {"seq_len": 11}),
        ("horizon", {"horizon": 2}),
        ("stride", {"stride": 2}),
        ("split", {"split": "train"}),
    ],
)
def test_a_state_from_another_stream_is_refused_naming_the_field(stream_cache, field, other):
    s = WindowStream(stream_cache, 10, **KW)
    _head(s, 3)
    state = s.state_dict()
    kw = {**KW, "seq_len": 10, **other}
    target = WindowStream(stream_cache, **kw)
    with pytest.raises(StateError, match=rf"^state_dict is from a different stream \(.*{field}: saved ") as e:
        target.load_state_dict(state)
    assert isinstance(e.value, ValueError) and target.state_dict()["history"] == []  # nothing loaded


def _parquet_bars(tmp_path):
    """One symbol's minute bars in two Parquet files: the first 500 bars, then the next 300."""
    bars = make_bars({"ES": 800}, n_features=2, seed=4, gaps=0)["ES"]
    first = write_parquet(tmp_path / "a.parquet", {"ES": SourceBars(bars.ts[:500], bars.values[:500])})
    later = write_parquet(tmp_path / "b.parquet", {"ES": SourceBars(bars.ts[500:], bars.values[500:])})
    return first, later


def test_a_state_from_another_build_or_before_an_append_to_its_windows_is_refused(tmp_path):
    first, later = _parquet_bars(tmp_path)
    out = tmp_path / "c.zarr"
    build_raw(first, out, shard_rows=128, chunk_rows=64)
    other = build_raw(first, tmp_path / "other.zarr", shard_rows=128, chunk_rows=64, max_gap="2h")
    kw = {"split": "all", "batch_size": 16, "seed": 0}
    s = WindowStream(out, 20, **kw)
    it = iter(s)
    next(it)
    state = json.loads(json.dumps(s.state_dict()))
    assert state["cache"]["windows"].startswith("480 #")
    with pytest.raises(
        StateError,
        match=r"^state_dict cannot resume on .*other\.zarr: it is another build than the one the state was saved on",
    ) as e:
        WindowStream(other, 20, **kw).load_state_dict(state)  # another build of the same bars
    assert "resume at the next epoch with stream.set_epoch(1), or from the start" in str(e.value)
    append_cache([later], out, progress=False)
    grown = WindowStream(out, 20, **kw)
    with pytest.raises(
        StateError,
        match=r"c\.zarr: the cache's windows changed since it was saved \(480 then, 780 now: an append added",
    ):
        grown.load_state_dict(state)
    assert grown.state_dict()["history"] == []  # nothing loaded
    old = {**state, "cache": "500 bars #29273e803d26"}  # how shardcache 0.2 named a cache
    with pytest.raises(StateError, match=r"saved by an earlier shardcache, which names a cache by its bar count"):
        WindowStream(out, 20, **kw).load_state_dict(old)


def test_a_state_saved_before_the_cache_field_still_resumes(stream_cache):
    s = WindowStream(stream_cache, 10, **KW)
    whole = rows_of(s.cache, WindowStream(stream_cache, 10, **KW))
    head = _head(s, 5)
    state = s.state_dict()
    del state["cache"]  # what a state_dict of shardcache 0.1.0 holds
    r = WindowStream(stream_cache, 10, **KW)
    r.load_state_dict(state)
    rest = rows_of(r.cache, r)
    assert torch.equal(torch.cat(head + rest), torch.cat(whole))


@pytest.mark.parametrize(
    "history, match",
    [
        ([[1, 10**6]], r"checkpoint 1 has 1000000 batches delivered per rank at world size 1, but that part"),
        ([[1, 3], [2, 10**6]], r"checkpoint 2 has 1000000 batches delivered per rank at world size 2"),
        ([[2, "n"]], r"is not \[\[world, batches\], \.\.\.\]"),
        ([[2, 1.5]], r"is not \[\[world, batches\]"),
        ([[True, 1]], r"is not \[\[world, batches\]"),
        ([[0, 1]], r"world >= 1, batches >= 0"),
        ([[10**9, 1]], r"world size 1000000000 has more ranks than the [\d,]+ windows"),
        ("x", r"is not \[\[world, batches\]"),
        ([[1, 1]] * 9, r"a resume can chain 8 checkpoints of one epoch, not 9"),
    ],
)
def test_a_history_beyond_its_epoch_is_refused(stream_cache, history, match):
    s = WindowStream(stream_cache, 10, **KW)
    state = {**s.state_dict(), "history": history}
    with pytest.raises(StateError, match=match):
        s.load_state_dict(state)
    n = s.n_batches
    s.load_state_dict({**state, "history": [[1, n - 1]]})  # the last batch left: a position inside the epoch
    assert len(list(s)) == 1


@pytest.mark.parametrize(
    "state, error, match",
    [
        (None, OptionTypeError, r"^load_state_dict takes a dict made by WindowStream.state_dict\(\), not NoneType$"),
        ([("epoch", 0)], OptionTypeError, r"not list$"),
        ({}, StateError, r"^state_dict has no epoch or history: not a WindowStream state_dict$"),
        ({"epoch": -1}, StateError, r"^state_dict epoch -1: must be an int >= 0"),
        ({"epoch": 1.5}, StateError, r"^state_dict epoch 1.5: must be an int >= 0"),
        ({"epoch": 10**30}, StateError, r"^state_dict epoch 10{30}: must be an int >= 0 \(below 2\*\*62\)$"),
    ],
)
def test_a_state_that_is_not_one_gets_a_clear_error(stream_cache, state, error, match):
    s = WindowStream(stream_cache, 10, **KW)
    if isinstance(state, dict) and state:
        state = {**s.state_dict(), **state}
    with pytest.raises(error, match=match):
        s.load_state_dict(state)


def test_a_world_larger_than_the_windows_is_refused_up_front(monkeypatch, stream_cache):
    n = WindowStream(stream_cache, 10, **KW).plan().n_windows
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "100000")
    msg = rf"^world_size=100000: more ranks than the {n:,} windows of .*bars\.zarr: every rank would get no batch"
    with pytest.raises(OptionError, match=msg):
        WindowStream(stream_cache, 10, **KW)
    resident = WindowStream(stream_cache, 10, memory_budget="1GiB", **KW)  # plans nothing when made
    with pytest.raises(OptionError, match=msg):
        iter(resident)
    with pytest.raises(OptionError, match=msg):
        resident.loader(1)
    monkeypatch.setenv("WORLD_SIZE", str(n))  # as many ranks as windows: one window each
    monkeypatch.setenv("RANK", str(n - 1))
    s = WindowStream(stream_cache, 10, **KW)
    assert [len(b.x) for b in s] == [1]
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(OptionError, match="^WORLD_SIZE='two': the environment variable must be an integer$"):
        WindowStream(stream_cache, 10, **KW)


def test_a_batch_size_above_the_windows_makes_one_batch_of_them_all(stream_cache):
    """``batch_size=10**12`` failed with ``OSError: Cannot allocate memory`` from mmap: buffers are
    sized by the windows a batch can hold, not by ``batch_size``."""
    kw = {**KW, "batch_size": 10**12}
    s = WindowStream(stream_cache, 10, **kw)
    (b,) = list(s)
    assert len(b.x) == s.plan().n_windows == s.batch_windows
    (w,) = list(WindowStream(stream_cache, 10, **kw).loader(1))  # a worker's ring: the same bound
    assert torch.equal(w.index, b.index) and torch.equal(w.x, b.x)


def test_a_batch_that_cannot_be_allocated_is_refused_up_front(tmp_path):
    bars = synthetic_bars(2_000_000, 2, n_symbols=1, gaps=0, short=0, seed=0, compressible=True)
    bars.segment_split[:] = 0
    bars.split_names = ["all"]
    cache = make_cache(tmp_path / "long.zarr", bars, shard_rows=1 << 18, chunk_rows=1 << 16)
    windows = n_windows(cache, 1_000_000)
    assert windows > 10**5
    want = rf"^batch_size=2000000: a batch of {windows:,} windows is [\d,.]+ GiB \(8,000,008 B each\), more than the"
    with pytest.raises(OptionError, match=want + r" [\d,.]+ GiB of cpu memory available: lower batch_size$"):
        WindowStream(cache, 1_000_000, batch_size=2_000_000)  # 7.3 TiB in one batch


@pytest.mark.parametrize(
    "given, bytes_",
    [
        (1e9, 10**9),
        (torch.tensor(10**9), 10**9),
        (np.float32(2**20), 2**20),
        (2.0e6, 2 * 10**6),
    ],
)
def test_a_memory_budget_is_any_whole_number_of_bytes(stream_cache, given, bytes_):
    assert WindowStream(stream_cache, 10, split="all", memory_budget=given).loading.memory_budget == bytes_


@pytest.mark.parametrize(
    "given, error, match",
    [
        (1.5, OptionError, r"^memory_budget=1\.5: 1\.5 is not a whole number of bytes; give bytes"),
        (1e9 + 0.5, OptionError, r"1000000000\.5 is not a whole number of bytes"),
        (float("inf"), OptionError, r"inf is not a whole number of bytes"),
        (float("nan"), OptionError, r"nan is not a whole number of bytes"),
        (torch.tensor(2.5), OptionError, r"^memory_budget=tensor\(2\.5000\): 2\.5 is not a whole number of bytes"),
        (-5, OptionError, r"^memory_budget=-5: must be a positive number of bytes"),
        (torch.tensor([10**9]), OptionTypeError, r"a tensor or array must be 0-d \(one number\)"),
        (True, OptionTypeError, r"^memory_budget=True: a bool is not a number of bytes"),
        ([10**9], OptionTypeError, r"^memory_budget=\[1000000000\]: list is not a number of bytes"),
        ("lots", OptionError, r"^memory_budget='lots': give bytes \(an int such as 2_000_000_000\), a size such as"),
    ],
)
def test_a_memory_budget_that_is_not_one_says_what_is_wrong(stream_cache, given, error, match):
    with pytest.raises(error, match=match):
        WindowStream(stream_cache, 10, split="all", memory_budget=given)


def test_read_errors_are_the_package_classes_naming_the_option(stream_cache):
    with pytest.raises(OptionError) as e:
        WindowStream(stream_cache, 10, split="all", batch_size=0)
    assert e.value.option == "batch_size" and e.value.flag() == "--batch-size 0: must be at least 1"
    with pytest.raises(OptionError) as e:
        WindowStream(stream_cache, 10, split="all", features=["nope"])
    assert e.value.option == "features"
    with pytest.raises(OptionError, match="^split=None: .* has splits train, val, test") as e:
        WindowStream(stream_cache, 10)
    s = WindowStream(stream_cache, 10, split="all")
    with pytest.raises(OptionError, match="^in_order=False: loader"):
        s.loader(1, in_order=False)
    with pytest.raises(OptionTypeError, match="loader\\(\\) sets batch_size itself"):
        s.loader(1, batch_size=3)
    it = iter(s)
    next(it)
    s.close()
    with pytest.raises(StreamClosedError, match="closed"):
        next(it)
    with pytest.raises(StreamClosedError, match="^WindowStream is closed$"):
        iter(s)
    assert all(issubclass(c, ShardcacheError) for c in (OptionError, OptionTypeError, StateError, StreamClosedError))


def test_read_raises_no_bare_builtin_errors():
    """Library code raises the classes of ``shardcache.errors``; ``AssertionError`` marks a broken
    invariant, ``IndexError`` an index out of range (Python's own contract for ``ds[i]``)."""
    read = Path(__file__).resolve().parents[1] / "shardcache" / "read"
    bare = []
    for path in sorted(read.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError", "RuntimeError", "KeyError"):
                    bare.append(f"{path.name}:{node.lineno} {exc.id}")
    assert bare == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"seed": -1}, OptionError, r"^seed=-1: must be at least 0$"),
        ({"seed": 1.5}, OptionTypeError, r"^seed=1\.5: expected a whole number$"),
        ({"seed": 2**64}, OptionError, r"^seed=18446744073709551616: must be below 2\*\*62$"),
        ({"device": "gpu"}, OptionError, r"^device='gpu': not a torch device \("),
        ({"split": 3}, OptionTypeError, r"^split=3: must be a split name \(a str\) or 'all'$"),
    ],
)
def test_other_settings_are_refused_in_one_line_naming_them(stream_cache, kwargs, error, match):
    with pytest.raises(error, match=match) as e:
        WindowStream(stream_cache, 10, **{"split": "all", **kwargs})
    assert "\n" not in str(e.value)
    with pytest.raises(OptionError, match=r"^num_workers=-1: must be at least 0$"):
        WindowStream(stream_cache, 10, split="all").loader(-1)
