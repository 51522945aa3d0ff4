"""CONTRACT STUB — to be completed by the providers work. Keep these names and signatures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ProviderReply:
    content: str
    tool_calls: list[ToolCall]
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens
    model: str = ""


class ProviderError(Exception):
    """A provider call failed. ``retryable`` follows RUNS.md §9."""

    def __init__(self, message: str, *, kind: str, retryable: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


class Provider(Protocol):
    def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], run_uuid: str
    ) -> ProviderReply: ...


def provider_for(configuration: Any, request: dict[str, Any]) -> Provider: ...
