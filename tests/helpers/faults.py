"""A fault-injecting HTTP proxy on loopback, in front of the moto S3 server (issue 30).

``FaultProxy(target)`` forwards every request to ``target`` and answers with a planned fault instead
where one is queued: ``proxy.inject("503", count=3, match="/features/")`` makes the next 3 requests
whose path holds ``/features/`` fail with S3's 503 SlowDown. The faults:

* ``drop``: the connection is closed without an answer;
* ``reset``: the connection is reset (a TCP RST);
* ``cut``: the answer's head and half its body are sent, then the connection is closed;
* ``stall``: nothing is answered for ``stall_s`` seconds (the client's read timeout ends it first);
* ``trickle``: the right answer, its body sent a few bytes at a time over ``trickle_s`` seconds;
* ``500``, ``503`` (S3's SlowDown), ``429``: that status with S3's XML error body.

``forever=True`` keeps a fault for every matching request until ``clear()``. Everything is bounded:
a stall waits at most ``stall_s`` and ends when the proxy stops. ``proxy.seen`` counts requests by
fault (``"ok"`` for forwarded ones), ``proxy.faulted`` the faults sent.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import urlsplit

__all__ = ["FaultProxy"]

KINDS = ("drop", "reset", "cut", "stall", "trickle", "500", "503", "429")
_ERRORS = {
    "500": ("InternalError", "We encountered an internal error. Please try again."),
    "503": ("SlowDown", "Please reduce your request rate."),
    "429": ("SlowDown", "Please reduce your request rate."),
}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class _QuietServer(ThreadingHTTPServer):
    """A server whose handlers' errors (a connection the client or a fault closed mid-answer) are not
    printed to stderr, where they would mix with the output a test reads."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@dataclass
class _Fault:
    kind: str
    count: int
    match: str
    methods: tuple[str, ...]
    forever: bool


class FaultProxy:
    """A loopback proxy to ``target`` (``http://127.0.0.1:PORT``) that sends queued faults; a context
    manager that stops it. ``url`` is its own endpoint, for ``storage_options["endpoint_url"]``."""

    def __init__(self, target: str, *, stall_s: float = 30.0, trickle_s: float = 1.0) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.stall_s, self.trickle_s = stall_s, trickle_s
        self.seen: Counter[str] = Counter()
        self.faulted: list[tuple[str, str, str]] = []  # (kind, method, path)
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and end every stall."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def inject(
        self, kind: str, count: int = 1, *, match: str = "", methods: tuple[str, ...] = (), forever: bool = False
    ) -> None:
        """Queue ``count`` faults of ``kind`` for requests whose path holds ``match`` (and whose method is
        one of ``methods``, any when empty); with ``forever``, every such request until ``clear``."""
        assert kind in KINDS, kind
        with self._lock:
            self._faults.append(_Fault(kind, count, match, tuple(m.upper() for m in methods), forever))

    def clear(self) -> None:
        """Drop every queued fault: requests are forwarded from now on."""
        with self._lock:
            self._faults.clear()

    def _take(self, method: str, path: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                if fault.match in path and (not fault.methods or method in fault.methods):
                    if not fault.forever:
                        fault.count -= 1
                        if fault.count == 0:
                            self._faults.remove(fault)
                    self.faulted.append((fault.kind, method, path))
                    return fault.kind
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        method, path = h.command, h.path
        body = _read_body(h)
        kind = self._take(method, path)
        with self._lock:
            self.seen[kind or "ok"] += 1
        if kind in ("drop", "reset"):
            if kind == "reset":
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
            h.connection.close()
            return
        if kind == "stall":
            self._stop.wait(self.stall_s)
            h.close_connection = True
            return
        if kind in _ERRORS:
            code, message = _ERRORS[kind]
            xml = (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
            )
            _answer(h, int(kind), {"Content-Type": "application/xml"}, xml.encode(), method)
            return
        status, headers, data = self._forward(method, path, h.headers.items(), body)
        if kind == "cut" and data:
            _answer(h, status, headers, data[: len(data) // 2], method, length=len(data))
            h.close_connection = True
            h.connection.close()
            return
        _answer(h, status, headers, data, method, trickle=self.trickle_s if kind == "trickle" else 0.0)

    def _forward(self, method: str, path: str, headers: list, body: bytes) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(*self.target, timeout=60)
        try:
            conn.request(method, path, body=body or None, headers={k: v for k, v in headers if k.lower() not in _HOP})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}, data
        finally:
            conn.close()


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request's body: by its Content-Length, or its chunks when it is chunked."""
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    n = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(n) if n else b""


def _answer(
    h: BaseHTTPRequestHandler,
    status: int,
    headers: dict,
    data: bytes,
    method: str,
    *,
    length: int | None = None,
    trickle: float = 0.0,
) -> None:
    """Send ``status``, ``headers`` and ``data`` (a HEAD keeps its upstream length and sends no body)."""
    h.send_response_only(status)
    for key, value in headers.items():
        if key.lower() != "content-length" or method == "HEAD":
            h.send_header(key, value)
    if method != "HEAD":
        h.send_header("Content-Length", str(len(data) if length is None else length))
    h.end_headers()
    if method == "HEAD" or not data:
        h.wfile.flush()
        return
    if trickle <= 0:
        h.wfile.write(data)
        h.wfile.flush()
        return
    pieces = 20
    step = -(-len(data) // pieces)
    for k in range(0, len(data), step):
        h.wfile.write(data[k : k + step])
        h.wfile.flush()
        time.sleep(trickle / pieces)
