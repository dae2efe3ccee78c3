"""Beyond one machine: builds on a dask.distributed cluster, inputs and caches on object storage
(a real moto S3 server on 127.0.0.1, see ``conftest.py``), and ``WindowStream`` over 2 and 4
gloo ranks."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import brute_starts, ddp_rank, stored_rows
from helpers.cli import run_cli
from helpers.tasks import Described, peek

from shardcache import ShardcacheError, WindowStream, open_cache
from shardcache.cli import build_cache_main, main
from shardcache.format.cache import Cache
from shardcache.format.layout import open_group
from shardcache.ingest.builder import build_cache
from shardcache.ingest.cluster import check_cluster
from shardcache.ingest.sample import make_sample, make_sample_parquet
from shardcache.ingest.sources import expand_inputs
from shardcache.ingest.tasks import run_tasks
from shardcache.inspect.verify import verify_cache
from shardcache.inspect.views import shards

OPTS = {"split": "train=0.8,val=0.1,test=0.1", "shard_rows": 4096, "chunk_rows": 512}
CLI_OPTS = ["--split", OPTS["split"], "--shard-rows", "4096", "--chunk-rows", "512", "-q"]
ARRAYS = ("features", "time", "segments")


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """A folder of 21 daily DBN files (4 symbols, ~39k bars: 10 shards of 4096 rows)."""
    root = tmp_path_factory.mktemp("dbn")
    make_sample(root, days=21, seed=3)
    return root


@pytest.fixture(scope="module")
def reference(sample, tmp_path_factory) -> Cache:
    """The sample built locally (dask threads): what every other build must reproduce."""
    return build_cache(sample, tmp_path_factory.mktemp("ref") / "c.zarr", progress=False, **OPTS)


@pytest.fixture(scope="module")
def cluster():
    """A real dask.distributed cluster: two worker processes of one thread each."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        yield lc


def s3fs_for(options: dict):
    import s3fs

    return s3fs.S3FileSystem(**options)


def assert_same_cache(got: Cache, want: Cache) -> None:
    """Array for array equality of two caches (their stored rows), plus statistics and shard digests."""
    g = open_group(got.url, "r", got.storage_options)
    w = open_group(want.url, "r", want.storage_options)
    assert got.manifest.bars_per_symbol == want.manifest.bars_per_symbol
    for name, a, b in zip(ARRAYS, stored_rows(got), stored_rows(want)):
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(g["segments"][...], w["segments"][...], err_msg="segments")
    for key in ("stats", "symbols", "splits"):
        assert getattr(got.manifest, key) == getattr(want.manifest, key), key
    np.testing.assert_array_equal(g["shard_digests"][...], w["shard_digests"][...], err_msg="shard_digests")
    np.testing.assert_array_equal(g["shards"][...], w["shards"][...], err_msg="shards")


# -- distributed builds ---------------------------------------------------------------------
def test_cluster_build_equals_local_build(sample, reference, cluster, tmp_path):
    from distributed import Client

    with Client(cluster) as client:
        before = client.run(lambda dask_worker: dask_worker.state.executed_count)
        out = tmp_path / "c.zarr"
        r = run_cli(str(sample), "--out", str(out), "--scheduler", cluster.scheduler_address, *CLI_OPTS)
        assert r.returncode == 0, r.stderr
        after = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert_same_cache(open_cache(out), reference)
    ran = {w: after[w] - before[w] for w in after}
    # scan per file, merge per symbol, stats and write per shard: no two of these symbols (~9,800 bars) or
    # shards fit in one batch of 4,096 rows
    n_tasks = 21 + 4 + 2 * reference.n_shards
    assert sum(ran.values()) == n_tasks and all(ran.values()), ran  # every worker took part


def test_cluster_build_from_and_to_s3(sample, reference, cluster, s3_bucket):
    bucket, options = s3_bucket
    s3fs_for(options).put(f"{sample}/", f"{bucket}/dbn/", recursive=True)
    cache = build_cache(
        f"{bucket}/dbn/*.dbn.zst",
        f"{bucket}/c.zarr",
        scheduler=cluster.scheduler_address,
        storage_options=options,
        progress=False,
        **OPTS,
    )
    assert cache.url == f"{bucket}/c.zarr"
    assert_same_cache(cache, reference)


