"""tools/s3_requests.py: requests to the moto S3 server counted by kind, exactly, between two marks."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from s3_requests import KINDS, Counts, RequestLog, parse, werkzeug_log


@pytest.fixture
def s3(s3_endpoint):
    """A boto3 client of the session's moto server: one call is one request."""
    boto3 = pytest.importorskip("boto3")
    return boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing")


def _bucket(s3) -> str:
    name = f"count-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def test_each_request_counts_once_by_kind(s3) -> None:
    with werkzeug_log() as log:
        bucket = _bucket(s3)
        mark = log.mark()
        s3.put_object(Bucket=bucket, Key="c.zarr/zarr.json", Body=b"{}")
        assert log.since(mark) == Counts({"PUT zarr.json": 1})
        steps = [
            (lambda: s3.put_object(Bucket=bucket, Key="c.zarr/symbols/0/features/c.3.0", Body=b"x" * 100), "PUT data"),
            (lambda: s3.put_object(Bucket=bucket, Key="c.zarr/notes.txt", Body=b"x"), "PUT other"),
            (lambda: s3.get_object(Bucket=bucket, Key="c.zarr/zarr.json")["Body"].read(), "GET zarr.json"),
            (
                lambda: s3.get_object(Bucket=bucket, Key="c.zarr/symbols/0/features/c.3.0", Range="bytes=0-9")[
                    "Body"
                ].read(),
                "GET data",
            ),
            (lambda: s3.get_object(Bucket=bucket, Key="c.zarr/notes.txt")["Body"].read(), "GET other"),
            (lambda: s3.head_object(Bucket=bucket, Key="c.zarr/zarr.json"), "HEAD"),
            (lambda: s3.list_objects_v2(Bucket=bucket, Prefix="c.zarr/", Delimiter="/"), "LIST"),
            (lambda: s3.delete_object(Bucket=bucket, Key="c.zarr/notes.txt"), "DELETE"),
            (
                lambda: s3.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": "c.zarr/zarr.json"}, {"Key": "c.zarr/x"}]}
                ),
                "DELETE",  # one request, however many keys
            ),
        ]
        for call, kind in steps:
            mark = log.mark()
            call()
            counts = log.since(mark)
            assert counts == Counts({kind: 1}), (kind, counts)
            assert counts.total == 1 and counts.missing == 0
        with pytest.raises(ClientError, match="404"):
            mark = log.mark()
            s3.head_object(Bucket=bucket, Key="c.zarr/absent")
        assert log.since(mark) == Counts({"HEAD": 1}) and log.since(mark).missing == 1


def test_a_mark_separates_runs_and_a_bucket_filter_keeps_one_bucket(s3) -> None:
    with werkzeug_log() as log:
        first, second = _bucket(s3), _bucket(s3)
        for i in range(3):
            s3.put_object(Bucket=first, Key=f"a/{i}/zarr.json", Body=b"{}")
        mark = log.mark()
        for i in range(5):
            s3.put_object(Bucket=second, Key=f"b/c/{i}", Body=b"x")
        s3.put_object(Bucket=first, Key="a/c/0", Body=b"x")
        assert log.since(mark, bucket=second) == Counts({"PUT data": 5})
        assert log.since(mark, bucket=first) == Counts({"PUT data": 1})
        both = log.since(mark)
        assert both.total == 6 and both.column("PUT") == 6 and both.summary() == "6 (PUT data 6)"
        assert log.since(0, bucket=first)["PUT zarr.json"] == 3
    s3.put_object(Bucket=first, Key="after/zarr.json", Body=b"{}")  # outside: not caught
    assert log.since(0, bucket=first).total == 3 + 1 + 1  # the bucket's creation is "other"


def test_a_log_file_is_read_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "moto.log"
    lines = [
        '127.0.0.1 - - [01/Dec/2026 10:00:00] "PUT /b/c.zarr/zarr.json HTTP/1.1" 200 -',
        '127.0.0.1 - - [01/Dec/2026 10:00:00] "\x1b[33mHEAD /b/c.zarr/symbols/0/zarr.json HTTP/1.1\x1b[0m" 404 -',
        " * Running on http://127.0.0.1:5000",  # not a request
        '127.0.0.1 - - [01/Dec/2026 10:00:01] "GET /b?list-type=2&prefix=c.zarr%2F&delimiter=%2F HTTP/1.1" 200 -',
    ]
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2] + "\n" + lines[3][:30])  # the last line half written
    log = RequestLog(str(path))
    assert log.mark() == 2
    with path.open("a") as fh:
        fh.write(lines[3][30:] + "\n" + '127.0.0.1 - - [x] "POST /b?delete HTTP/1.1" 200 -\n')
    counts = log.since(1)
    assert counts == Counts({"HEAD": 1, "LIST": 1, "DELETE": 1}) and counts.missing == 1
    assert parse(lines[3]).key == "" and parse(lines[3]).query == frozenset({"list-type", "prefix", "delimiter"})
    assert set(log.since(0)) <= set(KINDS)
