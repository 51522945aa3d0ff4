"""``LiveTokens``: a streamed call's text handed to the response in order with the steps,
bounded, and never making the segment wait for a slow browser."""

from __future__ import annotations

import queue
import time

from playground.live_tokens import MAX_BATCH_CHARS, LiveTokens, TokenBatch


def drain(q: queue.Queue, tokens: LiveTokens) -> list[dict]:
    out = []
    while not q.empty():
        item = q.get_nowait()
        out.append(tokens.take(item) if isinstance(item, TokenBatch) else item)
    return out


def test_text_arriving_before_the_browser_reads_joins_one_batch_and_after_opens_another():
    q: queue.Queue = queue.Queue()
    tokens = LiveTokens(q.put)
    tokens.begin()
    tokens.text("Hel")
    tokens.text("lo")
    first = drain(q, tokens)
    tokens.text(", world")
    tokens.end(answered=True)
    q.put("step: llm")
    tokens.begin()
    tokens.end(answered=False)

    assert first == [{"call": 1, "start": True, "text": "Hello"}]
    assert drain(q, tokens) == [
        {"call": 1, "text": ", world", "end": "answered"},
        "step: llm",
        {"call": 2, "start": True, "text": "", "end": "failed"},
    ]


def test_a_browser_that_never_reads_holds_at_most_one_bounded_batch_per_call():
    q: queue.Queue = queue.Queue()
    tokens = LiveTokens(q.put)
    tokens.begin()
    piece = "x" * 1000
    started = time.monotonic()
    for _ in range(10_000):  # 10 MB of text, nobody reading
        tokens.text(piece)
    tokens.end(answered=True)
    elapsed = time.monotonic() - started

    [line] = drain(q, tokens)
    assert len(line["text"]) == MAX_BATCH_CHARS
    assert line["dropped"] == 10_000 * 1000 - MAX_BATCH_CHARS
    assert line["end"] == "answered"
    print(f"10 000 pieces of 1000 characters, unread: {elapsed * 1e6 / 10_000:.1f} µs a piece")
