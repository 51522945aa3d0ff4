"""Discover the tools of MCP servers and store them (``python manage.py sync_mcp_tools``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns.services.mcp_sync import mcp_server_sync_tools, servers_to_sync
from agentruns.tools.mcp import McpError


class Command(BaseCommand):
    help = (
        "List the tools of every enabled MCP server (or --server NAME, enabled or not) with the "
        "mcp SDK and store them; they appear in the tool registry as mcp__<server>__<tool>."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--server", help="sync only this server (by name)")

    def handle(self, *args: Any, **options: Any) -> None:
        servers = servers_to_sync(name=options.get("server"))
        if options.get("server") and not servers:
            raise CommandError(f"no MCP server named {options['server']!r}")
        failed = 0
        for server in servers:
            try:
                snapshot = mcp_server_sync_tools(server=server)
            except McpError as exc:
                failed += 1
                self.stderr.write(f"{server.name}: FAILED: {exc}")
                continue
            usable = [e["registered_name"] for e in snapshot if not e["problem"]]
            self.stdout.write(f"{server.name}: {len(snapshot)} tools ({', '.join(usable)})")
            for entry in snapshot:
                if entry["problem"]:
                    self.stdout.write(f"  skipped {entry['name']!r}: {entry['problem']}")
        self.stdout.write(f"synced {len(servers) - failed} of {len(servers)} servers")
        if failed:
            raise CommandError(f"{failed} server(s) could not be synced")
