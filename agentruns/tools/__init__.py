"""Tools: the registry where code declares each tool's effect, and the context a call receives.

The effect is code, not configuration: an administrator cannot relabel a write. Running a tool
goes through ``agentruns.services.runtime`` (the fence hook is always installed there); nothing
here stamps or checks a lease.
"""

from agentruns.tools.invocation import ToolResult, invoke_tool, overlay_input, validate_input
from agentruns.tools.registry import (
    CheckAnswer,
    CheckContext,
    OutcomeUnknown,
    RemoteToolError,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolRefused,
    ToolRegistry,
    registry,
    tool,
)

__all__ = [
    "CheckAnswer",
    "CheckContext",
    "OutcomeUnknown",
    "RemoteToolError",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolRefused",
    "ToolRegistry",
    "ToolResult",
    "invoke_tool",
    "overlay_input",
    "registry",
    "tool",
    "validate_input",
]
