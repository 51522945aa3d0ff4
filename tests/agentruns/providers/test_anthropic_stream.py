"""The ``anthropic`` provider streamed against a real local Messages API server speaking the
``message_start`` … ``message_stop`` sequence the SDK reads: the reply is the one ``complete``
returns, and a hostile stream ends in today's failure classes, never a half answer."""

from __future__ import annotations

import pytest

from agentruns.providers.anthropic_messages import AnthropicProvider
from agentruns.providers.base import UNPARSED_KEY, ErrorKind, ProviderError
from agentruns.providers.replies import MAX_CONTENT_CHARS
from agentruns.providers.streaming import can_stream
from tests.support.messages_server import MessagesServer, message
from tests.support.sse import event, message_frames

KEY_ENV = "LEASEHOLD_TEST_ANTHROPIC_STREAM_KEY"
KEY = "sk-ant-stream-test-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "list_notes", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
def provider(messages_server: MessagesServer, monkeypatch) -> AnthropicProvider:
    monkeypatch.setenv(KEY_ENV, KEY)
    return AnthropicProvider(
        model="claude-test",
        base_url=messages_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
    )


def streamed(provider: AnthropicProvider) -> tuple[list[str], object]:
    pieces: list[str] = []
    try:
        reply = provider.stream(messages=MESSAGES, tools=TOOLS, run_uuid="r", on_text=pieces.append)
    except ProviderError as exc:
        return pieces, exc
    return pieces, reply


def tool_frames(input_json: str, *, stop_reason: str = "tool_use") -> list[str]:
    """A stream whose one ``tool_use`` block's input is ``input_json``, as sent."""
    body = message(text="calling", tool_uses=[{"name": "list_notes", "input": {}}])
    frames = message_frames(body, {})
    frames = [f for f in frames if "input_json_delta" not in f]
    at = next(i for i, f in enumerate(frames) if '"index": 1' in f and "content_block_stop" in f)
    delta = {"type": "input_json_delta", "partial_json": input_json}
    frames.insert(
        at,
        event("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta}),
    )
    return [
        f.replace('"stop_reason": "tool_use"', f'"stop_reason": "{stop_reason}"') for f in frames
    ]


def test_a_streamed_reply_is_the_reply_complete_returns(messages_server, provider):
    answer = {
        "text": "Two notes: <b>groceries</b> & bills.",
        "tool_uses": [{"id": "toolu_a", "name": "list_notes", "input": {"q": "x" * 30, "n": 2}}],
        "usage": {"input_tokens": 21, "output_tokens": 9, "cache_read_input_tokens": 4},
    }
    messages_server.reply(**answer)
    messages_server.reply(**answer)

    pieces, reply = streamed(provider)
    plain = provider.complete(messages=MESSAGES, tools=TOOLS, run_uuid="r")

    assert reply == plain
    assert len(pieces) > 5 and "".join(pieces) == answer["text"]
    assert messages_server.requests[0].body["stream"] is True
    assert "stream" not in messages_server.requests[1].body


def test_the_provider_streams():
    assert can_stream(AnthropicProvider(model="m"))


def test_a_stream_cut_mid_way_is_a_retried_connection_failure(messages_server, provider):
    frames = message_frames(message(text="a long answer cut short"), {})
    messages_server.stream_raw(frames, drop_after=4)

    pieces, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.CONNECTION, True)
    assert pieces


def test_a_stream_without_message_stop_is_never_an_answer(messages_server, provider):
    """The SDK would hand back its snapshot as the final message; Leasehold refuses it."""
    frames = message_frames(message(text="almost"), {})
    messages_server.stream_raw([f for f in frames if "message_stop" not in f])

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.CONNECTION, True)


@pytest.mark.parametrize(
    "input_json",
    ['{"a": 1,,}', '{"title": "half', "[1, 2]"],
    ids=["malformed", "truncated-object", "not-an-object"],
)
def test_tool_input_that_does_not_assemble_is_bad_response(messages_server, provider, input_json):
    """A truncated object would read as a smaller one in the SDK's partial parse: the pieces are
    parsed whole and strictly, so no call runs with half its arguments."""
    messages_server.stream_raw(tool_frames(input_json))

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)


def test_a_tool_use_sent_whole_in_its_start_keeps_its_input(messages_server, provider):
    body = message(tool_uses=[{"id": "toolu_w", "name": "list_notes", "input": {"q": "all"}}])
    frames = [f for f in message_frames(body, {}) if "input_json_delta" not in f]
    frames = [f.replace('"input": {}', '"input": {"q": "all"}') for f in frames]
    messages_server.stream_raw(frames)

    _, reply = streamed(provider)

    [call] = reply.tool_calls
    assert (call.id, call.arguments) == ("toolu_w", {"q": "all"})


def test_a_call_cut_off_at_max_tokens_is_unparsed_as_the_plain_call_s(messages_server, provider):
    messages_server.stream_raw(tool_frames('{"title": "ha', stop_reason="max_tokens"))

    _, reply = streamed(provider)

    [call] = reply.tool_calls
    assert UNPARSED_KEY in call.arguments and "max_tokens" in call.arguments[UNPARSED_KEY]


def test_an_overloaded_error_event_mid_stream_is_retried_as_a_529(messages_server, provider):
    frames = message_frames(message(text="starting well"), {})[:3]
    error_event = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    messages_server.stream_raw([*frames, event("error", error_event)])

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.SERVER_ERROR, True)
    assert "Overloaded" in str(error)


def test_an_enormous_delta_is_bad_response(messages_server, provider):
    frames = message_frames(message(text="x"), {})
    huge = {"type": "text_delta", "text": "y" * (MAX_CONTENT_CHARS + 1)}
    frames.insert(
        2, event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": huge})
    )
    messages_server.stream_raw(frames)

    pieces, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)
    assert all(len(p) < MAX_CONTENT_CHARS for p in pieces)


def test_a_delta_for_a_block_never_started_is_bad_response(messages_server, provider):
    frames = message_frames(message(text="x"), {})
    stray = {"type": "text_delta", "text": "nowhere"}
    frames.insert(
        2, event("content_block_delta", {"type": "content_block_delta", "index": 7, "delta": stray})
    )
    messages_server.stream_raw(frames)

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)


def test_events_out_of_order_are_bad_response(messages_server, provider):
    delta = {"type": "text_delta", "text": "before the start"}
    messages_server.stream_raw(
        [
            event(
                "content_block_delta", {"type": "content_block_delta", "index": 3, "delta": delta}
            ),
            *message_frames(message(text="x"), {}),
        ]
    )

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)
    assert "before message_start" in str(error)


def test_an_overloaded_529_before_the_stream_is_retried(messages_server, provider):
    messages_server.overloaded()

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable, error.status_code) == (ErrorKind.SERVER_ERROR, True, 529)
