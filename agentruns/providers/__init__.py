"""Providers: where a model turn comes from (``scripted``, any OpenAI-compatible endpoint, or
Anthropic's Messages API).

``provider_for`` picks the implementation; ``base`` holds the contract every implementation
imports (and imports no implementation itself).
"""

from __future__ import annotations

from typing import Any

from agentruns.providers.base import (
    ErrorKind,
    Provider,
    ProviderError,
    ProviderReply,
    ToolCall,
)

__all__ = ["Provider", "ProviderError", "ProviderReply", "ToolCall", "provider_for"]


def provider_for(configuration: Any, request: dict[str, Any]) -> Provider:
    """The provider for ``configuration.provider`` (``scripted`` | ``openai`` | ``anthropic``).

    ``scripted`` plays ``request["script"]`` when the request carries a non-empty one, else
    ``configuration.script``. ``openai`` and ``anthropic`` read their key from the environment at
    call time, so building a provider never fails for a missing key; the first ``complete`` does.
    Raises ``ProviderError`` (``configuration``, not retryable) for an unknown provider name.
    """
    name = str(getattr(configuration, "provider", "") or "")
    model = str(getattr(configuration, "model", "") or "")
    if name == "scripted":
        from agentruns.providers.scripted import ScriptedProvider

        script = (request or {}).get("script")
        if script is None or script == []:
            script = getattr(configuration, "script", None)
        return ScriptedProvider(script=script if script is not None else [], model=model)
    if name == "openai":
        from agentruns.providers.openai_compat import OpenAIProvider

        return OpenAIProvider.from_configuration(configuration)
    if name == "anthropic":
        from agentruns.providers.anthropic_messages import AnthropicProvider

        return AnthropicProvider.from_configuration(configuration)
    raise ProviderError(
        f"Unknown provider {name!r} (expected 'scripted', 'openai' or 'anthropic').",
        kind=ErrorKind.CONFIGURATION,
        retryable=False,
    )
