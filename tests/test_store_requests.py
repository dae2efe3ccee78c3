"""On object storage a cache costs what its objects cost: requests to the moto server, counted exactly.

The same bars per symbol, as 2 symbols and as 12: what the 10 symbols more cost is what one symbol
costs, times 10. Issue 21's acceptance: a build of at most 5 requests per added symbol (5 PUTs:
its three ``zarr.json``, its shard, its time chunk; no existence check, no read-back), ``verify`` at
most 1.3 requests per stored object (one GET each), ``ls``, ``info`` and opening a cache flat in the
number of symbols, and an append that touches only the grown symbols' objects and the root.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.parquet import SourceBars, build_raw, make_bars, write_parquet

from shardcache import open_cache
from shardcache.ingest.append import append_cache
from shardcache.inspect.verify import verify_cache
from shardcache.inspect.views import info, shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from s3_requests import Counts, werkzeug_log

BARS = 200  # one 256-row shard a symbol
OPTS = {"shard_rows": 256, "chunk_rows": 64, "split": "train=0.8,val=0.2"}
MINUTE = 60 * 10**9


def _bars(n_symbols: int) -> dict[str, SourceBars]:
    return make_bars({f"S{i}": BARS for i in range(n_symbols)}, n_features=3, seed=1)


def _later(bars: dict[str, SourceBars], symbols: list[str], n: int = 20) -> dict[str, SourceBars]:
    """``n`` more bars of ``symbols``, each after its last one."""
    rng = np.random.default_rng(2)
    return {
        s: SourceBars(bars[s].ts[-1] + MINUTE * np.arange(1, n + 1), rng.standard_normal((n, 3)).astype(np.float32))
        for s in symbols
    }


def _objects(url: str, options: dict) -> int:
    import s3fs

    return len(s3fs.S3FileSystem(**options, skip_instance_cache=True).find(url))


def _steps(log, url: str, options: dict, work: Path, n: int) -> dict[str, Counts | int]:
    """Build ``n`` symbols at ``url``, open, ls, info, verify it, append to every symbol: each one's requests."""

    def count(fn, *args, **kwargs) -> Counts:
        mark = log.mark()
        fn(*args, **kwargs)
        return log.since(mark)

    bars = _bars(n)
    src = write_parquet(work / f"b{n}.parquet", bars)
    later = write_parquet(work / f"later{n}.parquet", _later(bars, [f"S{i}" for i in range(n)]))
    steps: dict[str, Counts | int] = {
        "build": count(build_raw, src, url, storage_options=options, **OPTS),
        "open": count(open_cache, url, options),
        "ls": count(lambda: shards(open_cache(url, options))),
        "info": count(lambda: info(open_cache(url, options))),
        "verify": count(verify_cache, url, options),
        "objects": _objects(url, options),
        "append": count(append_cache, later, url, storage_options=options, progress=False),
    }
    steps["verified"] = verify_cache(url, options).ok
    return steps


@pytest.fixture(scope="module")
def counted(tmp_path_factory, s3_endpoint):
    """Requests of each step for 2 and for 12 symbols, and the objects each cache holds."""
    import uuid

    import s3fs

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    work = tmp_path_factory.mktemp("requests")
    out = {}
    with werkzeug_log() as log:
        for n in (2, 12):
            bucket = f"requests-{uuid.uuid4().hex[:12]}"
            s3fs.S3FileSystem(**options).mkdir(bucket)
            out[n] = _steps(log, f"s3://{bucket}/c.zarr", options, work, n)
    return out


def test_a_build_costs_five_puts_per_added_symbol_and_nothing_else(counted):
    small, big = counted[2]["build"], counted[12]["build"]
    assert big - small == Counts({"PUT zarr.json": 3 * 10, "PUT data": 2 * 10})  # no GET, HEAD or LIST grows
    assert (big.total - small.total) / 10 == 5
    assert counted[12]["objects"] - counted[2]["objects"] == 5 * 10


def test_verify_reads_each_stored_object_once(counted):
    for n in (2, 12):
        assert counted[n]["verified"]
        assert counted[n]["verify"].total <= 1.3 * counted[n]["objects"], (n, counted[n]["verify"].summary())
    grown = counted[12]["verify"] - counted[2]["verify"]
    assert grown == Counts({"GET zarr.json": 3 * 10, "GET data": 2 * 10})  # one GET per object of each symbol


@pytest.mark.parametrize("step", ["open", "ls", "info"])
def test_opening_ls_and_info_are_flat_in_the_symbols(counted, step):
    small, big = counted[2][step], counted[12][step]
    assert big == small and big.total <= 20, (small.summary(), big.summary())


def test_an_append_touches_the_grown_symbols_objects_and_the_root_only(counted):
    """Per grown symbol: its tail shard and time chunk read back (the rows kept) and written again, and
    its two arrays' documents: 2 GETs and 4 PUTs; a symbol's group document is not rewritten."""
    grown = Counts(counted[12]["append"] - counted[2]["append"])
    assert grown.column("PUT") == 4 * 10 and grown["PUT zarr.json"] == 2 * 10, grown.summary()
    assert grown.total <= 7 * 10, grown.summary()
