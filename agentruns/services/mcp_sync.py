"""MCP discovery as a service: list an ``McpServer``'s tools and store them on its row.

Owns the writes of the discovery columns (``tools_snapshot``, ``last_synced_at``,
``last_sync_error``); ``agentruns.tools.mcp_client`` reaches the server (a failure carries a
stdio server's last stderr lines) and ``agentruns.tools.mcp_tools`` builds the snapshot. The
``sync_mcp_tools`` command and the admin's "Sync tools" action call ``mcp_server_sync`` and
render its ``McpSyncResult``. It never touches a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models.functions import Now

from agentruns.models import McpServer
from agentruns.tools.mcp_tools import McpError, build_snapshot, list_remote_tools


@dataclass(frozen=True)
class McpSyncResult:
    """One sync of one server: the tools it discovered, or why the listing failed.

    ``snapshot`` is what was stored in ``tools_snapshot`` (empty when the sync failed: the
    previous snapshot is then kept). ``error`` is ``""`` on success, else the stored
    ``last_sync_error``.
    """

    server_name: str
    snapshot: list[dict[str, Any]]
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def usable(self) -> list[str]:
        """The registered names of the tools the registry accepts."""
        return [entry["registered_name"] for entry in self.snapshot if not entry["problem"]]

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """``(remote name, problem)`` of every tool kept in the snapshot but not registered."""
        return [(entry["name"], entry["problem"]) for entry in self.snapshot if entry["problem"]]


def mcp_server_sync(*, server: McpServer) -> McpSyncResult:
    """List the server's tools (every page, within its ``timeout_seconds``) and store them.

    On success ``tools_snapshot`` is replaced, ``last_synced_at`` set and ``last_sync_error``
    cleared. On any ``McpError`` (a configuration refusal: disabled stdio, no URL, a missing
    secret; or the server unreachable, broken or slow) only ``last_sync_error`` is written and
    the failed result returned: a failure is a recorded outcome, never raised. ``server`` is
    refreshed from the columns written.
    """
    try:
        snapshot = build_snapshot(server.name, list_remote_tools(server))
    except McpError as exc:
        McpServer.objects.filter(pk=server.pk).update(last_sync_error=str(exc), updated_at=Now())
        server.refresh_from_db(fields=["last_sync_error", "updated_at"])
        return McpSyncResult(server_name=server.name, snapshot=[], error=str(exc))
    McpServer.objects.filter(pk=server.pk).update(
        tools_snapshot=snapshot, last_synced_at=Now(), last_sync_error="", updated_at=Now()
    )
    server.refresh_from_db(fields=["tools_snapshot", "last_synced_at", "last_sync_error"])
    return McpSyncResult(server_name=server.name, snapshot=snapshot)


def servers_to_sync(*, name: str | None = None) -> list[McpServer]:
    """The servers ``sync_mcp_tools`` visits: the named one (enabled or not), else every
    enabled server."""
    if name:
        return list(McpServer.objects.filter(name=name))
    return list(McpServer.objects.filter(enabled=True))
