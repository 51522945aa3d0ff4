"""Reaching an operator-registered ``McpServer`` with the official ``mcp`` SDK (2.x): listing its
tools and calling one (docs/design.md §4.5).

What a call comes to:

* refused before anything is started or sent (stdio off, no URL, a refused or missing secret,
  the segment's sessions closed): ``McpRefused``;
* the server could not be started, reached or initialized — no tool call was sent:
  ``McpCallFailed``, with the last lines of a stdio server's stderr;
* the server answered: a result, ``McpToolError`` for ``isError`` or a JSON-RPC error;
* the call was sent and then the time ran out or the connection was lost: ``OutcomeUnknown``
  (whether it took effect is not known; a non-idempotent write then waits for reconciliation).

The timeout (the server's ``timeout_seconds``, capped by the call's) covers opening a session
when the call opens one, and the call; a call that runs out is aborted at once, so the caller
gets its answer within ``ABORT_SECONDS`` of the timeout. Inside a segment's ``session_scope``
calls share one session per server; outside one, each call opens and closes its own.

"Sent" means handed to the SDK on the session's loop (``_Handover``): when the time runs out
before that, the call is abandoned unsent and the answer is ``McpCallFailed``, not a doubt. One
deadline decides: the SDK's and the HTTP client's own timers run a little later as backstops,
and a failure that arrives once the deadline has passed is the same verdict as the deadline
itself ("no answer came within …"), whichever clock noticed first.

It never stamps, checks or clears a lease or a fence, and writes no rows.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agentruns.conf import app_settings
from agentruns.exceptions import SecretEnvRefused
from agentruns.models import McpServer, McpTransport
from agentruns.secrets import check_secret_env, read_secret_env
from agentruns.storable import TEXT, Mended
from agentruns.tools.mcp_errors import (
    MAX_MESSAGE_CHARS,
    McpCallFailed,
    McpError,
    McpRefused,
    McpToolError,
    short,
)
from agentruns.tools.mcp_sessions import (
    ABORT_SECONDS,
    RemoteSession,
    ScopeClosed,
    SessionOpenFailed,
    SessionTimedOut,
    current_scope,
)
from agentruns.tools.mcp_stdio import StdioProcess, stdio_transport
from agentruns.tools.mcp_wire import MendingTransport, Mends
from agentruns.tools.registry import OutcomeUnknown, ToolContext

MAX_LIST_PAGES = 50
STDERR_CHARS = 1000
#: How the SDK's HTTP client begins the parse error it answers a request with when the
#: server's answer could not be read ("Failed to parse JSON response: …", "… SSE message: …").
UNREADABLE_ANSWER = "Failed to parse"


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups from anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    leaf = _leaf(exc)
    text = " ".join(str(leaf).split()) or type(leaf).__name__
    return short(f"{type(leaf).__name__}: {text}")


def _stderr_note(stderr: str) -> str:
    """``"; the server's stderr: …"`` (its last lines, bounded) or ``""``."""
    if not stderr:
        return ""
    tail = stderr if len(stderr) <= STDERR_CHARS else "…" + stderr[-(STDERR_CHARS - 1) :]
    return f"; the server's stderr: {tail}"


# --- Connecting ------------------------------------------------------------------------------


def _headers(server: McpServer) -> dict[str, str]:
    """Header values read from the environment variables the server names (never the DB), each
    allowed by the secret rule (``agentruns.secrets``); ``McpRefused`` (its cause a
    ``SecretEnvRefused`` for a refused name) before anything is read or sent."""
    mapping = server.headers_env if isinstance(server.headers_env, dict) else None
    if mapping is None:
        raise McpRefused(f"MCP server {server.name!r}: headers_env must map headers to env vars")
    for header, variable in mapping.items():
        try:
            check_secret_env(variable, what=f"MCP server {server.name!r}, header {header!r}")
        except SecretEnvRefused as exc:
            raise McpRefused(exc.message) from exc
    headers = {}
    for header, variable in mapping.items():
        value = read_secret_env(variable, what=f"MCP server {server.name!r}")
        if value is None:
            raise McpRefused(
                f"MCP server {server.name!r}: environment variable {variable!r} "
                f"(header {header!r}) is not set"
            )
        headers[str(header)] = value
    return headers


def _argv(server: McpServer) -> list[str]:
    """The stdio command line, split like a shell would; ``McpRefused`` when stdio is off or
    there is no command."""
    if not app_settings().mcp_stdio_allowed:
        raise McpRefused(
            f"MCP server {server.name!r} uses stdio, which is off (AGENTRUNS['MCP_STDIO_ALLOWED'])"
        )
    try:
        argv = shlex.split(server.command)
    except ValueError as exc:
        raise McpRefused(f"MCP server {server.name!r}: its command cannot be split: {exc}") from exc
    if not argv:
        raise McpRefused(f"MCP server {server.name!r} has no command")
    return argv


def new_session(server: McpServer, timeout: float) -> RemoteSession:
    """An unopened session to ``server``. Every refusal (``McpRefused``: stdio off, no URL, a
    refused or missing secret) is raised here, before anything is started or sent."""
    if server.transport == McpTransport.STDIO:
        argv = _argv(server)
        process = StdioProcess()

        @asynccontextmanager
        async def stdio() -> AsyncIterator[Any]:
            from mcp import Client

            transport = stdio_transport(argv, process)
            async with Client(transport, read_timeout_seconds=timeout, cache=None) as client:
                yield client

        return RemoteSession(stdio, process=process)
    if server.transport != McpTransport.STREAMABLE_HTTP:
        raise McpRefused(
            f"MCP server {server.name!r} has an unknown transport {server.transport!r}"
        )
    if not server.url:
        raise McpRefused(f"MCP server {server.name!r} has no URL")
    headers = _headers(server)
    url = server.url
    mends = Mends()

    @asynccontextmanager
    async def http() -> AsyncIterator[Any]:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(timeout), transport=MendingTransport(mends)
        ) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, read_timeout_seconds=timeout, cache=None) as client:
                yield client

    return RemoteSession(http, mends=mends)


def session_key(server: McpServer, timeout: float) -> tuple[Any, ...]:
    """Which calls may share a session: the same server, reached the same way (an operator's
    edit of the row mid-segment opens a new session)."""
    headers = server.headers_env if isinstance(server.headers_env, dict) else {}
    return (
        server.name,
        server.transport,
        server.command,
        server.url,
        tuple(sorted((str(k), str(v)) for k, v in headers.items())),
        timeout,
    )


def _open(server: McpServer, timeout: float, deadline: float) -> tuple[RemoteSession, bool]:
    """The session for a call: the segment's (shared) or a fresh one the caller must close.
    Raises ``McpRefused`` or ``McpCallFailed``; nothing of the call was sent."""
    scope = current_scope()
    try:
        if scope is not None:
            shared = scope.session(
                session_key(server, timeout), lambda: new_session(server, timeout), deadline
            )
            return shared, False
        own = new_session(server, timeout)
        own.open(deadline)
        return own, True
    except ScopeClosed as exc:
        raise McpRefused(
            f"MCP server {server.name!r}: this segment's sessions are closed (it ended or lost "
            "its lease); nothing was sent"
        ) from exc
    except SessionOpenFailed as exc:
        raise McpCallFailed(
            f"MCP server {server.name!r} could not be started or initialized within "
            f"{timeout:g}s ({short(str(exc))}); nothing was sent{_stderr_note(exc.stderr)}"
        ) from exc


# --- Discovery -------------------------------------------------------------------------------


def list_remote_tools(server: McpServer, *, timeout: float | None = None) -> list[Any]:
    """The server's tools (``mcp_types.Tool``), every page, within ``timeout`` seconds in all
    (opening included). Raises ``McpRefused`` or ``McpCallFailed`` (with the server's stderr)."""
    limit = float(timeout if timeout is not None else server.timeout_seconds)
    deadline = time.monotonic() + limit
    session = new_session(server, limit)
    try:
        try:
            session.open(deadline)
        except SessionOpenFailed as exc:
            raise McpCallFailed(
                f"MCP server {server.name!r}: listing tools failed: {short(str(exc))}"
                f"{_stderr_note(exc.stderr)}"
            ) from exc

        async def listing(client: Any) -> list[Any]:
            tools: list[Any] = []
            cursor = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        try:
            return list(session.request(listing, deadline))
        except SessionTimedOut as exc:
            raise McpCallFailed(
                f"MCP server {server.name!r}: listing tools failed: no answer within "
                f"{limit:g}s{_stderr_note(session.stderr())}"
            ) from exc
        except (McpError, SessionOpenFailed) as exc:
            raise McpCallFailed(
                f"MCP server {server.name!r}: listing tools failed: {short(str(exc))}"
            ) from exc
        except Exception as exc:
            raise McpCallFailed(
                f"MCP server {server.name!r}: listing tools failed: {_describe(exc)}"
                f"{_stderr_note(session.stderr())}"
            ) from exc
    finally:
        session.close()


# --- Calling ---------------------------------------------------------------------------------


def _content(result: Any) -> dict[str, Any]:
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    returned: dict[str, Any] = {"content": blocks}
    if result.structured_content is not None:
        returned["structuredContent"] = result.structured_content
    return returned


def _error_text(result: Any) -> str:
    texts = [getattr(b, "text", "") for b in result.content if getattr(b, "type", "") == "text"]
    return short(" ".join(t for t in texts if t) or "the server reported an error")


def call_limit(server: McpServer, context: ToolContext) -> float:
    """The server's ``timeout_seconds``, capped by the call's."""
    limit = float(server.timeout_seconds)
    if context.timeout_seconds and context.timeout_seconds > 0:
        limit = min(limit, float(context.timeout_seconds))
    return limit


class _Handover:
    """Whether a call was handed to the SDK to be sent, settled once under a lock: the session's
    loop marks it sent just before the SDK may write it; a caller whose deadline passed first
    marks it abandoned, and the call then never starts. So "not sent" is never a guess."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "pending"

    def send(self) -> bool:
        """On the session's loop, before the call: ``False`` when the caller has given up."""
        with self._lock:
            if self._state == "pending":
                self._state = "sent"
            return self._state == "sent"

    def abandon(self) -> bool:
        """In the caller, once it stops waiting: whether the call had been handed over."""
        with self._lock:
            if self._state == "pending":
                self._state = "abandoned"
            return self._state == "sent"


def call_remote_tool(
    server: McpServer, tool_name: str, arguments: dict[str, Any], context: ToolContext
) -> dict[str, Any] | Mended:
    """Call one remote tool and return what the model sees; the idempotency key and fencing
    token travel in the request's ``_meta``. Raises ``McpRefused`` or ``McpCallFailed`` (nothing
    was sent), ``McpToolError`` (the server answered with an error) or ``OutcomeUnknown`` (sent,
    then no answer in time or the connection lost). An answer that held lone surrogates'
    escapes, read as U+FFFD (``mcp_wire``), comes back as ``Mended`` marked ``text``."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, PARSE_ERROR, REQUEST_TIMEOUT

    limit = call_limit(server, context)
    deadline = time.monotonic() + limit
    meta = {
        "idempotency_key": context.idempotency_key,
        "fencing_token": context.fencing_token,
        "run_uuid": str(context.run_uuid),
        "call_id": context.call_id,
    }
    where = f"MCP server {server.name!r}, tool {tool_name!r}"
    unknown = "; whether it took effect is unknown"
    session, owned = _open(server, limit, deadline)
    mended_before = session.mends.count if session.mends is not None else 0
    handover = _Handover()

    async def call(client: Any) -> Any:
        if not handover.send():
            raise SessionTimedOut()  # the caller has already answered "nothing was sent"
        # The SDK's own timer is a backstop behind the deadline the caller waits on.
        remaining = max(0.05, deadline - time.monotonic()) + ABORT_SECONDS
        return await client.call_tool(
            tool_name, arguments, read_timeout_seconds=remaining, meta=meta
        )

    def timed_out() -> OutcomeUnknown:
        return OutcomeUnknown(
            f"{where}: the call was sent and no answer came within {limit:g}s{unknown}"
            f"{_stderr_note(session.stderr())}"
        )

    try:
        result = session.request(call, deadline)
    except SessionTimedOut as exc:
        if not handover.abandon():
            raise McpCallFailed(
                f"{where}: the time ({limit:g}s) ran out before the call was sent; nothing was "
                f"sent{_stderr_note(session.stderr())}"
            ) from exc
        raise timed_out() from exc
    except SessionOpenFailed as exc:  # it died between the look and the send: nothing sent
        raise McpCallFailed(f"{where}: the session ended before the call was sent") from exc
    except MCPError as exc:
        if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
            session.abort()
            if time.monotonic() >= deadline:  # another clock noticed the deadline first
                raise timed_out() from exc
            raise OutcomeUnknown(
                f"{where}: the call was sent and then {short(exc.message)}{unknown}"
                f"{_stderr_note(session.stderr())}"
            ) from exc
        if exc.code == PARSE_ERROR and exc.message.startswith(UNREADABLE_ANSWER):
            # The SDK's own stand-in for an answer it could not read (not JSON, or JSON text
            # its parser refuses, such as a lone surrogate's escape): the server did answer,
            # but whether with a result or an error is unknown.
            raise OutcomeUnknown(
                f"{where}: the call was sent and the server answered, but its answer could not "
                f"be read ({short(exc.message)}){unknown}"
            ) from exc
        raise McpToolError(f"{where}: the server refused the call: {short(exc.message)}") from exc
    except Exception as exc:
        session.abort()
        if time.monotonic() >= deadline:  # e.g. the HTTP client's read timeout
            raise timed_out() from exc
        raise OutcomeUnknown(
            f"{where}: the call was sent and then failed ({_describe(exc)}){unknown}"
            f"{_stderr_note(session.stderr())}"
        ) from exc
    finally:
        if owned:
            session.close()
    if result.is_error:
        raise McpToolError(f"MCP tool {tool_name!r} reported an error: {_error_text(result)}")
    if session.mends is not None and session.mends.count != mended_before:
        return Mended(_content(result), (TEXT,))
    return _content(result)


__all__ = [
    "MAX_LIST_PAGES",
    "MAX_MESSAGE_CHARS",
    "call_limit",
    "call_remote_tool",
    "list_remote_tools",
    "new_session",
    "session_key",
]
