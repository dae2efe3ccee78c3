"""URLs that cannot be used (issue 20): an unknown scheme, an endpoint that does not answer, missing
credentials or a missing bucket end every CLI command in one line and exit 2, and the API in a
``CacheError`` or ``SourceError``; ``storage_options`` that are not a mapping are refused by name."""

from __future__ import annotations

import pytest
from ohlcv_files import ohlcv, write_parquet

from shardcache.cli import main
from shardcache.errors import CacheError, OptionTypeError, SourceError
from shardcache.format.cache import open_cache
from shardcache.format.layout import open_group
from shardcache.format.writer import CacheWriter
from shardcache.ingest.builder import build_cache

NOWHERE = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture
def local(tmp_path) -> str:
    return write_parquet(tmp_path / "ES.parquet", ohlcv(300))


def _commands(url: str, local: str, out: str) -> dict[str, list[str]]:
    """Every CLI command that opens ``url``: as a cache, an output, an append's cache or an input."""
    return {
        "info": ["info", url],
        "ls": ["ls", url],
        "verify": ["verify", url],
        "build --out": ["build", local, "--out", url, "-q"],
        "build --append": ["build", local, "--out", url, "--append", "-q"],
        "build input": ["build", url, "--out", out, "-q"],
    }


COMMANDS = ["info", "ls", "verify", "build --out", "build --append", "build input"]


def _one_line(capsys, argv: list[str], *expected: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    assert all(e in err[0] for e in expected), err[0]
    return err[0]


@pytest.fixture
def fake_credentials(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata lookups either


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_scheme_is_one_line(capsys, tmp_path, local, command):
    url = "nosuch://bucket/c.zarr"
    argv = _commands(url, local, str(tmp_path / "c.zarr"))[command]
    _one_line(capsys, argv, f"{url}: unknown URL scheme 'nosuch://' (no fsspec filesystem has it)")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_endpoint_that_does_not_answer_is_one_line(capsys, tmp_path, local, fake_credentials, command):
    url = "s3://bucket/c.zarr"
    argv = [*_commands(url, local, str(tmp_path / "c.zarr"))[command], "--storage-option", f"endpoint_url={NOWHERE}"]
    _one_line(capsys, argv, f"{url}: cannot use its store (EndpointConnectionError: Could not connect")


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_credentials_are_one_line(capsys, tmp_path, local, no_credentials, command):
    url = "s3://bucket/c.zarr"
    argv = [*_commands(url, local, str(tmp_path / "c.zarr"))[command], "--storage-option", f"endpoint_url={NOWHERE}"]
    _one_line(capsys, argv, f"{url}: cannot use its store (NoCredentialsError: Unable to locate credentials)")


def test_a_missing_bucket_is_one_line_from_every_command(capsys, tmp_path, local, s3_endpoint):
    url = "s3://no-such-bucket/c.zarr"
    for argv in _commands(url, local, str(tmp_path / "c.zarr")).values():
        line = _one_line(capsys, [*argv, "--storage-option", f"endpoint_url={s3_endpoint}"], url)
        assert line.endswith(
            "no bucket 'no-such-bucket' at this endpoint (create it, or check the URL and endpoint_url)"
        )


def test_the_api_raises_cache_and_source_errors(tmp_path, local, fake_credentials):
    with pytest.raises(CacheError, match="unknown URL scheme 'nosuch://'"):
        open_cache("nosuch://b/c.zarr")
    with pytest.raises(CacheError, match=r"^s3://b/c.zarr: cannot use its store \(EndpointConnectionError"):
        open_cache("s3://b/c.zarr", {"endpoint_url": NOWHERE})
    with pytest.raises(CacheError, match="unknown URL scheme"):
        build_cache(local, "nosuch://b/c.zarr", progress=False)
    with pytest.raises(SourceError, match=r"^s3://b/in: cannot use its store \(EndpointConnectionError"):
        build_cache("s3://b/in", tmp_path / "c.zarr", storage_options={"endpoint_url": NOWHERE}, progress=False)
    assert not (tmp_path / "c.zarr").exists()


def test_storage_options_must_be_a_mapping_wherever_a_cache_or_input_is_opened(tmp_path, local):
    from shardcache.read.stream import WindowDataset, WindowStream

    out = tmp_path / "c.zarr"
    build_cache(local, out, progress=False)
    message = r"storage_options='x': must be a mapping of fsspec options .*, not str"
    for call in (
        lambda: open_cache(out, "x"),
        lambda: WindowStream(out, 10, storage_options="x"),
        lambda: WindowDataset(out, 10, storage_options="x"),
        lambda: open_group(out, "r", "x"),
        lambda: CacheWriter(
            tmp_path / "w.zarr",
            feature_names=["a"],
            bars_per_symbol=[1],
            shard_rows=8,
            chunk_rows=8,
            storage_options="x",
        ),
        lambda: build_cache(local, tmp_path / "d.zarr", storage_options="x", progress=False),
    ):
        with pytest.raises(OptionTypeError, match=message):
            call()
    assert not (tmp_path / "w.zarr").exists() and not (tmp_path / "d.zarr").exists()
