"""The ``anthropic`` provider: Anthropic's Messages API with tool use, via the official
``anthropic`` SDK (docs/design.md §6.7, §7.1).

Like ``openai_compat``: the key is read at each call from the variable ``api_key_env`` names (an
allowed one, ``agentruns.secrets``), passed to the SDK explicitly (so it never falls back to
``ANTHROPIC_API_KEY``, a profile or a token on disk) and never stored, logged or put in a message;
the SDK's retries are off and every failure is a ``ProviderError`` in the same retry classes
(529 "overloaded" is a 5xx: ``server_error``, retried). The dialogue is written as the API takes
it by ``anthropic_dialogue``. A reply is read into a ``ProviderReply``, which the runtime checks
like any other (``providers.replies.check_reply``):

* ``text`` blocks are the content (joined by a blank line), ``tool_use`` blocks the calls (their
  ``input`` the arguments: not an object → ``_unparsed_arguments``); ``thinking`` blocks are not
  read; any other block (server tools, which Leasehold never offers) is ``bad_response``.
* usage: ``input_tokens`` plus the cache's ``cache_creation_input_tokens`` and
  ``cache_read_input_tokens`` are the prompt tokens, ``output_tokens`` the completion tokens.
* ``stop_reason``: ``end_turn``, ``stop_sequence``, ``tool_use`` and none at all are read as
  they are; at ``max_tokens`` or ``model_context_window_exceeded`` a last ``tool_use`` block was
  cut off mid-way, so its call carries ``_unparsed_arguments`` (never run; the model is told);
  ``refusal`` is a ``refused`` error (not retried; nothing of the reply is kept or run);
  ``pause_turn`` (server tools only) and any other value are ``bad_response``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic

from agentruns.providers.anthropic_dialogue import messages_request
from agentruns.providers.anthropic_stream import stream_failure, stream_messages
from agentruns.providers.base import (
    UNPARSED_KEY,
    ErrorKind,
    ProviderError,
    ProviderReply,
    ToolCall,
)
from agentruns.providers.streaming import TextSink
from agentruns.providers.wire import (
    SDK_STATUS_PREFIX,
    bad_response,
    parse_arguments,
    read_api_key,
    sanitise,
    status_kind,
)

#: ``max_tokens`` when the configuration sets no ``max_output_tokens`` (the API requires one).
DEFAULT_MAX_OUTPUT_TOKENS = 4096

#: Stop reasons whose reply is read as it is.
FINISHED = frozenset({"end_turn", "stop_sequence", "tool_use"})
#: Stop reasons that cut the answer off: a last ``tool_use`` block is incomplete.
CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded"})
#: What a call cut off mid-way carries instead of arguments (``_unparsed_arguments``).
CUT_OFF_MARK = "the answer was cut off (stop_reason {reason}) before this call's arguments ended"
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _field(value: Any, name: str) -> Any:
    """``value.name`` or ``value[name]`` (the SDK builds objects; an unknown shape may stay a
    dict), ``None`` when absent."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def classify(exc: BaseException, *, secret: str | None = None) -> ProviderError:
    """An SDK (or any) exception as a ``ProviderError``, in the classes of docs/design.md §7.1
    (``wire.status_kind``): connection errors, timeouts, 408, 429 and 5xx (529 included) are
    retried; 401/403, 400/404/422, a body that is not a message and anything else are not."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError(
            "The provider did not answer in time.", kind=ErrorKind.TIMEOUT, retryable=True
        )
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return ProviderError(
            sanitise(f"Could not connect to the provider{detail}", secret),
            kind=ErrorKind.CONNECTION,
            retryable=True,
        )
    if isinstance(exc, anthropic.APIStatusError):
        kind, retryable = status_kind(exc.status_code)
        said = exc.api_message if isinstance(exc.api_message, str) else None
        detail = said or SDK_STATUS_PREFIX.sub("", exc.message or "")
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
        anthropic.APIResponseValidationError
        | json.JSONDecodeError
        | UnicodeDecodeError
        | RecursionError,
    ):  # a 200 whose body is not a message: not JSON, not UTF-8, nested past the parser
        return bad_response(f"The provider's answer was not a valid message: {exc}", secret)
    return ProviderError(
        sanitise(f"Provider call failed: {type(exc).__name__}: {exc}", secret),
        kind=ErrorKind.UNKNOWN,
        retryable=False,
    )


def usage_counts(usage: Any) -> dict[str, Any]:
    """The reply's token counts in Leasehold's names, as sent (``check_reply`` refuses what is
    not a count); ``{}`` when the reply reported no usage (the call's cost is then unknown)."""
    if usage is None:
        return {}
    inputs = [
        _field(usage, name)
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    present = [count for count in inputs if count is not None]
    counts: dict[str, Any] = {}
    if present:
        odd = [count for count in present if type(count) is not int]
        counts["prompt_tokens"] = odd[0] if odd else sum(present)
    if (output := _field(usage, "output_tokens")) is not None:
        counts["completion_tokens"] = output
    prompt, completion = counts.get("prompt_tokens", 0), counts.get("completion_tokens", 0)
    if counts and type(prompt) is int and type(completion) is int:
        counts["total_tokens"] = prompt + completion
    return counts


class AnthropicProvider:
    """Messages against ``base_url`` (blank: the SDK's default, ``ANTHROPIC_BASE_URL`` or
    api.anthropic.com) with the key from the variable ``api_key_env`` names, read at each call;
    answers of at most ``max_output_tokens`` tokens (the API's ``max_tokens``)."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str = "",
        api_key_env: str = "",
        timeout_seconds: float = 30,
        max_output_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout_seconds = float(timeout_seconds)
        self.max_output_tokens = max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS

    @classmethod
    def from_configuration(cls, configuration: Any) -> AnthropicProvider:
        """Build from an ``AgentConfiguration`` (model, base_url, api_key_env, timeout_seconds,
        max_output_tokens)."""
        return cls(
            model=configuration.model,
            base_url=configuration.base_url or "",
            api_key_env=configuration.api_key_env or "",
            timeout_seconds=configuration.timeout_seconds or 30,
            max_output_tokens=getattr(configuration, "max_output_tokens", None),
        )

    def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], run_uuid: str
    ) -> ProviderReply:
        """One ``messages.create`` call, no SDK retries, timeout ``timeout_seconds``. Raises
        ``ProviderError`` only (``classify``; a refusal ``refused``); a missing key is ``auth``
        and a variable the secret rule refuses ``configuration``, both before any request."""
        key, arguments = self._prepared(messages, tools)
        try:
            with anthropic.Anthropic(
                api_key=key,
                base_url=self.base_url or None,
                timeout=self.timeout_seconds,
                max_retries=0,
            ) as client:
                message = client.messages.create(
                    model=self.model, max_tokens=self.max_output_tokens, **arguments
                )
        except ProviderError:
            raise
        except Exception as exc:
            raise classify(exc, secret=key) from None
        try:
            return self._reply(message, secret=key)
        except ProviderError:
            raise
        except Exception as exc:  # a message-shaped answer with the wrong insides
            raise bad_response(
                f"The provider's answer was not a valid message: {exc}", key
            ) from None

    def stream(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        run_uuid: str,
        on_text: TextSink,
    ) -> ProviderReply:
        """``complete``, streamed (``anthropic_stream``): each piece of text to ``on_text`` as it
        arrives, the reply the same as ``complete``'s for the same answer, failures in the same
        classes (a stream cut short: ``connection``; an ``error`` event: as its HTTP error)."""
        key, arguments = self._prepared(messages, tools)
        try:
            message = stream_messages(self, arguments=arguments, key=key, on_text=on_text)
        except ProviderError:
            raise
        except Exception as exc:
            raise (stream_failure(exc, secret=key) or classify(exc, secret=key)) from None
        try:
            return self._reply(message, secret=key)
        except ProviderError:
            raise
        except Exception as exc:  # a message-shaped answer with the wrong insides
            raise bad_response(
                f"The provider's answer was not a valid message: {exc}", key
            ) from None

    def _prepared(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[str, dict[str, Any]]:
        """The key (read now) and the request's arguments but the model and ``max_tokens``."""
        key = read_api_key(self.api_key_env)
        if not self.model:
            raise ProviderError(
                "The configuration names no model.", kind=ErrorKind.CONFIGURATION, retryable=False
            )
        return key, messages_request(messages, tools).arguments()

    def _reply(self, message: Any, *, secret: str) -> ProviderReply:
        blocks = _field(message, "content")
        if not isinstance(blocks, list):
            raise bad_response(
                f"The provider's answer was not a valid message: {message!r:.200}", secret
            )
        stop = _field(message, "stop_reason")
        if stop == "refusal":
            raise _refusal(message, secret)
        if stop is not None and (not isinstance(stop, str) or stop not in FINISHED | CUT_OFF):
            raise bad_response(
                f"The provider's reply was refused: it stopped for a reason Leasehold does not "
                f"act on (stop_reason {stop!r:.80})",
                secret,
            )
        texts: list[Any] = []
        calls: list[ToolCall] = []
        for position, block in enumerate(blocks):
            kind = _field(block, "type")
            if kind == "text":
                texts.append(_field(block, "text"))
            elif kind == "tool_use":
                cut = stop in CUT_OFF and position == len(blocks) - 1
                calls.append(_tool_call(block, cut_by=stop if cut else None))
            elif kind not in _SKIPPED_BLOCKS:
                raise bad_response(
                    f"The provider's reply was refused: it holds a {kind!r:.80} block, which "
                    "Leasehold never asks for",
                    secret,
                )
        model = _field(message, "model")
        return ProviderReply(
            content=_joined(texts),
            tool_calls=calls,
            usage=usage_counts(_field(message, "usage")),
            model=model if isinstance(model, str) and model else self.model,
        )


def _joined(texts: list[Any]) -> Any:
    """The text blocks as one content; a block that is not text is kept as it is, for
    ``check_reply`` to refuse."""
    odd = [text for text in texts if not isinstance(text, str)]
    return odd[0] if odd else "\n\n".join(texts)


def _tool_call(block: Any, *, cut_by: str | None) -> ToolCall:
    """One ``tool_use`` block as a call: an id or name that is not a string is kept as it is,
    for ``check_reply`` to refuse; a missing id gets a fresh one."""
    call_id = _field(block, "id")
    if call_id is None or call_id == "":
        call_id = f"toolu_{uuid.uuid4().hex}"
    name = _field(block, "name")
    if cut_by is not None:
        arguments: dict[str, Any] = {UNPARSED_KEY: CUT_OFF_MARK.format(reason=cut_by)}
    else:
        arguments = parse_arguments(_field(block, "input"))
    return ToolCall(id=call_id, name="" if name is None else name, arguments=arguments)


def _refusal(message: Any, secret: str) -> ProviderError:
    details = _field(message, "stop_details")
    said = [
        text
        for text in (_field(details, "category"), _field(details, "explanation"))
        if isinstance(text, str) and text
    ]
    return ProviderError(
        sanitise(
            "The model refused to answer (stop_reason refusal)"
            + (f": {' — '.join(said)}" if said else "")
            + "; nothing of its reply was kept or run.",
            secret,
        ),
        kind=ErrorKind.REFUSED,
        retryable=False,
    )
