"""A real MCP server (the ``mcp`` SDK's ``MCPServer``) over streamable HTTP, for remote-tool tests.

``TicketServer`` listens on 127.0.0.1 (an ephemeral port) in a background thread (uvicorn) and
offers three tools:

* ``create_ticket(title)`` — records the call (arguments and the request's ``_meta``) and
  returns ``{"ticket": n}``. It *claims* to be read-only (``readOnlyHint``) and idempotent: a
  server's hints must decide nothing.
* ``echo(text)`` — returns the text (also recorded).
* ``fail()`` — answers with ``isError``.

``offer(name, input_schema)`` lists one more tool declaring exactly that schema (one the SDK
would never derive from a signature, such as a remote ``$ref``).

``TicketServer(hostile=True)`` also offers ``hostile_text(kind)`` and ``hostile_structured(kind)``
(``tests.support.mcp_stdio_server.HOSTILE``) and sends every answer through ``raw_wire``: raw
``NaN`` / ``Infinity`` and lone-surrogate escapes on the wire, as a hostile server would.

``hold()`` makes every tool call wait (after recording it) until ``release()`` — so a test can
inspect the run row while the server holds the call. ``calls`` lists the recorded tool calls;
``http_requests`` counts every HTTP request that reached the server. Use the ``mcp_server``
fixture; ``server.url`` is the ``McpServer.url``.

A test about a short timeout must not spend it on anything but the call: ``server_row`` syncs
the row with time to spare before giving it its ``timeout_seconds``, and ``warm_sessions``
hands a segment a scope whose session to the server is already open.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from tests.support.mcp_stdio_server import HOSTILE, raw_wire

HOLD_LIMIT_SECONDS = 60.0
SPARE_SECONDS = 30  # for syncing and opening sessions, which a busy machine can make slow


@dataclass
class RecordedCall:
    tool: str
    arguments: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TicketServer:
    def __init__(self, *, hostile: bool = False) -> None:
        self.hostile = hostile
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.calls: list[RecordedCall] = []
        self.http_requests = 0
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self._server: Any = None
        self._mcp: Any = None
        self._thread: threading.Thread | None = None

    # -- test controls --

    def hold(self) -> None:
        """From now on every tool call waits (after being recorded) until ``release()``."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def offer(self, name: str, input_schema: dict[str, Any]) -> None:
        """From now on list a tool ``name`` whose input schema is ``input_schema``, as given."""

        def offered(ctx: Context) -> str:
            self._record(name, {}, ctx)
            return "offered"

        self._mcp.add_tool(offered, name=name, description="A tool with a hand-written schema.")
        self._mcp._tool_manager.get_tool(name).parameters = dict(input_schema)

    def wait_for_calls(self, count: int, *, timeout: float = 30.0) -> list[RecordedCall]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.calls) >= count:
                    return list(self.calls)
            time.sleep(0.02)
        raise AssertionError(f"the MCP server saw {len(self.calls)} calls, expected {count}")

    def tool_calls(self, name: str) -> list[RecordedCall]:
        with self._lock:
            return [c for c in self.calls if c.tool == name]

    # -- the server --

    def _record(self, tool: str, arguments: dict[str, Any], ctx: Any) -> None:
        meta = dict(ctx.request_context.meta or {})
        with self._lock:
            self.calls.append(RecordedCall(tool, arguments, meta))
        self._released.wait(HOLD_LIMIT_SECONDS)

    def _build(self) -> Any:
        server = MCPServer("tickets", log_level="WARNING")

        @server.tool(
            annotations=ToolAnnotations(
                read_only_hint=True, idempotent_hint=True, destructive_hint=False
            )
        )
        def create_ticket(title: str, ctx: Context) -> dict[str, Any]:
            """Open a ticket with a title."""
            self._record("create_ticket", {"title": title}, ctx)
            return {"ticket": len(self.tool_calls("create_ticket"))}

        @server.tool()
        def echo(text: str, ctx: Context) -> str:
            """Return the text."""
            self._record("echo", {"text": text}, ctx)
            return text

        @server.tool()
        def fail(ctx: Context) -> str:
            """Always fails."""
            self._record("fail", {}, ctx)
            raise ToolError("the ticket system is read-only today")

        if self.hostile:

            @server.tool()
            def hostile_text(kind: str, ctx: Context) -> str:
                """Returns a text no column can store."""
                self._record("hostile_text", {"kind": kind}, ctx)
                return str(HOSTILE[kind])

            @server.tool()
            def hostile_structured(kind: str, ctx: Context) -> dict[str, Any]:
                """Returns structured content no column can store."""
                self._record("hostile_structured", {"kind": kind}, ctx)
                return dict(HOSTILE[kind])

        return server

    def start(self) -> None:
        import uvicorn

        self._mcp = self._build()
        app = self._mcp.streamable_http_app(host="127.0.0.1")

        async def counting(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                with self._lock:
                    self.http_requests += 1
            await app(scope, receive, raw(send) if self.hostile else send)

        def raw(send: Any) -> Any:
            async def sending(message: dict) -> None:
                if message["type"] == "http.response.start":  # the length changes
                    headers = [
                        (k, v) for k, v in message.get("headers", []) if k != b"content-length"
                    ]
                    message = {**message, "headers": headers}
                elif message["type"] == "http.response.body" and message.get("body"):
                    body = raw_wire(message["body"].decode("utf-8")).encode("utf-8")
                    message = {**message, "body": body}
                await send(message)

            return sending

        config = uvicorn.Config(
            counting,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mcp-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


@pytest.fixture
def mcp_server() -> Iterator[TicketServer]:
    server = TicketServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hostile_mcp_server() -> Iterator[TicketServer]:
    server = TicketServer(hostile=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def server_row(server: TicketServer, **fields: Any) -> Any:
    """An ``McpServer`` row for ``server``, synced (listing its tools with ``SPARE_SECONDS``:
    a sync that fails for want of time would leave the tools unknown) and then given the
    ``timeout_seconds`` asked for."""
    from agentruns.models import McpServer
    from agentruns.services.mcp_sync import mcp_server_sync

    timeout = fields.pop("timeout_seconds", McpServer._meta.get_field("timeout_seconds").default)
    row = McpServer.objects.create(
        name=fields.pop("name", "tix"), url=server.url, timeout_seconds=SPARE_SECONDS, **fields
    )
    result = mcp_server_sync(server=row)
    assert result.ok, result.error
    McpServer.objects.filter(pk=row.pk).update(timeout_seconds=timeout)
    row.refresh_from_db()
    return row


@contextmanager
def _scope_with_open_session(row: Any, opened: list[Any]) -> Iterator[Any]:
    from agentruns.conf import app_settings
    from agentruns.tools.mcp_client import new_session, session_key
    from agentruns.tools.mcp_sessions import session_scope

    limit = min(float(row.timeout_seconds), app_settings().tool_timeout_seconds)
    with session_scope() as scope:
        deadline = time.monotonic() + SPARE_SECONDS
        scope.session(session_key(row, limit), lambda: new_session(row, limit), deadline)
        opened.append(scope)
        yield scope


def warm_sessions(monkeypatch: pytest.MonkeyPatch, row: Any) -> list[Any]:
    """Make every segment started from now on get a session scope in which the session to
    ``row`` (as a call with the default tool timeout keys it) is already open, opened with
    ``SPARE_SECONDS`` to spare: a call's timeout then covers the call alone, never a session's
    start. Returns the scopes handed out (``scope.opened == 1``: no call opened another)."""
    from agentruns.services.runtime import segment

    scopes: list[Any] = []
    monkeypatch.setattr(segment, "session_scope", lambda: _scope_with_open_session(row, scopes))
    return scopes
