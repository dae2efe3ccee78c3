"""Appends: later bars added in place, equal to a build at once, only tail shards rewritten, atomic."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import make_cache, stored_rows, synthetic_bars
from helpers.kills import APPEND_KILLS, in_child, kill_after, kill_before

from shardcache import CacheError, ShardcacheError, WindowDataset, WindowStream, open_cache
from shardcache.cli import build_cache_main, main
from shardcache.format.build_options import BuildOptions
from shardcache.format.layout import open_group
from shardcache.ingest import builder as builder_mod
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample, write_dbn
from shardcache.inspect.verify import compare_caches, verify_cache
from shardcache.read.plan import valid_ranges

OPTS = dict(split="train=0.6,val=0.2,test=0.2", shard_rows=1024, chunk_rows=128, workers=2, progress=False)
MIN = 60 * 10**9
T0 = np.datetime64("2024-03-04T14:30", "ns").astype(np.int64)
# differences a build at once has from two appends, by design: the append log and the build's own options
BY_DESIGN = ("manifest['appends']", "manifest['build']", "manifest['created']", "manifest['elapsed_s']")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("dbn"), days=15, seed=4)


def _shard_files(cache: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every shard object of every symbol's ``features`` and ``time``: inode, mtime and bytes."""
    out = {}
    for group in sorted((cache / "symbols").iterdir()):
        for array in ("features", "time"):
            for path in (group / array).glob("c.*"):
                st = path.stat()
                out[str(path.relative_to(cache))] = (st.st_ino, st.st_mtime_ns, path.read_bytes())
    return out


def _all_files(cache: Path) -> dict[str, bytes]:
    """Every file of a cache (shards, metadata, JSON objects) and its bytes."""
    return {
        os.path.relpath(os.path.join(root, n), cache): Path(root, n).read_bytes()
        for root, _, names in os.walk(cache)
        for n in names
    }


def n_windows(cache, seq_len: int) -> int:
    """Valid windows of every split at ``seq_len``, horizon 1, stride 1."""
    return valid_ranges(cache, seq_len, 1, 1, None).total()


def _bars(path: Path, minutes: np.ndarray, symbol: str = "ESM4", start_px: float = 100.0) -> Path:
    """A one-symbol OHLCV-1m file with bars at ``minutes`` after T0 and a rising close."""
    close = start_px + np.arange(len(minutes), dtype=np.float64) * 0.25 + minutes * 0.01
    recs = {
        "ts_event": T0 + MIN * minutes,
        "instrument_id": np.full(len(minutes), 7),
        "open": close - 0.1,
        "high": close + 0.5,
        "low": close - 0.5,
        "close": close,
        "volume": np.full(len(minutes), 5.0),
    }
    return write_dbn(path, "ohlcv-1m", recs, symbols={7: symbol})


def test_two_appends_equal_one_build_at_once(files, tmp_path):
    out = tmp_path / "c.zarr"
    first = build_cache(files[:9], out, **OPTS)
    cuts = first.manifest.splits.cuts_ns
    append_cache(files[9:12], out, workers=2, progress=False)
    appended = append_cache(files[12:], out, workers=2, progress=False)
    assert appended.manifest.splits.cuts_ns == cuts  # fraction cuts keep their first-build times
    assert appended.manifest.stats == first.manifest.stats  # frozen
    whole = build_cache(files, tmp_path / "whole.zarr", stats_from=out, **OPTS)
    assert [d for d in compare_caches(appended, whole) if not d.startswith(BY_DESIGN)] == []
    a, w = appended.manifest, whole.manifest
    for key in (
        "symbols",
        "stats",
        "splits",
        "counts",
        "bytes",
        "layout",
        "tails",
        "format_version",
        "bars_per_symbol",
        "groups",
    ):
        assert getattr(a, key) == getattr(w, key), key
    assert appended.history()["sources"] == whole.history()["sources"]
    assert sum(x["bars"] for x in appended.history()["appends"]) == appended.n_bars - first.n_bars > 0
    assert a.appends == 2 and w.appends == 0 and "appends" not in w.to_json()
    assert verify_cache(out).ok
    assert n_windows(appended, 60) == n_windows(whole, 60) > n_windows(first, 60)
    with WindowStream(appended, seq_len=60, split="all", batch_size=4096, shuffle=False) as stream:
        assert sum(len(x) for x, _ in stream) == n_windows(appended, 60)
    ds = WindowDataset(appended, seq_len=60, split="all")
    x, _ = ds[len(ds) - 1]
    np.testing.assert_array_equal(x.numpy(), WindowDataset(whole, seq_len=60, split="all")[len(ds) - 1][0].numpy())


