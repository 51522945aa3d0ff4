"""The dialogue as the Messages API takes it (docs/design.md §6.7): Leasehold keeps a run's
dialogue as OpenAI chat messages (``system``, ``user``, ``assistant`` with ``tool_calls``,
``tool``); ``messages_request`` writes the same dialogue as Anthropic's ``system``, ``messages``
of content blocks, ``tools`` and ``tool_choice``. Pure: no SDK, no database.

* The system messages become ``system`` (one string); the rest alternate ``user`` /
  ``assistant``, consecutive messages of one role merged into one (a turn's tool results are one
  ``user`` message of ``tool_result`` blocks, first in it as the API requires).
* An assistant message is a ``text`` block (left out when empty) and one ``tool_use`` block per
  call, its ``input`` the arguments as an object; an assistant message with neither is left out
  (the API refuses empty content), so the user messages around it merge.
* A call id the API would refuse (it takes letters, digits, ``_`` and ``-``: Leasehold makes ids
  unique with ``~``) is sent as ``lh_`` and a hash of it, the same in ``tool_use`` and
  ``tool_result``, so ids stay paired and distinct.
* A request that offers no tools (the final call) while the dialogue holds tool blocks declares
  the tools it used, with ``tool_choice`` ``none``: the API refuses tool blocks without tools.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentruns.providers.wire import parse_arguments

_WIRE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The schema of a tool declared only because the dialogue used it (the final call).
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class MessagesRequest:
    """The parts of one ``messages.create`` call that come from the dialogue."""

    system: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: dict[str, str] | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``messages.create`` (``system``, ``tools`` and
        ``tool_choice`` only when there are some)."""
        found: dict[str, Any] = {"messages": self.messages}
        if self.system:
            found["system"] = self.system
        if self.tools:
            found["tools"] = self.tools
        if self.tool_choice is not None:
            found["tool_choice"] = self.tool_choice
        return found


def wire_id(call_id: Any) -> str:
    """``call_id`` as the API takes it: itself when it may be, else ``lh_`` + a hash of it."""
    text = str(call_id)
    if _WIRE_ID.fullmatch(text):
        return text
    return "lh_" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def messages_request(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> MessagesRequest:
    """The Messages API request for the OpenAI-format dialogue ``messages`` and tool specs
    ``tools`` (see the module docstring). Does not mutate its arguments."""
    request = MessagesRequest()
    system: list[str] = []
    used: list[str] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            if message.get("content"):
                system.append(str(message["content"]))
            continue
        if role == "assistant":
            blocks = _assistant_blocks(message)
            used.extend(b["name"] for b in blocks if b["type"] == "tool_use")
            _append(request.messages, "assistant", blocks)
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": wire_id(message.get("tool_call_id")),
                "content": str(message.get("content") or ""),
            }
            _append(request.messages, "user", [result])
        else:
            _append(request.messages, "user", _text_blocks(message.get("content")))
    request.system = "\n\n".join(system)
    request.tools = [_tool(spec) for spec in tools]
    if not request.tools and used:
        request.tools = [{"name": name, "input_schema": dict(_ANY_OBJECT)} for name in _once(used)]
        request.tool_choice = {"type": "none"}
    return request


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = _text_blocks(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": wire_id(call.get("id")),
                "name": str(function.get("name") or ""),
                "input": parse_arguments(function.get("arguments")),
            }
        )
    return blocks


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return [{"type": "text", "text": text}]


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add ``blocks`` as a ``role`` message, merged into the last one when it has that role;
    in a user message, tool results come before text."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        merged = [*messages[-1]["content"], *blocks]
        if role == "user":
            merged.sort(key=lambda block: block["type"] != "tool_result")  # stable
        messages[-1]["content"] = merged
        return
    messages.append({"role": role, "content": list(blocks)})


def _tool(spec: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool spec (``{"type": "function", "function": {…}}``) as an Anthropic tool."""
    function = spec.get("function") or {}
    tool: dict[str, Any] = {
        "name": function.get("name", ""),
        "input_schema": function.get("parameters") or dict(_ANY_OBJECT),
    }
    if function.get("description"):
        tool["description"] = function["description"]
    return tool


def _once(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))
