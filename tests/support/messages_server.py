"""A real local HTTP server speaking Anthropic's Messages API, for the ``anthropic`` provider's
tests: the sibling of ``chat_server`` (same queue, recording, delays and raw bodies).

``MessagesServer`` answers ``POST <base>/v1/messages`` from a FIFO queue. Before it reads the
queue it refuses (400, ``invalid_request_error``) a request the API would refuse, checked against
the SDK's own request types (``anthropic.types``: each block's required and known keys) and the
API's rules: the version header and a key; ``model``, ``max_tokens`` and ``messages``; roles
alternating from ``user``; no empty content; every ``tool_use`` answered by a ``tool_result``
first in the next message and every result answering one; tool ids of letters, digits, ``_``
and ``-``; tools defined whenever the dialogue holds tool blocks. What it answers is built by
``message`` and validated by the SDK's ``Message`` model, so the server says only what the SDK's
types define; ``raw_message`` writes hostile bodies from raw JSON fragments, untouched. Errors
use the API's shape (``{"type": "error", "error": {"type", "message"}}``; 529 ``overloaded``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typing_extensions
from anthropic import types as sdk

from tests.support.chat_server import ChatServer, ScriptedResponse
from tests.support.sse import message_frames

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_ID = re.compile(r"[A-Za-z0-9_-]+")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _keys(typed: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The required and all the keys of one of the SDK's request ``TypedDict``s."""
    hints = typing_extensions.get_type_hints(typed, include_extras=True)
    required = {
        key
        for key, hint in hints.items()
        if typing_extensions.get_origin(hint) is typing_extensions.Required
    }
    return frozenset(required), frozenset(hints)


# The request blocks Leasehold sends, by type: the keys of the SDK's TypedDict for each.
_BLOCK_TYPES = {
    "text": _keys(sdk.TextBlockParam),
    "tool_use": _keys(sdk.ToolUseBlockParam),
    "tool_result": _keys(sdk.ToolResultBlockParam),
}
_TOOL_CHOICES = {"auto", "any", "tool", "none"}


def error_body(message: str, *, status: int = 400) -> dict[str, Any]:
    """An Anthropic error body (``overloaded_error`` for 529)."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def message(
    *,
    text: str | None = None,
    tool_uses: list[dict[str, Any]] | None = None,
    model: str = "claude-test",
    usage: dict[str, int] | None = None,
    stop_reason: str | None = None,
    stop_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Messages API response body, checked against the SDK's ``Message`` model. Each tool use:
    ``{"name", "input"}`` and optionally ``"id"`` (default ``toolu_<n>``). The stop reason
    defaults to ``tool_use`` with tool uses, else ``end_turn``."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    for position, use in enumerate(tool_uses or []):
        content.append(
            {
                "type": "tool_use",
                "id": use.get("id", f"toolu_{position}"),
                "name": use["name"],
                "input": use.get("input", {}),
            }
        )
    body = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
        "stop_sequence": None,
        "stop_details": stop_details,
        "usage": usage or {"input_tokens": 11, "output_tokens": 7},
    }
    sdk.Message.model_validate(body)  # the server says only what the SDK's types define
    return body


def raw_message(
    *,
    content: str = '[{"type": "text", "text": "ok"}]',
    usage: str = '{"input_tokens": 11, "output_tokens": 7}',
    model: str = '"claude-test"',
    stop_reason: str = '"end_turn"',
) -> str:
    """A Messages API body whose parts are raw JSON text, written into it untouched
    (``'[{"type": "tool_use", "id": "t", "name": "x", "input": {"v": NaN}}]'``)."""
    return (
        '{"id": "msg_raw", "type": "message", "role": "assistant", '
        f'"model": {model}, "content": {content}, "stop_reason": {stop_reason}, '
        f'"stop_sequence": null, "usage": {usage}}}'
    )


def tool_use(name: str, input_text: str, *, call_id: str = '"toolu_1"') -> str:
    """One raw ``tool_use`` block: ``input_text`` is the raw JSON of its input."""
    return f'{{"type": "tool_use", "id": {call_id}, "name": {name}, "input": {input_text}}}'


class MessagesServer(ChatServer):
    """A threaded Messages API server; ``start()``/``stop()`` or use as a context manager.
    ``base_url`` is the ``base_url`` of an ``AgentConfiguration`` (the SDK adds ``/v1``)."""

    endpoint = "/v1/messages"
    path_prefix = ""

    @staticmethod
    def error(message: str, *, status: int = 400) -> Any:
        return error_body(message, status=status)

    def reply(self, *, delay: float = 0.0, **message_fields: Any) -> None:  # type: ignore[override]
        """Queue a 200 message (arguments as for ``message``)."""
        self.enqueue(ScriptedResponse(body=message(**message_fields), delay=delay))

    @staticmethod
    def stream_frames(body: Any, request: dict[str, Any]) -> list[str]:
        return message_frames(body, request)

    def overloaded(self) -> None:
        """Queue the API's 529 ``overloaded_error``."""
        self.fail(529, "Overloaded")

    def request_problem(self, headers: dict[str, str], body: Any) -> str | None:
        if not headers.get("anthropic-version"):
            return "anthropic-version: header is required"
        if not (headers.get("x-api-key") or headers.get("authorization")):
            return "an API key is required (x-api-key or authorization)"
        if not isinstance(body, dict):
            return "the body must be a JSON object"
        return _request_problem(body)


