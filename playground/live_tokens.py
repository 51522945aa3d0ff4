"""The live view's tokens: what a streamed model call wrote so far, handed from the segment's
thread to the response's without ever making the segment wait (docs/design.md §6.8).

``LiveTokens`` is the ``token_stream.TokenWatcher`` of one ``RunStream``. It puts ``TokenBatch``
items into the stream's queue, in order with the steps: a batch opens with each call
(``begin``), the text that arrives while the response has not taken that batch yet is added to
it, and the next piece after the response took it opens a new one. So however slow the browser,
a call has at most one batch growing, and a batch holds at most ``MAX_BATCH_CHARS`` characters:
what passes that is counted (``dropped``), not kept, and the stored answer, which the next step
line shows, has it all. Nothing here is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The most text one batch keeps for a browser that has not read it yet.
MAX_BATCH_CHARS = 32_768

#: How a call ended, as a ``tokens`` line says it: a reply came back, or none did.
ANSWERED, FAILED = "answered", "failed"


@dataclass
class TokenBatch:
    """Text of call number ``call`` not yet sent to the browser; ``start``: the call's first
    batch; ``end``: how the call ended, when it did before the batch was sent."""

    call: int
    start: bool = False
    pieces: list[str] = field(default_factory=list)
    chars: int = 0
    dropped: int = 0
    end: str = ""
    taken: bool = False


class LiveTokens:
    """A token watcher that queues ``TokenBatch`` items with ``put`` (never blocking); the
    response reads each with ``take``."""

    def __init__(self, put: Callable[[TokenBatch], None]) -> None:
        self._put = put
        self._lock = threading.Lock()
        self._calls = 0
        self._open: TokenBatch | None = None

    # -- the segment's side (token_stream.TokenWatcher) ------------------------------------------

    def begin(self) -> None:
        with self._lock:
            self._calls += 1
            self._open = TokenBatch(call=self._calls, start=True)
            self._put(self._open)

    def text(self, piece: str) -> None:
        with self._lock:
            batch = self._batch()
            room = MAX_BATCH_CHARS - batch.chars
            kept = piece[: max(room, 0)]
            if kept:
                batch.pieces.append(kept)
                batch.chars += len(kept)
            batch.dropped += len(piece) - len(kept)

    def end(self, *, answered: bool) -> None:
        with self._lock:
            self._batch().end = ANSWERED if answered else FAILED

    def _batch(self) -> TokenBatch:
        """The call's batch the response has not taken yet (a new one, queued, if it took the
        last). Called under the lock."""
        if self._open is None or self._open.taken:
            self._open = TokenBatch(call=self._calls)
            self._put(self._open)
        return self._open

    # -- the response's side -------------------------------------------------------------------

    def take(self, batch: TokenBatch) -> dict[str, Any]:
        """``batch`` as a ``tokens`` line's fields; text arriving from now on goes to a new one."""
        with self._lock:
            batch.taken = True
            line: dict[str, Any] = {"call": batch.call, "text": "".join(batch.pieces)}
            if batch.start:
                line["start"] = True
            if batch.dropped:
                line["dropped"] = batch.dropped
            if batch.end:
                line["end"] = batch.end
            return line
