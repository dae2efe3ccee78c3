"""Appends that must equal a build at once (issues 11 and 12): a continuous symbol rolling at or after the
append boundary, ``--stats recompute`` keeping the split cut times, and a killed object-store append run again.

DBN files are written with ``databento_dbn`` (``test_input_truth.dbn_file``: continuous symbology with
one mapping interval per daily file); the object store is the session's moto S3 server.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pytest
from helpers.cli import cli
from helpers.inputs import DAY0, HOUR, MIN, T0, bars, dbn_file
from helpers.kills import APPEND_KILLS, in_child, kill_after, kill_before

from shardcache import CacheError, ShardcacheError, WindowDataset, open_cache
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample
from shardcache.ingest.staging import _root
from shardcache.inspect.verify import compare_caches, verify_cache

# what a build at once differs in from a build plus appends, by design (as in test_append.BY_DESIGN)
BY_DESIGN = ("manifest['appends']", "manifest['build']", "manifest['created']", "manifest['elapsed_s']")
IDS = {0: 100, 1: 100, 2: 200, 3: 200}  # ES.c.0's instrument per download: ESH4, then ESM4 from the third


def session_files(tmp_path: Path) -> list[Path]:
    """Four downloads of ES.c.0, two hours (120 one-minute bars) each with no gap between them: each
    maps the symbol to that download's instrument (``IDS``), so the series rolls between the second
    and the third."""
    out = []
    for d, iid in IDS.items():
        ts = T0 + 2 * HOUR * d + MIN * np.arange(120)
        close = 5000.0 + 100 * (iid == 200) + 0.25 * (np.arange(120) % 4) + d
        first, last = (DAY0 + dt.timedelta(days=int((t - T0 + 22 * HOUR) // (24 * HOUR))) for t in (ts[0], ts[-1]))
        out.append(
            dbn_file(
                tmp_path / f"part{d}.dbn",
                "ohlcv-1m",
                bars(ts, close, iid),
                [("ES.c.0", [(first, last + dt.timedelta(days=1), str(iid))])],
                dbn.SType.CONTINUOUS,
            )
        )
    return out


@pytest.mark.parametrize("k", [2, 1], ids=["roll-at-the-boundary", "roll-inside-the-appended-files"])
def test_a_roll_at_or_after_the_append_boundary_is_cut_as_in_one_build(tmp_path, capsys, k):
    files = session_files(tmp_path)
    opts = dict(features="close", normalize="none", max_gap="1h", progress=False)
    out, whole = tmp_path / "c.zarr", tmp_path / "whole.zarr"
    build_cache(files[:k], out, **opts)
    appended = append_cache(files[k:], out, progress=False)
    at_once = build_cache(files, whole, **opts)
    roll = [[T0 + 4 * HOUR, 100, 200]]
    assert at_once.manifest.rolls == {"ES.c.0": roll} and at_once.manifest.counts.rolls == 1
    assert appended.manifest.rolls == {"ES.c.0": roll} and appended.manifest.counts.rolls == 1
    np.testing.assert_array_equal(appended.segments, at_once.segments)
    assert len(appended.segments) == 2 and int(appended.segments[0, 2] - appended.segments[0, 1]) == 240
    assert [d for d in compare_caches(appended, at_once) if not d.startswith(BY_DESIGN)] == []
    ds = WindowDataset(appended, seq_len=10, horizon=1)
    assert len(ds) == len(WindowDataset(at_once, seq_len=10, horizon=1)) == 2 * (240 - 10)
    contract = np.asarray(appended.read_rows(0, appended.n_bars))[:, 0] >= 5100  # ESM4 closes are 5100 and up
    for i in range(len(ds)):  # no window, target included, mixes the two contracts
        x, y = ds[i]
        prices = np.concatenate([x.numpy().ravel(), y.numpy().ravel()])
        assert len(set((prices >= 5100).tolist())) == 1, i
    assert contract.sum() == 240 and verify_cache(out).ok
    rc, text, _ = cli(capsys, "info", str(out), prog="shardcache")
    assert rc == 0 and "rolls     1 contract roll(s)" in text


def bar_splits(cache) -> dict[tuple[str, int], int]:
    """Each stored bar, as (symbol, bar time in ns), and the split it is in."""
    out = {}
    for (sym, start, stop), split in zip(cache.segments.tolist(), cache.segment_split.tolist()):
        for ts in cache.bar_times(np.arange(start, stop)).tolist():
            out[(cache.symbols[sym], ts)] = split
    return out


def test_recompute_keeps_the_split_cut_times_of_the_cache(tmp_path):
    """``--stats recompute`` rebuilds from every input, but fraction splits stay at the times the first
    build resolved: no bar, so no window, changes split on append (and, all new bars being later than
    the train split, the train statistics stay those of the cache)."""
    files = make_sample(tmp_path / "dbn", days=8, seed=4)
    opts = dict(split="train=0.6,val=0.2,test=0.2", shard_rows=1024, chunk_rows=128, workers=1, progress=False)
    out = tmp_path / "c.zarr"
    first = build_cache(files[:5], out, **opts)
    cuts, before = first.manifest.splits.cuts_ns, bar_splits(first)
    frozen = tmp_path / "frozen.zarr"
    build_cache(files[:5], frozen, **opts)
    frozen = append_cache(files[5:], frozen, progress=False)
    moved = build_cache(files, tmp_path / "moved.zarr", **opts).manifest
    assert moved.splits.cuts_ns != cuts  # fractions resolved over all bars would move every cut
    rebuilt = append_cache(files[5:], out, stats="recompute", progress=False)
    assert rebuilt.manifest.splits.cuts_ns == cuts and rebuilt.manifest.splits.spec == opts["split"]
    after = bar_splits(rebuilt)
    assert len(after) == rebuilt.n_bars > len(before) and all(after[k] == v for k, v in before.items())
    assert after == bar_splits(frozen) and rebuilt.manifest.splits.bars == frozen.manifest.splits.bars
    whole = build_cache(files, tmp_path / "whole.zarr", split_cuts_ns=cuts, **opts)
    assert rebuilt.manifest.stats == whole.manifest.stats == frozen.manifest.stats != moved.stats
    assert [d for d in compare_caches(rebuilt, whole) if not d.startswith(BY_DESIGN)] == []
    assert [d for d in compare_caches(rebuilt, frozen) if not d.startswith(BY_DESIGN)] == []
    assert verify_cache(out).ok


def test_fixed_cut_times_are_checked_before_any_input_is_read(tmp_path):
    missing, out = tmp_path / "missing.dbn", tmp_path / "c.zarr"
    with pytest.raises(
        ShardcacheError,
        match=r"^split='train=0.6,val=0.2,test=0.2': 1 cut time\(s\) given where "
        r"its 3 splits need 2, increasing$",
    ):
        build_cache([missing], out, split="train=0.6,val=0.2,test=0.2", split_cuts_ns=[T0], progress=False)
    with pytest.raises(ShardcacheError, match="need 2, increasing"):
        build_cache([missing], out, split="train=0.6,val=0.2,test=0.2", split_cuts_ns=[T0 + 1, T0], progress=False)
    with pytest.raises(
        ShardcacheError, match="^stats_from=.*: keeps its cache's split cut times: pass it or split_cuts_ns, not both$"
    ):
        build_cache([missing], out, split="val=2024-03-05", split_cuts_ns=[T0], stats_from=out, progress=False)
    assert not out.exists() and not Path(f"{out}.staging").exists()


def _killed_s3_append(point: str, files: list[Path], url: str, options: dict) -> None:
    obj, name, after, when = APPEND_KILLS[point]
    (kill_after if after else kill_before)(obj, name, when)
    append_cache(files, url, workers=1, storage_options=options, progress=False)


@pytest.mark.parametrize("point", list(APPEND_KILLS))
def test_a_killed_object_store_append_run_again_records_its_inputs_once(point, tmp_path, s3_bucket):
    """On an object store an append writes in place, its history before the manifest: run again after
    a SIGKILL, it must not add its sources and its append record a second time."""
    bucket, options = s3_bucket
    files = make_sample(tmp_path / "dbn", days=5, seed=4)
    opts = dict(split="train=0.6,val=0.2,test=0.2", shard_rows=1024, chunk_rows=128, workers=1, progress=False)
    url, want = f"{bucket}/c.zarr", tmp_path / "want.zarr"
    first = build_cache(files[:3], url, storage_options=options, **opts).n_bars
    build_cache(files[:3], want, **opts)
    append_cache(files[3:], want, progress=False)
    assert in_child(_killed_s3_append, point, files[3:], url, options) == -signal.SIGKILL
    if point.startswith("finish: the root index"):  # the root index is the append's, the manifest not yet
        with pytest.raises(CacheError, match="the segment index and the manifest disagree"):
            open_cache(url, options)
        with pytest.raises(CacheError, match="an append to it stopped in its last writes; finish it first"):
            append_cache(files[3:], url, stats="recompute", storage_options=options, progress=False)
        root = _root(url)
        os.rename(root, f"{root}.aside")  # without its staging folder the append cannot be finished
        with pytest.raises(CacheError, match="keeps no append to finish; rebuild the cache$"):
            append_cache(files[3:], url, resume=True, storage_options=options, progress=False)
        os.rename(f"{root}.aside", root)
    cache = append_cache(files[3:], url, resume=True, storage_options=options, progress=False)
    history = cache.history()
    assert [s["path"] for s in history["sources"]] == [str(f) for f in files]
    assert len(history["appends"]) == 1 and history["appends"][0]["bars"] == cache.n_bars - first > 0
    assert [
        d for d in compare_caches(want, cache, options) if not d.startswith((*BY_DESIGN, "manifest['bytes']"))
    ] == []
    assert verify_cache(url, options).ok
    again = append_cache(files[3:], url, resume=True, storage_options=options, progress=False)  # finished: a no-op
    assert len(again.history()["appends"]) == 1 and again.manifest == cache.manifest


def test_recompute_refuses_a_recorded_input_that_changed(tmp_path, capsys):
    """A recorded input replaced by other bars: ``--stats recompute`` would rebuild the cache from it
    and lose the bars it held, so it is refused as ``--resume`` refuses a changed input, the cache untouched."""
    files = make_sample(tmp_path / "dbn", days=4, seed=5)
    out = tmp_path / "c.zarr"
    n_bars = build_cache(files[:3], out, shard_rows=1024, chunk_rows=128, workers=1, progress=False).n_bars
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    other = make_sample(tmp_path / "other", days=1, seed=9)[0]
    os.replace(other, files[0])  # another day's bars under the recorded name
    code, _out, err = cli(capsys, str(files[3]), "--append", "--stats", "recompute", "--out", str(out))
    assert code == 2
    want = (
        f"build-cache: error: {files[0]}: an input of {out} changed since it was built (size or modification "
        "time); --stats recompute rebuilds from every recorded input and would replace the cache's bars from it: "
        "put the original back, or use --stats frozen to append without reading it"
    )
    assert err.strip().splitlines() == [want]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert open_cache(out).n_bars == n_bars
