"""Window arithmetic in one module (``shardcache.format.windows``): a window's input and target rows,
the valid starts of a cache or of a segment table not written yet, and every reader (the stream
in-process, resident and through workers, ``WindowDataset``) reading exactly the rows it names.

``stream_cache``'s feature 0 is each bar's row number, so a batch names the rows it was read from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import brute_starts
from helpers.stream import window_rows

from shardcache.errors import OptionError
from shardcache.format.windows import SegmentTable, WindowSpec, n_windows, valid_ranges
from shardcache.read.stream import WindowDataset, WindowStream


def test_a_windows_rows_and_its_targets():
    starts = np.array([0, 5, 40], dtype=np.int64)
    one = WindowSpec(4, horizon=2)
    assert one.last_step == 3 and one.target_steps.tolist() == [5] and not one.multi
    assert one.input_rows(starts).tolist() == [[0, 1, 2, 3], [5, 6, 7, 8], [40, 41, 42, 43]]
    assert one.target_rows(starts).tolist() == [5, 10, 45]  # p + seq_len - 1 + h
    assert one.y_shape(3, 2) == (3, 2) and one.span == 6 and one.block_rows(512) == 517
    many = WindowSpec(4, horizon=(0, 3))
    assert many.multi and many.target_steps.tolist() == [3, 6]
    assert many.target_rows(starts).tolist() == [[3, 6], [8, 11], [43, 46]]
    assert many.y_shape(3, 2) == (3, 2, 2) and many.span == 7
    assert WindowSpec(4, horizon=(2,)).y_shape(1, 5) == (1, 1, 5)  # a sequence of one keeps its axis


def test_a_segment_table_counts_as_its_cache_does(stream_cache, stream_bars):
    """The build's summary counts a table not written yet: the same starts as the cache it becomes."""
    table = SegmentTable(
        segments=stream_cache.segments, segment_split=stream_cache.segment_split, split_names=stream_cache.split_names
    )
    for split in (None, "all", *stream_cache.split_names):
        for spec in (WindowSpec(9), WindowSpec(5, horizon=(0, 4), stride=3)):
            got, want = valid_ranges(table, spec, split=split), valid_ranges(stream_cache, spec, split=split)
            assert np.array_equal(got.starts(), want.starts()) and got.span == want.span == spec.span
    want = brute_starts(stream_bars, 9, 1, 2, "val")
    assert np.array_equal(valid_ranges(table, 9, 1, 2, "val").starts(), want) and len(want)
    assert n_windows(table, 9, stride=2, split="val") == len(want)


def test_an_unknown_split_of_a_table_is_named(stream_bars):
    table = SegmentTable(
        segments=stream_bars.segments, segment_split=stream_bars.segment_split, split_names=stream_bars.split_names
    )
    with pytest.raises(OptionError, match=r"split='nope': no such split; the table has train, val, test"):
        valid_ranges(table, 9, split="nope")


def test_a_shards_windows_read_at_most_its_block_rows(stream_cache):
    spec = WindowSpec(30, horizon=(1, 7))
    r = valid_ranges(stream_cache, spec, split="all")
    shard = r.starts() // stream_cache.shard_rows
    last_end = r.starts() + spec.span  # one past each window's last target row
    reach = last_end - shard * stream_cache.shard_rows
    assert reach.max() <= spec.block_rows(stream_cache.shard_rows) and reach.max() > stream_cache.shard_rows


def _check(cache, spec: WindowSpec, starts: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> int:
    assert np.array_equal(x[..., 0].numpy(), spec.input_rows(starts).astype(np.float32))
    assert np.array_equal(y[..., 0].numpy(), spec.target_rows(starts).astype(np.float32))
    return len(starts)


@pytest.mark.parametrize("horizon", [2, (0, 3)])
def test_every_reader_reads_the_rows_the_window_module_names(stream_cache, horizon):
    """In-process, resident (a second pass gathers from the arena), DataLoader workers and the
    map-style dataset: inputs and targets are the rows ``input_rows``/``target_rows`` name."""
    spec = WindowSpec(7, horizon=horizon, stride=2)
    total = n_windows(stream_cache, spec, split="train")
    kw = {"split": "train", "batch_size": 50, "meta": True}
    with WindowStream(stream_cache, spec, memory_budget="1GiB", **kw) as resident:
        assert resident.resident
        for _ in range(2):
            assert (
                sum(_check(stream_cache, spec, window_rows(stream_cache, b.index), b.x, b.y) for b in resident) == total
            )
    with WindowStream(stream_cache, spec, **kw) as s:
        assert sum(_check(stream_cache, spec, window_rows(stream_cache, b.index), b.x, b.y) for b in s) == total
        got = sum(_check(stream_cache, spec, window_rows(stream_cache, b.index), b.x, b.y) for b in s.loader(2))
        assert got == total
    ds = WindowDataset(stream_cache, spec, split="train")
    rows = np.array([ds.row(i) for i in range(len(ds))])
    assert _check(stream_cache, spec, rows, *ds[:]) == total == len(ds)
    x, y = ds[5]
    assert _check(stream_cache, spec, rows[5:6], x[None], y[None]) == 1