def test_append_rewrites_only_each_symbols_tail_shard(files, tmp_path):
    out = tmp_path / "c.zarr"
    cache = build_cache(files[:-1], out, **OPTS)
    before = _shard_files(out)
    table = cache.rows.shard_table
    sym = cache.segments[np.searchsorted(cache.segments[:, 1], table[:, 1], side="right") - 1, 0]
    last = {s: int(table[sym == s][-1, 0]) for s in np.unique(sym)}  # each symbol's last shard
    partial = {s: sh for s, sh in last.items() if table[table[:, 0] == sh][0, 2] % cache.shard_rows}
    expected = sorted(cache.shard_key(sh, a) for sh in partial.values() for a in ("features", "time"))
    last_local = {s: cache.rows.shard_symbol(sh)[1] for s, sh in last.items()}  # symbols/<s>/<array>/c.<local>...
    after_cache = append_cache(files[-1:], out, progress=False)  # `cache` is the one before: its arrays are gone
    after = _shard_files(out)
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == expected and len(partial) == len(cache.symbols)
    assert all(after[k][0] == before[k][0] for k in before if k not in changed)  # the same files, not copies
    new = set(after) - set(before)
    assert new and all(int(k.split("/")[3].split(".")[1]) > last_local[int(k.split("/")[1])] for k in new)
    record = after_cache.history()["appends"][-1]
    assert record["shards_rewritten"] == len(partial) and record["shards_written"] == len(new) // 2
    assert verify_cache(out).ok


@pytest.mark.parametrize("gap, grows", [(0, 100), (120, 100 - 61 + 1)])
def test_windows_across_the_boundary(tmp_path, gap, grows):
    """Bars right after the last stored bar continue its segment (every new bar adds a window);
    after a gap above max_gap they start a new one (the first seq_len + horizon - 1 add none)."""
    a = _bars(tmp_path / "a.dbn", np.arange(200))
    b = _bars(tmp_path / "b.dbn", 200 + gap + np.arange(100), start_px=150.0)
    out = tmp_path / "c.zarr"
    opts = dict(normalize="none", progress=False, max_gap="1h")
    before = n_windows(build_cache([a], out, **opts), 60)
    cache = append_cache([b], out, progress=False)
    assert before == 200 - 61 + 1 and n_windows(cache, 60) == before + grows
    assert len(cache.segments) == (1 if gap == 0 else 2)
    whole = build_cache([a, b], tmp_path / "w.zarr", **opts)
    np.testing.assert_array_equal(stored_rows(cache)[0], stored_rows(whole)[0])  # log_return at the seam too
    assert stored_rows(cache)[0][200, cache.feature_names.index("log_return")] != 0 or gap
    np.testing.assert_array_equal(cache.segments, whole.segments)


def test_new_symbols_get_new_regions(tmp_path, capsys):
    out = tmp_path / "c.zarr"
    build_cache([_bars(tmp_path / "a.dbn", np.arange(150), "ESM4")], out, normalize="none", progress=False)
    cache = append_cache(
        [
            _bars(tmp_path / "b.dbn", 150 + np.arange(150), "NQM4"),
            _bars(tmp_path / "c.dbn", 150 + np.arange(10), "TINY"),
        ],
        out,
        progress=False,
    )
    assert cache.symbols == ["ESM4", "NQM4", "TINY"]  # a symbol shorter than a window is kept, as in a build
    assert cache.manifest.groups == ["symbols/0", "symbols/1", "symbols/2"]
    assert cache.manifest.bars_per_symbol == [150, 150, 10]
    assert cache.array(1, "features").shape == (150, cache.n_features) and cache.segments[1, 1] == cache.rows.bases[1]
    assert verify_cache(out).ok and n_windows(cache, 60) == 2 * (150 - 61 + 1)  # TINY gives none at 60
    assert n_windows(cache, 5) == 2 * (150 - 6 + 1) + (10 - 6 + 1)
    assert main(["ls", str(out)]) == 0
    assert "symbols/1/features/c.0.0" in capsys.readouterr().out  # NQM4's first
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(out, group="symbols/1", consolidated=False)  # the new symbol, as plain xarray sees it
    assert ds.features.dims == ("time", "feature") and ds.features.shape == (150, cache.n_features)
    np.testing.assert_array_equal(ds.features.values, stored_rows(cache)[0][150:300])


