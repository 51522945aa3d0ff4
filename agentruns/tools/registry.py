"""CONTRACT STUB — to be completed by the tools work. Keep these names and signatures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from agentruns.models import Effect


@dataclass(frozen=True)
class ToolContext:
    """What a tool call receives beside its arguments (RUNS.md §5)."""

    run_uuid: UUID
    call_id: str
    initiator_id: int | None
    fencing_token: int  # the run's lease_epoch at the time of the call
    timeout_seconds: float

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_uuid}:{self.call_id}"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments
    effect: Effect
    func: Callable[[ToolContext, dict[str, Any]], Any]
    input_schema: dict[str, Any] | None = None  # typed values a human supplies (reads only)
    # None: decided by the effect (writes need approval). Remote tools set it from their server.
    requires_approval: bool | None = None
    source: str = "local"  # "local" or "mcp"
    hints: dict[str, Any] = field(default_factory=dict)  # shown to staff, never decide anything

    @property
    def needs_approval(self) -> bool: ...

    def openai_schema(self) -> dict[str, Any]:
        """{"type": "function", "function": {"name", "description", "parameters"}}"""
        ...


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: Any  # JSON-serialisable; what the model sees
    error: str = ""

    def as_message_content(self) -> str: ...


class ToolRegistry:
    def register(self, tool: Tool) -> Tool: ...
    def get(self, name: str) -> Tool | None: ...
    def all(self) -> list[Tool]: ...
    def effect_of(self, name: str) -> Effect:
        """Unknown names resolve to non_idempotent_write (fail closed)."""
        ...


registry = ToolRegistry()


def tool(
    *,
    name: str,
    description: str,
    effect: Effect,
    parameters: dict[str, Any] | None = None,
    input_schema: dict[str, Any] | None = None,
) -> Callable[[Callable[[ToolContext, dict[str, Any]], Any]], Tool]: ...


def invoke_tool(tool: Tool, arguments: Any, context: ToolContext) -> ToolResult:
    """Validate arguments (jsonschema) and call; invalid arguments or a raise → error result."""
    ...
