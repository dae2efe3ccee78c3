"""Readers while appends are swapped in (issue 20): a reader sees the cache before an append or after
it, never a manifest whose bar counts disagree with the arrays it reads.

Locally an append is swapped in whole (``renameat2``); a reader that opened the cache before reads
nothing of the new one (``Cache`` refuses: "replaced ... open it again"). On an object store the
append writes in place: a reader sees the cache as it was (its rows as stored before), then, between
the segment index write and the manifest write, an ``IndexAheadError`` ("open the cache again"), then
the appended cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from ohlcv_files import T0, ohlcv, write_parquet

from shardcache.errors import CacheError
from shardcache.format.cache import Cache, open_cache
from shardcache.ingest import append as append_mod
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.inspect.verify import verify_cache
from shardcache.read.stream import WindowStream

OPTS = {"shard_rows": 512, "chunk_rows": 128, "normalize": "none", "progress": False}
DAY = 86_400
REPLACED = "the cache was replaced (rebuilt or appended to) after it was opened; open it again"


def _day(folder: Path, k: int) -> str:
    """Day ``k``'s bars of ES and NQ (300 each, one file): each day comes after the one before."""
    es, nq = (ohlcv(300, start_s=T0 + k * DAY, seed=2 * k + j, symbol=s) for j, s in enumerate(("ES", "NQ")))
    return write_parquet(folder / f"day-{k:04d}.parquet", pa.concat_tables([es, nq]))


def _mixed(cache: Cache) -> list[str]:
    """What of ``cache`` disagrees with its manifest: its arrays' shapes and last stored bar times."""
    found = []
    for i, symbol in enumerate(cache.symbols):
        n = int(cache.bars_per_symbol[i])
        for name in ("features", "time"):
            shape = cache.array(i, name).shape
            if shape[0] != n:
                found.append(f"{symbol} {name} {shape[0]} rows, manifest {n}")
        last = int(cache.rows.bases[i]) + n - 1
        if int(cache.bar_times(np.array([last]))[0]) != int(cache.manifest.tails[symbol]["ts"]):
            found.append(f"{symbol} last bar time")
    return found


def test_a_reader_that_opened_before_an_append_reads_nothing_of_the_new_cache(tmp_path):
    """A deterministic pause point: the reader opens (manifest and index), an append is swapped in,
    then the reader reaches for its arrays, times and rows."""
    out = tmp_path / "c.zarr"
    build_cache(_day(tmp_path, 0), out, **OPTS)
    readers = [open_cache(out) for _ in range(5)]
    stream = WindowStream(open_cache(out), 10, batch_size=32)
    append_cache(_day(tmp_path, 1), out, progress=False)
    before = 300
    for reach in (
        lambda c: c.check_same(),  # what a reader of its own (verify) asks before it trusts what it read
        lambda c: c.array(0, "features"),
        lambda c: c.array(1, "time"),
        lambda c: c.bar_times(np.array([before - 1])),
        lambda c: c.read_rows(0, 10),
    ):
        cache = readers.pop()
        assert int(cache.bars_per_symbol[0]) == before
        with pytest.raises(CacheError, match=re.escape(REPLACED)):
            reach(cache)
    with pytest.raises(CacheError, match=re.escape(REPLACED)):
        next(iter(stream))
    after = open_cache(out)  # opened again: the appended cache, all of it
    assert after.bars_per_symbol.tolist() == [600, 600] and _mixed(after) == []


def _append_forever(out: str, folder: str, stop: str, done: str) -> None:
    """The writer process: append one day after another to ``out`` until ``stop`` exists."""
    k = 1
    while not os.path.exists(stop):
        append_cache(_day(Path(folder), k), out, progress=False)
        k += 1
        Path(done).write_text(str(k - 1))


