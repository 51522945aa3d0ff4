"""The ``openai`` provider streamed against a real local chat-completions server speaking SSE as
the SDK reads it: the reply is the one ``complete`` returns, the text arrives in pieces, and a
hostile stream (cut, unfinished, malformed, enormous) ends in today's failure classes."""

from __future__ import annotations

import pytest

from agentruns.providers.base import UNPARSED_KEY, ErrorKind, ProviderError
from agentruns.providers.openai_compat import OpenAIProvider
from agentruns.providers.replies import MAX_CONTENT_CHARS, MAX_TOOL_CALLS
from agentruns.providers.streaming import can_stream
from tests.support.chat_server import ChatServer, completion
from tests.support.sse import chat_frames, chunk, data

KEY_ENV = "LEASEHOLD_TEST_STREAM_KEY"
KEY = "sk-stream-test-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "list_notes", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
def provider(chat_server: ChatServer, monkeypatch) -> OpenAIProvider:
    monkeypatch.setenv(KEY_ENV, KEY)
    return OpenAIProvider(
        model="test-model", base_url=chat_server.base_url, api_key_env=KEY_ENV, timeout_seconds=5
    )


def streamed(provider: OpenAIProvider) -> tuple[list[str], object]:
    pieces: list[str] = []
    try:
        reply = provider.stream(messages=MESSAGES, tools=TOOLS, run_uuid="r", on_text=pieces.append)
    except ProviderError as exc:
        return pieces, exc
    return pieces, reply


def test_a_streamed_reply_is_the_reply_complete_returns(chat_server, provider):
    answer = {
        "content": "Two notes: <b>groceries</b> & bills.",
        "tool_calls": [
            {"id": "call_a", "name": "list_notes", "arguments": {"q": "x" * 30}},
            {"id": "call_b", "name": "create_note", "arguments": '{"title": "t"}'},
        ],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30},
    }
    chat_server.reply(**answer)
    chat_server.reply(**answer)

    pieces, reply = streamed(provider)
    plain = provider.complete(messages=MESSAGES, tools=TOOLS, run_uuid="r")

    assert reply == plain
    assert len(pieces) > 5 and "".join(pieces) == answer["content"]
    streamed_request, plain_request = (r.body for r in chat_server.requests)
    assert streamed_request["stream"] is True
    assert streamed_request["stream_options"] == {"include_usage": True}
    assert {k: v for k, v in streamed_request.items() if not k.startswith("stream")} == (
        plain_request
    )


def test_the_provider_streams():
    assert can_stream(OpenAIProvider(model="m"))


def test_a_stream_cut_mid_way_is_a_retried_connection_failure(chat_server, provider):
    frames = chat_frames(completion(content="a long answer cut short"), {})
    chat_server.stream_raw(frames, drop_after=3)

    pieces, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.CONNECTION, True)
    assert pieces  # some text had arrived: it was never an answer


def test_a_stream_without_a_finish_reason_is_a_retried_connection_failure(chat_server, provider):
    body = completion(content="never finished")
    frames = [f for f in chat_frames(body, {}) if '"finish_reason": "stop"' not in f]
    chat_server.stream_raw(frames)

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.CONNECTION, True)
    assert "finish_reason" in str(error)


def test_a_chunk_that_is_not_json_is_bad_response(chat_server, provider):
    body = completion(content="fine so far")
    chat_server.stream_raw([chunk(body, {"content": "ok"}), 'data: {"choices": [\n\n'])

    _, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)


def test_malformed_argument_pieces_give_the_unparsed_call_complete_gives(chat_server, provider):
    answer = {"tool_calls": [{"id": "c", "name": "list_notes", "arguments": '{"a": 1,,'}]}
    chat_server.reply(**answer)
    chat_server.reply(**answer)

    _, reply = streamed(provider)
    plain = provider.complete(messages=MESSAGES, tools=TOOLS, run_uuid="r")

    assert reply == plain
    assert reply.tool_calls[0].arguments == {UNPARSED_KEY: '{"a": 1,,'}


def test_an_enormous_delta_is_bad_response_and_the_rest_is_not_read(chat_server, provider):
    body = completion(content="x")
    huge = chunk(body, {"content": "y" * (MAX_CONTENT_CHARS + 1)})
    chat_server.stream_raw([chunk(body, {"content": "start "}), huge, *chat_frames(body, {})])

    pieces, error = streamed(provider)

    assert isinstance(error, ProviderError)
    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)
    assert pieces == ["start "]  # the enormous piece was never handed on


def test_a_tool_call_index_out_of_range_or_renamed_is_bad_response(chat_server, provider):
    body = completion(content="x")
    far = {"tool_calls": [{"index": MAX_TOOL_CALLS, "id": "c", "function": {"name": "n"}}]}
    chat_server.stream_raw([chunk(body, far), chunk(body, {}, finish="tool_calls")])
    renamed = [
        chunk(body, {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "list_notes"}}]}),
        chunk(body, {"tool_calls": [{"index": 0, "function": {"name": "create_note"}}]}),
        chunk(body, {}, finish="tool_calls"),
        data("[DONE]"),
    ]
    chat_server.stream_raw(renamed)

    for _ in range(2):
        _, error = streamed(provider)
        assert isinstance(error, ProviderError)
        assert error.kind == ErrorKind.BAD_RESPONSE


def test_a_watcher_that_raises_never_breaks_the_call(chat_server, provider):
    chat_server.reply(content="all of it")

    def broken(piece: str) -> None:
        raise RuntimeError("the viewer broke")

    reply = provider.stream(messages=MESSAGES, tools=TOOLS, run_uuid="r", on_text=broken)

    assert reply.content == "all of it"


def test_an_error_status_before_the_stream_is_classed_as_the_plain_call_s(chat_server, provider):
    chat_server.fail(429, "slow down")
    chat_server.fail(401, "bad key")

    _, limited = streamed(provider)
    _, refused = streamed(provider)

    assert isinstance(limited, ProviderError) and isinstance(refused, ProviderError)
    assert (limited.kind, limited.retryable) == (ErrorKind.RATE_LIMITED, True)
    assert (refused.kind, refused.retryable) == (ErrorKind.AUTH, False)
    assert KEY not in str(limited) + str(refused)
