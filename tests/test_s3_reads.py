"""Reading a cache from object storage by request count (issue 21), on the moto S3 server of ``conftest.py``:
an epoch is about one request per shard with 0 and 2 DataLoader workers, a second epoch through a named
``cache_dir`` almost none, a ``cache_limit`` below the split's bytes holds during the epoch (and the next epoch fetches most shards again), fsspec's chained
URLs (``filecache::``, ``simplecache::``, ``blockcache::``) stream (the two that cache nothing there with one
warning), and ``open_symbols`` reads only the groups it opens.
Counts come from the server's request log (``tools/s3_requests.py``): deterministic, where timings are not."""

from __future__ import annotations

import sys
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.local import peak_bytes

from shardcache import WindowStream, open_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample_parquet
from shardcache.inspect.views import open_symbols

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from s3_requests import werkzeug_log

KW = {"seq_len": 20, "batch_size": 128, "split": "all"}


def _upload(local: str, endpoint: str) -> tuple[str, dict]:
    import s3fs

    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    bucket = f"reads-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir(bucket)
    fs.put(local.rstrip("/") + "/", f"{bucket}/c.zarr/", recursive=True)
    return f"s3://{bucket}/c.zarr", options


@pytest.fixture(scope="module")
def many(tmp_path_factory, s3_endpoint):
    """60 symbols of 150 bars (one shard each) on the server: its URL, options and the local original."""
    work = tmp_path_factory.mktemp("many")
    files = make_sample_parquet(work / "in", n_bars=60 * 150, n_features=3, symbols=[f"S{i:03d}" for i in range(60)])
    local = build_cache(str(files[0]), work / "c.zarr", progress=False)
    url, options = _upload(local.url, s3_endpoint)
    return url, options, local


@pytest.fixture(scope="module")
def few(tmp_path_factory, s3_endpoint):
    """3 symbols of 2,000 bars in 512-row shards of 64-row chunks: a few rows of a shard are a range read."""
    work = tmp_path_factory.mktemp("few")
    files = make_sample_parquet(work / "in", n_bars=6000, n_features=3, symbols=["A", "B", "C"])
    local = build_cache(str(files[0]), work / "c.zarr", progress=False, shard_rows=512, chunk_rows=64)
    url, options = _upload(local.url, s3_endpoint)
    return url, options, local


OPENING_DATA = 2  # the data objects opening a cache reads: the root index's `segments` and `shards` chunks


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) > 0 and all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))


def _reference(local) -> list:
    with WindowStream(local, **KW) as stream:
        return list(stream)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_is_about_one_request_per_shard_with_any_workers(many, workers):
    url, options, local = many
    shards = local.n_shards
    with werkzeug_log() as log:
        mark = log.mark()
        with WindowStream(url, storage_options=options, **KW) as stream:  # opened here: its requests count
            got = list(stream.loader(workers))
        counts = log.since(mark)
    assert _same(got, _reference(local))
    assert counts["GET data"] == shards + OPENING_DATA  # each shard object once (the workers share it), the root index
    assert counts.total <= 1.3 * shards, counts.summary()  # the rest: opening (the manifest, the index's metadata)
    assert counts["HEAD"] <= 1 and counts.missing == 0, (
        counts.summary()
    )  # the bucket probe; no size or existence checks


def test_a_second_epoch_through_a_named_cache_dir_makes_almost_no_requests(many, tmp_path):
    url, options, local = many
    folder = tmp_path / "node-local"
    with werkzeug_log() as log:
        mark = log.mark()
        with WindowStream(url, storage_options=options, cache_dir=folder, **KW) as stream:
            first = list(stream.loader(2))
            first_epoch, between = log.since(mark), log.mark()
            again = list(stream.loader(2))  # the next epoch of the same stream
            same_stream = log.since(between)
        mark = log.mark()
        with WindowStream(url, storage_options=options, cache_dir=folder, **KW) as stream:  # a new run on the node
            second = list(stream.loader(2))
        new_stream, mark = log.since(mark), log.mark()
        open_cache(url, options)
        opening = log.since(mark)
    assert len(first) == len(again) == len(second) and _same(first, _reference(local))
    assert first_epoch["GET data"] == local.n_shards + OPENING_DATA
    assert same_stream.total == 0, same_stream.summary()  # the next epoch: <= 5% of the first's (none)
    assert new_stream == opening, (new_stream.summary(), opening.summary())  # a new run: its opening alone


