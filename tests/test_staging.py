"""The build's resumable state (``shardcache.ingest.staging``, ``shardcache.ingest.markers``): markers are data and
never code, a damaged one is "not finished", ``prepare`` is its decision table, and a second build of
the same output is refused while the first runs."""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import logging
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shardcache.cli import build_cache_main
from shardcache.errors import ShardcacheError, SourceError
from shardcache.format.cache import open_cache
from shardcache.format.index import ShardRecord
from shardcache.format.layout import FORMAT_VERSION
from shardcache.format.manifest import Manifest
from shardcache.format.moments import Moments
from shardcache.ingest import append, merge, scan, staging
from shardcache.ingest.builder import build_cache
from shardcache.ingest.compute import ShardWork, Spills, shard_stats, write_shards
from shardcache.ingest.markers import Unreadable, decode, encode
from shardcache.ingest.merge import Merged
from shardcache.ingest.sample import make_sample, make_sample_parquet
from shardcache.inspect.verify import compare_caches, verify_cache

OPTS = dict(split="train=0.8,val=0.1,test=0.1", shard_rows=1024, chunk_rows=128, workers=2, progress=False)
KINDS = ("scan", "merge", "stats", "write", "created")  # every kind of marker a build writes


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("dbn"), days=8, seed=5)


