"""``--overwrite`` replaces only a shardcache cache (``shardcache.ingest.staging``'s table, issue 20).

It never replaces a file, a folder that is not a cache, an input of the build or a folder holding or
inside one, or a folder that holds a cache; each is refused in one line saying what is there, with
or without ``--overwrite``, and the "pass --overwrite" hint appears only where it would be accepted.
An interrupted build's staging folder and an incomplete cache are still replaced.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ohlcv_files import ohlcv, write_parquet

from shardcache.cli import build_cache_main
from shardcache.format.cache import open_cache
from shardcache.format.writer import CacheWriter
from shardcache.ingest import staging
from shardcache.ingest.builder import build_cache
from shardcache.inspect.verify import verify_cache

OPTS = {"shard_rows": 1024, "chunk_rows": 128, "workers": 1, "progress": False}


@pytest.fixture
def inputs(tmp_path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    write_parquet(folder / "ES.parquet", ohlcv(600, seed=1))
    write_parquet(folder / "NQ.parquet", ohlcv(600, seed=2))
    return folder


def _tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) with a hash of its bytes: what must not change."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _refused(capsys, argv: list[str], *expected: str) -> str:
    """Run ``build-cache`` with and without --overwrite: exit 2, one line holding ``expected``, no hint."""
    lines = []
    for extra in ([], ["--overwrite"]):
        assert build_cache_main([*argv, "-q", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert all(e in err[0] for e in expected), err[0]
        assert "pass --overwrite" not in err[0] and "Traceback" not in err[0]
        lines.append(err[0])
    return lines[1]


def test_a_regular_file_is_never_replaced(inputs, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    line = _refused(capsys, [str(inputs), "--out", str(notes)], "a file of 9 bytes, not a shardcache cache")
    assert "choose another --out" in line
    assert notes.read_text() == "my notes\n" and not Path(f"{notes}.staging").exists()


def test_a_device_is_never_replaced(inputs, capsys):
    _refused(capsys, [str(inputs), "--out", "/dev/null"], "/dev/null: a character device, not a shardcache cache")


def test_a_folder_that_is_not_a_cache_is_never_replaced(inputs, tmp_path, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "src" / "model.py").write_text("x = 1\n")
    before = _tree(project)
    _refused(
        capsys,
        [str(inputs), "--out", str(project)],
        "a folder that is not a shardcache cache (it holds 2 entries: src, train.py)",
    )
    assert _tree(project) == before and not Path(f"{project}.staging").exists()


@pytest.mark.parametrize(
    "out, what",
    [
        ("in", "is an input folder of this build"),
        ("in/ES.parquet", "is an input file of this build"),
        (".", "holds an input of this build"),
        ("in/cache.zarr", "is inside the input folder"),
    ],
)
def test_an_input_or_a_folder_holding_or_inside_one_is_never_written_over(inputs, tmp_path, capsys, out, what):
    before = _tree(inputs)
    target = tmp_path / out
    line = _refused(capsys, [str(inputs), "--out", str(target)], what, "a cache is never written over its inputs")
    assert line.startswith(f"build-cache: error: {target}: ")
    assert _tree(inputs) == before
    assert target.suffix != ".zarr" or not target.exists()


def test_an_input_named_by_a_glob_is_never_written_over(inputs, capsys):
    _refused(capsys, [str(inputs / "*.parquet"), "--out", str(inputs / "NQ.parquet")], "is an input file")


def test_a_parent_of_a_cache_is_never_replaced(inputs, tmp_path, capsys):
    holder = tmp_path / "caches"
    holder.mkdir()
    build_cache(inputs, holder / "c.zarr", **OPTS)
    before = _tree(holder)
    line = _refused(capsys, [str(inputs), "--out", str(holder)], f"a folder holding the cache {holder}/c.zarr")
    assert f"pass --out {holder}/c.zarr to replace that one" in line
    assert _tree(holder) == before
    out = holder / "c.zarr"  # the cache itself: the hint, and --overwrite replaces it
    assert build_cache_main([str(inputs), "--out", str(out), "-q", "--normalize", "none"]) == 2
    assert (
        capsys.readouterr().err.strip() == f"build-cache: error: {out}: already exists; pass --overwrite to replace it"
    )
    assert build_cache_main([str(inputs), "--out", str(out), "-q", "--normalize", "none", "--overwrite"]) == 0
    assert open_cache(out).manifest.normalize == "none"


def test_an_interrupted_builds_staging_and_an_incomplete_cache_are_still_replaced(inputs, tmp_path, monkeypatch):
    out = tmp_path / "c.zarr"
    with monkeypatch.context() as mp:  # a build stopped just before it published: its staging folder is kept
        mp.setattr(staging.Staging, "publish", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            build_cache(inputs, out, **OPTS)
    assert Path(f"{out}.staging", staging.STATE).exists()
    CacheWriter(out, feature_names=["a"], bars_per_symbol=[100], shard_rows=64, chunk_rows=32)  # incomplete
    with pytest.raises(staging.ShardcacheError, match="interrupted build is kept .*--overwrite to start again"):
        build_cache(inputs, out, normalize="none", **OPTS)
    cache = build_cache(inputs, out, normalize="none", overwrite=True, **OPTS)
    assert cache.manifest.normalize == "none" and verify_cache(out).ok
    assert not Path(f"{out}.staging").exists()


def test_a_damaged_cache_is_replaced_with_overwrite(inputs, tmp_path, capsys):
    out = tmp_path / "c.zarr"
    build_cache(inputs, out, **OPTS)
    meta = out / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    assert build_cache_main([str(inputs), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "a shardcache cache that cannot be opened (" in err and "pass --overwrite to build it again" in err
    assert build_cache_main([str(inputs), "--out", str(out), "-q", "--overwrite"]) == 0
    assert verify_cache(out).ok


def test_something_that_appears_at_out_during_an_overwrite_build_is_not_replaced(inputs, tmp_path, monkeypatch):
    out = tmp_path / "c.zarr"
    publish = staging.Staging.publish

    def someone_writes_there(self):
        out.mkdir()
        (out / "thesis.tex").write_text("...")
        publish(self)

    monkeypatch.setattr(staging.Staging, "publish", someone_writes_there)
    with pytest.raises(staging.ShardcacheError, match=r"c.zarr: a folder that is not a shardcache cache \(it holds"):
        build_cache(inputs, out, overwrite=True, **OPTS)
    assert (out / "thesis.tex").read_text() == "..."


def test_an_object_store_prefix_that_is_not_a_cache_is_never_deleted(inputs, s3_bucket, capsys):
    import s3fs

    bucket, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    fs.pipe(f"{bucket}/reports/q1.txt", b"quarterly numbers")
    flags = [f"--storage-option={k}={v}" for k, v in options.items()]
    _refused(
        capsys,
        [str(inputs), "--out", f"{bucket}/reports", *flags],
        "a folder that is not a shardcache cache (it holds 1 entry: q1.txt)",
    )
    _refused(capsys, [str(inputs), "--out", f"{bucket}/reports/q1.txt", *flags], "a file of 17 bytes")
    assert fs.cat(f"{bucket}/reports/q1.txt") == b"quarterly numbers"
    out = f"{bucket}/c.zarr"
    assert build_cache_main([str(inputs), "--out", out, "-q", *flags]) == 0
    assert build_cache_main([str(inputs), "--out", out, "-q", "--overwrite", "--normalize", "none", *flags]) == 0
    assert open_cache(out, options).manifest.normalize == "none"
