"""Tokens while the model writes: a segment's provider call streamed to whoever watches the
segment, and nothing of it stored (docs/design.md §6.8).

A watcher (``TokenWatcher``) is attached to the code that runs a segment with ``watching``: the
playground's live view runs its segments in the web process, in the thread that reads this
context, so the segment it started sends the text of each streamed answer there as it arrives.
``ask`` is the segment's provider call: with a watcher in the context, ``STREAM_TOKENS`` on and
a provider that streams (``providers.streaming``) it streams, else it is ``complete`` as it
always was — a worker's segment, an API call and the reaper's continuation have no watcher and
send the request they always sent.

Tokens are ephemeral: no row, no event and no lease renewal per token; the answer is stored as
one ``llm`` event by the step that always stored it, from the reply the stream assembled, which
is the reply ``complete`` returns. A call that ends without an answer (an error, a cut stream, the
process dying) leaves the watcher with text that was never an answer: it is told so
(``end(answered=False)``), and the segment does what it does after a failed call (§7.1). A
watcher never slows the call: its methods must return at once, and a watcher that raises is
ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from agentruns.conf import app_settings
from agentruns.providers import Provider, ProviderReply
from agentruns.providers.streaming import StreamingProvider, can_stream

logger = logging.getLogger(__name__)


class TokenWatcher(Protocol):
    """Sees each streamed model call of the segments run in its context: ``begin`` when one
    starts, ``text`` with each piece of its answer, ``end`` when it returns (``answered``: a
    reply came back) or fails. Each must return at once (buffer, never wait)."""

    def begin(self) -> None: ...

    def text(self, piece: str) -> None: ...

    def end(self, *, answered: bool) -> None: ...


_watcher: ContextVar[TokenWatcher | None] = ContextVar("agentruns_token_watcher", default=None)


@contextmanager
def watching(watcher: TokenWatcher) -> Iterator[TokenWatcher]:
    """Send the tokens of the streamed model calls of segments run inside the block (in this
    thread or task) to ``watcher``."""
    token = _watcher.set(watcher)
    try:
        yield watcher
    finally:
        _watcher.reset(token)


def ask(
    provider: Provider,
    *,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    run_uuid: str,
) -> ProviderReply:
    """The provider's reply to one turn: streamed to the context's watcher when there is one,
    ``STREAM_TOKENS`` is on and the provider streams; else ``provider.complete``. Raises what
    the provider raises (``ProviderError``)."""
    watcher = _watcher.get()
    if watcher is None or not can_stream(provider) or not app_settings().stream_tokens:
        return provider.complete(messages=messages, tools=tools, run_uuid=run_uuid)
    assert isinstance(provider, StreamingProvider)
    _tell(watcher.begin)
    answered = False
    try:
        reply = provider.stream(
            messages=messages, tools=tools, run_uuid=run_uuid, on_text=watcher.text
        )
        answered = True
        return reply
    finally:
        _tell(lambda: watcher.end(answered=answered))


def _tell(call: Any) -> None:
    try:
        call()
    except Exception:
        logger.exception("a token watcher failed; the model call goes on without it")
