"""Several caches, one stream (``shardcache/read/sources.py``, ``mixture.py``; issue 23): real caches
built apart from the DBN sample (ES and NQ), streamed as one in-process, through DataLoader workers
and (slow tier) gloo ranks; every single-cache guarantee checked for the mix, and a single cache
checked against the batches recorded before mixing existed."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import brute_starts, make_cache, synthetic_bars
from helpers.recorded import CASES, RECORD, case_digests, recorded_caches
from helpers.stream import check_windows, ddp_mix_rank, keys_of
from torch.utils.data import DataLoader

from shardcache import build_cache
from shardcache.errors import CacheError, OptionError, OptionTypeError, SeveralCachesError, StateError
from shardcache.format.cache import Cache
from shardcache.ingest.sample import make_sample
from shardcache.read.dataset import WindowDataset
from shardcache.read.resident import resident_bytes
from shardcache.read.stream import WindowStream

DATES = "val=2023-01-06,test=2023-01-09"  # cuts every cache shares: built with the same --split dates
BUILD = {"shard_rows": 1024, "chunk_rows": 128, "workers": 1, "progress": False}
KW = {"split": "train", "batch_size": 64, "meta": True}


@pytest.fixture(scope="module")
def dbn(tmp_path_factory):
    """Six days of the sample, ES and NQ in files of their own (two vendors' inputs)."""
    root = tmp_path_factory.mktemp("mixdbn")
    return {sym: make_sample(root / sym, days=6, symbols=[sym], seed=1) for sym in ("ESH3", "NQH3")}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, dbn) -> list[Cache]:
    """An ES and an NQ cache built apart, each z-scored with its own statistics, cut at the same dates."""
    root = tmp_path_factory.mktemp("pair")
    return [build_cache(dbn[s], root / f"{s}.zarr", split=DATES, **BUILD) for s in ("ESH3", "NQH3")]


def stream_keys(stream) -> list[np.ndarray]:
    return [keys_of([b]) for b in stream]


def one_by_one(pair, split="train", seq_len=60) -> np.ndarray:
    """Every window of each cache on its own, tagged with the cache's place in ``pair``."""
    parts = []
    for k, cache in enumerate(pair):
        keys = keys_of(WindowStream(cache, seq_len, split=split, meta=True, shuffle=False))
        parts.append(np.column_stack([np.full(len(keys), k), keys[:, 1:]]))
    return np.concatenate(parts)


def rows(keys: np.ndarray) -> list[tuple[int, ...]]:
    return sorted(map(tuple, keys.tolist()))


def within(part: np.ndarray, whole: np.ndarray) -> bool:
    """Whether the windows ``part`` are a sub-multiset of ``whole``'s (a window served at most as often)."""
    have = Counter(map(tuple, whole.tolist()))
    return all(have[k] >= n for k, n in Counter(map(tuple, part.tolist())).items())


# ---- a single cache: the batches of the code before mixing --------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return recorded_caches(tmp_path_factory.mktemp("recorded")), json.loads(RECORD.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_a_single_cache_streams_the_batches_recorded_before_mixing(recorded, monkeypatch, name):
    """Batches (content and metadata), epochs and rank and resume plans as recorded at commit 1fb6635."""
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    caches, record = recorded
    case = CASES[name]
    assert case_digests(caches[case["cache"]], case) == record[name]


# ---- every window of every cache, once --------------------------------------------------------


def test_every_window_of_every_cache_once_an_epoch_shuffled_across_caches(pair):
    stream = WindowStream(pair, 60, **KW)
    batches = list(stream)
    keys = keys_of(batches)
    assert rows(keys) == rows(one_by_one(pair)) and len(set(map(tuple, keys.tolist()))) == len(keys)
    assert check_windows(pair, batches, 60) == len(keys)  # x, symbol, row and time from the window's cache
    assert all(b.source.dtype == torch.int64 and b.source.shape == (len(b.x),) for b in batches)
    mixed = [len(set(b.source.tolist())) == 2 for b in batches]
    assert sum(mixed) >= len(batches) // 4  # a pool draws from both caches: not one cache after the other
    assert np.count_nonzero(np.diff(keys[:, 0])) > 10
    assert len(stream) == stream.plan().n_batches == len(batches) == math.ceil(len(keys) / 64)
    again = keys_of(stream)
    assert rows(again) == rows(keys) and not np.array_equal(again, keys)  # the next pass: a new shuffle


