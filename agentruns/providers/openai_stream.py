"""The ``openai`` provider, streamed: ``chat.completions.create(stream=True)`` with
``stream_options.include_usage``, its chunks assembled into the completion the non-streamed call
would have returned and read by the same code (``OpenAIProvider._reply``) (docs/design.md §6.8).

Each chunk's ``delta.content`` is handed to ``on_text`` as it arrives. Tool calls are assembled
by ``index``: the first id and name sent, the argument text joined; a second, different name for
one call is ``bad_response``. The answer is complete when its choice says ``finish_reason``; the
usage chunk (no choices) that follows is read when it comes. A stream that ends without a
``finish_reason`` is ``connection`` (``streaming.incomplete``); the limits are
``streaming.StreamBounds``'."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import openai

from agentruns.providers.streaming import StreamBounds, TextSink, incomplete, safe_sink
from agentruns.providers.wire import bad_response

if TYPE_CHECKING:
    from agentruns.providers.openai_compat import OpenAIProvider


@dataclass
class _Call:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class ChunkAssembler:
    """The chunks of one streamed completion, assembled (``add``), then read as the completion
    the non-streamed call returns (``completion``)."""

    def __init__(self, *, on_text: TextSink, secret: str | None) -> None:
        self._on_text = safe_sink(on_text)
        self._secret = secret
        self._bounds = StreamBounds(secret)
        self._content: list[str] = []
        self._calls: dict[int, _Call] = {}
        self.finish_reason: Any = None
        self.usage: Any = None
        self.model: Any = None

    def add(self, chunk: Any) -> None:
        """One chunk: its model, its usage, and its first choice's delta."""
        if self.model is None and getattr(chunk, "model", None):
            self.model = chunk.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return
        choice = choices[0]
        delta = getattr(choice, "delta", None)
        if delta is not None:
            self._delta(delta)
        if getattr(choice, "finish_reason", None):
            self.finish_reason = choice.finish_reason

    def _delta(self, delta: Any) -> None:
        text = getattr(delta, "content", None)
        if text is not None:
            self._content.append(self._bounds.text(text))
            self._on_text(text)
        for piece in getattr(delta, "tool_calls", None) or []:
            self._call_piece(piece)

    def _call_piece(self, piece: Any) -> None:
        index = self._bounds.call_index(getattr(piece, "index", None))
        call = self._calls.setdefault(index, _Call())
        if call.id is None and getattr(piece, "id", None):
            call.id = piece.id
        function = getattr(piece, "function", None)
        if function is None:
            return
        name = getattr(function, "name", None)
        if name:
            if call.name is not None and name != call.name:
                raise bad_response(
                    "The provider's stream was refused: one tool call was sent two names",
                    self._secret,
                )
            call.name = name
        if (arguments := getattr(function, "arguments", None)) is not None:
            call.arguments.append(self._bounds.arguments(arguments))

    def completion(self) -> Any:
        """The completion as the non-streamed call returns it (attribute access, as the SDK's
        objects); ``connection`` when the stream never said the answer was complete."""
        if not self.finish_reason:
            raise incomplete("no finish_reason")
        calls = [
            SimpleNamespace(
                id=call.id,
                function=SimpleNamespace(name=call.name, arguments="".join(call.arguments)),
            )
            for _, call in sorted(self._calls.items())
        ]
        message = SimpleNamespace(
            content="".join(self._content) if self._content else None, tool_calls=calls
        )
        return SimpleNamespace(
            choices=[SimpleNamespace(message=message, finish_reason=self.finish_reason)],
            model=self.model,
            usage=self.usage,
        )


def stream_chat(
    provider: OpenAIProvider,
    *,
    arguments: dict[str, Any],
    key: str,
    on_text: TextSink,
) -> Any:
    """One streamed ``chat.completions.create`` (``arguments`` as the non-streamed call's), read
    to its end: the completion it assembles to. SDK failures propagate for the caller to
    classify."""
    assembler = ChunkAssembler(on_text=on_text, secret=key)
    with openai.OpenAI(
        api_key=key,
        base_url=provider.base_url or None,
        timeout=provider.timeout_seconds,
        max_retries=0,
    ) as client:
        stream = client.chat.completions.create(
            **arguments, stream=True, stream_options={"include_usage": True}
        )
        with stream:
            for chunk in stream:
                assembler.add(chunk)
    return assembler.completion()
