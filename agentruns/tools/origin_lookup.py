"""Where a tool comes from, as staff are shown it (docs/design.md §4.5, §5.1): its description,
its source and, for a remote tool, its MCP server (name, transport, the command or URL) and the
hints the server declares — which are *declared by the server, not verified* and decide nothing.

One reader for every interface: the approval and reconciliation cards, the playground and the
API's pending turn. It reads the registry and the server row now (identity over snapshot: a call
re-reads its server when it runs, so this is where it would go). Read-only; remote text is
bounded here and escaped by the templates.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from agentruns.models import McpServer, McpTransport
from agentruns.tools.mcp_tools import read_only_by_operator, server_name_of
from agentruns.tools.registry import registry
from agentruns.turns.origins import HINTS_NOTE, ServerOrigin, ToolOrigin

MAX_DESCRIPTION_CHARS = 1000
MAX_HINTS = 12
MAX_HINT_CHARS = 120


__all__ = ["HINTS_NOTE", "ServerOrigin", "ToolOrigin", "tool_origin"]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _hints(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    items = sorted(raw.items(), key=lambda item: str(item[0]))[:MAX_HINTS]
    return {_cut(str(k), MAX_HINT_CHARS): _cut(str(v), MAX_HINT_CHARS) for k, v in items}


def _server(row: McpServer) -> ServerOrigin:
    endpoint = row.command if row.transport == McpTransport.STDIO else _without_userinfo(row.url)
    return ServerOrigin(
        name=row.name,
        transport=str(row.transport),
        endpoint=_cut(endpoint, 500),
        enabled=row.enabled,
    )


def tool_origin(name: str) -> ToolOrigin:
    """Where the tool registered as ``name`` comes from, read now."""
    server_name = server_name_of(name)
    if server_name is not None:
        row = McpServer.objects.filter(name=server_name).first()
        if row is not None:
            entries = row.tools_snapshot if isinstance(row.tools_snapshot, list) else []
            entry = next(
                (e for e in entries if isinstance(e, dict) and e.get("registered_name") == name),
                None,
            )
            if entry is not None:
                return ToolOrigin(
                    description=_cut(str(entry.get("description") or ""), MAX_DESCRIPTION_CHARS),
                    source="mcp",
                    server=_server(row),
                    hints=_hints(entry.get("hints")),
                    read_only_by_operator=read_only_by_operator(row, entry),
                )
            return ToolOrigin(description="", source="unknown", server=_server(row))
    found = registry.get(name)
    if found is None:
        return ToolOrigin(description="", source="unknown")
    return ToolOrigin(
        description=_cut(found.description, MAX_DESCRIPTION_CHARS),
        source=found.source,
        hints=_hints(found.hints) if found.source == "mcp" else {},
    )