@pytest.fixture(scope="module")
def clean(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "c.zarr"
    build_cache(files, out, **OPTS)
    return out


@pytest.fixture(scope="module")
def interrupted(files, tmp_path_factory) -> Path:
    """The staging folder of a build stopped just before it published: every task's marker is there."""
    out = tmp_path_factory.mktemp("interrupted") / "c.zarr"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(staging.Staging, "publish", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            build_cache(files, out, **OPTS)
    root = Path(f"{out}.staging")
    assert {p.name.split("-")[0].split(".")[0] for p in (root / "done").iterdir()} == set(KINDS)
    return root


def _copy_state(interrupted: Path, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "c.zarr"
    shutil.copytree(interrupted, f"{out}.staging", symlinks=True)
    return out, Path(f"{out}.staging")


# -- markers: data in, data out ----------------------------------------------------------------
def _scan_result() -> scan._Scan:
    runs = np.zeros(3, scan.RUN)
    runs["n"], runs["ts_max"] = [5, 6, 7], [10**18, 2, 3]
    return scan._Scan(
        symbols=["ESM4", "NQM4"],
        runs=runs,
        sketch=np.arange(3 * scan.SKETCH).reshape(3, -1),
        drops=collections.Counter({"NaN price": 3}),
        reordered=2,
        records=21,
        median_dt=60 * 10**9,
        step=60 * 10**9,
        symbology={"unmapped": {"42": "ESH3"}},
    )


def _merged() -> Merged:
    return Merged(
        symbol="ESM4",
        job=3,
        cluster_rows=np.array([5, 7]),
        cluster_at=np.array([[0, 0], [0, 5]]),
        n=12,
        seg_starts=np.array([0, 9]),
        seg_split=np.array([0, 1], np.int8),
        duplicates=1,
        tail={"ts": 17, "close": 4321.25, "volume": None},
    )


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_equal(getattr(a, k), getattr(b, k)) for k in a.__dataclass_fields__)
    return type(a) is type(b) and a == b


RESULTS = {  # a task's result as the build writes it, and the type it is read back as
    "scan": (_scan_result(), staging._returns(scan._scan)),
    "merge": (merge.MergedBatch.of(3, [_merged(), _merged()]), staging._returns(merge._merge)),
    "stats": ((np.ones((2, 4)), np.zeros((2, 4)), np.arange(8.0).reshape(2, 4)), staging._returns(shard_stats)),
    "write": (
        [
            ShardRecord(
                symbol=2,
                shard=1,
                rows=300,
                first_ts=10**18,
                last_ts=10**18 + 299,
                stored_bytes=4321,
                chunk_rows=512,
                digest="9f2c",
                moments=Moments.of(np.arange(1200.0).reshape(300, 4), np.array([0, 256])),
            ),
            ShardRecord(
                symbol=3,
                shard=0,
                rows=12,
                first_ts=10**18,
                last_ts=10**18 + 11,
                stored_bytes=99,
                chunk_rows=512,
                digest="77aa01",
                moments=Moments.of(np.ones((12, 4))),
            ),
        ],
        staging._returns(write_shards),
    ),
    "created": (True, bool),
}


@pytest.mark.parametrize("kind", list(RESULTS))
def test_every_task_result_round_trips_as_data(kind):
    value, typ = RESULTS[kind]
    suffix, data = encode(value)
    assert suffix == (".json" if kind == "created" else ".npz")  # a shard's records hold its chunk moments
    assert _equal(decode(data, typ), value)
    if suffix == ".npz":  # every member loads without pickle
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            assert all(npz[name].dtype != object for name in npz.files)


def test_build_records_are_keyword_only_and_read_back_as_their_types(clean):
    """Jobs, results, the shard work and an append's placement and finish have named fields only (no
    positional records, no 7-tuples); the ones a resume reads back (a scan's, a merge's, an append's
    finish) decode as their own types."""
    records = [
        *(scan.ScanJob, scan._Scan, scan.Scanned, scan.Inputs),
        *(merge.MergeJob, Merged, merge.MergedBatch, merge._Run, ShardWork),
    ]
    for record in [*records, append._Placement, append._Finish]:
        with pytest.raises(TypeError, match="positional argument"):
            record(*range(len(dataclasses.fields(record))))
    manifest = open_cache(clean).manifest
    finish = append._Finish(
        bars_per_symbol=np.array([3, 4]),
        segments=np.array([[0, 0, 3], [1, 1024, 1028]]),
        segment_split=np.array([0, 1], np.int8),
        shards=np.array([[0, 0, 3, 10, 12, 99, 8], [1, 0, 4, 11, 14, 120, 8]]),
        digests=np.array([[1, 2], [2**64 - 1, 0]], np.uint64),
        moments=Moments.of(np.arange(14.0).reshape(7, 2), np.array([0, 3])),
        grown=[1],
        first_new=1,
        manifest=manifest.to_json(),
        history={"sources": [{"path": "a.dbn"}], "appends": [{"bars": 7}]},
    )
    back = decode(encode(finish)[1], append._Finish)
    assert _equal(back, finish) and Manifest.from_json(back.manifest) == manifest
    for value, kind in (RESULTS["scan"], RESULTS["merge"]):
        assert _equal(decode(encode(value)[1], kind), value)


def test_results_that_are_not_data_are_refused_when_written():
    for value in (object(), np.array([1, "a"], dtype=object), {1: "int key"}, {"$npy": 0}):
        with pytest.raises(TypeError, match="a marker cannot hold"):
            encode(value)


def _object_array_npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, value=np.frombuffer(b"{}", np.uint8), **{"0": np.array([{}], dtype=object)})
    return buf.getvalue()


@pytest.mark.parametrize(
    "data, typ, why",
    [
        (pickle.dumps(_merged()), Merged, "a pickle"),
        (b"", Merged, "empty"),
        (encode(_merged())[1][:100], Merged, "truncated"),
        (encode(_merged())[1].replace(b'"marker": 1', b'"marker": 2'), Merged, "another marker format"),
        (b'{"marker": 1, "value": "x"}', str, "no digest"),
        (encode("9f2c0d")[1], Merged, "another type"),
        (encode(_merged())[1], staging._returns(scan._scan), "another dataclass"),
        (encode((np.ones(2), np.ones(2)))[1], staging._returns(shard_stats), "a tuple of another length"),
        (_object_array_npz(), object, "an object array"),
    ],
)
def test_a_marker_that_is_not_the_expected_data_is_unreadable(data, typ, why):
    with pytest.raises(Unreadable):
        decode(data, typ)


def _payload_bytes(data: bytes) -> set[int]:
    """Offsets of the bytes that carry the value: all of a JSON marker, each member of an .npz."""
    if not data.startswith(b"PK"):
        return set(range(len(data)))
    out: set[int] = set()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_len + extra_len
            out |= set(range(start, start + info.compress_size))
    return out


@pytest.mark.parametrize("kind", list(RESULTS))
def test_every_flipped_byte_is_caught_or_harmless(kind):
    """A flip anywhere in a marker reads as unfinished or leaves the value as written; a flip in
    the bytes that carry the value is always caught."""
    value, typ = RESULTS[kind]
    data = encode(value)[1]
    payload, missed = _payload_bytes(data), []
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        try:
            assert _equal(decode(bytes(bad), typ), value), f"byte {i} changed the value"
            missed.append(i)
        except Unreadable:
            pass
    assert len(payload) > len(data) // 2 and not payload & set(missed), sorted(payload & set(missed))


# -- planted pickles and damaged markers, resumed ----------------------------------------------
class _Evil:
    """A pickle that writes ``path`` when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').write('code ran')",)


def _payload(sentinel: Path) -> bytes:
    data = pickle.dumps(_Evil(sentinel))
    pickle.loads(data)  # the payload does run code when a pickle is loaded ...
    assert sentinel.exists()
    sentinel.unlink()
    return data


def test_a_planted_pickle_under_every_marker_name_never_runs(files, clean, interrupted, tmp_path, caplog):
    out, root = _copy_state(interrupted, tmp_path)
    sentinel = tmp_path / "pwned"
    evil = _payload(sentinel)
    done = root / "done"
    bases = sorted({p.name.rsplit(".", 1)[0] for p in done.iterdir()} | {"linked"})
    for base in bases:  # the names of today's markers and of the pickle markers before them
        for suffix in (".pkl", ".json", ".npz"):
            (done / f"{base}{suffix}").write_bytes(evil)
    stage = staging.Staging(str(root), str(out), {}, -1)
    kinds = {prefix: kind for prefix, (_, kind) in RESULTS.items()}
    for base in bases:
        prefix, _, i = base.partition("-")
        assert stage.load(prefix, int(i) if i else None, kinds.get(prefix, bool)) is None
    with caplog.at_level(logging.WARNING, "shardcache"):
        cache = build_cache(files, out, resume=True, **OPTS)
    assert not sentinel.exists(), "a marker ran code"
    assert "damaged marker(s)" in caplog.text
    assert compare_caches(clean, cache) == [] and verify_cache(out).ok and not root.exists()


def test_old_pickle_markers_are_never_read(files, clean, interrupted, tmp_path, caplog):
    """Beside intact markers, an old build's ``.pkl`` names are not markers: the resume skips every task."""
    out, root = _copy_state(interrupted, tmp_path)
    sentinel = tmp_path / "pwned"
    evil = _payload(sentinel)
    for p in list((root / "done").iterdir()):
        p.with_suffix(".pkl").write_bytes(evil)
    with caplog.at_level(logging.INFO, "shardcache"):
        cache = build_cache(files, out, resume=True, **OPTS)
    assert not sentinel.exists() and "damaged" not in caplog.text
    for desc in ("read files", "sort symbols", "statistics", "write shards"):
        assert re.search(rf"{desc}: (\d+) of \1 already done", caplog.text), f"{desc} ran again"
    assert compare_caches(clean, cache) == []


@pytest.mark.parametrize("kind", KINDS)
def test_flipped_bytes_in_a_marker_then_resume_gives_the_clean_cache(kind, files, clean, interrupted, tmp_path, caplog):
    out, root = _copy_state(interrupted, tmp_path)
    marker = max((root / "done").glob(f"{kind}*"))
    data = bytearray(marker.read_bytes())
    for i in np.linspace(0, len(data) - 1, 5).astype(int):
        data[i] ^= 0xFF
    marker.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "shardcache"):
        cache = build_cache(files, out, resume=True, **OPTS)
    assert f"first {marker.name}" in caplog.text
    assert compare_caches(clean, cache) == [] and verify_cache(out).ok and not root.exists()