def test_opening_a_cache_500_times_while_appends_run_never_sees_a_mixed_state(tmp_path):
    out = tmp_path / "c.zarr"
    build_cache(_day(tmp_path, 0), out, **OPTS)
    stop, done = tmp_path / "stop", tmp_path / "done"
    writer = subprocess.Popen(
        [sys.executable, __file__, "append-forever", str(out), str(tmp_path), str(stop), str(done)],
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, mixed, refused = set(), [], 0
    try:
        while not done.exists():  # the first append is written
            assert writer.poll() is None, writer.stderr.read()
            time.sleep(0.01)
        for _ in range(500):
            try:
                cache = open_cache(out)
                found = _mixed(cache)
            except CacheError as exc:
                assert REPLACED in str(exc), exc  # swapped between this reader's open and its reads
                refused += 1
                continue
            seen.add(int(cache.n_bars))
            mixed += [f"{cache.n_bars} bars: {f}" for f in found]
    finally:
        stop.write_text("")
        _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    assert mixed == [], mixed[:5]
    appended = int(done.read_text())
    assert len(seen) >= 2 and appended >= 2, (seen, appended, refused)  # the opens met appends
    print(f"500 opens: {len(seen)} versions seen, {refused} refused as replaced, {appended} appends")
    assert verify_cache(out).ok


# -- object stores: what a reader opening during an append sees ---------------------------------------
_READER = """
import json, sys
import numpy as np
from shardcache.errors import CacheError
from shardcache.format.cache import open_cache
url, options = sys.argv[1], json.loads(sys.argv[2])
try:
    cache = open_cache(url, options)
except CacheError as exc:
    print(json.dumps({"refused": str(exc)}))
    raise SystemExit
rows = [cache.read_rows(int(cache.rows.bases[i]), int(cache.rows.bases[i] + n)).tolist() for i, n in enumerate(cache.bars_per_symbol)]
times = cache.bar_times(np.concatenate([cache.rows.bases[i] + np.arange(n) for i, n in enumerate(cache.bars_per_symbol)]))
print(json.dumps({"bars": cache.bars_per_symbol.tolist(), "rows": rows, "times": times.tolist()}))
"""


def _read_in_another_process(url: str, options: dict) -> dict:
    argv = [sys.executable, "-c", _READER, url, json.dumps(options)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _as_read(cache: Cache) -> dict:
    rows = [
        cache.read_rows(int(cache.rows.bases[i]), int(cache.rows.bases[i] + n)).tolist()
        for i, n in enumerate(cache.bars_per_symbol)
    ]
    times = cache.bar_times(
        np.concatenate([cache.rows.bases[i] + np.arange(n) for i, n in enumerate(cache.bars_per_symbol)])
    )
    return {"bars": cache.bars_per_symbol.tolist(), "rows": rows, "times": times.tolist()}


def test_a_reader_of_an_object_store_sees_the_cache_before_the_append_then_a_refusal_then_after(
    tmp_path, s3_bucket, monkeypatch
):
    bucket, options = s3_bucket
    url = f"{bucket}/c.zarr"
    build_cache(_day(tmp_path, 0), url, storage_options=options, **OPTS)
    before = _as_read(open_cache(url, options))
    seen: dict[str, dict] = {}
    writer = append_mod.CacheWriter
    history, index = writer.write_history, writer.write_index

    def after_the_shards(self, record):  # every new and rewritten shard is written, arrays grown
        seen["shards written"] = _read_in_another_process(url, options)
        history(self, record)

    def after_the_index(self, *args):  # the root index (segments, shards, digests), before the manifest
        index(self, *args)
        seen["index written"] = _read_in_another_process(url, options)

    monkeypatch.setattr(writer, "write_history", after_the_shards)
    monkeypatch.setattr(writer, "write_index", after_the_index)
    append_cache(_day(tmp_path, 1), url, storage_options=options, progress=False)
    assert seen["shards written"] == before  # the old cache, row for row, though its arrays are longer
    assert "an append is being written to this object store); open the cache again" in seen["index written"]["refused"]
    after = _as_read(open_cache(url, options))
    assert after["bars"] == [600, 600] and [r[:300] for r in after["rows"]] == before["rows"]


if __name__ == "__main__":
    if sys.argv[1] == "append-forever":
        _append_forever(*sys.argv[2:6])