@pytest.mark.parametrize("weights", [None, (0.75, 0.25)])
def test_the_order_is_the_same_in_process_and_with_two_workers(pair, weights):
    ref = stream_keys(WindowStream(pair, 60, weights=weights, **KW))
    with WindowStream(pair, 60, weights=weights, **KW) as s:
        assert all(np.array_equal(a, b) for a, b in zip(stream_keys(s.loader(2)), ref, strict=True))
    with WindowStream(pair, 60, weights=weights, **KW) as s:
        plain = stream_keys(DataLoader(s, batch_size=None, num_workers=2))
        assert all(np.array_equal(a, b) for a, b in zip(plain, ref, strict=True))


# ---- weights -------------------------------------------------------------------------------


def test_weights_serve_their_proportions_within_one_percent(pair):
    stream = WindowStream(pair, 60, weights=(0.75, 0.25), **KW)
    total = sum(n for n in (len(one_by_one([c])) for c in pair))
    for epoch in (0, 1):
        stream.set_epoch(epoch)
        source = keys_of(stream)[:, 0]
        assert len(source) == total == stream.plan().n_windows  # epoch_windows: every window, by default
        assert abs(np.mean(source == 0) - 0.75) < 0.01
    shorter = WindowStream(pair, 60, weights=(3, 1), epoch_windows=1000, **KW)
    assert np.bincount(keys_of(shorter)[:, 0]).tolist() == [750, 250] and len(shorter) == 16
    assert "weights=(3.0, 1.0)" in repr(shorter)


def test_a_cache_above_its_windows_repeats_only_after_each_was_seen_and_one_below_serves_new_subsets(pair):
    es, nq = (len(one_by_one([c])) for c in pair)
    stream = WindowStream(pair, 60, weights=(0.25, 0.75), epoch_windows=6000, **KW)
    epochs = [keys_of(stream) for _ in range(3)]  # each pass is the next epoch
    info = stream.info()
    assert [c["windows"] for c in info["caches"]] == [es, nq] and [c["per_epoch"] for c in info["caches"]] == [
        1500,
        4500,
    ]
    nq0 = [tuple(k) for k in epochs[0][epochs[0][:, 0] == 1].tolist()]
    assert len(nq0) == 4500 > nq and len(set(nq0[:nq])) == nq  # every NQ window once before any twice
    assert len(set(nq0[nq : 2 * nq])) == nq
    es_sets = [{tuple(k) for k in e[e[:, 0] == 0].tolist()} for e in epochs]
    assert all(len(s) == 1500 for s in es_sets[:1]) and es_sets[0] != es_sets[1]  # a new subset each epoch
    es_order = [tuple(k) for e in epochs[:2] for k in e[e[:, 0] == 0].tolist()]
    assert len(set(es_order[:es])) == es  # no ES window again before every ES window was served
    again = WindowStream(pair, 60, weights=(0.25, 0.75), epoch_windows=6000, **KW)
    again.set_epoch(1)
    assert np.array_equal(keys_of(again), epochs[1])  # deterministic per (seed, epoch)


# ---- resume, ranks ---------------------------------------------------------------------------


@pytest.mark.parametrize("weights,epoch_windows", [(None, None), ((0.6, 0.4), 3000)])
def test_a_resume_is_the_uninterrupted_epoch_at_any_world_size(monkeypatch, pair, weights, epoch_windows):
    kw = {**KW, "weights": weights, "epoch_windows": epoch_windows, "seed": 5}
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    whole = stream_keys(WindowStream(pair, 60, **kw))
    s = WindowStream(pair, 60, **kw)
    head = []
    for b in s.loader(2):
        head.append(keys_of([b]))
        if len(head) == 7:
            break
    state = s.state_dict()
    s.close()
    assert state["history"] == [[1, 7]] and (weights is None) == ("weights" not in state)
    rest = WindowStream(pair, 60, **kw)
    rest.load_state_dict(state)
    assert np.array_equal(np.concatenate(head + stream_keys(rest)), np.concatenate(whole))
    monkeypatch.setenv("WORLD_SIZE", "2")  # two ranks stop after 4 batches each, three go on
    seqs, states = [], []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        s = WindowStream(pair, 60, **kw)
        seqs.append(stream_keys(s))
        s.set_epoch(0)  # the same epoch again, stopped after 4 batches
        it = iter(s)
        [next(it) for _ in range(4)]
        states.append(s.state_dict())
    assert states[0] == states[1]
    both = np.concatenate([np.concatenate(q) for q in seqs])
    assert within(both, np.concatenate(whole)) and len(both) == len(np.concatenate(whole)) // 2 * 2
    monkeypatch.setenv("WORLD_SIZE", "3")
    resumed = []
    for rank in (0, 1, 2):
        monkeypatch.setenv("RANK", str(rank))
        s = WindowStream(pair, 60, **kw)
        s.load_state_dict(states[0])
        resumed.append(np.concatenate(stream_keys(s)))
    left = np.concatenate([np.concatenate(q[4:]) for q in seqs])
    assert np.array_equal(np.concatenate(resumed), left)  # what no rank delivered, once, in its order