def test_a_short_symbol_keeps_its_small_inner_chunks_when_an_append_grows_it(tmp_path):
    """A symbol shorter than ``chunk_rows`` gets smaller inner chunks (halved while they hold its bars,
    down to chunk_rows / 16), recorded in the root index; an append cannot change an array's chunks."""
    out, opts = tmp_path / "c.zarr", {"normalize": "none", "progress": False, "shard_rows": 4096, "chunk_rows": 1024}
    a = _bars(tmp_path / "a.dbn", np.arange(150), "ESM4")
    later = [_bars(tmp_path / "b.dbn", 150 + np.arange(3000)), _bars(tmp_path / "c.dbn", 150 + np.arange(30), "TINY")]
    first = build_cache([a], out, **opts)
    assert first.symbol_chunks.tolist() == [256]  # 1024 -> 512 -> 256 (>= 150); 128 would not hold it
    cache = append_cache(later, out, progress=False)
    assert cache.symbols == ["ESM4", "TINY"] and cache.manifest.bars_per_symbol == [3150, 30]
    assert cache.symbol_chunks.tolist() == [256, 64]  # ESM4 keeps its chunks; TINY: 1024 / 16 at the least
    group = open_group(out)
    for i, chunk_rows in enumerate([256, 64]):
        assert group[f"symbols/{i}/features"].metadata.codecs[0].chunk_shape == (chunk_rows, cache.n_features)
        assert (cache.root_shards[cache.root_shards[:, 0] == i, 6] == chunk_rows).all()
    assert verify_cache(out).ok
    whole = build_cache([a, *later], tmp_path / "w.zarr", **opts)
    assert whole.symbol_chunks.tolist() == [1024, 64]  # built at once, ESM4 is long enough for whole chunks
    np.testing.assert_array_equal(stored_rows(cache)[0], stored_rows(whole)[0])


