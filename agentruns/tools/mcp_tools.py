"""Remote tools over MCP: the snapshot, the registry resolver and the tools' call and preview
(docs/design.md §4.5).

Owns how an operator-registered ``McpServer``'s tools are named in the registry
(``mcp__<server>__<tool>``) and what they are. Every remote tool is a ``non_idempotent_write``
whatever the server says about it, unless the operator lists it in the row's ``read_only_tools``
(then a read: no approval, no fence): the server's hints (``readOnlyHint`` and friends) are kept
for staff to read and decide nothing. Whether a write waits for approval is the server row's
``approval_required`` (fail closed). Reaching the server is ``agentruns.tools.mcp_client``.

It must never stamp, check or clear a lease or a fence: the runtime's before-tool hook does that
before ``Tool.func`` is called. It writes no rows: ``agentruns.services.mcp_sync`` stores what
discovery (``list_remote_tools``, ``build_snapshot``) finds.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agentruns.models import Effect, McpServer
from agentruns.tools.mcp_client import call_remote_tool, list_remote_tools
from agentruns.tools.mcp_errors import (
    McpCallFailed,
    McpError,
    McpRefused,
    McpToolError,
    short,
)
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

__all__ = [
    "McpCallFailed",
    "McpError",
    "McpRefused",
    "McpToolError",
    "build_snapshot",
    "call_remote_tool",
    "list_remote_tools",
    "registered_name",
    "server_name_of",
]

PREFIX = "mcp__"
SEPARATOR = "__"
MAX_TOOL_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


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


# --- Discovery -------------------------------------------------------------------------------


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
            entry["problem"] = short(str(exc))
        snapshot.append(entry)
    return snapshot


@dataclass(frozen=True)
class RemoteCall:
    """``Tool.func`` of a remote tool: re-reads its server at call time (identity over
    snapshot), refuses a disabled or misconfigured server, then calls."""

    server_name: str
    tool_name: str

    def __call__(self, context: ToolContext, arguments: dict[str, Any]) -> Any:
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


def _tool(
    server_name: str, entry: dict[str, Any], *, approval_required: bool, read_only: bool = False
) -> Tool:
    description = (entry.get("description") or "").strip() or (
        f"Remote tool {entry.get('name')!r} of MCP server {server_name!r}."
    )
    return Tool(
        name=entry["registered_name"],
        description=description,
        parameters=entry.get("input_schema") or {"type": "object", "properties": {}},
        # A body we cannot inspect is a non-idempotent write, unless the operator listed the tool
        # as read-only on its server row. The server's hints never relabel it.
        effect=Effect.READ if read_only else Effect.NON_IDEMPOTENT_WRITE,
        func=RemoteCall(server_name, entry["name"]),
        requires_approval=False if read_only else approval_required,
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
    return _listed(allowed, entry)  # a malformed allow-list allows nothing


def _listed(names: object, entry: dict[str, Any]) -> bool:
    if not isinstance(names, list):
        return False  # a malformed list names nothing
    return entry.get("name") in names or entry.get("registered_name") in names


def read_only_by_operator(server: McpServer, entry: dict[str, Any]) -> bool:
    """Whether the operator declared this tool read-only on its server row
    (``read_only_tools``, by remote or registered name). Never the server's hints."""
    return _listed(server.read_only_tools, entry)


def server_tools(server: McpServer) -> list[Tool]:
    """The registry tools of one server: its allowed, valid snapshot entries; those the operator
    lists in ``read_only_tools`` are reads (no approval, no fence), every other one a
    non-idempotent write."""
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
            tools.append(
                _tool(
                    server.name,
                    entry,
                    approval_required=server.approval_required,
                    read_only=read_only_by_operator(server, entry),
                )
            )
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