def test_cluster_refuses_what_workers_cannot_reach(sample, cluster, tmp_path):
    from distributed import Client

    with pytest.raises(ShardcacheError, match="memory:// lives inside one process"):
        build_cache(sample, f"memory://{uuid.uuid4().hex}/c.zarr", scheduler=cluster.scheduler_address, progress=False)
    with Client(cluster) as client, pytest.raises(ShardcacheError, match="not visible on worker"):
        check_cluster(client, str(tmp_path / "only-here"), [str(tmp_path)])


def test_many_small_symbols_on_a_cluster_equal_the_local_build_in_a_few_tasks(cluster, tmp_path):
    """300 symbols of 40 bars: the same cache as a local build, from a task per input file and a few per
    stage (batches of symbols or shards holding at most a shard's rows), not one per symbol or shard."""
    from distributed import Client

    names = [f"S{i:03d}" for i in range(300)]
    files = make_sample_parquet(tmp_path / "in", n_bars=12_000, n_features=3, symbols=names, rows_per_file=4_000)
    reference = build_cache(files, tmp_path / "ref.zarr", progress=False, **OPTS)
    with Client(cluster) as client:
        before = client.run(lambda dask_worker: dask_worker.state.executed_count)
        cache = build_cache(files, tmp_path / "c.zarr", scheduler=client, progress=False, **OPTS)
        after = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert_same_cache(cache, reference)
    assert reference.n_shards == 300
    # 3 files; 12,000 bars in batches of at most 4,096 rows: 3 merge, 3 stats and 3 write tasks
    assert sum(after[w] - before[w] for w in after) == 3 + 3 * 3


def test_a_stage_description_reaches_local_tasks_once():
    """dask's threads: every task gets the one description, which dask never walks (it would read its
    5,000 entries once per task, as it walks every dataclass in a task's arguments)."""
    described = Described(symbols=[f"S{i}" for i in range(5_000)], n=5_000)
    got = run_tasks(peek, range(40), shared=described, desc="peek", workers=2, show=False)
    assert got == [(i, 5_000) for i in range(40)] and described.reads == 0


def test_local_tasks_get_their_items_unwalked():
    """dask's threads: a task's item reaches it as it is, never walked by dask (a merge batch holds its
    symbols' names: walking them was a stage's per-symbol cost in the driver)."""
    items = [Described(symbols=[f"S{i}" for i in range(1_000)], n=i) for i in range(20)]
    got = run_tasks(_size, items, desc="size", workers=2, show=False)
    assert got == list(range(20)) and [item.reads for item in items] == [0] * 20


def _size(item: Described) -> int:
    return item.n


def test_a_stage_description_reaches_a_cluster_once(cluster):
    """dask.distributed: the description is sent once (one pickle per worker at most), not with each task."""
    from distributed import Client

    described = Described(symbols=[f"S{i}" for i in range(5_000)], n=5_000)
    Described.pickled = 0
    with Client(cluster) as client:
        got = run_tasks(peek, range(40), shared=described, desc="peek", client=client, show=False)
    assert got == [(i, 5_000) for i in range(40)]
    assert 1 <= Described.pickled <= len(cluster.workers) and described.reads == 0


# -- object storage ------------------------------------------------------------------------
def test_expand_inputs_on_s3(sample, s3_bucket):
    bucket, options = s3_bucket
    fs = s3fs_for(options)
    fs.put(f"{sample}/", f"{bucket}/dbn/", recursive=True)
    fs.pipe({f"{bucket}/dbn/.hidden/x.dbn": b"DBN", f"{bucket}/dbn/notes.txt": b"-"})
    names = sorted(p.name for p in sample.iterdir())
    assert expand_inputs([f"{bucket}/dbn"], options) == [f"{bucket}/dbn/{n}" for n in names]
    assert expand_inputs([f"{bucket}/dbn/*0103*", f"{bucket}/dbn/{names[0]}"], options) == [
        f"{bucket}/dbn/{names[0]}",
        f"{bucket}/dbn/glbx-mdp3-20230103.ohlcv-1m.dbn.zst",
    ]
    with pytest.raises(ShardcacheError, match="no such file"):
        expand_inputs([f"{bucket}/nothing"], options)


