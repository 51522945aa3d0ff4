"""Streamed model calls: what a provider that streams shares (docs/design.md §6.8).

A provider that can stream has, beside ``complete``, a ``stream`` method taking the same
arguments and ``on_text``, a callable it hands each piece of the answer's text to as it arrives.
``stream`` returns what ``complete`` would have returned for the same answer (the same
``ProviderReply``: content, tool calls, usage, model), assembled from the pieces, and raises
``ProviderError`` in the same classes. Tool-call arguments arrive in pieces too: they are only
assembled, never shown or acted on before the answer is complete, and an answer that never
completes is no answer at all:

* a stream that ends before the provider said the answer is complete (a dropped connection, no
  final chunk) is ``connection`` (retried, as a call cut off before its answer is);
* more text, more tool calls or more argument text than ``providers.replies`` lets a reply hold
  is ``bad_response`` as soon as the stream passes it (the rest is never read);
* a stream that is not the protocol (malformed JSON, events out of order) is ``bad_response``.

``on_text`` belongs to whoever watches the call (``services.runtime.token_stream``); it must not
block and never raises into the provider.

Free of Django and of any SDK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from agentruns.providers.base import ErrorKind, ProviderError, ProviderReply
from agentruns.providers.replies import MAX_ARGUMENTS_CHARS, MAX_CONTENT_CHARS, MAX_TOOL_CALLS
from agentruns.providers.wire import bad_response

#: Receives each piece of an answer's text as it arrives.
TextSink = Callable[[str], None]


@runtime_checkable
class StreamingProvider(Protocol):
    def stream(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        run_uuid: str,
        on_text: TextSink,
    ) -> ProviderReply:
        """``complete``, with each piece of the answer's text handed to ``on_text`` as it
        arrives; the reply is the one ``complete`` would return for the same answer."""
        ...


def can_stream(provider: object) -> bool:
    """Whether ``provider`` streams (has a ``stream`` method)."""
    return isinstance(provider, StreamingProvider)


def incomplete(what: str) -> ProviderError:
    """A stream that ended before its answer did: retried like a dropped connection."""
    return ProviderError(
        f"The provider's stream ended before the answer was complete ({what}).",
        kind=ErrorKind.CONNECTION,
        retryable=True,
    )


class StreamBounds:
    """Counts what a stream has sent so far and refuses (``bad_response``) the piece that takes
    it past what one reply may hold (``providers.replies``): text, tool calls, argument text.
    A refused stream is not read further."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret
        self.content_chars = 0
        self.argument_chars = 0

    def text(self, piece: Any) -> str:
        """``piece`` of the answer's text, counted; a piece that is not text is refused."""
        if not isinstance(piece, str):
            raise bad_response(
                f"The provider's stream was refused: a text piece is {type(piece).__name__}",
                self._secret,
            )
        self.content_chars += len(piece)
        if self.content_chars > MAX_CONTENT_CHARS:
            raise bad_response(
                f"The provider's stream was refused: its text passed {MAX_CONTENT_CHARS} "
                "characters",
                self._secret,
            )
        return piece

    def arguments(self, piece: Any) -> str:
        """``piece`` of a tool call's argument text, counted over all the reply's calls."""
        if not isinstance(piece, str):
            raise bad_response(
                f"The provider's stream was refused: an argument piece is {type(piece).__name__}",
                self._secret,
            )
        self.argument_chars += len(piece)
        if self.argument_chars > MAX_ARGUMENTS_CHARS:
            raise bad_response(
                "The provider's stream was refused: its tool calls' arguments passed "
                f"{MAX_ARGUMENTS_CHARS} characters",
                self._secret,
            )
        return piece

    def call_index(self, index: Any) -> int:
        """A tool call's position in the reply: an integer from 0 below ``MAX_TOOL_CALLS``."""
        if type(index) is not int or not 0 <= index < MAX_TOOL_CALLS:
            raise bad_response(
                f"The provider's stream was refused: a tool call's index is {index!r:.40}",
                self._secret,
            )
        return index


def safe_sink(on_text: TextSink) -> TextSink:
    """``on_text`` that never raises an ``Exception`` into the provider (a watcher's fault is
    not the call's); a ``BaseException`` (the process going away) passes."""

    def send(piece: str) -> None:
        if not piece:
            return
        with contextlib.suppress(Exception):  # the watcher's fault; the answer goes on
            on_text(piece)

    return send
