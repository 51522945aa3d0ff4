"""Remote tools over MCP: discovery, the registry resolver and the call (docs/design.md §4.5).

Owns how an operator-registered ``McpServer`` is reached with the official ``mcp`` SDK (2.x),
how its tools are named in the registry (``mcp__<server>__<tool>``) and what a call returns.
Every remote tool is a ``non_idempotent_write`` whatever the server says about it: its hints
(``readOnlyHint`` and friends) are kept for staff to read and decide nothing. Whether a call
waits for approval is the server row's ``approval_required`` (fail closed).

It must never stamp, check or clear a lease or a fence: the runtime's before-tool hook does that
before ``Tool.func`` is called. It writes no rows: ``agentruns.services.mcp_sync`` stores what
discovery (``list_remote_tools``, ``build_snapshot``) finds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import shlex
import threading
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from agentruns import conf
from agentruns.exceptions import SecretEnvRefused
from agentruns.models import Effect, McpServer, McpTransport
from agentruns.secrets import check_secret_env, read_secret_env
from agentruns.tools.registry import (
    TOOL_NAME_RE,
    Tool,
    ToolContext,
    ToolDefinitionError,
    check_tool,
    registry,
)
from agentruns.turns import Change, Preview

logger = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "mcp__"
SEPARATOR = "__"
MAX_TOOL_NAME = 64
MAX_LIST_PAGES = 50
MAX_MESSAGE_CHARS = 500
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class McpError(Exception):
    """A remote tool could not be listed or called. The message is shown to the model."""


class McpRefused(McpError):
    """The server's configuration forbids the call (disabled, stdio off, a missing secret)."""


class McpCallFailed(McpError):
    """The server could not be reached, broke the protocol or did not answer in time."""


class McpToolError(McpError):
    """The server answered the call with ``isError``."""


# --- Names ---------------------------------------------------------------------------------


def registered_name(server_name: str, tool_name: str, *, taken: Collection[str] = ()) -> str:
    """``mcp__<server>__<tool>``: only letters, digits, ``_`` and ``-``, at most 64 characters.

    Unsafe characters become ``_``; a tool part that had to change (sanitised or truncated) or
    that collides with a name in ``taken`` gets an 8-hex suffix of its original name, so two
    remote tools never share a registered name.
    """
    head = f"{PREFIX}{server_name}{SEPARATOR}"
    cleaned = _UNSAFE.sub("_", tool_name) or "_"
    candidate = head + cleaned
    if cleaned == tool_name and len(candidate) <= MAX_TOOL_NAME and candidate not in taken:
        return candidate
    digest = hashlib.sha256(tool_name.encode()).hexdigest()
    for length in (8, 12, 16, 64):
        suffix = "-" + digest[:length]
        room = MAX_TOOL_NAME - len(head) - len(suffix)
        candidate = head + cleaned[: max(room, 0)] + suffix
        candidate = candidate[:MAX_TOOL_NAME]
        if candidate not in taken:
            return candidate
    raise ToolDefinitionError(f"cannot name remote tool {tool_name!r} of {server_name!r}")


def server_name_of(name: str) -> str | None:
    """The server part of a registered remote tool name, or None when it is not one."""
    if not name.startswith(PREFIX):
        return None
    server, sep, rest = name[len(PREFIX) :].partition(SEPARATOR)
    return server if sep and server and rest else None


# --- Bridging the async SDK into a synchronous caller ---------------------------------------


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion in a fresh event loop, from synchronous code.

    The runtime calls tools synchronously (a worker thread or a web request). When the calling
    thread already runs a loop (an async view), the coroutine runs in a helper thread instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(make())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    helper = threading.Thread(target=target, name="mcp-call", daemon=True)
    helper.start()
    helper.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups from anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _describe(exc: BaseException, *, timeout: float) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, TimeoutError):
        return f"no answer within {timeout:g}s"
    text = str(leaf) or type(leaf).__name__
    return _short(f"{type(leaf).__name__}: {text}")


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


def _check_callable(server: McpServer) -> None:
    if server.transport == McpTransport.STREAMABLE_HTTP:
        if not server.url:
            raise McpRefused(f"MCP server {server.name!r} has no URL")
        return
    if server.transport == McpTransport.STDIO:
        if not conf.get("MCP_STDIO_ALLOWED"):
            raise McpRefused(
                f"MCP server {server.name!r} uses stdio, which is off "
                "(AGENTRUNS['MCP_STDIO_ALLOWED'])"
            )
        if not server.command.strip():
            raise McpRefused(f"MCP server {server.name!r} has no command")
        return
    raise McpRefused(f"MCP server {server.name!r} has an unknown transport {server.transport!r}")


