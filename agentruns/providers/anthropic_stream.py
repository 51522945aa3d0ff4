"""The ``anthropic`` provider, streamed: ``messages.stream`` read event by event, its final
message read by the same code as the non-streamed call's (``AnthropicProvider._reply``)
(docs/design.md §6.8).

Each ``text_delta`` is handed to ``on_text`` as it arrives. A ``tool_use`` block's input arrives
as ``input_json_delta`` pieces: they are joined here and parsed whole, strictly, once the answer
is complete (the SDK's own snapshot parses them leniently, as partial JSON, so that a truncated
object would read as a smaller one; a block sent whole in its ``content_block_start``, without
pieces, keeps the input it came with); input that does not parse as one JSON object is
``bad_response``, except in a last block an answer at ``max_tokens`` cut off (``_reply`` marks
that call unparsed, as it does the non-streamed one). The answer is complete at
``message_stop``: a stream that ends before it is ``connection`` (``streaming.incomplete``). An
``error`` event mid-stream is classed by its error type as the same HTTP error would be
(``overloaded_error``: ``server_error``, retried); the limits are ``streaming.StreamBounds``'.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import httpx2  # the anthropic SDK's HTTP client

from agentruns.providers.base import ErrorKind, ProviderError
from agentruns.providers.streaming import StreamBounds, TextSink, incomplete, safe_sink
from agentruns.providers.wire import bad_response, sanitise, status_kind

if TYPE_CHECKING:
    from agentruns.providers.anthropic_messages import AnthropicProvider

#: An ``error`` event's type → the HTTP status that error comes with when it is not streamed.
ERROR_STATUS = {
    "overloaded_error": 529,
    "api_error": 500,
    "rate_limit_error": 429,
    "request_too_large": 413,
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
}


class EventReader:
    """The events of one streamed message: text to ``on_text``, tool input pieces joined per
    block, ``message_stop`` noted."""

    def __init__(self, *, on_text: TextSink, secret: str | None) -> None:
        self._on_text = safe_sink(on_text)
        self._secret = secret
        self._bounds = StreamBounds(secret)
        self.inputs: dict[int, list[str]] = {}
        self.blocks = 0
        self.started = False
        self.stopped = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self.started = True
        elif not self.started:  # the SDK passes on what comes before the start untouched
            raise bad_response(
                f"The provider's stream was refused: {kind!r:.40} came before message_start",
                self._secret,
            )
        if kind == "message_stop":
            self.stopped = True
        elif kind == "content_block_start":
            self._bounds.call_index(self.blocks)  # at most MAX_TOOL_CALLS blocks
            self.blocks += 1
        elif kind == "content_block_delta":
            self._delta(event.index, event.delta)

    def _delta(self, index: Any, delta: Any) -> None:
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            self._on_text(self._bounds.text(delta.text))
        elif kind == "input_json_delta":
            self.inputs.setdefault(index, []).append(self._bounds.arguments(delta.partial_json))

    def message(self, final: Any) -> dict[str, Any]:
        """The final message as the non-streamed call returns it (a dict ``_reply`` reads), each
        ``tool_use`` block's input parsed whole from its pieces."""
        if not self.stopped:
            raise incomplete("no message_stop")
        message = final.model_dump(mode="python", warnings=False)
        blocks = message.get("content") or []
        cut = message.get("stop_reason") in ("max_tokens", "model_context_window_exceeded")
        for index, block in enumerate(blocks):
            # A block whose input came whole in its ``content_block_start`` keeps it.
            if block.get("type") == "tool_use" and index in self.inputs:
                last = index == len(blocks) - 1
                block["input"] = self._input(index, may_be_cut=cut and last)
        return message

    def _input(self, index: int, *, may_be_cut: bool) -> Any:
        text = "".join(self.inputs[index])
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict) or may_be_cut:
            return value  # a cut-off call is marked unparsed by ``_reply``
        raise bad_response(
            "The provider's stream was refused: a tool_use block's input did not assemble into "
            f"a JSON object: {text!r:.120}",
            self._secret,
        )


def stream_messages(
    provider: AnthropicProvider, *, arguments: dict[str, Any], key: str, on_text: TextSink
) -> dict[str, Any]:
    """One ``messages.stream`` (``arguments`` as the non-streamed call's), read to its end: the
    final message as a dict. SDK failures propagate for the caller to classify
    (``stream_classify`` first)."""
    reader = EventReader(on_text=on_text, secret=key)
    with (
        anthropic.Anthropic(
            api_key=key,
            base_url=provider.base_url or None,
            timeout=provider.timeout_seconds,
            max_retries=0,
        ) as client,
        client.messages.stream(
            model=provider.model, max_tokens=provider.max_output_tokens, **arguments
        ) as stream,
    ):
        for event in stream:
            reader.add(event)
        final = stream.get_final_message()
    return reader.message(final)


def stream_failure(exc: BaseException, *, secret: str | None) -> ProviderError | None:
    """What a streamed call's failure is, when streaming makes it different from a plain
    call's: the connection failing mid-body (which the SDK does not wrap) as ``connection`` or
    ``timeout``; an ``error`` event (a status error on a 200 response) by its error type; a
    stream the SDK could not accumulate (events out of order, input JSON it cannot parse) as
    ``bad_response``. ``None``: classify it as the plain call's."""
    if isinstance(exc, httpx2.TimeoutException):  # the SDK does not wrap a stream's own
        return ProviderError(
            "The provider did not answer in time.", kind=ErrorKind.TIMEOUT, retryable=True
        )
    if isinstance(exc, httpx2.TransportError):  # e.g. the connection cut mid-body
        return ProviderError(
            sanitise(f"The provider's stream broke off: {type(exc).__name__}: {exc}", secret),
            kind=ErrorKind.CONNECTION,
            retryable=True,
        )
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code < 400:
        body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
        said_error = body.get("error")
        error: dict[str, Any] = said_error if isinstance(said_error, dict) else {}
        status = ERROR_STATUS.get(str(error.get("type")), 0)
        kind, retryable = status_kind(status) if status else (ErrorKind.UNKNOWN, False)
        said = error.get("message")
        return ProviderError(
            sanitise(
                "The provider's stream sent an error"
                + (f" ({error.get('type')}): {said}" if isinstance(said, str) else ""),
                secret,
            ),
            kind=kind,
            retryable=retryable,
        )
    if isinstance(exc, ValueError | RuntimeError | TypeError | AssertionError | IndexError):
        return bad_response(f"The provider's stream was not a valid message: {exc}", secret)
    return None