def _request_problem(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: field required"
    tokens = body.get("max_tokens")
    if type(tokens) is not int or tokens < 1:
        return "max_tokens: must be an integer of at least 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if "system" in body and not isinstance(body["system"], str | list):
        return "system: must be text or a list of text blocks"
    return _messages_problem(messages) or _tools_problem(body, messages)


def _messages_problem(messages: list[Any]) -> str | None:
    expected, previous_uses = "user", set()
    for index, item in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(item, dict) or item.get("role") != expected:
            return f"{where}: roles must alternate, starting with user"
        blocks = _blocks(item.get("content"))
        if blocks is None or not blocks:
            return f"{where}: all messages must have non-empty content"
        for position, block in enumerate(blocks):
            if problem := _block_problem(block):
                return f"{where}.content.{position}: {problem}"
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if problem := _pairing_problem(where, blocks, results, previous_uses):
            return problem
        previous_uses = {b["id"] for b in blocks if b["type"] == "tool_use"}
        expected = "assistant" if expected == "user" else "user"
    if previous_uses:
        return "the last message has tool_use blocks without results"
    return None


def _blocks(content: Any) -> list[Any] | None:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content if isinstance(content, list) else None


def _block_problem(block: Any) -> str | None:
    if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
        return "a block of a type this server does not take"
    required, known = _BLOCK_TYPES[block["type"]]
    missing = required - block.keys()
    unknown = block.keys() - known
    if missing or unknown:
        return f"{block['type']} block: missing {sorted(missing)}, unknown {sorted(unknown)}"
    if block["type"] == "text" and (not isinstance(block["text"], str) or not block["text"]):
        return "text content blocks must be non-empty"
    if block["type"] == "tool_use":
        if not isinstance(block["id"], str) or not _ID.fullmatch(block["id"]):
            return f"tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$': {block['id']!r}"
        if not isinstance(block["input"], dict):
            return "tool_use.input: must be an object"
    return None


def _pairing_problem(
    where: str, blocks: list[dict[str, Any]], results: list[str], previous_uses: set[str]
) -> str | None:
    if set(results) - previous_uses:
        return f"{where}: tool_result blocks without a tool_use in the previous message"
    if previous_uses - set(results):
        return f"{where}: tool_use ids were found without tool_result blocks immediately after"
    firsts = [b["type"] == "tool_result" for b in blocks]
    if firsts != sorted(firsts, reverse=True):
        return f"{where}: tool_result blocks must come first"
    return None


def _tools_problem(body: dict[str, Any], messages: list[Any]) -> str | None:
    tools = body.get("tools", [])
    if not isinstance(tools, list):
        return "tools: must be a list"
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not _TOOL_NAME.fullmatch(str(tool.get("name", ""))):
            return f"tools.{index}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"tools.{index}.input_schema: must be an object schema"
    used = any(
        isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
        for item in messages
        for block in _blocks(item.get("content")) or []
    )
    if used and not tools:
        return "requests which include tool_use or tool_result blocks must define tools"
    choice = body.get("tool_choice")
    if choice is not None and (not tools or choice.get("type") not in _TOOL_CHOICES):
        return "tool_choice: may only be specified while providing tools"
    return None


@pytest.fixture
def messages_server() -> Iterator[MessagesServer]:
    """A started ``MessagesServer``, stopped after the test."""
    with MessagesServer() as server:
        yield server
