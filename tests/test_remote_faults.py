"""Remote I/O never hangs and rides out transient faults (issue 30), against ``helpers.faults.FaultProxy``
on loopback in front of the session's moto server: an epoch through drops, resets, cut bodies, stalls, a
slow trickle, 500s, 503 SlowDowns and 429s serves exactly the local cache's batches; faults that never end
fail within the client's timeouts in one line naming the cache, the object and the endpoint; a build
through transient faults is byte-identical to a clean one, and a build or an append stopped by a lasting
fault resumes.
Every test here is bounded in time (``timeout``) and small timeouts keep the lasting faults short."""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from helpers.cli import cli
from helpers.faults import FaultProxy

from shardcache import WindowStream
from shardcache.errors import StoreError
from shardcache.format.remote import CLIENT_DEFAULTS, client_options
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample_parquet
from shardcache.inspect.verify import verify_cache

KW = {"seq_len": 20, "batch_size": 128, "split": "all"}
# short enough that a stall or a lasting fault ends in seconds; the retries are the defaults' kind
QUICK = {"read_timeout": 2, "connect_timeout": 2, "retries": {"mode": "standard", "max_attempts": 3}}
BRIEF = {"read_timeout": 1, "connect_timeout": 1, "retries": {"mode": "standard", "max_attempts": 2}}
TRANSIENT = ("drop", "reset", "cut", "stall", "trickle", "500", "503", "429")


def _s3fs(options: dict):
    import s3fs

    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    """3 symbols of 2,000 bars in one Parquet file."""
    work = tmp_path_factory.mktemp("faults")
    return str(make_sample_parquet(work / "in", n_bars=6000, n_features=3, symbols=["A", "B", "C"])[0])


BUILD = {"shard_rows": 512, "chunk_rows": 64, "progress": False}


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory, parquet, s3_endpoint):
    """The cache built locally and uploaded: its URL, the server's options and the local batches."""
    local = build_cache(parquet, tmp_path_factory.mktemp("local") / "c.zarr", **BUILD)
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    fs = _s3fs(options)
    fs.mkdir(bucket)
    fs.put(local.url.rstrip("/") + "/", f"{bucket}/c.zarr/", recursive=True)
    with WindowStream(local, **KW) as stream:
        reference = list(stream)
    return f"s3://{bucket}/c.zarr", reference


@pytest.fixture
def proxy(s3_endpoint):
    with FaultProxy(s3_endpoint, stall_s=60, trickle_s=1.0) as p:
        yield p


def _options(proxy: FaultProxy, config: dict) -> dict:
    return {"endpoint_url": proxy.url, "key": "testing", "secret": "testing", "config_kwargs": config}


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) > 0 and all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", TRANSIENT)
def test_an_epoch_through_transient_faults_serves_exactly_the_local_batches(on_s3, proxy, kind):
    url, reference = on_s3
    with WindowStream(url, storage_options=_options(proxy, QUICK), **KW) as stream:
        proxy.inject(kind, 2, match="/features/", methods=("GET",))  # the shards' reads, after the opening
        got = list(stream)
    assert [f[0] for f in proxy.faulted] == [kind, kind]  # both were sent, and ridden out
    assert _same(got, reference)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["stall", "drop", "503"])
def test_a_fault_that_never_ends_fails_the_epoch_in_one_line(on_s3, proxy, kind):
    url, _ = on_s3
    with WindowStream(url, storage_options=_options(proxy, BRIEF), **KW) as stream:
        proxy.inject(kind, match="/features/", methods=("GET",), forever=True)
        with pytest.raises(StoreError) as caught:
            list(stream)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{url}: cannot fetch symbols/") and "/features/" in message
    assert f"from {proxy.url} after its retries" in message
    assert "check that the endpoint answers" in message and "read_timeout" in message
    # one failed fetch ends the stream: the blocks queued behind it are not each retried for minutes
    assert len(proxy.faulted) <= 2 * 2 * 2 * 8  # S3FS_TRIES x (s3fs's two loops) x attempts x pools ahead


def _objects(url: str, options: dict) -> dict[str, bytes]:
    """Every object of the cache at ``url`` by key; the root document without the build's clock
    (``created``, ``elapsed_s``), the only bytes two builds of the same inputs may differ in."""
    fs = _s3fs(options)
    root = url.removeprefix("s3://").rstrip("/") + "/"
    got = {path[len(root) :]: fs.cat_file(path) for path in fs.find(root)}
    doc = json.loads(got["zarr.json"])
    for key in ("created", "elapsed_s"):
        del doc["attributes"]["shardcache"][key]
    got["zarr.json"] = json.dumps(doc, sort_keys=True).encode()
    return got


