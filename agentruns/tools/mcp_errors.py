"""The refusals and failures of remote (MCP) tools: every one is a definite answer the model reads
(``RemoteToolError``: logged as a one-line warning, not a traceback). A call whose outcome is not
known raises ``agentruns.tools.registry.OutcomeUnknown`` instead."""

from __future__ import annotations

from agentruns.tools.registry import RemoteToolError

MAX_MESSAGE_CHARS = 500


class McpError(RemoteToolError):
    """A remote tool could not be listed or called. The message is shown to the model."""


class McpRefused(McpError):
    """The server's configuration forbids the call (disabled, stdio off, a missing secret)."""


class McpCallFailed(McpError):
    """The server could not be started, reached or initialized: nothing of the call was sent."""


class McpToolError(McpError):
    """The server answered the call with ``isError`` or a JSON-RPC error."""


def short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
