"""``shardcache info`` of a read-time cut (``shardcache/inspect/cut_stats.py``): ``--split-times``/``--embargo`` and
``--walk-forward``/``--fold`` show each split's range, bars and windows and the train range's statistics, and
``--horizon`` takes a duration in ``info`` and the build's summary. Oracles: numpy over plain zarr's bars and
times; windows: ``WindowDataset``'s lengths; the stream's ``stats``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from shardcache import open_cache
from shardcache.cli import main
from shardcache.read.dataset import WindowDataset
from shardcache.read.folds import walk_forward
from shardcache.read.stream import WindowStream

HOUR = 3_600_000_000_000
SPLIT_TIMES = "val=2023-01-20,test=2023-01-25T12:00"
WALK = "train=10D,val=3D,step=3D,embargo=1h"


@pytest.fixture(scope="module")
def raw(twenty_day_cache) -> str:
    """Raw stored values (``normalize="none"``), split at dates of its own (which the cuts below re-cut)."""
    return twenty_day_cache("raw", normalize="none", split="val=2023-01-23,test=2023-01-26")


def plain_bars(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Every symbol's features (float64) and bar times (int64 ns), concatenated, read with plain zarr."""
    g = zarr.open_group(path, mode="r")
    feats, times = [], []
    for i in range(len(g["symbols"])):
        feats.append(np.asarray(g[f"symbols/{i}/features"][:], dtype=np.float64))
        t = np.asarray(g[f"symbols/{i}/time"][:])
        times.append(t.astype("datetime64[ns]").astype(np.int64) if t.dtype.kind == "M" else t.astype(np.int64))
    return np.concatenate(feats), np.concatenate(times)


def ns(text: str) -> int:
    return int(np.datetime64(text, "ns").astype(np.int64))


