"""The ``openai`` provider: any OpenAI-compatible chat-completions endpoint, via the ``openai`` SDK.

The API key is read at call time from the environment variable the configuration names
(``api_key_env``), and only from an allowed one (``agentruns.secrets``: a refused name is a
``configuration`` error, not retryable, before any request); it is never stored, logged or put
in an error message. The SDK's own retries
are off (``max_retries=0``): every failure becomes a ``ProviderError`` classified per docs/design.md
§7.1 and the runtime decides whether to retry."""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai

from agentruns.providers.base import ErrorKind, ProviderError, ProviderReply, ToolCall
from agentruns.providers.openai_stream import stream_chat
from agentruns.providers.streaming import TextSink
from agentruns.providers.wire import (
    SDK_STATUS_PREFIX,
    parse_arguments,
    read_api_key,
    sanitise,
    status_kind,
)


def classify(exc: BaseException, *, secret: str | None = None) -> ProviderError:
    """Map an SDK (or any) exception to a ``ProviderError`` per docs/design.md §7.1.

    Connection errors, timeouts, 408, 429 and 5xx are retryable; 401/403 (``auth``),
    400/404/422 (``bad_request``), an answer that is not a completion (``bad_response``) and
    everything else (``unknown``) are not.
    """
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(
            "The provider did not answer in time.", kind=ErrorKind.TIMEOUT, retryable=True
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return ProviderError(
            sanitise(f"Could not connect to the provider{detail}", secret),
            kind=ErrorKind.CONNECTION,
            retryable=True,
        )
    if isinstance(exc, openai.APIStatusError):
        kind, retryable = status_kind(exc.status_code)
        detail = SDK_STATUS_PREFIX.sub("", exc.message or "")
        return ProviderError(
            sanitise(
                f"The provider answered HTTP {exc.status_code}" + (f": {detail}" if detail else ""),
                secret,
            ),
            kind=kind,
            retryable=retryable,
            status_code=exc.status_code,
        )
    if isinstance(
        exc,
        openai.APIResponseValidationError
        | json.JSONDecodeError
        | UnicodeDecodeError
        | RecursionError,
    ):  # a 200 whose body is not a completion: not JSON, not UTF-8, nested past the parser
        return ProviderError(
            sanitise(f"The provider's answer was not a valid completion: {exc}", secret),
            kind=ErrorKind.BAD_RESPONSE,
            retryable=False,
        )
    return ProviderError(
        sanitise(f"Provider call failed: {type(exc).__name__}: {exc}", secret),
        kind=ErrorKind.UNKNOWN,
        retryable=False,
    )


def _tool_call(call: Any) -> ToolCall:
    """One tool call as sent: an id or name that is not a string is kept as it is, for
    ``check_reply`` to refuse (never turned into text that names some other tool)."""
    call_id = getattr(call, "id", None)
    if call_id is None or call_id == "":
        call_id = f"call_{uuid.uuid4().hex}"
    function = getattr(call, "function", None)
    if function is not None:
        name, raw = getattr(function, "name", None), getattr(function, "arguments", None)
    else:  # a "custom" tool call: free-form input, no JSON arguments
        custom = getattr(call, "custom", None)
        name, raw = getattr(custom, "name", None), getattr(custom, "input", None)
    return ToolCall(id=call_id, name="" if name is None else name, arguments=parse_arguments(raw))


def _usage(usage: Any) -> dict[str, Any]:
    """The reply's token counts as sent (``check_reply`` refuses what is not a count); ``{}``
    when the endpoint reported no usage at all (the call's cost is then unknown: charged 0 and
    marked, ``agentruns.budgets``). A missing or zero total is the sum of the other two."""
    if usage is None:
        return {}
    counts = {
        key: getattr(usage, key, None) or 0
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    prompt, completion = counts["prompt_tokens"], counts["completion_tokens"]
    if not counts["total_tokens"] and type(prompt) is int and type(completion) is int:
        counts["total_tokens"] = prompt + completion
    return counts


class OpenAIProvider:
    """Chat completions against ``base_url`` (blank: the SDK default, ``OPENAI_BASE_URL`` or
    api.openai.com) with the key from the environment variable ``api_key_env`` names (an
    allowed name, ``agentruns.secrets``), read at each call."""

    def __init__(
        self, *, model: str, base_url: str = "", api_key_env: str = "", timeout_seconds: float = 30
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout_seconds = float(timeout_seconds)

    @classmethod
    def from_configuration(cls, configuration: Any) -> OpenAIProvider:
        """Build from an ``AgentConfiguration`` (model, base_url, api_key_env, timeout_seconds)."""
        return cls(
            model=configuration.model,
            base_url=configuration.base_url or "",
            api_key_env=configuration.api_key_env or "",
            timeout_seconds=configuration.timeout_seconds or 30,
        )

    def _api_key(self) -> str:
        return read_api_key(self.api_key_env)

    def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], run_uuid: str
    ) -> ProviderReply:
        """One ``chat.completions.create`` call (``tools`` omitted when empty), no SDK retries,
        timeout ``timeout_seconds``. Raises ``ProviderError`` only, classified by ``classify``;
        a missing key is ``auth`` and a variable the secret rule refuses ``configuration``
        (its cause a ``SecretEnvRefused``), both not retryable and before any request is sent."""
        key, arguments = self._prepared(messages, tools)
        try:
            with openai.OpenAI(
                api_key=key,
                base_url=self.base_url or None,
                timeout=self.timeout_seconds,
                max_retries=0,
            ) as client:
                completion = client.chat.completions.create(**arguments)
        except ProviderError:
            raise
        except Exception as exc:
            raise classify(exc, secret=key) from None
        return self._reply(completion, secret=key)

    def stream(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        run_uuid: str,
        on_text: TextSink,
    ) -> ProviderReply:
        """``complete``, streamed (``openai_stream``): each piece of text to ``on_text`` as it
        arrives, the reply the same as ``complete``'s for the same answer, failures in the same
        classes (a stream cut short: ``connection``; past a reply's limits: ``bad_response``)."""
        key, arguments = self._prepared(messages, tools)
        try:
            completion = stream_chat(self, arguments=arguments, key=key, on_text=on_text)
        except ProviderError:
            raise
        except Exception as exc:
            raise classify(exc, secret=key) from None
        return self._reply(completion, secret=key)

    def _prepared(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[str, dict[str, Any]]:
        """The key (read now) and the request's arguments (``tools`` omitted when empty)."""
        key = self._api_key()
        if not self.model:
            raise ProviderError(
                "The configuration names no model.", kind=ErrorKind.CONFIGURATION, retryable=False
            )
        arguments: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            arguments["tools"] = tools
        return key, arguments

    def _reply(self, completion: Any, *, secret: str) -> ProviderReply:
        choices = getattr(completion, "choices", None)
        if not choices:
            raise ProviderError(
                sanitise(f"The provider answered without choices: {completion!r:.200}", secret),
                kind=ErrorKind.BAD_RESPONSE,
                retryable=False,
            )
        try:
            message = choices[0].message
            model = getattr(completion, "model", None)
            return ProviderReply(
                content="" if message.content is None else message.content,
                tool_calls=[_tool_call(call) for call in (message.tool_calls or [])],
                usage=_usage(getattr(completion, "usage", None)),
                model=model if isinstance(model, str) and model else self.model,
            )
        except ProviderError:
            raise
        except Exception as exc:  # a completion-shaped answer with the wrong insides
            raise ProviderError(
                sanitise(f"The provider's answer was not a valid completion: {exc}", secret),
                kind=ErrorKind.BAD_RESPONSE,
                retryable=False,
            ) from None