def test_bad_appends_are_refused_with_one_line(files, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    n_bars = build_cache(files[:5], out, **OPTS).n_bars
    with pytest.raises(CacheError, match=r"nope.zarr: no cache to append to \(build it first without --append\)"):
        append_cache(files[5:6], tmp_path / "nope.zarr")
    (tmp_path / "junk").mkdir()
    with pytest.raises(CacheError, match="junk: not a shardcache cache; --append adds to a cache made by build-cache"):
        append_cache(files[5:6], tmp_path / "junk")
    with pytest.raises(ShardcacheError, match=rf"{files[4].name}: \w+ bars from .* are not after the cache's last"):
        append_cache(files[4:6], out, progress=False)  # files[4] is already in the cache
    old = tmp_path / "v2.zarr"
    make_cache(old, synthetic_bars(300, 2, n_symbols=1), shard_rows=64, chunk_rows=32)
    meta = json.loads((old / "zarr.json").read_text())
    meta["attributes"]["shardcache"]["format_version"] = 2
    (old / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="v2.zarr: cache format 2 is no longer read; rebuild it with build-cache$"):
        append_cache(files[5:6], old)
    close = 100.0 + np.arange(50, dtype=np.float64)
    recs = {
        "ts_event": T0 + 10**15 + 3600 * 10**9 * np.arange(50),
        "instrument_id": np.full(50, 7),
        "open": close,
        "high": close + 1,
        "low": close - 1,
        "close": close,
        "volume": np.ones(50),
    }
    hourly = write_dbn(tmp_path / "x.ohlcv-1h.dbn", "ohlcv-1h", recs, symbols={7: "ESH3"})
    with pytest.raises(ShardcacheError, match="x.ohlcv-1h.dbn: 3600 s bars; the cache .* holds 60 s bars"):
        append_cache([hourly], out, progress=False)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"ts": pa.array([int(T0) + 10**15], pa.int64()), "symbol": ["ESH3"], "vwap": [1.0]}),
        tmp_path / "x.parquet",
    )
    with pytest.raises(ShardcacheError, match=r"x.parquet: gives features vwap; the cache .* has log_return"):
        append_cache([tmp_path / "x.parquet"], out, progress=False)
    assert verify_cache(out).ok and open_cache(out).n_bars == n_bars and not Path(f"{out}.staging").exists()
    for argv, message in [
        ([str(files[5]), "--append", "--out", str(tmp_path / "nope.zarr")], "no cache to append to"),
        (
            [str(files[5]), "--append", "--out", str(out), "--split", "none", "--features", "raw"],
            "--append keeps the build options of .*; drop --features",
        ),
        ([str(files[4]), "--append", "--out", str(out)], "are not after the cache's last"),
        ([str(files[5]), "--out", str(tmp_path / "e.zarr"), "--stats", "frozen"], "--stats applies to --append"),
    ]:
        capsys.readouterr()
        assert build_cache_main([*argv, "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("build-cache: error: "), err
        assert re.search(message, err[0]), err[0]


def test_cli_append_and_recompute(files, tmp_path, capsys):
    """A date split whose train part ends after the cache's last bar: recompute's statistics take the new train bars."""
    out, dates = tmp_path / "c.zarr", "val=2023-01-18,test=2023-01-19"  # files[10:12] are 2023-01-16 and 17
    assert (
        build_cache_main(
            [
                *map(str, files[:10]),
                "--out",
                str(out),
                "--split",
                dates,
                "--shard-rows",
                "1024",
                "--chunk-rows",
                "128",
                "-q",
            ]
        )
        == 0
    )
    frozen = open_cache(out).manifest.stats
    capsys.readouterr()
    assert build_cache_main([*map(str, files[10:12]), "--append", "--out", str(out), "-q"]) == 0
    assert capsys.readouterr() == ("", "") and open_cache(out).manifest.stats == frozen  # -q: quiet
    assert build_cache_main([*map(str, files[12:13]), "--append", "--out", str(out)]) == 0
    assert "bars" in capsys.readouterr().out  # the summary, without -q
    assert build_cache_main([*map(str, files[13:]), "--append", "--stats", "recompute", "--out", str(out), "-q"]) == 0
    rebuilt = open_cache(out)
    whole = build_cache(files, tmp_path / "w.zarr", **{**OPTS, "split": dates, "workers": None})
    assert rebuilt.manifest.stats == whole.manifest.stats != frozen
    # the rebuild takes its BuildOptions from the manifest: the builder must record every one of them
    recorded = open_group(str(out), "r").attrs["shardcache"]["build"]
    assert set(BuildOptions.names()) - {"stats_from", "split_cuts_ns"} <= set(recorded)
    assert rebuilt.manifest.build.options == whole.manifest.build.options.replace(
        split_cuts_ns=recorded["split_cuts_ns"]
    )
    assert (
        rebuilt.manifest.appends == 0 and "appends" not in recorded and len(rebuilt.history()["sources"]) == len(files)
    )
    assert "appends" not in open_group(str(out), "r").attrs["shardcache"]


def test_interrupted_append_keeps_the_old_cache_and_resumes(files, tmp_path, monkeypatch):
    out = tmp_path / "c.zarr"
    build_cache(files[:10], out, **OPTS)
    old = tmp_path / "old.zarr"
    shutil.copytree(out, old)
    want = tmp_path / "want.zarr"
    shutil.copytree(out, want)
    append_cache(files[10:], want, progress=False)
    real, calls = builder_mod.write_shards, []  # an append writes through the builder's write_batches

    def full(work, shards):
        calls.append(shards)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "features/c.x.0")
        return real(work, shards)

    monkeypatch.setattr(builder_mod, "write_shards", full)
    with pytest.raises(ShardcacheError, match="No space left on device; the finished part is kept in .*--resume"):
        append_cache(files[10:], out, workers=1, progress=False)
    assert compare_caches(old, out) == [] and verify_cache(out).ok  # untouched: the append was staged
    monkeypatch.setattr(builder_mod, "write_shards", real)
    resumed = append_cache(files[10:], out, resume=True, progress=False)
    assert [d for d in compare_caches(want, resumed) if not d.startswith("manifest['appends']")] == []
    assert not Path(f"{out}.staging").exists()


def test_append_on_s3(files, tmp_path, s3_bucket):
    bucket, options = s3_bucket
    url = f"{bucket}/c.zarr"
    build_cache(files[:10], url, storage_options=options, **OPTS)
    cache = append_cache(files[10:], url, storage_options=options, progress=False)
    local = tmp_path / "c.zarr"
    build_cache(files[:10], local, **OPTS)
    append_cache(files[10:], local, progress=False)
    differ = [
        d
        for d in compare_caches(local, cache, options)
        if not d.startswith((*BY_DESIGN, "history['sources']", "manifest['bytes']"))
    ]
    assert differ == []
    assert verify_cache(url, options).ok


def _killed_append(point: str, files: list[Path], out: Path) -> None:
    obj, name, after, when = APPEND_KILLS[point]
    (kill_after if after else kill_before)(obj, name, when)
    append_cache(files, out, workers=1, progress=False)


@pytest.mark.parametrize("point", list(APPEND_KILLS))
def test_sigkilled_append_leaves_the_cache_as_it_was_and_resumes(point, files, tmp_path):
    out, old, want = tmp_path / "c.zarr", tmp_path / "old.zarr", tmp_path / "want.zarr"
    build_cache(files[:10], out, **OPTS)
    shutil.copytree(out, old)
    shutil.copytree(out, want)
    append_cache(files[10:], want, progress=False)
    assert in_child(_killed_append, point, files[10:], out) == -signal.SIGKILL
    assert compare_caches(old, out) == [] and verify_cache(out).ok  # readers still see the old cache, whole
    with pytest.raises(ShardcacheError, match="interrupted build is kept in .*--resume"):
        build_cache(files, out, **OPTS)  # a build of the same --out is told about the staged append
    resumed = append_cache(files[10:], out, resume=True, progress=False)
    assert [d for d in compare_caches(want, resumed) if not d.startswith("manifest['appends']")] == []
    assert verify_cache(out).ok and not Path(f"{out}.staging").exists()


def _append_cmd(files: list[Path], out: Path) -> list[str]:
    code = "import sys; from shardcache.cli import build_cache_main; sys.exit(build_cache_main(sys.argv[1:]))"
    return [
        sys.executable,
        "-c",
        code,
        *map(str, files),
        "--append",
        "--resume",
        "--out",
        str(out),
        "-q",
        "--workers",
        "1",
    ]


def test_append_killed_at_random_points_never_changes_a_file_of_the_cache(files, tmp_path):
    """A real ``build-cache --append`` process, SIGKILLed at random times: while it runs and after
    it dies every file of the original cache (shards, metadata, history) keeps its bytes; then
    ``--append --resume`` finishes it, equal to an append that was never interrupted."""
    out, want, orig = tmp_path / "c.zarr", tmp_path / "want.zarr", tmp_path / "orig.zarr"
    build_cache(files[:10], out, **OPTS)
    shutil.copytree(out, want)
    shutil.copytree(out, orig)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    quiet = dict(env=env, timeout=300, stdout=subprocess.DEVNULL)
    took = []
    for target in (want, tmp_path / "again.zarr"):  # the quicker of two uninterrupted appends sizes the kills
        if not target.exists():
            shutil.copytree(orig, target)
        t0 = time.perf_counter()
        assert subprocess.run(_append_cmd(files[10:], target), **quiet, check=False).returncode == 0
        took.append(time.perf_counter() - t0)
    took = min(took)
    staged = 0
    before = _all_files(out)
    rng = np.random.default_rng(11)
    staging = Path(f"{out}.staging")
    # random moments, then one as soon as the staging folder appears: on a loaded machine the random ones
    # may all fall before the append stages anything, and the resume below needs a staged append
    for kill_at in [*(rng.uniform(0.2, 0.9, 5) * took), None]:
        if kill_at is None and staged:
            break
        ino = os.stat(out).st_ino  # a published append swaps in another folder: a new cache, not a changed one
        had_staging = staging.exists()
        proc = subprocess.Popen(_append_cmd(files[10:], out), env=env, stdout=subprocess.DEVNULL)
        t0 = time.perf_counter()
        while proc.poll() is None and (
            time.perf_counter() - t0 < kill_at if kill_at is not None else not (staging.exists() and not had_staging)
        ):
            now = _all_files(out)
            if os.stat(out).st_ino != ino:
                break
            assert now == before  # during the append
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if os.stat(out).st_ino != ino:  # it finished before the kill: start again from the original cache
            shutil.rmtree(out)
            shutil.copytree(orig, out)
            continue
        assert _all_files(out) == before, f"killed after {time.perf_counter() - t0:.2f} s of {took:.2f} s"
        staged += staging.exists()
    assert staged  # at least one kill left a staged, unfinished append for --resume to pick up
    assert subprocess.run(_append_cmd(files[10:], out), **quiet, check=False).returncode == 0
    assert [d for d in compare_caches(want, out) if not d.startswith(BY_DESIGN)] == []
    assert verify_cache(out).ok and not Path(f"{out}.staging").exists()
