"""Read-time normalization (shardcache/read/normalize.py): the statistics a stream applies are numpy's over
the plain-zarr raw bars of its train range (the build's split, a ``split_times`` re-cut, per symbol, per
cache, pooled), and every window served (streamed, resident, on the device strategy, map-style, through
DataLoader workers, of a walk-forward fold with its own train statistics, resumed, in weighted proportions)
is ``(raw - mean) / std`` of its plain-zarr bars; raw targets stay raw; gloo ranks serve each window once."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import zarr
from helpers import ddp_rank

from shardcache import Normalization, WindowDataset, WindowStream, build_cache, walk_forward
from shardcache.errors import OptionError, OptionTypeError, StateError
from shardcache.ingest.sample import make_sample
from shardcache.read.storage import Device

SPLIT = "val=2023-01-05,test=2023-01-06"
RECUT = "val=2023-01-04,test=2023-01-06"


def _cut(text: str) -> int:
    """The first date of a ``split``/``split_times`` text, in ns: train is every bar before it."""
    return int(np.datetime64(text.split(",")[0].split("=")[1], "ns").astype(np.int64))


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Two raw caches (``--normalize none``) of other symbols and prices, split at the same dates, in small shards."""
    root = tmp_path_factory.mktemp("norm")
    out = []
    for k, symbols in enumerate((["ESH3", "NQH3"], ["YMH3", "RTYH3", "CLH3"])):
        files = make_sample(root / f"dbn{k}", days=5, seed=11 + k, symbols=symbols)
        out.append(
            str(
                build_cache(
                    files,
                    root / f"c{k}.zarr",
                    normalize="none",
                    split=SPLIT,
                    shard_rows=1024,
                    chunk_rows=256,
                    progress=False,
                ).url
            )
        )
    return out


@pytest.fixture(scope="module")
def zscored(tmp_path_factory):
    """A cache z-scored at build time."""
    root = tmp_path_factory.mktemp("zs")
    files = make_sample(root / "dbn", days=3, seed=5, symbols=["ESH3"])
    return str(build_cache(files, root / "z.zarr", split="val=2023-01-04", progress=False).url)


def raw_bars(path: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each symbol's features (float32) and bar times, read with plain zarr."""
    g = zarr.open_group(path, mode="r")
    out = []
    for i in range(len(g["symbols"])):
        out.append((g[f"symbols/{i}/features"][:], g[f"symbols/{i}/time"][:]))
    return out


def train_bars(path: str, cut: str) -> list[np.ndarray]:
    """Each symbol's raw bars before ``cut``'s first date, float64."""
    return [f[t < _cut(cut)].astype(np.float64) for f, t in raw_bars(path)]


def _std(x: np.ndarray) -> np.ndarray:
    s = x.std(axis=0)
    return np.where(s > 0, s, 1.0)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-14)


def test_the_stats_are_numpys_over_the_builds_train_split(caches):
    stream = WindowStream(caches[0], 8, split="train", normalize="zscore")
    want = np.concatenate(train_bars(caches[0], SPLIT))
    stats = stream.stats
    assert stats is not None and stats.per == "all" and stats.mean.shape == (want.shape[1],)
    _close(stats.mean, want.mean(axis=0))
    _close(stats.std, _std(want))
    assert WindowStream(caches[0], 8, split="train").stats is None  # the default: as stored
    said = {"normalize": "zscore", "normalize_targets": True, "pool_caches": False}
    assert stream.info()["normalization"] == said and "normalize='zscore'" in repr(stream)
    plain = WindowStream(caches[0], 8, split="train")
    assert plain.info()["normalization"] is None and "normalize" not in repr(plain)


def test_a_split_times_recut_moves_the_stats(caches):
    """Moving val earlier takes its bars out of the statistics: no val mean or variance leaks into training."""
    stream = WindowStream(caches[0], 8, split="train", split_times=RECUT, normalize="zscore")
    want = np.concatenate(train_bars(caches[0], RECUT))
    _close(stream.stats.mean, want.mean(axis=0))
    _close(stream.stats.std, _std(want))
    built = WindowStream(caches[0], 8, split="train", normalize="zscore").stats
    assert not np.allclose(stream.stats.mean, built.mean)


