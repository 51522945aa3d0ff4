"""Discover the tools of MCP servers and store them (``python manage.py sync_mcp_tools``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns.services.mcp_sync import mcp_server_sync, servers_to_sync


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
            result = mcp_server_sync(server=server)
            if not result.ok:
                failed += 1
                self.stderr.write(f"{result.server_name}: FAILED: {result.error}")
                continue
            tools = f"{len(result.snapshot)} tools ({', '.join(result.usable)})"
            self.stdout.write(f"{result.server_name}: {tools}")
            for name, problem in result.skipped:
                self.stdout.write(f"  skipped {name!r}: {problem}")
        self.stdout.write(f"synced {len(servers) - failed} of {len(servers)} servers")
        if failed:
            raise CommandError(f"{failed} server(s) could not be synced")