def _connector(server: McpServer, timeout: float) -> Callable[[], Any]:
    """A factory of an async context manager yielding an entered ``mcp.Client``.

    Every refusal (``McpRefused``: stdio off, no URL, a missing secret) is raised here, before
    anything is started or sent; the client itself is built inside the event loop.
    """
    _check_callable(server)
    if server.transport == McpTransport.STDIO:
        argv = shlex.split(server.command)
        if not argv:
            raise McpRefused(f"MCP server {server.name!r} has no command")

        @asynccontextmanager
        async def stdio() -> AsyncIterator[Any]:
            from mcp import Client, StdioServerParameters

            params = StdioServerParameters(command=argv[0], args=argv[1:])
            async with Client(params, read_timeout_seconds=timeout, cache=None) as client:
                yield client

        return stdio
    headers = _headers(server)
    url = server.url

    @asynccontextmanager
    async def http() -> AsyncIterator[Any]:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout)) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, read_timeout_seconds=timeout, cache=None) as client:
                yield client

    return http


# --- Discovery -------------------------------------------------------------------------------


def list_remote_tools(server: McpServer, *, timeout: float | None = None) -> list[Any]:
    """The server's tools (``mcp_types.Tool``), every page, within ``timeout`` seconds in all.

    Raises ``McpRefused`` (configuration) or ``McpCallFailed`` (unreachable, protocol, timeout).
    """
    import anyio

    limit = float(timeout if timeout is not None else server.timeout_seconds)
    connect = _connector(server, limit)

    async def listing() -> list[Any]:
        tools: list[Any] = []
        with anyio.fail_after(limit):
            async with connect() as session:
                cursor = None
                for _ in range(MAX_LIST_PAGES):
                    page = await session.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        return tools

    try:
        return _run_sync(listing)
    except McpError:
        raise
    except Exception as exc:
        raise McpCallFailed(
            f"MCP server {server.name!r}: listing tools failed: {_describe(exc, timeout=limit)}"
        ) from exc


def _hints(remote: Any) -> dict[str, Any]:
    annotations = getattr(remote, "annotations", None)
    if annotations is None:
        return {}
    return annotations.model_dump(mode="json", by_alias=True, exclude_none=True)


def build_snapshot(server_name: str, remote_tools: list[Any]) -> list[dict[str, Any]]:
    """What ``tools_snapshot`` stores for each remote tool; a tool the registry would refuse
    (a schema that is not an object schema, or one that refers outside itself: nothing is
    fetched) is kept with its ``problem`` and never offered."""
    taken: set[str] = set()
    snapshot = []
    for remote in remote_tools:
        name = registered_name(server_name, remote.name, taken=taken)
        taken.add(name)
        entry = {
            "name": remote.name,
            "registered_name": name,
            "title": getattr(remote, "title", None) or "",
            "description": remote.description or "",
            "input_schema": remote.input_schema,
            "hints": _hints(remote),
            "problem": "",
        }
        try:
            check_tool(_tool(server_name, entry, approval_required=True))
        except ToolDefinitionError as exc:
            entry["problem"] = _short(str(exc))
        snapshot.append(entry)
    return snapshot


# --- Calling ---------------------------------------------------------------------------------


def _content(result: Any) -> dict[str, Any]:
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    returned: dict[str, Any] = {"content": blocks}
    if result.structured_content is not None:
        returned["structuredContent"] = result.structured_content
    return returned


def _error_text(result: Any) -> str:
    texts = [getattr(b, "text", "") for b in result.content if getattr(b, "type", "") == "text"]
    return _short(" ".join(t for t in texts if t) or "the server reported an error")


def call_remote_tool(
    server: McpServer, tool_name: str, arguments: dict[str, Any], context: ToolContext
) -> dict[str, Any]:
    """Call one remote tool through the SDK's client session and return what the model sees.

    The timeout is the server's, capped by the call's (``AGENTRUNS["TOOL_TIMEOUT_SECONDS"]``)
    and covers connecting too. The idempotency key and fencing token travel in the request's
    ``_meta``. Raises ``McpRefused`` before anything is sent, ``McpCallFailed`` (unreachable,
    protocol error, timeout: the call may have landed) or ``McpToolError`` (``isError``).
    """
    import anyio

    limit = float(server.timeout_seconds)
    if context.timeout_seconds and context.timeout_seconds > 0:
        limit = min(limit, float(context.timeout_seconds))
    connect = _connector(server, limit)
    meta = {
        "idempotency_key": context.idempotency_key,
        "fencing_token": context.fencing_token,
        "run_uuid": str(context.run_uuid),
        "call_id": context.call_id,
    }

    async def call() -> Any:
        with anyio.fail_after(limit):
            async with connect() as session:
                return await session.call_tool(
                    tool_name, arguments, read_timeout_seconds=limit, meta=meta
                )

    try:
        result = _run_sync(call)
    except McpError:
        raise
    except Exception as exc:
        raise McpCallFailed(
            f"MCP server {server.name!r}, tool {tool_name!r}: {_describe(exc, timeout=limit)}"
        ) from exc
    if result.is_error:
        raise McpToolError(f"MCP tool {tool_name!r} reported an error: {_error_text(result)}")
    return _content(result)


