"""A real local HTTP server speaking the chat-completions protocol, for provider tests.

``ChatServer`` listens on 127.0.0.1 (an ephemeral port) in a background thread and answers
``POST <anything>/chat/completions`` from a FIFO queue of scripted responses, recording every
request (path, lower-cased headers, JSON body). An empty queue answers 400 (not retryable) so a
test that under-scripts fails fast. Use the ``chat_server`` fixture; ``server.base_url`` is the
``base_url`` for an ``AgentConfiguration``.

Hostile answers go out exactly as written: ``reply_raw`` sends a body (text or bytes) as it is,
and ``raw_completion`` builds a completion from raw JSON fragments, so a test can send what
Python's ``json`` would never write (``NaN``, ``1e999``, ``"\\u0000"``, ``"\\ud800"``).

A request asking ``"stream": true`` gets a 200 JSON answer as the SDK's stream reads it: chunked
``text/event-stream`` frames built by ``stream_frames`` (``sse.chat_frames``; the Messages server
``sse.message_frames``). ``stream_raw`` queues frames sent exactly as given, one by one, with a
delay between them or the connection cut after some (``drop_after``).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.sse import chat_frames


@dataclass(frozen=True)
class ScriptedResponse:
    """What the server answers to one request: a status, a JSON body (a ``str`` or ``bytes``
    body is sent as it is), a delay."""

    status: int = 200
    body: Any = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # Streamed (``text/event-stream``, chunked): these frames as they are, one by one; a 200
    # JSON body asked for with ``"stream": true`` is streamed as its frames (``sse``).
    frames: tuple[str | bytes, ...] | None = None
    # Stop after this many frames and close the connection mid-body (no final chunk).
    drop_after: int | None = None
    # Seconds between two frames.
    frame_delay: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


def completion(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "test-model",
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A chat-completion body. Each tool call: ``{"name", "arguments"}`` (a dict is JSON-encoded,
    a string is sent as is) and optionally ``"id"`` (default ``call_<n>``)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call.get("id", f"call_{position}"),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": call["arguments"]
                    if isinstance(call.get("arguments"), str)
                    else json.dumps(call.get("arguments", {})),
                },
            }
            for position, call in enumerate(tool_calls)
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def raw_completion(
    *,
    content: str = "null",
    tool_calls: list[dict[str, str]] | None = None,
    usage: str = '{"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}',
    model: str = '"test-model"',
    finish_reason: str | None = None,
) -> str:
    """A chat-completion body whose parts are raw JSON text, written into it untouched.

    ``content``, ``usage``, ``model`` and ``finish_reason`` are JSON fragments (``'"a\\u0000b"'``,
    ``'{"prompt_tokens": NaN}'``). Each tool call is ``{"id", "name", "arguments"}``, all raw
    fragments too, except that ``arguments`` is the *text* of the arguments (what the model
    wrote, e.g. ``'{"value": NaN}'``), quoted here as the protocol's string.
    """
    calls = ""
    if tool_calls:
        calls = ', "tool_calls": [' + ", ".join(_raw_call(n, c) for n, c in enumerate(tool_calls))
        calls += "]"
    finish = finish_reason or ('"tool_calls"' if tool_calls else '"stop"')
    message = '{"role": "assistant", "content": ' + content + calls + "}"
    return (
        '{"id": "chatcmpl-raw", "object": "chat.completion", "created": 0, '
        f'"model": {model}, "choices": [{{"index": 0, "message": {message}, '
        f'"finish_reason": {finish}}}], "usage": {usage}}}'
    )


def _raw_call(position: int, call: dict[str, str]) -> str:
    function = f'{{"name": {call["name"]}, "arguments": {json.dumps(call["arguments"])}}}'
    call_id = call.get("id", f'"call_{position}"')
    return f'{{"id": {call_id}, "type": "function", "function": {function}}}'


def error_body(message: str, *, type_: str = "server_error") -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": type_, "code": None}}


def unused_port() -> int:
    """A localhost port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ChatServer:
    """A threaded chat-completions server; ``start()``/``stop()`` or use as a context manager.

    A sibling speaking another protocol overrides ``endpoint`` (the path a request must end
    with), ``path_prefix`` (what ``base_url`` adds), ``error`` (its error body) and
    ``request_problem`` (why a request is refused before the queue is read)."""

    endpoint = "/chat/completions"
    path_prefix = "/v1"

    @staticmethod
    def error(message: str, *, status: int = 400) -> Any:
        """The error body this protocol sends."""
        return error_body(message)

    def request_problem(self, headers: dict[str, str], body: Any) -> str | None:
        """Why this request is refused with 400 (``None``: it is answered from the queue)."""
        return None

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._responses: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting -------------------------------------------------------------------------
    def enqueue(self, *responses: ScriptedResponse) -> None:
        with self._lock:
            self._responses.extend(responses)

    def reply(self, *, delay: float = 0.0, **completion_fields: Any) -> None:
        """Queue a 200 completion (arguments as for ``completion``)."""
        self.enqueue(ScriptedResponse(body=completion(**completion_fields), delay=delay))

    def reply_raw(self, body: str | bytes, *, status: int = 200) -> None:
        """Queue a body sent exactly as given (``raw_completion``, or any bytes at all)."""
        self.enqueue(ScriptedResponse(status=status, body=body))

    def stream_raw(
        self, frames: list[str | bytes], *, drop_after: int | None = None, delay: float = 0.0
    ) -> None:
        """Queue a streamed answer of exactly these frames (``sse.data``, ``sse.event``);
        ``drop_after``: the connection is cut after that many."""
        self.enqueue(
            ScriptedResponse(frames=tuple(frames), drop_after=drop_after, frame_delay=delay)
        )

    @staticmethod
    def stream_frames(body: Any, request: dict[str, Any]) -> list[str]:
        """The frames of this protocol's stream for a JSON answer ``body``."""
        return chat_frames(body, request)

    def fail(self, status: int, message: str = "scripted failure") -> None:
        """Queue an error status with an OpenAI-style error body."""
        self.enqueue(ScriptedResponse(status=status, body=self.error(message, status=status)))

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}{self.path_prefix}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> ChatServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

            def do_GET(self) -> None:
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="chat-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- serving ---------------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {key.lower(): value for key, value in handler.headers.items()}
        with self._lock:
            self.requests.append(RecordedRequest(handler.command, handler.path, headers, body))
            if handler.command != "POST" or not handler.path.endswith(self.endpoint):
                response = ScriptedResponse(
                    status=404, body=self.error("no such endpoint", status=404)
                )
            elif (problem := self.request_problem(headers, body)) is not None:
                response = ScriptedResponse(status=400, body=self.error(problem))
            elif self._responses:
                response = self._responses.popleft()
            else:
                response = ScriptedResponse(
                    status=400, body=self.error("test server: no scripted response left")
                )
        if response.delay and self._stopping.wait(response.delay):
            return
        if response.status == 200 and isinstance(body, dict) and body.get("stream") is True:
            frames = response.frames
            if frames is None and isinstance(response.body, dict):
                frames = tuple(self.stream_frames(response.body, body))
            if frames is not None:
                self._stream(handler, response, frames)
                return
        if isinstance(response.body, bytes):
            payload = response.body
        elif isinstance(response.body, str):
            payload = response.body.encode()
        else:
            payload = json.dumps(response.body).encode()
        try:
            handler.send_response(response.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def _stream(
        self,
        handler: BaseHTTPRequestHandler,
        response: ScriptedResponse,
        frames: tuple[str | bytes, ...],
    ) -> None:
        """The frames as a chunked ``text/event-stream``, flushed one by one; cut (the socket
        closed without the last chunk) after ``drop_after`` of them."""
        handler.protocol_version = "HTTP/1.1"
        handler.close_connection = True
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.send_header("Connection", "close")
            handler.end_headers()
            for sent, frame in enumerate(frames):
                if response.drop_after is not None and sent >= response.drop_after:
                    handler.wfile.flush()
                    handler.connection.shutdown(socket.SHUT_RDWR)
                    return
                if response.frame_delay and self._stopping.wait(response.frame_delay):
                    return
                payload = frame if isinstance(frame, bytes) else frame.encode()
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client gave up


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A started ``ChatServer``, stopped after the test."""
    with ChatServer() as server:
        yield server
