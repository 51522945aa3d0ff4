"""The ``anthropic`` provider against a real local Messages API server (``MessagesServer``): what
it sends, how it reads tool use, usage and stop reasons, and the class of every failure."""

from __future__ import annotations

import json

import pytest

from agentruns.models import AgentConfiguration
from agentruns.providers import provider_for
from agentruns.providers.anthropic_messages import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    AnthropicProvider,
    usage_counts,
)
from agentruns.providers.base import UNPARSED_KEY, ErrorKind, ProviderError, ToolCall
from agentruns.providers.replies import check_reply
from tests.support.chat_server import ScriptedResponse, unused_port
from tests.support.messages_server import MessagesServer, raw_message, tool_use

KEY_ENV = "LEASEHOLD_TEST_ANTHROPIC_KEY"
KEY = "sk-ant-test-0123456789abcdef"
RUN = "00000000-0000-0000-0000-000000000002"

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a thing up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
DIALOGUE = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def anthropic_config(base_url: str, **overrides) -> AgentConfiguration:
    fields = {
        "slug": "a",
        "provider": "anthropic",
        "model": "claude-test",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_seconds": 5,
    }
    return AgentConfiguration(**{**fields, **overrides})


def provider(server: MessagesServer, **overrides) -> AnthropicProvider:
    built = provider_for(anthropic_config(server.base_url, **overrides), {})
    assert isinstance(built, AnthropicProvider)
    return built


def complete(built, messages=None, tools=None):
    return built.complete(messages=messages or list(DIALOGUE), tools=tools or [], run_uuid=RUN)


def failure(built, messages=None, tools=None) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        complete(built, messages, tools)
    return caught.value


def test_a_tool_use_reply_becomes_calls_and_the_request_is_the_messages_api_s(messages_server):
    messages_server.reply(
        text="Let me look.",
        tool_uses=[{"id": "toolu_01", "name": "lookup", "input": {"q": "x"}}],
        usage={"input_tokens": 20, "output_tokens": 5},
    )

    reply = complete(provider(messages_server), tools=[LOOKUP])

    assert reply.content == "Let me look."
    assert reply.tool_calls == [ToolCall(id="toolu_01", name="lookup", arguments={"q": "x"})]
    assert reply.usage == {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
    assert reply.model == "claude-test"
    (request,) = messages_server.requests
    assert request.path == "/v1/messages"
    assert request.headers["anthropic-version"]
    assert KEY in request.headers.get("x-api-key", "") + request.headers.get("authorization", "")
    assert request.body == {
        "model": "claude-test",
        "max_tokens": DEFAULT_MAX_OUTPUT_TOKENS,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [
            {
                "name": "lookup",
                "description": "Look a thing up.",
                "input_schema": LOOKUP["function"]["parameters"],
            }
        ],
    }


def test_tool_results_go_back_as_tool_result_blocks_keyed_by_the_tool_use_id(messages_server):
    messages_server.reply(text="Found it.")
    dialogue = [
        *DIALOGUE,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "toolu_01", "function": {"name": "lookup", "arguments": '{"q": "x"}'}},
                {"id": "toolu_02", "function": {"name": "lookup", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": '{"found": 1}'},
        {"role": "tool", "tool_call_id": "toolu_02", "content": '{"error": "no"}'},
    ]

    reply = complete(provider(messages_server, max_output_tokens=300), dialogue, [LOOKUP])

    assert (reply.content, reply.tool_calls) == ("Found it.", [])
    body = messages_server.requests[0].body
    assert body["max_tokens"] == 300
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"q": "x"}},
                {"type": "tool_use", "id": "toolu_02", "name": "lookup", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": '{"found": 1}'},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": '{"error": "no"}'},
            ],
        },
    ]


