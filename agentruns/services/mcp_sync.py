"""MCP discovery as a service: list an ``McpServer``'s tools and store them on its row."""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now

from agentruns.models import McpServer
from agentruns.tools.mcp import McpError, build_snapshot, list_remote_tools


def mcp_server_sync_tools(*, server: McpServer) -> list[dict[str, Any]]:
    """List the server's tools and store them (``tools_snapshot``, ``last_synced_at``).

    On failure the error is stored in ``last_sync_error`` (the snapshot is kept) and the
    ``McpError`` is raised. Returns the new snapshot.
    """
    try:
        snapshot = build_snapshot(server.name, list_remote_tools(server))
    except McpError as exc:
        McpServer.objects.filter(pk=server.pk).update(last_sync_error=str(exc), updated_at=Now())
        server.refresh_from_db(fields=["last_sync_error", "updated_at"])
        raise
    McpServer.objects.filter(pk=server.pk).update(
        tools_snapshot=snapshot, last_synced_at=Now(), last_sync_error="", updated_at=Now()
    )
    server.refresh_from_db(fields=["tools_snapshot", "last_synced_at", "last_sync_error"])
    return snapshot


def servers_to_sync(*, name: str | None = None) -> list[McpServer]:
    """The servers ``sync_mcp_tools`` visits: the named one (enabled or not), else every
    enabled server."""
    if name:
        return list(McpServer.objects.filter(name=name))
    return list(McpServer.objects.filter(enabled=True))