def test_cli_build_info_ls_verify_on_s3(sample, reference, s3_bucket, capsys):
    bucket, options = s3_bucket
    s3fs_for(options).put(f"{sample}/", f"{bucket}/dbn/", recursive=True)
    url = f"{bucket}/c.zarr"
    opts = [
        "--storage-option",
        f"endpoint_url={options['endpoint_url']}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        "secret=testing",
    ]
    assert build_cache_main([f"{bucket}/dbn", "--out", url, *opts, *CLI_OPTS]) == 0
    for command in ("info", "ls", "verify"):
        capsys.readouterr()
        assert main([command, url, *opts, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["path" if command != "verify" else "ok"]
    cache = open_cache(url, options)
    assert_same_cache(cache, reference)
    assert verify_cache(url, options).ok
    assert [s.missing for s in shards(cache)] == [False] * reference.n_shards
    assert cache.history()["sources"][0]["path"].startswith(f"{bucket}/dbn/")


def test_parquet_inputs_from_s3(tmp_path, s3_bucket):
    bucket, options = s3_bucket
    make_sample_parquet(tmp_path / "pq", n_bars=6000, n_features=4, rows_per_file=1000)
    s3fs_for(options).put(f"{tmp_path / 'pq'}/", f"{bucket}/pq/", recursive=True)
    local = build_cache(tmp_path / "pq", tmp_path / "c.zarr", normalize="none", progress=False)
    remote = build_cache(
        f"{bucket}/pq/*.parquet", f"{bucket}/c.zarr", normalize="none", storage_options=options, progress=False
    )
    assert_same_cache(remote, local)


def test_memory_url_build_and_stream(sample, reference):
    url = f"memory://{uuid.uuid4().hex}/c.zarr"
    cache = build_cache(sample, url, progress=False, **OPTS)
    assert_same_cache(open_cache(url), reference)
    with (
        WindowStream(cache, 30, split="all", batch_size=500) as a,
        WindowStream(reference, 30, split="all", batch_size=500) as b,
    ):
        got, want = list(a), list(b)
    assert len(got) == len(want) == b.n_batches > 0
    assert all(torch.equal(x, y) for u, v in zip(got, want) for x, y in zip(u, v))


def test_stream_from_s3_equals_local(reference, s3_bucket):
    bucket, options = s3_bucket
    s3fs_for(options).put(f"{reference.url}/", f"{bucket}/c.zarr/", recursive=True)
    cache = open_cache(f"{bucket}/c.zarr", options)
    kw = {"seq_len": 30, "batch_size": 512, "split": "train", "meta": True}
    with WindowStream(reference, **kw) as local:
        want = list(local)
    for workers in (0, 2):
        with WindowStream(cache, **kw) as remote:
            got = list(remote.loader(workers))
        assert len(got) == len(want) == remote.n_batches
        assert all(torch.equal(x, y) for u, v in zip(got, want) for x, y in zip(u, v)), workers


# -- DDP ranks -----------------------------------------------------------------------------
@pytest.mark.parametrize("world, where", [(4, "local"), (2, "s3")])
def test_ddp_ranks_cover_the_epoch_once(world, where, tmp_path, stream_bars, stream_cache, request):
    cache = stream_cache
    if where == "s3":
        bucket, options = request.getfixturevalue("s3_bucket")
        s3fs_for(options).put(f"{stream_cache.url}/", f"{bucket}/bars.zarr/", recursive=True)
        cache = open_cache(f"{bucket}/bars.zarr", options)  # pickled to each rank with its options
    kwargs = {"seq_len": 9, "horizon": 1, "batch_size": 50, "split": "train"}
    mp.spawn(ddp_rank, args=(world, cache, str(tmp_path / "init"), str(tmp_path), kwargs), nprocs=world, join=True)
    got = [np.load(tmp_path / f"rank{r}.npy") for r in range(world)]
    meta = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    ref = brute_starts(stream_bars, 9, 1, 1, "train")
    union = np.concatenate(got)
    assert all(m["all"] == [meta[0]["n_batches"]] * world for m in meta)  # equal batch counts
    assert len({len(g) for g in got}) == 1 and meta[0]["dropped"] == len(ref) % world < world
    assert len(np.unique(union)) == len(union) == len(ref) - meta[0]["dropped"]  # exactly once
    assert np.isin(union, ref).all()