def test_per_symbol_per_cache_and_pooled_stats(caches):
    per = [train_bars(c, SPLIT) for c in caches]
    sym = WindowStream(caches, 8, split="train", normalize="zscore-per-symbol").stats
    assert sym.per == "symbol" and sym.mean.shape == (5, per[0][0].shape[1])
    for k, bars in enumerate(per):
        for s, x in enumerate(bars):
            mean, std = sym.of(k, s)
            _close(mean, x.mean(axis=0))
            _close(std, _std(x))
    own = WindowStream(caches, 8, split="train", normalize="zscore").stats
    assert own.per == "cache" and own.mean.shape == (2, per[0][0].shape[1])
    for k, bars in enumerate(per):
        _close(own.mean[k], np.concatenate(bars).mean(axis=0))
        _close(own.std[k], _std(np.concatenate(bars)))
    pooled = WindowStream(caches, 8, split="train", normalize="zscore", pool_caches=True).stats
    every = np.concatenate([x for bars in per for x in bars])
    assert pooled.per == "all"
    _close(pooled.mean, every.mean(axis=0))
    _close(pooled.std, _std(every))


def _oracle(paths, stats, batch, seq_len, horizon, xcols, ycols, raw_targets):
    """``(raw - mean) / std`` of each served window's plain-zarr bars (raw targets: the bars), float64."""
    bars = [raw_bars(p) for p in paths]
    xs, ys = [], []
    for k, s, r in zip(batch.source.tolist(), batch.index[:, 0].tolist(), batch.index[:, 1].tolist()):
        f = bars[k][s][0].astype(np.float64)
        mean, std = stats.of(k, s)
        x = (f[r : r + seq_len] - mean) / std
        t = f[r + seq_len - 1 + horizon]
        xs.append(x[:, xcols])
        ys.append((t if raw_targets else (t - mean) / std)[ycols])
    return np.stack(xs), np.stack(ys)


def _check(paths, reads, batches, *, raw_targets=False, features=slice(None), target=slice(None)):
    n = 0
    for b in batches:
        want_x, want_y = _oracle(paths, reads.stats, b, reads.seq_len, reads.horizon, features, target, raw_targets)
        np.testing.assert_allclose(b.x.numpy(), want_x, rtol=2e-7, atol=1e-6)
        if raw_targets:  # exact to float32 rounding
            np.testing.assert_array_equal(b.y.numpy(), want_y.astype(np.float32))
        else:
            np.testing.assert_allclose(b.y.numpy(), want_y, rtol=2e-7, atol=1e-6)
        n += len(b.x)
    return n


def _on_device_cpu(reads):
    """``reads`` switched to the device strategy on the CPU (the device code path)."""
    reads.read_spec = dataclasses.replace(reads.read_spec, storage=Device(torch.device("cpu")))
    return reads


@pytest.mark.parametrize("how", ["streamed", "resident", "device", "device-resident"])
@pytest.mark.parametrize(
    "norm",
    [
        dict(normalize="zscore"),
        dict(normalize="zscore", pool_caches=True),
        dict(normalize="zscore-per-symbol", normalize_targets=False),
        dict(normalize="zscore", normalize_targets=False, features=["log_return", "gap", "body"], target=["gap"]),
        dict(normalize="zscore-per-symbol", features=["body", "log_volume"], target=["log_volume", "tod_sin"]),
    ],
)
def test_served_windows_are_the_plain_zarr_bars_z_scored(caches, how, norm):
    norm = dict(norm)
    budget = "1GiB" if "resident" in how else None
    stream = WindowStream(caches, 8, split="train", meta=True, batch_size=300, memory_budget=budget, **norm)
    if how.startswith("device"):
        _on_device_cpu(stream)
    names = stream.caches[0].feature_names
    cols = {k: [names.index(c) for c in norm.get(k, names)] for k in ("features", "target")}
    raw = not norm.get("normalize_targets", True)
    for _ in range(2 if budget else 1):  # resident: the second epoch gathers from the kept arena
        n = _check(caches, stream, stream, raw_targets=raw, features=cols["features"], target=cols["target"])
        assert n == stream.planner.n_windows
    assert stream.resident == bool(budget)


