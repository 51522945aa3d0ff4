"""Where a call's tool comes from, as a card shows it: its description, source, MCP server and
the hints the server declares (``agentruns.tools.origin_lookup`` reads it from the registry and the
server row). A value of the turn a person decides on: the digest covers it, so it is parsed and
serialised here like the rest of a stored call. Free of queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentruns.turns.calls import Unreadable

HINTS_NOTE = "declared by the server, not verified"


@dataclass(frozen=True)
class ServerOrigin:
    name: str
    transport: str
    endpoint: str  # the command (stdio) or the URL (without credentials)
    enabled: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "endpoint": self.endpoint,
            "enabled": self.enabled,
        }

    @classmethod
    def parse(cls, raw: object, *, where: str) -> ServerOrigin:
        if not isinstance(raw, dict):
            raise Unreadable(f"{where} is not an object")
        name, transport, endpoint = raw.get("name"), raw.get("transport"), raw.get("endpoint")
        enabled = raw.get("enabled", True)
        if not all(isinstance(v, str) for v in (name, transport, endpoint)):
            raise Unreadable(f"{where} has no name, transport or endpoint")
        if not isinstance(enabled, bool):
            raise Unreadable(f"{where}'s enabled is not true or false")
        return cls(
            name=str(name), transport=str(transport), endpoint=str(endpoint), enabled=enabled
        )


@dataclass(frozen=True)
class ToolOrigin:
    """``source``: ``local``, ``mcp`` or ``unknown`` (no such tool is registered now)."""

    description: str
    source: str
    server: ServerOrigin | None = None
    hints: dict[str, str] = field(default_factory=dict)
    read_only_by_operator: bool = False

    @property
    def hints_note(self) -> str:
        return HINTS_NOTE if self.hints else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "source": self.source,
            "server": self.server.to_json() if self.server is not None else None,
            "hints": dict(self.hints),
            "hints_note": self.hints_note,
            "read_only_by_operator": self.read_only_by_operator,
        }

    @classmethod
    def parse(cls, raw: object, *, where: str) -> ToolOrigin:
        """A stored origin; ``Unreadable`` unless every field has its type."""
        if not isinstance(raw, dict):
            raise Unreadable(f"{where} is not an object")
        description, source, hints = raw.get("description"), raw.get("source"), raw.get("hints")
        read_only = raw.get("read_only_by_operator", False)
        if not isinstance(description, str) or not isinstance(source, str):
            raise Unreadable(f"{where} has no description or source")
        if not isinstance(hints, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in hints.items()
        ):
            raise Unreadable(f"{where}'s hints are not text")
        if not isinstance(read_only, bool):
            raise Unreadable(f"{where}'s read_only_by_operator is not true or false")
        server = raw.get("server")
        return cls(
            description=description,
            source=source,
            server=ServerOrigin.parse(server, where=f"{where}'s server")
            if server is not None
            else None,
            hints=dict(hints),
            read_only_by_operator=read_only,
        )