def test_the_final_call_declares_the_tools_the_dialogue_used_and_forbids_calls(messages_server):
    """The API refuses tool blocks without tools: the final call (offered none) declares the
    ones used, with ``tool_choice`` ``none``."""
    messages_server.reply(text="Summary.")
    dialogue = [
        *DIALOGUE,
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"id": "call_1~2", "function": {"name": "lookup", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1~2", "content": "{}"},
    ]

    assert complete(provider(messages_server), dialogue, tools=[]).content == "Summary."

    body = messages_server.requests[0].body
    assert body["tools"] == [{"name": "lookup", "input_schema": {"type": "object"}}]
    assert body["tool_choice"] == {"type": "none"}
    # An id the API would refuse (Leasehold's "~") is sent as one it takes, paired the same way.
    used = body["messages"][1]["content"][1]["id"]
    assert used.startswith("lh_") and body["messages"][2]["content"][0]["tool_use_id"] == used


def test_cache_tokens_count_as_prompt_tokens():
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1000,
        "output_tokens": 5,
    }
    assert usage_counts(usage) == {
        "prompt_tokens": 1110,
        "completion_tokens": 5,
        "total_tokens": 1115,
    }
    assert usage_counts(None) == {}
    # What is not a count is passed on as it is, for check_reply to refuse.
    assert usage_counts({"input_tokens": 3, "cache_read_input_tokens": "many"}) == {
        "prompt_tokens": "many"
    }


def test_text_blocks_are_joined_and_thinking_is_not_read(messages_server):
    messages_server.reply_raw(
        raw_message(
            content='[{"type": "thinking", "thinking": "secret plan", "signature": "s"}, '
            '{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]'
        )
    )

    assert complete(provider(messages_server)).content == "one\n\ntwo"


# -- stop reasons ----------------------------------------------------------------------------


def test_a_refusal_is_a_refused_error_and_nothing_of_the_reply_is_kept(messages_server):
    messages_server.reply(
        text="Sure, here is how to",
        tool_uses=[{"name": "lookup", "input": {"q": "x"}}],
        stop_reason="refusal",
        stop_details={"type": "refusal", "category": "cyber", "explanation": "Not this."},
    )

    error = failure(provider(messages_server), tools=[LOOKUP])

    assert (error.kind, error.retryable) == (ErrorKind.REFUSED, False)
    assert "refused to answer (stop_reason refusal): cyber — Not this." in str(error)
    assert "Sure, here is how to" not in str(error)


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
def test_a_tool_use_cut_off_at_the_limit_never_carries_its_partial_arguments(
    messages_server, reason
):
    messages_server.reply(
        tool_uses=[
            {"id": "toolu_a", "name": "lookup", "input": {"q": "complete"}},
            {"id": "toolu_b", "name": "lookup", "input": {"q": "cut"}},
        ],
        stop_reason=reason,
    )

    reply = complete(provider(messages_server), tools=[LOOKUP])

    first, cut = reply.tool_calls
    assert first.arguments == {"q": "complete"}  # finished before the cut: read as sent
    assert cut.arguments == {
        UNPARSED_KEY: f"the answer was cut off (stop_reason {reason}) "
        "before this call's arguments ended"
    }


def test_text_cut_off_at_max_tokens_is_the_answer_as_far_as_it_went(messages_server):
    messages_server.reply(text="The answer is", stop_reason="max_tokens")
    assert complete(provider(messages_server)).content == "The answer is"


@pytest.mark.parametrize("reason", ['"pause_turn"', '"something_new"', '{"x": 1}', "7"])
def test_a_stop_reason_leasehold_does_not_act_on_is_bad_response(messages_server, reason):
    messages_server.reply_raw(raw_message(stop_reason=reason))

    error = failure(provider(messages_server))

    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)
    assert "stopped for a reason Leasehold does not act on" in str(error)


def test_a_block_leasehold_never_asks_for_is_bad_response(messages_server):
    messages_server.reply_raw(
        raw_message(
            content='[{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", '
            '"input": {}}]'
        )
    )
    error = failure(provider(messages_server))
    assert error.kind == ErrorKind.BAD_RESPONSE
    assert "'server_tool_use' block" in str(error)


# -- failures and their classes ----------------------------------------------------------------