@pytest.mark.parametrize("raw", [False, True])
def test_the_dataset_serves_the_same_z_scored_windows(caches, raw):
    ds = WindowDataset(caches, 8, split="val", horizon=2, meta=True, normalize="zscore", normalize_targets=not raw)
    stream = WindowStream(caches, 8, split="val", horizon=2, normalize="zscore", normalize_targets=not raw)
    assert ds.stats.per == stream.stats.per == "cache"
    np.testing.assert_array_equal(ds.stats.mean, stream.stats.mean)
    idx = np.r_[0 : len(ds) : 7, len(ds) - 1]
    assert _check(caches, ds, [ds[idx]], raw_targets=raw) == len(idx)
    # a val stream's statistics are still the train range's
    _close(ds.stats.mean[1], np.concatenate(train_bars(caches[1], SPLIT)).mean(axis=0))


def test_dataloader_workers_serve_z_scored_windows(caches):
    stream = WindowStream(caches[1], 8, split="train", meta=True, batch_size=256, normalize="zscore-per-symbol")
    n = _check([caches[1]], stream, stream.loader(num_workers=2))
    assert n == stream.planner.n_windows


def test_a_build_time_z_scored_cache_is_refused(zscored, caches):
    with pytest.raises(OptionError, match=r"z\.zarr is already z-scored .*build it with --normalize none"):
        WindowStream(zscored, 8, split="train", normalize="zscore")
    with pytest.raises(OptionError, match="already z-scored"):
        WindowDataset(zscored, 8, split="train", normalize="zscore-per-symbol")
    assert WindowStream(zscored, 8, split="train").stats is None  # as stored: served as before


def test_statistics_of_no_bars_are_refused(tmp_path, caches):
    """A train range without bars (split_times before the first bar), or a symbol without any, is refused."""
    with pytest.raises(OptionError, match=r"normalize='zscore': .*c0\.zarr has no bars in its train range"):
        WindowStream(caches[0], 8, split="val", split_times="val=2000-01-03,test=2023-01-06", normalize="zscore")
    files = make_sample(tmp_path / "a", days=3, symbols=["ESH3"])
    files += make_sample(tmp_path / "b", days=2, start="2023-01-09", symbols=["NQH3"])
    late = str(build_cache(files, tmp_path / "late.zarr", normalize="none", split="val=2023-01-05", progress=False).url)
    with pytest.raises(OptionError, match=r"late\.zarr's symbol 'NQH3' has no bars in the train range"):
        WindowStream(late, 8, split="train", normalize="zscore-per-symbol")
    assert WindowStream(late, 8, split="train", normalize="zscore").stats.per == "all"  # pooled over its symbols


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        (
            dict(normalize="minmax"),
            OptionError,
            "normalize='minmax': is not a normalization: give None, 'zscore' or 'zscore-per-symbol'",
        ),
        (dict(normalize_targets="no"), OptionTypeError, "normalize_targets='no': must be True or False"),
        (dict(normalize="zscore-per-symbol", pool_caches=True), OptionError, "pool_caches=True: pools one set"),
        (
            dict(normalization=Normalization(normalize="zscore"), normalize_targets=False),
            OptionTypeError,
            r"pass normalization=Normalization\(\.\.\.\) or its fields \(normalize_targets\), not both",
        ),
    ],
)
def test_bad_normalization_settings_are_refused_before_any_read(caches, fields, error, match):
    with pytest.raises(error, match=match):
        WindowStream(caches[0], 8, split="train", **fields)