def test_a_marker_read_as_another_type_is_not_finished(interrupted, tmp_path):
    _, root = _copy_state(interrupted, tmp_path)
    stage = staging.Staging(str(root), "unused", {}, -1)
    batch = RESULTS["merge"][1]
    assert all(isinstance(m, Merged) for m in stage.load("merge", 0, batch).merged())
    assert stage.load("merge", 0, Merged) is None and stage.load("merge", 0, str) is None
    assert stage.load("write", 0, batch) is None
    assert stage.load("created", None, bool) is True and stage.load("linked") is None


# -- batches: what a build records does not grow with its symbols -------------------------------
def _staged_counts(files: list[Path], out: Path, monkeypatch) -> dict[str, int]:
    """Markers by kind, cluster files and run files of a build stopped just before it published."""
    runs: list[str] = []
    real_drop = merge._drop_runs
    monkeypatch.setattr(merge, "_drop_runs", lambda paths: (runs.extend(paths), real_drop(paths)))
    monkeypatch.setattr(staging.Staging, "publish", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build_cache(files, out, **OPTS)
    root = Path(f"{out}.staging")
    counts = collections.Counter(p.name.split("-")[0].split(".")[0] for p in (root / "done").iterdir())
    return {**counts, "cluster files": len(list((root / "clusters").iterdir())), "run files": len(runs)}


def test_small_symbols_share_tasks_markers_and_spill_files(tmp_path, monkeypatch):
    """The same 10,000 bars as 200 symbols of 50 or 20 symbols of 500 (shards of 1,024 rows): the same few
    merge, stats and write tasks (one marker each, a batch of symbols or shards holding at most a shard's
    rows), one cluster file per merge batch and one run file per input piece: nothing per symbol."""
    got = {}
    for n in (200, 20):
        names = [f"S{i:03d}" for i in range(n)]
        files = make_sample_parquet(
            tmp_path / f"in-{n}", n_bars=10_000, n_features=3, symbols=names, rows_per_file=5_000
        )
        got[n] = _staged_counts(files, tmp_path / f"{n}.zarr", monkeypatch)
    want = {"scan": 2, "merge": 10, "stats": 10, "write": 10, "created": 1, "cluster files": 10, "run files": 2}
    assert got[200] == got[20] == want


# -- prepare: the decision table ---------------------------------------------------------------
def _before_the_table(staged: str, out: str, resume: bool, overwrite: bool) -> str:
    """``prepare``'s branches as they were before ``RULES`` (no running check): the reference."""
    if resume and out == "built":
        return "done"
    if staged != "none" and not overwrite:
        if not resume:
            return "refuse:kept"
        if staged == "other":
            return "refuse:other"
    if staged in ("same", "same+replace") and resume:
        if out not in ("missing", "incomplete") and not (staged == "same+replace" or overwrite):
            return "refuse:exists"
        return "resume"
    if out == "incomplete" and not overwrite:
        return "refuse:incomplete"
    if out != "missing" and not overwrite:
        return "refuse:exists"
    return "fresh"


STAGED = ("none", "same", "same+replace", "other")
# what was one state "other" (anything at OUT but a cache) before --overwrite learnt to refuse what is not one:
# an empty folder and a damaged cache are still replaced as it was; the rest never is
OUTS = {"missing": "missing", "built": "built", "complete": "complete", "incomplete": "incomplete"}
OUTS.update(empty="other", damaged="other")
NEVER = ("input", "file", "parent", "folder")


def test_the_table_decides_every_case_as_prepare_did_and_refuses_all_while_another_build_runs():
    for staged, out, resume, overwrite in itertools.product(STAGED, [*OUTS, *NEVER], (False, True), (False, True)):
        got = staging.decide(False, staged, out, resume, overwrite)
        if out in NEVER:  # whatever the flags and the build state: never replaced
            assert got == f"refuse:{out}", (staged, out, resume, overwrite)
        else:
            before = _before_the_table(staged, OUTS[out], resume, overwrite)
            if out == "damaged" and before == "refuse:exists" and staged == "none":
                before = "refuse:damaged"  # the same refusal, saying why the cache cannot be opened
            assert got == before, (staged, out, resume, overwrite)
        assert staging.decide(True, staged, out, resume, overwrite) == "refuse:running"


CASES = [  # (what is on disk, flags) -> outcome, as a user meets them
    ("first build", ("none", "missing", False, False), "fresh"),
    ("rebuild over a cache", ("none", "complete", False, True), "fresh"),
    ("build over a cache", ("none", "complete", False, False), "refuse:exists"),
    ("build over a half-written object-store cache", ("none", "incomplete", False, False), "refuse:incomplete"),
    ("--resume with nothing kept", ("none", "missing", True, False), "fresh"),
    ("--resume after it finished", ("none", "built", True, False), "done"),
    ("--resume, killed while cleaning up", ("same", "built", True, False), "done"),
    ("build after a kill", ("same", "missing", False, False), "refuse:kept"),
    ("--resume after a kill", ("same", "missing", True, False), "resume"),
    ("--resume with other options", ("other", "missing", True, False), "refuse:other"),
    ("--overwrite after a kill with other options", ("other", "missing", False, True), "fresh"),
    ("--resume of an --overwrite build", ("same+replace", "complete", True, False), "resume"),
    ("--resume over a cache that appeared", ("same", "complete", True, False), "refuse:exists"),
    ("--resume of an object-store build", ("same", "incomplete", True, False), "resume"),
]


@pytest.mark.parametrize("situation, outcome", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_table(situation, outcome):
    assert staging.decide(False, *situation) == outcome


def test_refusals_name_their_flag(files, tmp_path):
    out = tmp_path / "c.zarr"
    build_cache(files, out, **{**OPTS, "normalize": "none"})
    with pytest.raises(staging.ShardcacheError, match=r"c.zarr: already exists; pass --overwrite to replace it$"):
        build_cache(files, out, **OPTS)
    assert not Path(f"{out}.staging").exists()  # a refusal leaves nothing behind


# -- a second build while the first runs -------------------------------------------------------
def _first_build(files: list[Path], out: str, tmp_path: Path, extra: list[str]) -> subprocess.Popen:
    """A real ``build-cache`` process, stopped (SIGSTOP) once it holds its staging folder."""
    state = Path(staging._root(out)) / staging.STATE
    with open(tmp_path / "first.log", "w") as log:  # the child keeps its own copy of the file
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardcache.cli", "build", *_argv(files, out), *extra], stdout=log, stderr=log
        )
    deadline = time.monotonic() + 120
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None and state.exists(), "the first build ended before it could be caught running"
    return proc


def _argv(files: list[Path], out: str) -> list[str]:
    return [*map(str, files), "--out", out, "--shard-rows", "1024", "--chunk-rows", "128", "-q"]


def _refused_while_running(files: list[Path], out: str, tmp_path: Path, capsys, extra: list[str]) -> None:
    proc = _first_build(files, out, tmp_path, extra)
    try:
        for flags in ([], ["--resume"], ["--overwrite"], ["--resume", "--overwrite"]):
            code = build_cache_main([*_argv(files, out), *extra, *flags])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and len(err) == 1, (flags, err)
            assert err[0] == (
                f"build-cache: error: {out}: another build of this cache is running (it holds {staging._root(out)})"
            ), flags
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(120) == 0, (tmp_path / "first.log").read_text()
    assert not os.path.exists(staging._root(out))


def test_a_second_build_is_refused_while_the_first_runs(files, tmp_path, capsys):
    out = str(tmp_path / "c.zarr")
    _refused_while_running(files, out, tmp_path, capsys, [])
    assert verify_cache(out).ok


def test_a_second_build_of_an_object_store_output_is_refused_while_the_first_runs(files, tmp_path, capsys):
    """``memory://`` stands in for an object store: its staging folder is local, under the temp directory."""
    _refused_while_running(files, f"memory://{tmp_path.name}/c.zarr", tmp_path, capsys, [])


def test_a_second_build_to_s3_is_refused_while_the_first_runs(files, tmp_path, capsys, s3_bucket):
    bucket, options = s3_bucket
    out = f"{bucket}/c.zarr"
    _refused_while_running(files, out, tmp_path, capsys, [f"--storage-option={k}={v}" for k, v in options.items()])
    assert verify_cache(out, storage_options=options).ok


def test_a_killed_build_leaves_no_lock(files, tmp_path, capsys):
    """The lock dies with its process: after SIGKILL the kept state is resumable at once."""
    out = str(tmp_path / "c.zarr")
    proc = _first_build(files, out, tmp_path, [])
    proc.kill()
    proc.wait()
    argv = _argv(files, out)
    assert build_cache_main(argv) == 2
    assert "an interrupted build is kept" in capsys.readouterr().err
    assert build_cache_main([*argv, "--resume"]) == 0
    assert open_cache(out).manifest.format_version == FORMAT_VERSION and verify_cache(out).ok


def test_spill_files_with_a_pickled_arrow_extension_type_run_no_code(tmp_path):
    """The staging folder's Arrow runs and clusters are untrusted too: pyarrow's old pickled
    extension type (``arrow.py_extension_type``, CVE-2023-47248) is read as plain storage."""
    sentinel = tmp_path / "pwned"
    field = pa.field(
        "close",
        pa.float64(),
        metadata={b"ARROW:extension:name": b"arrow.py_extension_type", b"ARROW:extension:metadata": _payload(sentinel)},
    )
    path = tmp_path / "000000-0000.arrow"
    schema = pa.schema([pa.field("ts", pa.int64()), field])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.table({"ts": pa.array([1, 2]), "close": pa.array([1.5, 2.5])}, schema=schema))
    table = Spills().rows(str(path), 0, 2)
    assert table["close"].to_pylist() == [1.5, 2.5] and not sentinel.exists()


@pytest.mark.parametrize(
    "error, kept",
    [
        (SourceError("x.dbn", "truncated DBN data after 3 records"), False),
        (ShardcacheError("the cluster went away"), True),
    ],
)
def test_a_resumed_build_keeps_its_folder_only_for_errors_a_resume_can_fix(tmp_path, error, kept):
    """Bad input data met by a resumed build leaves nothing that would invite another ``--resume``."""
    out = str(tmp_path / "c.zarr")
    stage = staging.prepare(out, None, {"inputs": []}, resume=False, overwrite=False)
    stage.resumed = True  # as after an interrupted build
    with pytest.raises(type(error)), stage.guard("build"):
        raise error
    assert os.path.isdir(f"{out}.staging") is kept
    if kept:  # the lock is released, so the next build may resume it
        again = staging.prepare(out, None, {"inputs": []}, resume=True, overwrite=False)
        assert isinstance(again, staging.Staging) and again.resumed
        again.release()
