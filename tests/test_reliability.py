"""Never lose or corrupt data: killed builds resume to the same cache, readers never see a partial
one, incomplete caches are refused, and bad inputs end in one clean line (see docs/bad-inputs.md)."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.kills import die as _die
from helpers.kills import in_child as _in_child
from helpers.kills import kill_after as _after
from helpers.kills import kill_before as _before

from shardcache import CacheError, ShardcacheError, WindowDataset, WindowStream, open_cache
from shardcache.cli import build_cache_main, main
from shardcache.format import objects as objects_mod
from shardcache.format.writer import CacheWriter
from shardcache.ingest import builder, merge, scan, staging
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample, make_sample_parquet, write_dbn
from shardcache.inspect.verify import compare_caches, verify_cache

# shards of 1,024 rows: symbol 0 (~9,800 rows) fills shards 0-9, so the shard numbers below are all written
OPTS = dict(split="train=0.8,val=0.1,test=0.1", shard_rows=1024, chunk_rows=128, workers=2, progress=False)
SHARED = Path(os.environ.get("SHARDCACHE_SAMPLE_DBN", Path(__file__).resolve().parents[2] / "shared" / "data" / "dbn"))
MIN = 60 * 10**9
T0 = int(np.datetime64("2024-03-04T14:30", "ns").astype(np.int64))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("dbn"), days=21, seed=3)


@pytest.fixture(scope="module")
def clean(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "c.zarr"
    build_cache(files, out, **OPTS)
    return out


def _drop_one_then_die(paths) -> None:
    os.remove(paths[0])
    _die()


KILL_POINTS = {
    "scan: file 3 spilled, not recorded": lambda: _after(scan, "_scan", lambda a: a[0].index == 3),
    "merge: batch 1 clustered, not recorded": lambda: _after(merge, "_merge", lambda a: a[0].index == 1),
    "merge: every batch recorded, runs half deleted": lambda: setattr(merge, "_drop_runs", _drop_one_then_die),
    "plan: cache created, not recorded": lambda: _before(staging.Staging, "save", lambda a: a[1] == "created"),
    "stats: the batch of shard 3 done, not recorded": lambda: _after(builder, "shard_stats", lambda a: 3 in a[1]),
    "write: the batch of shard 4 written, not recorded": lambda: _after(builder, "write_shards", lambda a: 4 in a[1]),
    "finish: segments written, manifest not": lambda: _before(CacheWriter, "finish", lambda a: True),
    "publish: complete, not renamed": lambda: _before(staging.Staging, "publish", lambda a: True),
    "cleanup: renamed, state.json deleted": lambda: _after(
        staging, "_unlink", lambda a: str(a[0]).endswith("state.json")
    ),
    "cleanup: renamed, staging folder deleted": lambda: _after(
        staging.shutil, "rmtree", lambda a: str(a[0]).endswith(".staging")
    ),
}
# the batch boundaries of ``many`` (60 symbols of 120 bars, one shard each: 8 symbols or shards a batch,
# so batch 1 is symbols and shards 8-15): a batch half spilled or written, and a batch done but not
# recorded (a stats batch writes nothing but its marker: no half-done state to leave)
MANY_SYMBOLS, MANY_BARS = 60, 120
BATCH_KILL_POINTS = {
    "merge: batch 1's clusters spilled, their file not closed": lambda: _after(
        merge._ClusterFiles, "add", lambda a: a[0].job == 1
    ),
    "merge: batch 1 clustered, not recorded": lambda: _after(merge, "_merge", lambda a: a[0].index == 1),
    "stats: batch 1 done, not recorded": lambda: _after(builder, "shard_stats", lambda a: a[1][0] == 8),
    "write: batch 1's first shard written, the rest not": lambda: _after(
        objects_mod, "_write_file", lambda a: a[0].endswith(os.path.join("symbols", "8", "time", "c.0"))
    ),
    "write: batch 1 written, not recorded": lambda: _after(builder, "write_shards", lambda a: a[1][0] == 8),
}


def _killed_build(point: str, files: list[Path], out: Path, opts: dict) -> None:
    {**KILL_POINTS, **BATCH_KILL_POINTS}[point]()
    build_cache(files, out, **opts)


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_anywhere_then_resume_gives_the_same_cache(point, files, clean, tmp_path):
    out = tmp_path / "c.zarr"
    assert _in_child(_killed_build, point, files, out, OPTS) == -signal.SIGKILL
    published = point.startswith("cleanup")
    assert out.exists() == published, "a cache appeared at --out before it was complete"
    if not published:
        with pytest.raises(ShardcacheError, match="--resume .*--overwrite"):
            build_cache(files, out, **OPTS)
    cache = build_cache(files, out, resume=True, **OPTS)
    assert compare_caches(clean, cache) == []
    assert not Path(f"{out}.staging").exists()
    assert verify_cache(out).ok


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> tuple[list[Path], Path]:
    """Many small symbols in 3 Parquet files, and their cache built without a kill."""
    root = tmp_path_factory.mktemp("many")
    names = [f"S{i:03d}" for i in range(MANY_SYMBOLS)]
    files = make_sample_parquet(
        root / "in", n_bars=MANY_SYMBOLS * MANY_BARS, n_features=4, symbols=names, rows_per_file=2400
    )
    build_cache(files, root / "clean.zarr", **OPTS)
    return files, root / "clean.zarr"


@pytest.mark.parametrize("point", list(BATCH_KILL_POINTS))
def test_sigkill_inside_a_batch_then_resume_gives_the_same_cache(point, many, tmp_path):
    files, clean = many
    out = tmp_path / "c.zarr"
    assert _in_child(_killed_build, point, files, out, OPTS) == -signal.SIGKILL
    assert not out.exists()
    done = {p.name for p in (Path(f"{out}.staging") / "done").iterdir()}
    stage = point.split(":")[0]
    assert not any(name.startswith(f"{stage}-000001") for name in done)  # batch 1 is run again
    cache = build_cache(files, out, resume=True, **OPTS)
    assert compare_caches(clean, cache) == [] and verify_cache(out).ok


def _killed_overwrite(point: str, files: list[Path], out: Path, opts: dict) -> None:
    KILL_POINTS[point]()
    build_cache(files, out, overwrite=True, **opts)


@pytest.mark.parametrize(
    "point",
    [
        "write: the batch of shard 4 written, not recorded",
        "publish: complete, not renamed",
        "cleanup: renamed, staging folder deleted",
    ],
)
def test_sigkill_during_overwrite_leaves_the_old_or_the_new_cache(point, files, clean, tmp_path):
    out = tmp_path / "c.zarr"
    build_cache(files, out, **{**OPTS, "normalize": "none"})
    assert _in_child(_killed_overwrite, point, files, out, OPTS) == -signal.SIGKILL
    assert verify_cache(out).ok  # still a complete cache: the old one, or the new one once swapped
    assert open_cache(out).manifest.normalize == ("zscore" if point.startswith("cleanup") else "none")
    cache = build_cache(files, out, resume=True, **OPTS)  # the interrupted build was an --overwrite
    assert compare_caches(clean, cache) == [] and not Path(f"{out}.staging").exists()


def test_resume_refuses_other_inputs_or_options(files, tmp_path):
    out = tmp_path / "c.zarr"
    assert (
        _in_child(_killed_build, "write: the batch of shard 4 written, not recorded", files, out, OPTS)
        == -signal.SIGKILL
    )
    with pytest.raises(ShardcacheError, match=r"other inputs or options \(normalize='zscore' -> 'none'\)"):
        build_cache(files, out, resume=True, **{**OPTS, "normalize": "none"})
    with pytest.raises(ShardcacheError, match=r"input .*20230102.ohlcv-1m.dbn.zst removed"):
        build_cache(files[1:], out, resume=True, **OPTS)
    copy = tmp_path / "inputs"
    shutil.copytree(files[0].parent, copy)
    moved = sorted(copy.iterdir())
    os.utime(moved[2], ns=(0, 0))
    with pytest.raises(ShardcacheError, match="other inputs"):
        build_cache(moved, out, resume=True, **OPTS)
    cache = build_cache(files, out, overwrite=True, **{**OPTS, "normalize": "none"})
    assert cache.manifest.normalize == "none" and not Path(f"{out}.staging").exists()


def test_cli_resume(files, clean, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    opts = {**OPTS, "split": "none"}
    assert (
        _in_child(_killed_build, "write: the batch of shard 4 written, not recorded", files, out, opts)
        == -signal.SIGKILL
    )
    argv = [*map(str, files), "--out", str(out), "--shard-rows", "1024", "--chunk-rows", "128"]
    code, err, _ = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and "pass --resume to continue it or --overwrite to start again" in err[0]
    code, err, stdout = _cli(capsys, *argv, "--resume")
    assert code == 0 and err == [] and "bars" in stdout and verify_cache(out).ok


def test_resume_of_a_finished_build_does_nothing_and_resume_without_state_builds(files, clean, tmp_path):
    out = tmp_path / "c.zarr"
    build_cache(files, out, resume=True, **OPTS)  # nothing to resume: a plain build
    stamp = (out / "zarr.json").stat().st_mtime_ns
    assert compare_caches(clean, build_cache(files, out, resume=True, **OPTS)) == []
    assert (out / "zarr.json").stat().st_mtime_ns == stamp
    with pytest.raises(ShardcacheError, match="already exists; pass --overwrite"):
        build_cache(files, out, resume=True, **{**OPTS, "normalize": "none"})


def test_a_second_build_of_the_same_output_is_refused_while_one_runs(files, tmp_path):
    out = tmp_path / "c.zarr"
    stage = staging.prepare(str(out), None, {"x": 1}, resume=False, overwrite=False)
    try:
        with pytest.raises(ShardcacheError, match="another build of this cache is running"):
            build_cache(files, out, overwrite=True, **OPTS)
    finally:
        stage.release()


# -- incomplete caches ----------------------------------------------------------------------
def _incomplete(out: Path) -> None:
    writer = CacheWriter(out, feature_names=["a"], bars_per_symbol=[100], shard_rows=64, chunk_rows=32)
    writer.write_shard(0, np.ones((64, 1)), np.arange(64))


def test_incomplete_cache_is_refused_everywhere(files, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    _incomplete(out)
    for opener in (
        open_cache,
        lambda p: WindowStream(p, seq_len=4, split="all"),
        lambda p: WindowDataset(p, seq_len=4, split="all"),
        verify_cache,
    ):
        with pytest.raises(CacheError, match="incomplete .*--resume .*--overwrite"):
            opener(out)
    assert main(["info", str(out)]) == 2 and main(["verify", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("incomplete" in line for line in err)
    with pytest.raises(ShardcacheError, match="incomplete cache .*pass --overwrite"):
        build_cache(files, out, **OPTS)
    assert build_cache(files, out, overwrite=True, **OPTS).n_bars > 0


# -- readers during builds ----------------------------------------------------------------
def _poll(out: Path, stop: Path, log: Path) -> None:
    """Open and fully verify ``out`` until an attempt that began after ``stop`` appeared; record each."""
    seen, last = [], False
    while not last:
        last = stop.exists()  # the final attempt starts after the writer finished, so it sees the end state
        try:
            cache = open_cache(out)
            report = verify_cache(cache)
            seen.append(
                {"none": "A", "zscore": "B"}[cache.manifest.normalize] if report.ok else f"BAD {report.problems}"
            )
        except CacheError as exc:
            seen.append(
                "replaced" if "replaced" in str(exc) else "absent" if "no cache found" in str(exc) else f"ERROR {exc}"
            )
        if seen[-1] == "A":
            log.with_suffix(".A").touch()  # the writer waits for this before replacing A
    log.write_text(json.dumps(seen))


def test_readers_see_only_complete_caches_during_build_and_overwrite(files, tmp_path):
    out, stop, log = tmp_path / "c.zarr", tmp_path / "stop", tmp_path / "seen.json"
    reader = mp.get_context("fork").Process(target=_poll, args=(out, stop, log))
    reader.start()
    try:
        time.sleep(0.3)
        build_cache(files, out, **{**OPTS, "normalize": "none"})  # A
        deadline = time.monotonic() + 120  # a loaded machine verifies slowly: replace A once a reader saw it
        while not log.with_suffix(".A").exists() and time.monotonic() < deadline and reader.is_alive():
            time.sleep(0.05)
        build_cache(files, out, overwrite=True, **OPTS)  # B replaces A
        time.sleep(0.3)
    finally:
        stop.touch()
        reader.join(60)
    seen = json.loads(log.read_text())
    first = next(i for i, s in enumerate(seen) if s != "absent")
    assert first > 0, "the reader never ran during the first build"
    rest = seen[first:]
    assert set(rest) <= {"A", "B", "replaced"}, rest  # never absent again, never incomplete or damaged
    states = [s for s in rest if s in ("A", "B")]
    assert states[0] == "A" and states[-1] == "B" and states == sorted(states), states


def test_a_cache_replaced_under_an_open_handle_is_refused(files, tmp_path):
    out = tmp_path / "c.zarr"
    old = build_cache(files, out, **{**OPTS, "normalize": "none"})
    old.read_rows(0, 10)
    pickled = pickle.dumps(old)
    build_cache(files, out, overwrite=True, **OPTS)
    with pytest.raises(CacheError, match="replaced .*open it again"):
        old.read_rows(0, 10)
    with pytest.raises(CacheError, match="replaced"):
        pickle.loads(pickled).read_rows(0, 10)  # as a DataLoader worker would
    assert open_cache(out).manifest.normalize == "zscore"


# -- bad inputs: one line, exit 2, no complete-looking cache ---------------------------------
def _cli(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = build_cache_main(list(argv))
    cap = capsys.readouterr()
    return code, cap.err.strip().splitlines(), cap.out


def _looks_complete(out: Path) -> bool:
    try:
        open_cache(out)
    except ShardcacheError:
        return False
    return True


def _assert_refused(code: int, err: list[str], needle: str, out: Path) -> None:
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("build-cache: error: ") and needle in err[0], err
    assert not _looks_complete(out)


@pytest.mark.parametrize("schema", ["status", "statistics"])
def test_unsupported_schemas(schema, tmp_path, capsys):
    path = SHARED / f"test_data.{schema}.v3.dbn.zst"
    if not path.exists():
        pytest.skip("shared DBN samples not present")
    code, err, _ = _cli(capsys, str(path), "--out", str(tmp_path / "c.zarr"), "-q")
    _assert_refused(code, err, schema, tmp_path / "c.zarr")


def test_bad_dbn_values_are_dropped_and_counted_in_the_summary(tmp_path, capsys):
    n = 200
    ts = T0 + MIN * np.arange(n)
    ts[[5, 6]] = ts[[6, 5]]  # one pair out of order
    ts[7] = ts[8]  # a duplicate timestamp (the later record wins)
    ts[10] = 0  # 1970: out of range
    ts[11] = np.datetime64("2150-01-01", "ns").astype(np.int64)
    px = np.full(n, 100.0)
    close = px.copy()
    close[20], close[21], close[22] = 0.0, -5.0, np.nan  # NaN is written as UNDEF_PRICE
    recs = {
        "ts_event": ts,
        "instrument_id": np.full(n, 7),
        "open": px,
        "high": px + 1,
        "low": px - 1,
        "close": close,
        "volume": np.ones(n),
    }
    path = write_dbn(tmp_path / "x.ohlcv-1m.dbn", "ohlcv-1m", recs, symbols={7: "ESM4"})
    out = tmp_path / "c.zarr"
    code, err, stdout = _cli(capsys, str(path), "--out", str(out), "--features", "close", "--normalize", "none")
    assert code == 0, err
    dropped = open_cache(out).manifest.counts.dropped
    assert dropped == {
        "timestamp out of range": 2,
        "non-finite price": 1,
        "non-positive price": 2,
        "duplicate timestamp": 1,
    }
    line = next(s for s in stdout.splitlines() if s.startswith("records"))
    assert line.endswith(
        "read; dropped timestamp out of range: 2, non-finite price: 1, "
        "non-positive price: 2, duplicate timestamp: 1; 1 out of order (sorted)"
    )
    assert np.isfinite(open_cache(out).read_rows(0, open_cache(out).n_bars)).all()


def test_bad_parquet_values_are_dropped_and_counted(tmp_path, capsys):
    n = 100
    close = np.full(n, 10.0)
    close[[1, 2, 3, 4, 5]] = [np.nan, np.inf, -np.inf, 0.0, -1.0]
    ts = T0 + MIN * np.arange(n)
    ts[6] = -5
    volume = np.ones(n)
    volume[7] = np.nan
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"ts": ts, "symbol": ["A"] * n, "close": close, "volume": volume}), path)
    out = tmp_path / "c.zarr"
    code, err, stdout = _cli(capsys, str(path), "--out", str(out), "--seq-len", "10")
    assert code == 0, err
    assert open_cache(out).manifest.counts.dropped == {
        "non-finite price": 3,
        "non-positive price": 2,
        "timestamp out of range": 1,
        "non-finite value": 1,
    }
    assert "non-finite price: 3" in stdout and open_cache(out).n_bars == n - 7


@pytest.mark.parametrize(
    "column, value, features, needle",
    [
        (
            "close",
            1e39,
            "close",
            "feature 'close' is not finite at 1 bar(s) of shard 0, first A at 2024-03-04T14:35:00:",
        ),
        ("volume", -1e300, "close,volume", "feature 'volume' is not finite"),
    ],
)
def test_values_that_would_become_nan_or_inf_are_refused(column, value, features, needle, tmp_path, capsys):
    n = 100
    cols = {"ts": T0 + MIN * np.arange(n), "symbol": ["A"] * n, "close": np.full(n, 10.0), "volume": np.ones(n)}
    cols[column][5] = value
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table(cols), path)
    out = tmp_path / "c.zarr"
    code, err, _ = _cli(capsys, str(path), "--out", str(out), "--features", features, "--seq-len", "10")
    _assert_refused(code, err, needle, out)
    assert not Path(f"{out}.staging").exists()


PARQUET_CASES = {
    "no timestamp column": ({"when": [T0], "close": [1.0]}, [], "no timestamp column"),
    "timestamps as non-ISO text": ({"ts": ["yesterday"], "close": [1.0]}, [], "not an ISO-8601 time"),
    "timestamps of another type": ({"ts": [1.5], "close": [1.0]}, [], "has type double"),
    "timestamps in no unit": ({"ts": [12_345], "close": [1.0]}, [], "what unit are they in?"),
    "named column missing": ({"ts": [T0], "close": [1.0]}, ["--columns", "close,vwap"], "no column 'vwap'"),
    "non-numeric feature column": ({"ts": [T0], "venue": ["X"]}, ["--columns", "venue"], "must be numeric"),
    "no numeric columns": ({"ts": [T0], "venue": ["X"]}, [], "no numeric feature columns"),
    "symbol column of fractions": (
        {"ts": [T0], "sym": [1.5], "close": [1.0]},
        ["--symbol-column", "sym"],
        "not a whole number",
    ),
    "feature needs absent columns": ({"ts": [T0], "close": [1.0]}, ["--features", "log_range"], "needs source"),
}


@pytest.mark.parametrize("case", list(PARQUET_CASES))
def test_bad_parquet_files(case, tmp_path, capsys):
    cols, flags, needle = PARQUET_CASES[case]
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table(cols), path)
    out = tmp_path / "c.zarr"
    code, err, _ = _cli(capsys, str(path), "--out", str(out), "-q", *flags)
    _assert_refused(code, err, needle, out)


def test_output_under_a_regular_file(files, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "c.zarr"
    code, err, _ = _cli(capsys, str(files[0]), "--out", str(out), "-q")
    _assert_refused(code, err, "cannot write here (Not a directory)", out)


def _mount(path: Path, options: str) -> None:
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the ENOSPC path is tested by a patched write")


@pytest.fixture
def mounts(tmp_path):
    made: list[Path] = []
    yield lambda name, options: (_mount(tmp_path / name, options), made.append(tmp_path / name), tmp_path / name)[2]
    for path in made:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def test_read_only_filesystem(files, mounts, capsys):
    out = mounts("ro", "size=1m,ro") / "c.zarr"
    code, err, _ = _cli(capsys, str(files[0]), "--out", str(out), "-q")
    _assert_refused(code, err, "cannot write here (Read-only file system)", out)


def test_disk_full_during_a_build(files, mounts, capsys):
    out = mounts("small", "size=2m") / "c.zarr"
    code, err, _ = _cli(capsys, *map(str, files), "--out", str(out), "-q")
    _assert_refused(code, err, "No space left on device", out)
    assert "--resume" in err[0]


def _disk_full_at_shard_5(monkeypatch):
    """Make writing shard 5 (and the shards written with it) fail with ENOSPC; return the real
    ``write_shards`` to restore."""
    real = CacheWriter.write_shards

    def full(self, items):
        if any(shard == 5 for shard, *_ in items):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{self.url}/features/c.5.0")
        return real(self, items)

    monkeypatch.setattr(CacheWriter, "write_shards", full)
    return real


def test_disk_full_while_writing_a_shard_then_resume(files, clean, tmp_path, monkeypatch, capsys):
    real = _disk_full_at_shard_5(monkeypatch)
    out = tmp_path / "c.zarr"
    with pytest.raises(ShardcacheError, match=r"c\.5\.0: No space left on device; .* --resume"):
        build_cache(files, out, **OPTS)
    assert not out.exists()
    # what a SIGKILL inside a write leaves: a half-written temporary file of the writer (zarr names its own alike)
    staged = Path(f"{out}.staging") / "cache.zarr" / "symbols" / "0" / "features"
    staged.mkdir(parents=True, exist_ok=True)
    (staged / f"c.5.0.{'ab' * 16}.partial").write_bytes(b"x" * 70_000)
    (staged / f"zarr.json.{'cd' * 16}.partial").write_bytes(b"{")  # a document's
    monkeypatch.setattr(CacheWriter, "write_shards", real)
    assert compare_caches(clean, build_cache(files, out, resume=True, **OPTS)) == []  # bytes counted too
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial")]


def test_only_a_resumed_build_looks_for_strays(files, clean, tmp_path, monkeypatch):
    """Strays are what a killed write leaves: a build run once never walks its cache's folders for them
    (thousands of symbols are tens of thousands of folders); a resumed one does (above)."""
    swept = []
    real = CacheWriter.sweep
    monkeypatch.setattr(CacheWriter, "sweep", lambda self: swept.append(self.url) or real(self))
    assert compare_caches(clean, build_cache(files, tmp_path / "c.zarr", **OPTS)) == []
    assert swept == []


def test_object_store_build_is_written_in_place_and_resumes(files, clean, tmp_path, monkeypatch):
    url = f"memory://{tmp_path.name}/c.zarr"  # fsspec's in-memory filesystem stands in for s3://
    real = _disk_full_at_shard_5(monkeypatch)
    with pytest.raises(ShardcacheError, match="No space left on device; the finished part is kept in .*--resume"):
        build_cache(files, url, **OPTS)
    with pytest.raises(CacheError, match="incomplete"):  # written in place, refused until complete
        open_cache(url)
    monkeypatch.setattr(CacheWriter, "write_shards", real)
    assert compare_caches(clean, build_cache(files, url, resume=True, **OPTS)) == []
    assert open_cache(url)._stamp is None  # no folder stamp on an object store


def test_newer_format_version_is_refused(clean, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    shutil.copytree(clean, out)
    meta = json.loads((out / "zarr.json").read_text())
    meta["attributes"]["shardcache"]["format_version"] = 99
    (out / "zarr.json").write_text(json.dumps(meta))
    for opener in (open_cache, lambda p: WindowStream(p, seq_len=4, split="all"), verify_cache):
        with pytest.raises(CacheError, match="format version 99 is newer .*upgrade shardcache"):
            opener(out)
    assert main(["verify", str(out)]) == 2
    assert "upgrade shardcache" in capsys.readouterr().err