def test_a_state_of_another_mix_is_refused_naming_what_differs(pair):
    state = WindowStream(pair, 60, weights=(0.6, 0.4), **KW).state_dict()
    with pytest.raises(StateError, match=r"weights: saved \[0.6, 0.4\], now \[0.5, 0.5\]"):
        WindowStream(pair, 60, weights=(0.5, 0.5), **KW).load_state_dict(state)
    with pytest.raises(StateError, match="weights: saved"):
        WindowStream(pair, 60, **KW).load_state_dict(state)
    plain = WindowStream(pair, 60, **KW).state_dict()
    with pytest.raises(StateError, match="cache: saved"):
        WindowStream(pair[::-1], 60, **KW).load_state_dict(plain)  # the same caches in another order
    with pytest.raises(StateError, match="cache: saved"):
        WindowStream(pair[0], 60, **KW).load_state_dict(plain)


# ---- what a mix refuses --------------------------------------------------------------------


def test_caches_with_other_features_are_refused_in_one_line_naming_the_difference(tmp_path, dbn, pair):
    names = pair[0].feature_names
    fewer = build_cache(dbn["NQH3"], tmp_path / "fewer.zarr", split=DATES, features=names[:-2], **BUILD)
    shuffled = build_cache(dbn["NQH3"], tmp_path / "shuffled.zarr", split=DATES, features=names[::-1], **BUILD)
    with pytest.raises(OptionError, match=f"fewer.zarr lacks {names[-2]}, {names[-1]}") as info:
        WindowStream([pair[0], fewer], 60, **KW)
    assert "\n" not in str(info.value) and str(info.value).startswith("caches=")
    with pytest.raises(
        OptionError, match=f"shuffled.zarr has the same features in another order .position 0: {names[-1]!r}"
    ):
        WindowStream([pair[0], shuffled], 60, **KW)
    with pytest.raises(OptionError, match=r"caches\[1\] .*ESH3.zarr is caches\[0\] .*ESH3.zarr again \(given twice\)"):
        WindowStream([pair[0], pair[0].url], 60, **KW)


def test_a_cache_without_the_split_is_refused_by_name(tmp_path, dbn, pair):
    whole = build_cache(dbn["NQH3"], tmp_path / "nosplit.zarr", **BUILD)
    with pytest.raises(CacheError, match=r"nosplit.zarr: no split 'train'; the cache has all"):
        WindowStream([pair[0], whole], 60, **KW)
    with pytest.raises(OptionError, match=r"ESH3.zarr has splits train, val, test"):
        WindowStream([whole, pair[0]], 60, meta=True)  # no split named: one cache has several


def test_split_cuts_that_differ_are_refused_naming_both_or_cut_again_at_shared_times(tmp_path, dbn):
    frac = [
        build_cache(dbn[s], tmp_path / f"{s}.zarr", split="train=0.8,val=0.1,test=0.1", **BUILD)
        for s in ("ESH3", "NQH3")
    ]
    cuts = [c.manifest.splits.cuts_ns for c in frac]
    assert cuts[0] != cuts[1]  # fractions of each cache's own bars: different times
    with pytest.raises(
        OptionError, match="ESH3.zarr's train split runs from the first bar to .* but .*NQH3.zarr's"
    ) as info:
        WindowStream(frac, 60, **KW)
    assert "\n" not in str(info.value) and "split_times=" in str(info.value) and "--split" in str(info.value)
    val_cut, test_cut = (int(np.datetime64(d, "ns").astype(np.int64)) for d in ("2023-01-06", "2023-01-09"))
    train = WindowStream(frac, 60, split_times=DATES, **KW)
    val = WindowStream(frac, 60, split="val", split_times={"val": "2023-01-06", "test": "2023-01-09"}, meta=True)
    tb, vb = list(train), list(val)
    assert max(int(b.target_time.max()) for b in tb) < val_cut  # no training target in the validation period
    first = np.concatenate([_first_times(frac, b) for b in vb])
    assert first.min() >= val_cut and max(int(b.target_time.max()) for b in vb) < test_cut
    assert set(np.concatenate([b.source.numpy() for b in tb]).tolist()) == {0, 1}
    assert "split_times" in train.state_dict()
    with pytest.raises(OptionError, match="split_times='train=0.5,val=0.5': takes the dates"):
        WindowStream(frac, 60, split_times="train=0.5,val=0.5", **KW)
    with pytest.raises(OptionError, match="split='holdout': no such split; split_times cuts train, val, test"):
        WindowStream(frac, 60, split="holdout", split_times=DATES)