def run_info(capsys, *args: str) -> dict:
    assert main(["info", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def check_stats(doc: dict, x: np.ndarray, names: list[str]) -> None:
    """The document's statistics equal numpy's (population std) over ``x``, to float64 rounding."""
    assert doc["stats_bars"] == len(x) > 0
    got_mean = np.asarray([doc["stats"][n]["mean"] for n in names])
    got_std = np.asarray([doc["stats"][n]["std"] for n in names])
    np.testing.assert_allclose(got_mean, x.mean(axis=0), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(got_std, x.std(axis=0), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("horizon", ["1", "5min"])
def test_split_times_show_ranges_statistics_and_windows(raw, capsys, horizon):
    doc = run_info(
        capsys, raw, "--split-times", SPLIT_TIMES, "--embargo", "1h", "--seq-len", "30", "--horizon", horizon
    )
    cut = doc["cut"]
    feats, times = plain_bars(raw)
    val, test = ns("2023-01-20"), ns("2023-01-25T12:00")
    edges = {"train": (None, val, val - HOUR), "val": (val, test, test - HOUR), "test": (test, None, None)}
    assert [s["name"] for s in cut["splits"]] == ["train", "val", "test"]
    h = int(horizon) if horizon.isdigit() else horizon
    for s in cut["splits"]:
        start, stop, end = edges[s["name"]]
        assert (s["start_ns"], s["stop_ns"], s["end_ns"]) == (start, stop, end)
        inside = (times >= (start or times.min())) & (times < (end if end is not None else times.max() + 1))
        assert s["bars"] == int(inside.sum())
        assert (s["first_bar_ns"], s["last_bar_ns"]) == (int(times[inside].min()), int(times[inside].max()))
        ds = WindowDataset(raw, 30, horizon=h, split=s["name"], split_times=SPLIT_TIMES, embargo="1h")
        assert s["windows"] == len(ds) > 0
    check_stats(cut, feats[times < val - HOUR], doc["features"])
    with WindowStream(raw, 30, split="train", split_times=SPLIT_TIMES, embargo="1h", normalize="zscore") as stream:
        stats = stream.stats
    assert stats is not None
    np.testing.assert_array_equal(stats.mean, [cut["stats"][n]["mean"] for n in doc["features"]])
    np.testing.assert_array_equal(stats.std, [cut["stats"][n]["std"] for n in doc["features"]])


def test_a_fold_shows_its_train_and_val_times_and_its_train_statistics(raw, capsys):
    fold = walk_forward(raw, train="10D", val="3D", step="3D", embargo="1h")[1]
    doc = run_info(capsys, raw, "--walk-forward", WALK, "--fold", "1", "--seq-len", "30")
    cut = doc["cut"]
    assert cut["fold"] == {"index": 1, "train": list(fold.train), "val": list(fold.val)}
    train, val = cut["splits"]
    assert (train["start_ns"], train["stop_ns"], train["end_ns"]) == (*fold.train, fold.val[0] - HOUR)
    assert (val["start_ns"], val["stop_ns"], val["end_ns"]) == (*fold.val, fold.val[1])
    feats, times = plain_bars(raw)
    check_stats(cut, feats[(times >= fold.train[0]) & (times < fold.val[0] - HOUR)], doc["features"])
    for s in (train, val):
        assert s["windows"] == len(WindowDataset(raw, 30, fold=fold, split=s["name"])) > 0
    with WindowStream(raw, 30, fold=fold, split="val", normalize="zscore") as stream:
        stats = stream.stats
    assert stats is not None
    np.testing.assert_array_equal(stats.mean, [cut["stats"][n]["mean"] for n in doc["features"]])


def test_the_text_says_the_cut_and_the_statistics(raw, capsys):
    assert main(["info", raw, "--walk-forward", WALK, "--fold", "0"]) == 0
    text = capsys.readouterr().out
    fold = walk_forward(raw, train="10D", val="3D", step="3D", embargo="1h")[0]
    assert f"cut       {fold!r}" in text
    feats, times = plain_bars(raw)
    x = feats[(times >= fold.train[0]) & (times < fold.val[0] - HOUR)]
    assert f"train statistics over {len(x):,} bars" in text
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("log_volume "))
    k = open_cache(raw).feature_names.index("log_volume")
    assert (float(row[1]), float(row[2])) == pytest.approx((x[:, k].mean(), x[:, k].std()), rel=1e-5)


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--fold", "1"], "--fold 1", "needs --walk-forward"),
        (["--walk-forward", WALK], "--walk-forward", "needs --fold K"),
        (["--walk-forward", "train=10X,val=3D", "--fold", "0"], "--walk-forward", "train='10X': use a whole number"),
        (["--walk-forward", "train=10D", "--fold", "0"], "--walk-forward", "needs val"),
        (["--walk-forward", "train=10D,val=3D,every=1D", "--fold", "0"], "--walk-forward", "'every' is not one of"),
        (["--walk-forward", WALK, "--fold", "-1"], "--fold -1", "must be at least 0"),
        (["--walk-forward", WALK, "--fold", "0", "--embargo", "1h"], "--embargo '1h'", "drop --embargo"),
        (["--walk-forward", WALK, "--fold", "0", "--split-times", SPLIT_TIMES], "--split-times", "drop --split-times"),
        (["--split-times", "val=soon"], "--split-times 'val=soon'", "is not a date"),
        (["--split-times", "train=0.5,val=0.5"], "--split-times", "not fractions"),
        (["--embargo", "soon"], "--embargo 'soon'", "use a whole number and a unit"),
        (["--horizon", "5 parsecs"], "--horizon '5 parsecs'", "not a duration"),
        (["--horizon", "0min"], "--horizon '0min'", "must be longer than 0"),
        (["--horizon", "-1"], "--horizon -1", "must be at least 0"),
    ],
)
def test_a_bad_value_is_one_line_before_the_cache_is_read(tmp_path, capsys, args, flag, says):
    missing = str(tmp_path / "no-such.zarr")  # refused before it is opened: else the line would name it
    assert main(["info", missing, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardcache: error: {flag}"), err
    assert says in err and "no-such" not in err


def test_a_fold_out_of_range_is_one_line(raw, capsys):
    n = len(walk_forward(raw, train="10D", val="3D", step="3D", embargo="1h"))
    assert main(["info", raw, "--walk-forward", WALK, "--fold", str(n)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"shardcache: error: --fold {n}: out of range: --walk-forward {WALK} makes {n} folds")
    assert err.rstrip().endswith(f"(0..{n - 1})")


def test_spans_the_cache_cannot_hold_are_one_line_naming_walk_forward(raw, capsys):
    assert main(["info", raw, "--walk-forward", "train=100D,val=3D", "--fold", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        "shardcache: error: --walk-forward 'train=100D,val=3D': train='100D' and val 3D need more time"
    )


def test_build_summary_and_info_count_windows_at_a_time_horizon(twenty_days, tmp_path, capsys):
    out = str(tmp_path / "h.zarr")
    argv = ["build", *map(str, twenty_days), "--out", out, "--normalize", "none", "--split", "val=2023-01-23"]
    assert main([*argv, "--seq-len", "30", "--horizon", "5min", "--json", "-q"]) == 0
    built = json.loads(capsys.readouterr().out)
    per = {n: len(WindowDataset(out, 30, horizon="5min", split=n)) for n in ("train", "val")}
    rows = {n: len(WindowDataset(out, 30, horizon=1, split=n)) for n in ("train", "val")}
    assert built["horizon"] == "5min" and built["windows_per_split"] == per != rows
    assert run_info(capsys, out, "--seq-len", "30", "--horizon", "5min")["windows_per_split"] == per
    assert main(["build", *map(str, twenty_days), "--out", str(tmp_path / "x.zarr"), "--horizon", "5mon"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardcache: error: --horizon '5mon': not a duration") and not (tmp_path / "x.zarr").exists()
