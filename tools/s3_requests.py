"""A moto S3 server on loopback (``Moto``) and its requests, counted by kind from its log between two points of a run.

moto's server (werkzeug) logs one line per request as it sends the status line, before the body, so every request
a client call made is in the log once the call has returned (``"GET /bucket/c.zarr/zarr.json HTTP/1.1" 200 -``):
a count is deterministic where a loopback timing is not (on real S3 each request costs a 10-50 ms first byte). A
request is one of ``KINDS``: by method, and for object GETs and PUTs by key class (``zarr.json``, ``data``: a chunk
or shard ``.../c.0.0`` or ``.../c/0/0``, ``other``); a bucket GET with a prefix or ``list-type`` is a ``LIST``, a
multi-object delete (``POST ?delete``) one ``DELETE``. ``RequestLog(path)`` reads the log file of ``Moto`` (``python
-m moto.server`` on a free 127.0.0.1 port, fake credentials); ``werkzeug_log()`` catches the lines of a server in
this process (``moto.server.ThreadedMotoServer``, the tests' ``s3_endpoint``)::

    log = RequestLog(moto.log)
    mark = log.mark()
    ...                                  # the work to count
    counts = log.since(mark, bucket="bench")
    print(counts.total, counts["GET data"], counts.summary())
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["COLUMNS", "ENV", "KINDS", "Counts", "Moto", "Request", "RequestLog", "classify", "parse", "werkzeug_log"]

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

KINDS = (
    "GET zarr.json",
    "GET data",
    "GET other",
    "PUT zarr.json",
    "PUT data",
    "PUT other",
    "LIST",
    "HEAD",
    "DELETE",
    "other",
)
# the table's columns: each kind falls in one (PUTs of every key class together)
COLUMNS = {
    "GET zarr.json": ("GET zarr.json",),
    "GET data": ("GET data",),
    "GET other": ("GET other",),
    "PUT": ("PUT zarr.json", "PUT data", "PUT other"),
    "LIST": ("LIST",),
    "HEAD": ("HEAD",),
    "DELETE": ("DELETE",),
    "other": ("other",),
}
_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" (\d{3}) ')
_CHUNK = re.compile(r"(?:^|/)c(?:[/.]\d+)+$")  # zarr v3's default chunk keys: c/0/0 or c.0.0
_LIST_QUERY = {"list-type", "prefix", "delimiter", "marker", "continuation-token", "start-after"}


@dataclass(frozen=True)
class Request:
    """One logged request: method, bucket, object key ('' for a bucket request), query keys, status."""

    method: str
    bucket: str
    key: str
    query: frozenset[str]
    status: int

    @property
    def kind(self) -> str:
        """The request's entry of ``KINDS``."""
        return classify(self)


def parse(line: str) -> Request | None:
    """The request of one log line (path-style addressing, as s3fs uses with an ``endpoint_url``),
    None for a line that is not a request."""
    m = _LINE.search(line)
    if m is None:
        return None
    method, target, status = m.groups()
    parts = urlsplit(target)
    bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
    query = frozenset(parse_qs(parts.query, keep_blank_values=True))
    return Request(method, bucket, key, query, int(status))


def _key_class(key: str) -> str:
    if key == "zarr.json" or key.endswith("/zarr.json"):
        return "zarr.json"
    return "data" if _CHUNK.search(key) else "other"


def classify(req: Request) -> str:
    """The kind of ``req`` (one of ``KINDS``)."""
    if req.method == "HEAD":
        return "HEAD"
    if req.method == "DELETE" or (req.method == "POST" and "delete" in req.query):
        return "DELETE"
    if req.method == "GET" and not req.key:
        return "LIST" if req.query & _LIST_QUERY or not req.query else "other"
    if req.method in ("GET", "PUT") and req.key:
        return f"{req.method} {_key_class(req.key)}"
    return "other"  # bucket creation, multipart upload start and completion


class Counts(Counter):
    """Requests by kind (``KINDS``); ``missing`` counts those answered 404 (existence checks that found nothing)."""

    missing: int = 0

    @classmethod
    def of(cls, requests: Iterable[Request]) -> Counts:
        counts = cls()
        for req in requests:
            counts[req.kind] += 1
            counts.missing += req.status == 404
        return counts

    @property
    def total(self) -> int:
        return sum(self.values())

    def column(self, name: str) -> int:
        """Requests of table column ``name`` (``COLUMNS``: the PUTs of every key class together)."""
        return sum(self[k] for k in COLUMNS[name])

    def summary(self) -> str:
        """``total (kind n, ...)``: the kinds that occurred, in ``KINDS`` order."""
        parts = [f"{k} {self[k]:,}" for k in KINDS if self[k]]
        return f"{self.total:,}" + (f" ({', '.join(parts)})" if parts else "")


class RequestLog:
    """The requests a moto server logged: read from its log file (``path``), or collected by
    ``werkzeug_log`` (no path). ``mark()`` is a point of the run; ``since(mark)`` counts what came after."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._lines: list[str] = []
        self._offset = 0
        self._lock = threading.Lock()

    def _add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def requests(self) -> list[Request]:
        """Every request logged so far, in log order."""
        if self.path is not None:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._offset += end
            self._lines.extend(data[:end].decode("utf-8", "replace").splitlines())
        with self._lock:
            lines = list(self._lines)
        return [r for r in map(parse, lines) if r is not None]

    def mark(self) -> int:
        """The number of requests so far: a point of the run to count from."""
        return len(self.requests())

    def since(self, mark: int, bucket: str | None = None) -> Counts:
        """The requests after ``mark`` (to ``bucket`` only, when given), by kind."""
        return Counts.of(r for r in self.requests()[mark:] if bucket is None or r.bucket == bucket)


class _Collect(logging.Handler):
    def __init__(self, log: RequestLog) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log._add(record.getMessage())


@contextlib.contextmanager
def werkzeug_log() -> Iterator[RequestLog]:
    """The requests of every werkzeug server in this process (``ThreadedMotoServer``) while inside.

    While inside, the ``werkzeug`` logger is at INFO and its records go to this log only (not to
    its own handlers nor to the root logger's); its level, handlers and propagation are restored
    on the way out.
    """
    logger = logging.getLogger("werkzeug")
    log = RequestLog()
    saved = logger.level, logger.handlers[:], logger.propagate
    logger.handlers[:] = [_Collect(log)]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield log
    finally:
        level, handlers, logger.propagate = saved
        logger.handlers[:] = handlers
        logger.setLevel(level)


class Moto:
    """``python -m moto.server`` on a free loopback port, in a subprocess; its request log in the file ``log``,
    read by ``request_log`` (None: the log is discarded)."""

    def __init__(self, log: str | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log, self.request_log = log, None if log is None else RequestLog(log)
        with contextlib.ExitStack() as files:  # the server writes to its own copy of the file
            err = subprocess.DEVNULL if log is None else files.enter_context(open(log, "w"))
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **ENV})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            time.sleep(0.1)
        raise RuntimeError("moto server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, str]:
        """s3fs storage options for this server."""
        return {"endpoint_url": self.url, "key": ENV["AWS_ACCESS_KEY_ID"], "secret": ENV["AWS_SECRET_ACCESS_KEY"]}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