def _first_times(caches, b) -> np.ndarray:
    """Each window's first bar time, read with plain zarr."""
    return np.array([int(caches[k].array(s, "time")[r]) for k, s, r in keys_of([b]).tolist()])


def test_statistics_are_per_cache_and_repr_and_info_say_whether_they_differ(tmp_path, dbn, pair):
    own = WindowStream(pair, 60, **KW)
    assert "stats='differ'" in repr(own) and own.info()["stats"] == "differ"
    assert own.info()["caches"][0]["stats"] == pair[0].stats != pair[1].stats
    frac = "train=0.8,val=0.1,test=0.1"  # fractions of ES's bars; NQ takes ES's cut times and statistics
    es = build_cache(dbn["ESH3"], tmp_path / "es.zarr", split=frac, **BUILD)
    nq = build_cache(dbn["NQH3"], tmp_path / "nq.zarr", split=frac, stats_from=es.url, **BUILD)
    assert nq.manifest.splits.cuts_ns == es.manifest.splits.cuts_ns and nq.stats == es.stats
    assert "stats='shared'" in repr(WindowStream([es, nq], 60, **KW))  # and no refusal: the same cuts
    raw = build_cache(dbn["NQH3"], tmp_path / "raw.zarr", split=DATES, normalize="none", **BUILD)
    raw_es = build_cache(dbn["ESH3"], tmp_path / "raw_es.zarr", split=DATES, normalize="none", **BUILD)
    assert WindowStream([raw_es, raw], 60, **KW).info()["stats"] == "none"  # a z-scored one with a raw one: refused
    assert "stats=" not in repr(WindowStream(pair[0], 60, **KW))  # one cache: its repr as it always was


# ---- inputs ----------------------------------------------------------------------------------


def test_caches_given_as_paths_urls_and_open_caches_with_their_own_options(pair):
    by_path = keys_of(WindowStream([pair[0].url, pair[1]], 60, **KW))
    assert np.array_equal(by_path, keys_of(WindowStream(pair, 60, **KW)))
    file_urls = [f"file://{c.url}" for c in pair]
    assert np.array_equal(keys_of(WindowStream(file_urls, 60, storage_options=[{}, None], **KW)), by_path)
    stream = WindowStream(tuple(pair), 60, **KW)
    assert stream.caches == tuple(pair)
    with pytest.raises(SeveralCachesError, match=r"reads 2 caches: use stream.caches\[i\]"):
        stream.cache  # noqa: B018
    assert not hasattr(stream, "cache")  # an AttributeError
    with pytest.raises(OptionError, match="every cache given is already open"):
        WindowStream(pair, 60, storage_options={"anon": True}, **KW)
    with pytest.raises(OptionTypeError, match="a list of 2"):
        WindowStream(pair, 60, storage_options=[None], **KW)
    with pytest.raises(OptionError, match=r"caches=\[\]: give at least one cache"):
        WindowStream([], 60, **KW)
    with pytest.raises(OptionTypeError, match="is not a cache"):
        WindowStream([pair[0], 3], 60, **KW)
    with pytest.raises(OptionError, match="2 weight.s. for 1 cache"):
        WindowStream(pair[0], 60, weights=(1, 1), **KW)