def test_a_cache_limit_below_the_split_holds_and_the_next_epoch_fetches_again(many, tmp_path):
    import s3fs

    url, options, local = many
    fs = s3fs.S3FileSystem(**options)
    stored = sum(fs.du(url, total=False).get(k, 0) for k in fs.find(url) if "/features/c." in k)
    limit = stored // 3
    folder = tmp_path / "bounded"
    with werkzeug_log() as log, peak_bytes(folder) as peak:
        mark = log.mark()
        with WindowStream(url, storage_options=options, cache_dir=folder, cache_limit=limit, **KW) as stream:
            got = list(stream.loader(2))
            counts, mark = log.since(mark), log.mark()
            again = list(stream.loader(2))  # the next epoch: the folder holds the last third read
            next_epoch = log.since(mark)
    assert _same(got, _reference(local)) and len(again) == len(got)
    assert 0 < peak[0] <= limit < stored
    assert counts["GET data"] == local.n_shards + OPENING_DATA, counts.summary()  # the workers still share each fetch
    # below its working set the folder is no cache for the next epoch (docs/scaling.md says so): most shards again
    assert next_epoch["GET data"] >= local.n_shards // 2, next_epoch.summary()


@pytest.mark.parametrize("proto", ["filecache", "simplecache", "blockcache"])
def test_fsspec_chained_urls_stream_an_epoch_and_read_ranges(few, tmp_path, proto):
    url, options, local = few
    chained = f"{proto}::{url}"
    chain_options = {"s3": options, proto: {"cache_storage": str(tmp_path / proto)}}
    for workers in (0, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with WindowStream(chained, storage_options=chain_options, **KW) as stream:
                assert _same(list(stream.loader(workers)), _reference(local)), workers
        idle = [str(w.message) for w in caught if "caches nothing" in str(w.message)]
        if proto == "simplecache":  # it caches under the reads: no word
            assert idle == []
        else:  # the layer keeps nothing: one warning pointing to cache_dir
            want = (
                f"{chained}: fsspec's {proto}:: caches nothing under a stream's reads (every read goes to s3://); "
                f"the stream keeps node-local copies itself: read {url!r} with cache_dir=FOLDER to keep them "
                "across runs, bounded by cache_limit and shared by the node's processes"
            )
            assert idle == [want], workers
    cache = open_cache(chained, chain_options)  # no local copy: a few rows of a shard are asked for as a range
    for _, a, _ in cache.rows.shard_table.tolist():
        np.testing.assert_array_equal(cache.read_rows(a, a + 10), local.read_rows(a, a + 10))


def test_open_symbols_reads_only_the_groups_it_opens(many):
    pytest.importorskip("xarray")
    url, options, local = many
    cache = open_cache(url, options)
    keys = {}
    with werkzeug_log() as log:
        for pick in ([3, 7], [40, 59]):
            mark = log.mark()
            opened = open_symbols(cache, pick)
            keys[tuple(pick)] = [r.key or r.kind for r in log.requests()[mark:]]  # a listing names no key
            for i, ds in zip(pick, opened.values()):
                rows = int(local.rows.bases[i]), int(local.rows.bases[i]) + int(local.bars_per_symbol[i])
                np.testing.assert_array_equal(ds.features.values, local.read_rows(*rows))
    for pick, read in keys.items():
        assert read and all(k == "LIST" or any(k.startswith(f"c.zarr/symbols/{i}/") for i in pick) for k in read), read
    assert len(keys[(3, 7)]) == len(keys[(40, 59)])  # the same for any two symbols of the cache