def test_overloaded_529_is_a_retryable_server_error(messages_server):
    messages_server.overloaded()

    error = failure(provider(messages_server))

    assert (error.kind, error.retryable, error.status_code) == (
        ErrorKind.SERVER_ERROR,
        True,
        529,
    )
    assert str(error) == "The provider answered HTTP 529: Overloaded"
    assert len(messages_server.requests) == 1  # no retry inside the SDK


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (429, ErrorKind.RATE_LIMITED, True),
        (500, ErrorKind.SERVER_ERROR, True),
        (401, ErrorKind.AUTH, False),
        (400, ErrorKind.BAD_REQUEST, False),
        (413, ErrorKind.UNKNOWN, False),
    ],
)
def test_error_statuses_fall_into_the_openai_provider_s_classes(
    messages_server, status, kind, retryable
):
    messages_server.fail(status, f"scripted {status} for {KEY}")

    error = failure(provider(messages_server))

    assert (error.kind, error.retryable, error.status_code) == (kind, retryable, status)
    assert KEY not in str(error) and "[redacted]" in str(error)


def test_a_request_the_api_would_refuse_is_a_bad_request(messages_server):
    # A dialogue ending with a call that has no result: the server refuses it as the API does.
    dialogue = [
        *DIALOGUE,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "function": {}}]},
    ]
    error = failure(provider(messages_server), dialogue, [LOOKUP])
    assert (error.kind, error.status_code) == (ErrorKind.BAD_REQUEST, 400)
    assert "without results" in str(error)


def test_a_timeout_is_retryable(messages_server):
    messages_server.enqueue(ScriptedResponse(body={"late": True}, delay=30))

    error = failure(provider(messages_server, timeout_seconds=1))

    assert (error.kind, error.retryable) == (ErrorKind.TIMEOUT, True)


def test_a_connection_refused_is_retryable():
    built = provider_for(anthropic_config(f"http://127.0.0.1:{unused_port()}"), {})
    error = failure(built)
    assert (error.kind, error.retryable) == (ErrorKind.CONNECTION, True)


@pytest.mark.parametrize(
    "body",
    [
        b'{"content": [',
        b"[1, 2]",
        b'"a message"',
        raw_message(content='"not blocks"').encode(),
        raw_message(content='[{"type": "text", "text": "a\xffb"}]').encode("latin-1"),
        raw_message(content="[" * 5000 + "]" * 5000).encode(),
    ],
    ids=["not-json", "a-list", "a-string", "content-not-a-list", "not-utf8", "too-deep"],
)
def test_a_200_whose_body_is_not_a_message_is_bad_response(messages_server, body):
    messages_server.reply_raw(body)

    error = failure(provider(messages_server))

    assert (error.kind, error.retryable) == (ErrorKind.BAD_RESPONSE, False)
    assert "not a valid message" in str(error)


def test_hostile_values_pass_through_to_check_reply_which_refuses_them(messages_server):
    messages_server.reply_raw(
        raw_message(
            content="[" + tool_use('"probe_write"', '{"value": NaN}') + "]",
            usage='{"input_tokens": 1e999, "output_tokens": 7}',
            stop_reason='"tool_use"',
        )
    )
    reply = complete(provider(messages_server))
    with pytest.raises(ProviderError) as caught:
        check_reply(reply)
    assert caught.value.kind == ErrorKind.BAD_RESPONSE
    assert "is not a finite number (nan" in str(caught.value)


# -- the key ---------------------------------------------------------------------------------


def test_the_key_comes_only_from_the_named_variable(messages_server, monkeypatch):
    """Never the SDK's own fallbacks: with the named variable unset, no request is sent even
    though ``ANTHROPIC_API_KEY`` is set."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-process-wide")
    monkeypatch.delenv(KEY_ENV)

    error = failure(provider(messages_server))

    assert (error.kind, error.retryable) == (ErrorKind.AUTH, False)
    assert messages_server.requests == []


def test_a_refused_variable_name_is_a_configuration_error_before_any_request(
    messages_server, monkeypatch
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-process-wide")

    error = failure(provider(messages_server, api_key_env="ANTHROPIC_API_KEY"))

    assert (error.kind, error.retryable) == (ErrorKind.CONFIGURATION, False)
    assert "sk-ant-process-wide" not in str(error)
    assert messages_server.requests == []


def test_no_model_is_a_configuration_error(messages_server):
    error = failure(provider(messages_server, model=""))
    assert error.kind == ErrorKind.CONFIGURATION
    assert messages_server.requests == []


def test_the_reply_s_model_falls_back_to_the_configured_one(messages_server):
    messages_server.reply_raw(raw_message(model="null"))
    assert complete(provider(messages_server)).model == "claude-test"
    assert json.loads(raw_message())["model"] == "claude-test"
