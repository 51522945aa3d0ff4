"""The provider contract: one model turn in, one reply out, failures classified (docs/design.md
§6.7, §7.1).

A provider is stateless between calls: everything it needs is in the arguments (the OpenAI chat
``messages`` so far, the OpenAI-format ``tools`` and the run uuid). It never touches the
database and never retries; retries are the runtime's, decided by ``ProviderError.retryable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for. ``arguments`` is always a dict (see ``UNPARSED_KEY``)."""

    id: str
    name: str
    arguments: dict[str, Any]


#: When a model's arguments are not a JSON object, the call carries ``{UNPARSED_KEY: raw}`` so
#: schema validation reports the problem back to the model instead of the provider failing.
UNPARSED_KEY = "_unparsed_arguments"


@dataclass(frozen=True)
class ProviderReply:
    """One assistant turn: text, tool calls (possibly both), token usage and the model name."""

    content: str
    tool_calls: list[ToolCall]
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens
    model: str = ""
    # The parts ``providers.replies.check_reply`` changed to make them storable ("content",
    # "model"); empty for a reply as the provider sent it.
    normalised: tuple[str, ...] = ()

    def as_message(self) -> dict[str, Any]:
        """The OpenAI chat ``assistant`` message for this reply, to append to the dialogue."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(call.arguments, sort_keys=True),
                    },
                }
                for call in self.tool_calls
            ]
        return message


class ErrorKind(StrEnum):
    """Stable values of ``ProviderError.kind``."""

    CONNECTION = "connection"  # retryable
    TIMEOUT = "timeout"  # retryable
    RATE_LIMITED = "rate_limited"  # retryable (429)
    SERVER_ERROR = "server_error"  # retryable (5xx)
    AUTH = "auth"  # 401/403, or the key's environment variable is unset
    BAD_REQUEST = "bad_request"  # 400/404/422
    BAD_RESPONSE = "bad_response"  # the endpoint answered something that is not a completion
    REFUSED = "refused"  # the model declined to answer (Anthropic's stop_reason "refusal")
    CONFIGURATION = "configuration"  # unknown provider name and the like
    SCRIPT_EXHAUSTED = "script_exhausted"  # the scripted provider ran out of turns
    SCRIPT_INVALID = "script_invalid"  # the script is malformed
    SCRIPTED = "scripted"  # a scripted ``"error"`` turn (retryable or not, as scripted)
    UNKNOWN = "unknown"  # anything else: never retried


class ProviderError(Exception):
    """A provider call failed. ``retryable`` follows docs/design.md §7.1.

    ``kind`` is one of ``ErrorKind`` (a plain ``str``); the message is safe to store and show
    (it never contains an API key). ``status_code`` is the HTTP status when there was one.
    """

    def __init__(
        self, message: str, *, kind: str, retryable: bool, status_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.status_code = status_code

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description (for ``AgentRun.error`` and events)."""
        data: dict[str, Any] = {
            "kind": str(self.kind),
            "retryable": self.retryable,
            "message": str(self),
        }
        if self.status_code is not None:
            data["status_code"] = self.status_code
        return data


class Provider(Protocol):
    def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], run_uuid: str
    ) -> ProviderReply:
        """Answer one turn. ``messages`` are OpenAI chat messages, ``tools`` OpenAI tool specs.

        Raises ``ProviderError`` (and nothing else) on failure. Does not mutate its arguments.
        The runtime checks what it returns (``providers.replies.check_reply``) before anything
        of it is stored.
        """
        ...