def test_resuming_with_another_normalization_is_refused(caches):
    stream = WindowStream(caches[0], 8, split="train", normalize="zscore", batch_size=64)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    assert state["normalization"] == {"normalize": "zscore", "normalize_targets": True, "pool_caches": False}
    WindowStream(caches[0], 8, split="train", normalize="zscore", batch_size=64).load_state_dict(state)
    for other in (dict(), dict(normalize="zscore", normalize_targets=False)):
        with pytest.raises(StateError, match="normalization: saved"):
            WindowStream(caches[0], 8, split="train", batch_size=64, **other).load_state_dict(state)
    plain = WindowStream(caches[0], 8, split="train", batch_size=64)
    assert "normalization" not in plain.state_dict()  # a stream without one saves what it saved before
    with pytest.raises(StateError, match="normalization: saved None"):
        WindowStream(caches[0], 8, split="train", normalize="zscore", batch_size=64).load_state_dict(plain.state_dict())


def test_the_float32_scaling_keeps_a_price_far_from_zero_within_one_rounding():
    """A price near 4,000 with a std of 0.25: a float32 mean alone is off by up to 1e-4, 1,000 ulps of z."""
    from shardcache.read.normalize import _affine, _scale

    rng = np.random.default_rng(7)
    mean, std = np.array([4012.3456789, -0.001234, 55.5]), np.array([0.25, 3e-4, 40.0])
    raw = (rng.standard_normal((20_000, 3)) * std + mean).astype(np.float32)
    want = ((raw.astype(np.float64) - mean) / std).astype(np.float32)
    got = raw.copy()
    _scale(got, *_affine(mean, std))
    np.testing.assert_array_max_ulp(got, want, maxulp=2)


def test_each_folds_statistics_are_its_own_train_range(caches):
    """A fold's val windows are z-scored with the bars of that fold's train range, before its embargo."""
    folds = walk_forward(caches[1], train="2D", val="1D", step="1D", embargo="2h")
    assert len(folds) >= 2
    bars = raw_bars(caches[1])
    means = []
    for fold in folds:
        for norm in ("zscore", "zscore-per-symbol"):
            val = WindowStream(caches[1], 8, fold=fold, split="val", meta=True, batch_size=128, normalize=norm)
            lo, hi = fold.train[0], fold.val[0] - fold.embargo
            per = [f[(t >= lo) & (t < hi)].astype(np.float64) for f, t in bars]
            if norm == "zscore":
                _close(val.stats.mean, np.concatenate(per).mean(axis=0))
                _close(val.stats.std, _std(np.concatenate(per)))
                means.append(val.stats.mean)
            else:
                for s, x in enumerate(per):
                    _close(val.stats.of(0, s)[0], x.mean(axis=0))
            assert _check([caches[1]], val, val) == val.planner.n_windows
    assert not np.allclose(means[0], means[1])  # each fold its own


def test_a_resumed_normalized_stream_serves_the_rest_as_one_epoch_would(caches):
    kw = dict(split="train", normalize="zscore-per-symbol", batch_size=64, meta=True, seed=4)
    whole = list(WindowStream(caches, 8, **kw))
    first = WindowStream(caches, 8, **kw)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    rest = WindowStream(caches, 8, **kw)
    rest.load_state_dict(first.state_dict())
    got = head + list(rest)
    assert len(got) == len(whole)
    for a, b in zip(got, whole):
        assert torch.equal(a.index, b.index) and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_weighted_caches_serve_z_scored_windows_in_proportion(caches):
    stream = WindowStream(
        caches, 8, split="train", normalize="zscore", weights=(3, 1), epoch_windows=4000, batch_size=250, meta=True
    )
    batches = list(stream)
    assert _check(caches, stream, batches) == 4000
    assert int(sum(int((b.source == 0).sum()) for b in batches)) == 3000


def test_gloo_ranks_serve_z_scored_windows_once(caches, tmp_path):
    kwargs = {"seq_len": 8, "batch_size": 100, "split": "train", "normalize": "zscore-per-symbol"}
    mp.spawn(ddp_rank, args=(2, caches[0], str(tmp_path / "init"), str(tmp_path), kwargs), nprocs=2, join=True)
    got = np.concatenate([np.load(tmp_path / f"rank{r}.npy") for r in range(2)])
    dropped = json.loads((tmp_path / "rank0.json").read_text())["dropped"]
    assert len(np.unique(got)) == len(got) == WindowStream(caches[0], **kwargs).planner.n_windows - dropped
