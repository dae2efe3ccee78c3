"""Horizons in market time (``horizon="5min"``, ``shardcache.format.horizons``): every served target is the
as-of bar of an oracle read from plain zarr (``root["segments"]``, ``symbols/<i>/time`` and ``features``),
every valid window is served once (in-process, resident, through DataLoader workers, resumed, from several
caches, indexed by ``WindowDataset``), and each bad time horizon is refused in one line naming ``horizon``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader

from shardcache.errors import OptionError
from shardcache.format.cache import open_cache
from shardcache.format.durations import parse_duration
from shardcache.format.windows import WindowSpec, n_windows, valid_ranges
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.read.stream import WindowDataset, WindowStream

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dbn"
BUILD = {"shard_rows": 256, "chunk_rows": 64, "progress": False}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """Three days of the sample (minutes without trades have no bar), split, in 256-row shards."""
    root = tmp_path_factory.mktemp("timed")
    out = root / "c.zarr"
    build_cache(make_sample(root / "dbn", days=3, seed=3), out, split="train=0.8,val=0.1,test=0.1", **BUILD)
    return out


class Oracle:
    """Valid windows and their as-of targets from plain zarr: ``{(symbol, local start): [target rows]}``."""

    def __init__(
        self,
        path: Path,
        seq_len: int,
        horizons: tuple[str, ...],
        stride: int,
        split: int | None,
        before: int | None = None,
    ) -> None:
        """``split``: the id of the split read (None: all); ``before``: read each segment's bars before that
        time instead (a ``split_times`` cut's first split)."""
        root = zarr.open_group(str(path), mode="r")
        self.times = {i: root[f"symbols/{i}/time"][...] for i in range(len(root["symbols"]))}
        self.features = {i: root[f"symbols/{i}/features"][...] for i in self.times}
        self.seq_len, self.windows, self.no_bar, self.crossing = seq_len, {}, 0, 0
        hs = [parse_duration(h) for h in horizons]
        for sym, a, b, sp in root["segments"][...].tolist():
            if split is not None and sp != split:
                continue
            t = self.times[sym]
            if before is not None:
                b = min(b, int(np.searchsorted(t, before)))
            for p in range(a, b - seq_len + 1, stride):
                last = p + seq_len - 1
                targets = [int(np.searchsorted(t, t[last] + h, side="right")) - 1 for h in hs]
                known = b < len(t) or all(t[last] + h <= t[b - 1] for h in hs)  # no later bar may be appended
                if all(last < x < b for x in targets) and known:
                    self.windows[(sym, p)] = targets
                self.no_bar += any(x == last for x in targets)
                self.crossing += any(x >= b for x in targets) and all(x > last for x in targets)

    def check(self, batch, multi: bool) -> list[tuple[int, int]]:
        """Assert every window of a ``MetaBatch`` against the oracle; its ``(symbol, start)`` keys."""
        keys = [tuple(k) for k in batch.index.tolist()]
        y = batch.y if multi else batch.y[:, None]
        tt = batch.target_time if multi else batch.target_time[:, None]
        for i, (sym, p) in enumerate(keys):
            targets, f, t = self.windows[(sym, p)], self.features[sym], self.times[sym]
            last = p + self.seq_len - 1
            assert np.array_equal(batch.x[i].numpy(), f[p : last + 1]) and int(batch.time[i]) == t[last]
            assert np.array_equal(y[i].numpy(), f[targets]) and tt[i].tolist() == t[targets].tolist()
        return keys


def _once(oracle: Oracle, keys: list[tuple[int, int]]) -> None:
    assert len(keys) == len(set(keys)) == len(oracle.windows) and set(keys) == set(oracle.windows)


def test_time_horizon_targets_are_the_asof_bars_of_plain_zarr(demo):
    oracle = Oracle(demo, 10, ("5min",), 1, 0)
    assert oracle.no_bar and oracle.crossing  # windows dropped for both reasons: the counts below must leave them out
    assert n_windows(open_cache(demo), 10, horizon="5min", split="train") == len(oracle.windows)
    ranges = valid_ranges(open_cache(demo), WindowSpec(10, horizon="5min"), split="train")
    want = sorted(oracle.windows)
    got = sorted(zip(*open_cache(demo).rows.locate(ranges.starts())))
    assert [(int(s), int(p)) for s, p in got] == want
    stream = WindowStream(demo, 10, horizon="5min", split="train", batch_size=64, meta=True, seed=3)
    _once(oracle, [k for b in stream for k in oracle.check(b, multi=False)])
    assert stream.state_dict()["horizon"] == "5min"


def test_a_sequence_of_time_horizons_with_stride_and_the_dataset(demo):
    oracle = Oracle(demo, 7, ("1min", "5min"), 3, None)
    stream = WindowStream(demo, 7, horizon=("1min", "5min"), stride=3, split="all", batch_size=50, meta=True)
    _once(oracle, [k for b in stream for k in oracle.check(b, multi=True)])
    ds = WindowDataset(demo, 7, horizon=["1min", "5min"], stride=3, split="all", meta=True)
    assert len(ds) == len(oracle.windows)
    order = np.random.default_rng(0).permutation(len(ds))
    _once(oracle, [k for i in range(0, len(ds), 97) for k in oracle.check(ds[order[i : i + 97]], multi=True)])


def test_time_horizons_through_two_dataloader_workers(demo):
    oracle = Oracle(demo, 10, ("5min",), 2, 2)
    with WindowStream(demo, 10, horizon="5min", stride=2, split="test", batch_size=16, meta=True) as stream:
        keys = [k for b in stream.loader(num_workers=2) for k in oracle.check(b, multi=False)]
    _once(oracle, keys)
    ds = WindowDataset(demo, 10, horizon="5min", stride=2, split="test", meta=True)
    loader = DataLoader(ds, batch_size=32, num_workers=2, collate_fn=_stack)
    _once(oracle, [k for b in loader for k in oracle.check(b, multi=False)])


def _stack(samples):
    return type(samples[0])(*(torch.stack(f) for f in zip(*samples)))


def test_a_resident_stream_serves_each_window_once_every_epoch(demo):
    oracle = Oracle(demo, 10, ("1min", "5min"), 1, 0)
    stream = WindowStream(
        demo, 10, horizon=("1min", "5min"), split="train", batch_size=64, meta=True, memory_budget=1 << 30
    )
    assert stream.resident
    for _ in range(2):
        _once(oracle, [k for b in stream for k in oracle.check(b, multi=True)])


def test_a_resumed_time_horizon_stream_serves_the_rest(demo):
    kw = {"horizon": "5min", "split": "train", "batch_size": 32, "meta": True, "seed": 1}
    oracle = Oracle(demo, 10, ("5min",), 1, 0)
    first = WindowStream(demo, 10, **kw)
    it = iter(first)
    head = [k for _ in range(4) for k in oracle.check(next(it), multi=False)]
    state = first.state_dict()
    with pytest.raises(Exception, match="horizon"):
        WindowStream(demo, 10, **{**kw, "horizon": "6min"}).load_state_dict(state)
    rest = WindowStream(demo, 10, **kw)
    rest.load_state_dict(state)
    _once(oracle, head + [k for b in rest for k in oracle.check(b, multi=False)])


def test_several_caches_at_a_time_horizon(demo, tmp_path):
    other = tmp_path / "other.zarr"
    build_cache(make_sample(tmp_path / "dbn", days=2, seed=8), other, split="train=0.8,val=0.1,test=0.1", **BUILD)
    oracles = [Oracle(p, 10, ("5min",), 1, None) for p in (demo, other)]
    stream = WindowStream([demo, other], 10, horizon="5min", split="all", batch_size=64, meta=True)
    keys: list[list[tuple[int, int]]] = [[], []]
    for b in stream:
        for k in (0, 1):
            mine = b.source == k
            part = type(b)(*(f[mine] for f in b))
            keys[k] += oracles[k].check(part, multi=False)
    for oracle, k in zip(oracles, keys):
        _once(oracle, k)


def test_a_time_horizon_with_split_times_cuts_segments_at_those_times(demo):
    cut = int(np.datetime64("2023-01-03T12:00", "ns").astype(np.int64))
    oracle = Oracle(demo, 10, ("5min",), 1, None, before=cut)
    assert oracle.crossing
    stream = WindowStream(
        demo, 10, horizon="5min", split="train", split_times="val=2023-01-03T12:00", batch_size=64, meta=True
    )
    _once(oracle, [k for b in stream for k in oracle.check(b, multi=False)])


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared DBN samples not present")
@pytest.mark.parametrize(
    ("name", "horizon", "served"),
    [
        ("test_data.ohlcv-1m.dbn", "1min", 1),  # 2 bars a minute apart
        ("test_data.ohlcv-1m.v3.dbn.zst", "60s", 1),  # 5min would pass the last bar: no window
        ("test_data.bbo-1m.v3.dbn.zst", "90s", 2),  # 4 bars a minute apart: 90s past the third is after the last
        ("test_data.ohlcv-1s.dbn", "1s", 1),
    ],
)
def test_time_horizons_on_the_shared_databento_samples(name, horizon, served, tmp_path):
    out = tmp_path / "c.zarr"
    build_cache([SHARED / name], out, normalize="none", **BUILD)
    oracle = Oracle(out, 1, (horizon,), 1, None)
    assert oracle.windows and served in (None, len(oracle.windows))
    stream = WindowStream(out, 1, horizon=horizon, split="all", batch_size=2, meta=True)
    _once(oracle, [k for b in stream for k in oracle.check(b, multi=False)])
    ds = WindowDataset(out, 1, horizon=(horizon,), split="all", meta=True)
    _once(oracle, oracle.check(ds[np.arange(len(ds))], multi=True))  # a sequence of one keeps its axis


@pytest.mark.parametrize(
    ("horizon", "problem"),
    [
        ("0min", "horizon='0min': a time horizon must be longer than 0"),
        ("5 parsecs", "horizon='5 parsecs': not a duration: bad duration"),
        ("1", "horizon='1': not a duration"),  # a bare number in a string has no unit
        ((1, "5min"), r"horizon=\(1, '5min'\): mixes bars and durations"),
        (["5min", "soon"], "horizon='soon': not a duration"),
    ],
)
def test_a_bad_time_horizon_is_refused_in_one_line(demo, horizon, problem):
    for make in (
        lambda: WindowSpec(10, horizon=horizon),
        lambda: WindowStream(demo, 10, horizon=horizon, batch_size=8),
        lambda: WindowDataset(demo, 10, horizon=horizon),
    ):
        with pytest.raises(OptionError, match=problem) as err:
            make()
        assert "\n" not in str(err.value)


def test_a_time_horizon_past_every_segment_says_why(demo):
    with pytest.raises(OptionError, match=r"horizon='30D': no window: a time horizon's target .* lasts .* bars") as err:
        WindowStream(demo, 10, horizon="30D", split="val", batch_size=8)
    assert "\n" not in str(err.value)
    assert n_windows(open_cache(demo), 10, horizon="30D", split="val") == 0


def test_an_append_never_changes_a_served_time_horizon_target(tmp_path):
    files = make_sample(tmp_path / "dbn", days=3, seed=5)
    out = tmp_path / "c.zarr"
    build_cache(files[:2], out, normalize="none", max_gap="2h", **BUILD)  # one segment a symbol, over the night

    def served() -> dict[tuple[int, int], int]:
        ds = WindowDataset(out, 10, horizon="90min", split="all", meta=True)  # longer than the hour's break
        batch = ds[np.arange(len(ds))]
        return dict(zip(map(tuple, batch.index.tolist()), map(int, batch.target_time)))

    before = served()
    assert before
    append_cache(files[2:], out, progress=False)
    after = served()
    assert len(after) > len(before)
    assert {k: after.get(k) for k in before} == before  # every window served before, with the same target
