"""Shared pytest fixtures. Each section belongs to one part of the project; add new sections below."""

from __future__ import annotations

import pytest

from helpers import Bars, make_cache, synthetic_bars

# ---- window index and stream (shardcache/index.py, shardcache/stream.py) -------------------


@pytest.fixture(scope="session")
def stream_bars() -> Bars:
    """6000 bars, 5 features, 3 symbols with gaps, tiny segments and train/val/test splits."""
    return synthetic_bars(6000, 5, n_symbols=3, seed=7, shard_rows=512)


@pytest.fixture(scope="session")
def stream_cache(tmp_path_factory, stream_bars):
    """``stream_bars`` written with 512-row shards (12 shards, several pools per epoch)."""
    path = tmp_path_factory.mktemp("stream") / "bars.zarr"
    return make_cache(path, stream_bars, shard_rows=512, chunk_rows=128)


# ---- object storage: a real S3-compatible server on 127.0.0.1 (tests/test_scaling.py) ------


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server in server mode on 127.0.0.1 (a free port) for the session: its endpoint URL.

    The AWS variables point every client at fake credentials (also in subprocesses, DDP ranks
    and dask workers started by a test); no request leaves the machine.
    """
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            mp.setenv(key, value)
        for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(key, raising=False)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A new empty bucket on the session's S3 server: ``("s3://NAME", storage_options)``."""
    import uuid

    import s3fs

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    name = f"shardcache-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(name)
    return f"s3://{name}", options