def test_caches_of_other_shard_sizes_share_one_row_space(tmp_path):
    """512- and 384-row shards: the stream's shards are 128 rows (their greatest common divisor), no
    shard straddles two caches or two symbols, every window of both is served once with its bars."""
    bars = [synthetic_bars(3000, 4, n_symbols=2, seed=s, shard_rows=r) for s, r in ((1, 512), (2, 384))]
    caches = [make_cache(tmp_path / f"{r}.zarr", b, shard_rows=r, chunk_rows=128) for b, r in zip(bars, (512, 384))]
    stream = WindowStream(caches, 12, split="all", batch_size=50, meta=True)
    assert stream.sources.shard_rows == 128
    batches = list(stream)
    assert rows(keys_of(batches)) == rows(one_by_one(caches, "all", 12))
    for k, b in enumerate(bars):  # feature 0 is the bar's row in its cache: the windows' own bars
        mine = np.concatenate([x.x[x.source == k][:, 0, 0].numpy() for x in batches]).astype(np.int64)
        assert np.array_equal(np.sort(mine), brute_starts(b, 12, 1, 1, None))


# ---- len, resident epochs, the map-style twin ------------------------------------------------


def test_resident_epochs_hold_the_whole_mix_within_one_shared_budget(pair):
    need = resident_bytes(WindowStream(pair, 60, **KW).read_spec)
    assert need == sum(resident_bytes(WindowStream(c, 60, **KW).read_spec) for c in pair)  # one budget for both
    short = WindowStream(pair, 60, memory_budget=need - 1, mix=1, **KW)
    assert not short.resident and len(keys_of(short)) == len(one_by_one(pair))  # it streams within the budget
    for weights in (None, (0.7, 0.3)):
        on = WindowStream(pair, 60, memory_budget=need, weights=weights, **KW)
        off = WindowStream(pair, 60, weights=weights, **KW)
        assert on.resident
        for _ in range(2):  # the first decodes into the arena, the second only gathers from it
            assert all(np.array_equal(a, b) for a, b in zip(stream_keys(on), stream_keys(off), strict=True))
        assert on.resources.resident.complete


def test_window_dataset_concatenates_the_caches(pair):
    ds = WindowDataset(pair, 60, split="val")
    one = [WindowDataset(c, 60, split="val") for c in pair]
    assert len(ds) == sum(map(len, one)) and ds.offsets.tolist() == [0, len(one[0]), len(ds)]
    for i in (0, len(one[0]) - 1, len(one[0]), len(ds) - 1):
        k, j = ds.locate(i)
        assert torch.equal(ds[i].x, one[k][j].x) and torch.equal(ds[i].y, one[k][j].y)
    both = ds[len(one[0]) - 2 : len(one[0]) + 2]
    assert torch.equal(both.x, torch.cat([one[0][-2:].x, one[1][:2].x]))
    assert repr(ds).startswith("WindowDataset([")
    with pytest.raises(SeveralCachesError):
        ds.cache  # noqa: B018


# ---- DDP (slow tier: tests/conftest.py) -------------------------------------------------------


def test_gloo_ranks_serve_the_mix_once_and_resume_at_another_world_size(tmp_path, monkeypatch, pair):
    """Two gloo ranks serve every window once (weights=None) or the planned multiset (weights), each
    through a DataLoader worker; from a checkpoint after 3 batches, three ranks finish the epoch."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    urls = [c.url for c in pair]
    configs = [{"seq_len": 60, "split": "train", "batch_size": 64, "weights": w, "seed": 2} for w in (None, (0.7, 0.3))]
    mp.spawn(ddp_mix_rank, args=(2, urls, configs, str(tmp_path / "a"), str(tmp_path), 3), nprocs=2, join=True)
    mp.spawn(ddp_mix_rank, args=(3, urls, configs, str(tmp_path / "b"), str(tmp_path), 0), nprocs=3, join=True)
    for i, kw in enumerate(configs):
        whole = keys_of(WindowStream(pair, meta=True, **kw))
        ranks = [np.load(tmp_path / f"c{i}-w2-rank{r}.npy") for r in range(2)]
        meta = json.loads((tmp_path / f"c{i}-w2-rank0.json").read_text())
        assert meta["all"][0] == meta["all"][1] == meta["n_batches"]  # equal batches per rank
        served = np.concatenate(ranks)
        assert within(served, whole) and len(served) == len(whole) - len(whole) % 2  # the planned multiset
        if kw["weights"] is None:
            assert len(set(map(tuple, served.tolist()))) == len(served)  # every window once
        assert json.loads((tmp_path / f"state{i}.json").read_text())["history"] == [[2, 3]]
        rest = np.concatenate([np.load(tmp_path / f"c{i}-w3-rank{r}.npy") for r in range(3)])
        left = np.concatenate([r[3 * 64 :] for r in ranks])
        assert np.array_equal(rest, left)  # what no rank delivered, once, in its original order