@pytest.fixture(scope="module")
def clean_build(parquet, s3_endpoint):
    """The objects of a build straight to the server, no proxy: what every faulted build must equal."""
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    bucket = f"clean-{uuid.uuid4().hex[:12]}"
    _s3fs(options).mkdir(bucket)
    build_cache(parquet, f"s3://{bucket}/c.zarr", storage_options=options, **BUILD)
    return _objects(f"s3://{bucket}/c.zarr", options)


def _bucket(proxy: FaultProxy) -> str:
    bucket = f"build-{uuid.uuid4().hex[:12]}"
    _s3fs(_options(proxy, QUICK)).mkdir(bucket)
    return f"s3://{bucket}/c.zarr"


@pytest.mark.timeout(180)
def test_a_build_through_transient_faults_is_byte_identical_to_a_clean_one(parquet, clean_build, proxy):
    url = _bucket(proxy)
    for kind in ("503", "500", "drop", "reset", "stall", "429"):
        proxy.inject(kind, 1, match="/features/", methods=("PUT",))
    build_cache(parquet, url, storage_options=_options(proxy, QUICK), **BUILD)
    assert sorted(f[0] for f in proxy.faulted) == sorted(["503", "500", "drop", "reset", "stall", "429"])
    got = _objects(url, _options(proxy, QUICK))
    assert got.keys() == clean_build.keys()
    assert [k for k in got if got[k] != clean_build[k]] == []


@pytest.mark.timeout(180)
def test_a_build_stopped_by_a_lasting_fault_fails_in_one_line_and_resumes(parquet, clean_build, proxy, capsys):
    url = _bucket(proxy)
    flags = [f"--storage-option={k}={v}" for k, v in _options(proxy, BRIEF).items()]
    flags = [f.replace("'", '"') for f in flags]  # JSON for the nested config_kwargs
    args = [parquet, "--out", url, "--shard-rows", "512", "--chunk-rows", "64", "-q", *flags]
    proxy.inject("503", match="/features/", methods=("PUT",), forever=True)
    rc, _, err = cli(capsys, *args)
    assert rc == 2, err
    err = err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"build-cache: error: {url}: cannot store symbols/") and "/features/" in err
    assert f"at {proxy.url} after its retries (" in err and "reduce your request rate" in err
    proxy.clear()
    rc, _, err = cli(capsys, *args, "--resume")
    assert rc == 0, err
    got = _objects(url, _options(proxy, QUICK))
    assert got.keys() == clean_build.keys()
    assert [k for k in got if got[k] != clean_build[k]] == []


@pytest.mark.timeout(180)
def test_an_append_stopped_by_a_lasting_fault_fails_in_one_line_and_resumes(tmp_path, parquet, proxy, capsys):
    later = str(
        make_sample_parquet(tmp_path / "later", n_bars=600, n_features=3, symbols=["A", "B", "C"], start="2023-01-16")[
            0
        ]
    )
    clean, url = _bucket(proxy), _bucket(proxy)
    options = _options(proxy, BRIEF)
    for out in (clean, url):
        build_cache(parquet, out, storage_options=options, **BUILD)
    append_cache(later, clean, storage_options=options, progress=False)
    flags = [f"--storage-option={k}={v}".replace("'", '"') for k, v in options.items()]
    args = [later, "--append", "--out", url, "-q", *flags]
    proxy.inject("reset", match="/features/", methods=("PUT",), forever=True)
    rc, _, err = cli(capsys, *args)
    assert rc == 2, err
    assert "\n" not in err.strip() and f"{url}: cannot store symbols/" in err and f"at {proxy.url} after" in err
    proxy.clear()
    rc, _, err = cli(capsys, *args, "--resume")
    assert rc == 0, err
    with WindowStream(url, storage_options=options, **KW) as a, WindowStream(clean, storage_options=options, **KW) as b:
        assert _same(list(a), list(b))
    assert verify_cache(url, options).ok


def test_client_options_fill_the_defaults_the_caller_leaves_out():
    mine = {"endpoint_url": "http://x", "config_kwargs": {"read_timeout": 1}}
    got = client_options("s3://b/c.zarr", mine)
    assert got == {"endpoint_url": "http://x", "config_kwargs": {**CLIENT_DEFAULTS, "read_timeout": 1}}
    assert mine == {"endpoint_url": "http://x", "config_kwargs": {"read_timeout": 1}}  # the caller's untouched
    chained = client_options("simplecache::s3://b/c.zarr", {"s3": {"anon": True}, "simplecache": {"x": 1}})
    assert chained == {"s3": {"anon": True, "config_kwargs": CLIENT_DEFAULTS}, "simplecache": {"x": 1}}
    assert client_options("memory://c.zarr", {"a": 1}) == {"a": 1}
    assert client_options("/tmp/c.zarr", None) is None
