"""A real local HTTP server that records every request it receives, for tests.

``HTTPRecorder`` listens on 127.0.0.1 on a free port in a background thread (or on another
loopback address and port, e.g. ``HTTPRecorder(host="127.0.0.2")`` or ``host="::1"``; with
``tls=`` an ``ssl.SSLContext``, it speaks HTTPS). Each request is recorded (method, path,
headers, body) before the canned response is sent, so "no request was received" can be asserted
after the fact. The ``http_recorder`` fixture starts one and shuts it down after the test.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class CannedResponse:
    status: int = 200
    body: bytes = b'{"received": true}'
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


class _Handler(BaseHTTPRequestHandler):
    server: _RecordingServer

    def _record_and_answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.record(
            RecordedRequest(self.command, self.path, dict(self.headers.items()), body)
        )
        answer = self.server.response
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _record_and_answer

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        return


class _RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)
        self.requests: list[RecordedRequest] = []
        self.response = CannedResponse()
        self._lock = threading.Lock()

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)


class HTTPRecorder:
    """Start/stop a recording server; ``requests`` is a snapshot of what it received."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self._host = host
        self._server = _RecordingServer(host, port)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def netloc(self) -> str:
        """``127.0.0.1:<port>`` (``[::1]:<port>``): the allowlist entry for this server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"{self._scheme}://{self.netloc}{path}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._server._lock:
            return list(self._server.requests)

    def respond_with(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        """Answer every later request with this status, body and headers."""
        self._server.response = CannedResponse(status, body, dict(headers or {}))

    def start(self) -> HTTPRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def http_recorder() -> Iterator[HTTPRecorder]:
    """A started ``HTTPRecorder`` on 127.0.0.1 (free port), stopped after the test."""
    recorder = HTTPRecorder().start()
    try:
        yield recorder
    finally:
        recorder.stop()


@contextmanager
def recorders_on_one_port(*hosts: str) -> Iterator[list[HTTPRecorder]]:
    """Started recorders on ``hosts`` (loopback addresses, e.g. 127.0.0.2 and 127.0.0.1), all on
    the same free port: a request that reaches the wrong address is seen by the wrong one."""
    for _ in range(20):
        started: list[HTTPRecorder] = []
        try:
            for host in hosts:
                port = started[0].port if started else 0
                started.append(HTTPRecorder(host=host, port=port).start())
        except OSError:  # that port is taken on one of the hosts: try another
            for recorder in started:
                recorder.stop()
            continue
        try:
            yield started
        finally:
            for recorder in started:
                recorder.stop()
        return
    raise RuntimeError(f"no port free on all of {hosts}")