@dataclass(frozen=True)
class RemoteCall:
    """``Tool.func`` of a remote tool: re-reads its server at call time (identity over
    snapshot), refuses a disabled or misconfigured server, then calls."""

    server_name: str
    tool_name: str

    def __call__(self, context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
        server = McpServer.objects.filter(name=self.server_name).first()
        if server is None or not server.enabled:
            raise McpRefused(f"MCP server {self.server_name!r} is not enabled")
        return call_remote_tool(server, self.tool_name, arguments, context)


@dataclass(frozen=True)
class RemotePreview:
    """``Tool.preview`` of a remote tool: what Leasehold knows without calling it — the server
    and the tool, and the hints the server declares about it, marked as unverified."""

    server_name: str
    tool_name: str
    hints: tuple[tuple[str, Any], ...] = ()

    def __call__(self, context: ToolContext, arguments: dict[str, Any]) -> Preview:
        server = McpServer.objects.filter(name=self.server_name).first()
        where = f"{server.transport}: {server.url or server.command}" if server else "not found"
        return Preview(
            summary=f"calls {self.tool_name!r} on MCP server {self.server_name!r} ({where}); "
            "what it changes is up to the server",
            target=f"mcp:{self.server_name}/{self.tool_name}",
            changes=tuple(
                Change(field=f"{hint} (declared by the server, not verified)", after=value)
                for hint, value in self.hints
            ),
        )


# --- The registry resolver -------------------------------------------------------------------


def _tool(server_name: str, entry: dict[str, Any], *, approval_required: bool) -> Tool:
    description = (entry.get("description") or "").strip() or (
        f"Remote tool {entry.get('name')!r} of MCP server {server_name!r}."
    )
    return Tool(
        name=entry["registered_name"],
        description=description,
        parameters=entry.get("input_schema") or {"type": "object", "properties": {}},
        # Always: a body we cannot inspect. The server's hints never relabel it.
        effect=Effect.NON_IDEMPOTENT_WRITE,
        func=RemoteCall(server_name, entry["name"]),
        requires_approval=approval_required,
        source="mcp",
        hints=dict(entry.get("hints") or {}),
        preview=RemotePreview(
            server_name, entry["name"], tuple(sorted((entry.get("hints") or {}).items()))
        ),
    )


def _allowed(server: McpServer, entry: dict[str, Any]) -> bool:
    allowed = server.allowed_tools
    if allowed in (None, [], ""):
        return True
    if not isinstance(allowed, list):
        return False  # a malformed allow-list allows nothing
    return entry.get("name") in allowed or entry.get("registered_name") in allowed


def server_tools(server: McpServer) -> list[Tool]:
    """The registry tools of one server: its allowed, valid snapshot entries."""
    if not server.enabled or not isinstance(server.tools_snapshot, list):
        return []
    tools = []
    for entry in server.tools_snapshot:
        if not isinstance(entry, dict) or entry.get("problem"):
            continue
        name = entry.get("registered_name")
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
            continue
        if _allowed(server, entry):
            tools.append(_tool(server.name, entry, approval_required=server.approval_required))
    return tools


def resolve(name: str) -> Tool | None:
    """The registry resolver: the remote tool registered as ``name``, read from the database
    on every lookup (a changed approval switch counts at once), or None."""
    server_name = server_name_of(name)
    if server_name is None:
        return None
    server = McpServer.objects.filter(name=server_name, enabled=True).first()
    if server is None:
        return None
    for found in server_tools(server):
        if found.name == name:
            return found
    return None


def list_tools() -> list[Tool]:
    """Every remote tool of every enabled server (for ``registry.all()``)."""
    tools: list[Tool] = []
    for server in McpServer.objects.filter(enabled=True):
        tools.extend(server_tools(server))
    return tools


def install() -> None:
    """Add the resolver to the tool registry (idempotent; ``AgentrunsConfig.ready`` calls it)."""
    registry.add_resolver(resolve, list_tools=list_tools)
