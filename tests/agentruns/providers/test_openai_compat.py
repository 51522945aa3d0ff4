"""Providers: the scripted player and the OpenAI-compatible client against a real local server."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import pytest

from agentruns.exceptions import SecretEnvRefused
from agentruns.models import AgentConfiguration
from agentruns.providers import provider_for
from agentruns.providers.base import (
    UNPARSED_KEY,
    ErrorKind,
    ProviderError,
    ProviderReply,
    ToolCall,
)
from agentruns.providers.openai_compat import OpenAIProvider
from agentruns.providers.scripted import ScriptedProvider
from tests.support.chat_server import ChatServer, ScriptedResponse, unused_port

KEY_ENV = "LEASEHOLD_TEST_PROVIDER_KEY"
KEY = "sk-test-0123456789abcdef"
RUN = "00000000-0000-0000-0000-000000000001"

SCRIPT = [
    {"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}}, {"name": "noop"}]},
    {"content": "done"},
]


@pytest.fixture(autouse=True)
def _clear_recordings():
    ScriptedProvider.clear_recordings()
    yield
    ScriptedProvider.clear_recordings()


def scripted_config(script: list | None = None) -> AgentConfiguration:
    return AgentConfiguration(slug="s", provider="scripted", model="", script=script or SCRIPT)


def openai_config(base_url: str, **overrides) -> AgentConfiguration:
    fields = {
        "slug": "o",
        "provider": "openai",
        "model": "test-model",
        "base_url": base_url,
        "api_key_env": KEY_ENV,
        "timeout_seconds": 5,
    }
    return AgentConfiguration(**{**fields, **overrides})


def dialogue(*assistant_turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    for _ in range(sum(assistant_turns)):
        messages.append({"role": "assistant", "content": "..."})
        messages.append({"role": "user", "content": "more"})
    return messages


def complete(provider, messages, tools=None, run_uuid=RUN) -> ProviderReply:
    return provider.complete(messages=messages, tools=tools or [], run_uuid=run_uuid)


# -- scripted ----------------------------------------------------------------------------------


def test_scripted_plays_the_turn_given_by_the_assistant_count():
    provider = provider_for(scripted_config(), {})

    first = complete(provider, dialogue(0))
    second = complete(provider, dialogue(1))

    assert first.content == ""
    assert first.tool_calls == [
        ToolCall(id="call_0_0", name="lookup", arguments={"q": "x"}),
        ToolCall(id="call_0_1", name="noop", arguments={}),
    ]
    assert second.content == "done"
    assert second.tool_calls == []
    assert first.model == "scripted"


def test_scripted_is_stateless_a_fresh_instance_plays_the_same_turn():
    again = provider_for(scripted_config(), {})
    assert complete(again, dialogue(1)).content == "done"
    assert complete(again, dialogue(1)).content == "done"
    assert [call.id for call in complete(again, dialogue(0)).tool_calls] == [
        "call_0_0",
        "call_0_1",
    ]


def test_scripted_estimates_usage_deterministically_unless_given():
    provider = provider_for(scripted_config([{"content": "a"}, {"content": "b", "usage": {}}]), {})
    estimated = complete(provider, dialogue(0)).usage
    assert estimated == complete(provider, dialogue(0)).usage
    assert estimated["prompt_tokens"] > 0
    assert estimated["completion_tokens"] > 0
    assert estimated["total_tokens"] == estimated["prompt_tokens"] + estimated["completion_tokens"]

    given = provider_for(
        scripted_config([{"content": "a", "usage": {"prompt_tokens": 3, "completion_tokens": 4}}]),
        {},
    )
    assert complete(given, dialogue(0)).usage == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }


def test_scripted_checks_its_script_once_per_provider():
    """A provider lives for one segment: a malformed script is refused on every call, a
    well-formed one is checked on the first call only."""
    malformed = provider_for(scripted_config([{"content": 1}]), {})
    for _ in range(2):
        with pytest.raises(ProviderError) as caught:
            complete(malformed, dialogue(0))
        assert caught.value.kind == ErrorKind.SCRIPT_INVALID
    provider = provider_for(scripted_config([dict(turn) for turn in SCRIPT]), {})
    complete(provider, dialogue(0))
    provider.script.append({"content": 2})  # no longer well-formed, but already checked
    assert complete(provider, dialogue(1)).content == "done"


def test_scripted_running_out_of_turns_is_a_fatal_provider_error():
    provider = provider_for(scripted_config(), {})
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(2))
    assert caught.value.kind == ErrorKind.SCRIPT_EXHAUSTED == "script_exhausted"
    assert caught.value.retryable is False


def test_scripted_records_deep_copies_of_what_it_was_sent_per_run(scripted_recordings):
    provider = provider_for(scripted_config(), {})
    messages = dialogue(0)
    complete(provider, messages)
    messages.append({"role": "assistant", "content": "mutated later"})
    complete(provider, dialogue(1), run_uuid="other-run")

    assert ScriptedProvider.recordings[RUN] == [dialogue(0)]
    assert ScriptedProvider.recorded(RUN) == [dialogue(0)]
    assert ScriptedProvider.recorded("other-run") == [dialogue(1)]

    ScriptedProvider.clear_recordings("other-run")
    assert ScriptedProvider.recorded("other-run") == []
    assert ScriptedProvider.recorded(RUN) == [dialogue(0)]


def test_scripted_recording_is_thread_safe(scripted_recordings):
    provider = provider_for(scripted_config([{"content": "x"}]), {})

    def call() -> None:
        for _ in range(50):
            complete(provider, dialogue(0))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ScriptedProvider.recorded(RUN)) == 400


def test_scripted_keeps_nothing_of_a_dialogue_unless_a_test_records(monkeypatch):
    provider = ScriptedProvider(script=[{"content": "ok"}])
    complete(provider, [{"role": "user", "content": "x" * 1000}], run_uuid="warm-up")
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for run in range(20):  # twenty distinct 1 MB prompts: 20 MB if any were kept
            prompt = f"run {run}: " + "x" * 1_000_000
            complete(provider, [{"role": "user", "content": prompt}], run_uuid=f"run-{run}")
        del prompt
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 1_000_000
    assert ScriptedProvider.recordings == {}
    assert ScriptedProvider.recorded("run-3") == []


def test_recording_is_bounded_by_runs_and_by_calls(scripted_recordings, monkeypatch):
    monkeypatch.setattr(ScriptedProvider, "MAX_RECORDED_RUNS", 3)
    monkeypatch.setattr(ScriptedProvider, "MAX_RECORDED_CALLS", 2)
    provider = ScriptedProvider(script=[{"content": "ok"}])
    for run in range(5):
        for _ in range(4):
            complete(provider, dialogue(0), run_uuid=f"run-{run}")
    assert list(ScriptedProvider.recordings) == ["run-2", "run-3", "run-4"]
    assert all(len(calls) == 2 for calls in ScriptedProvider.recordings.values())
    with ScriptedProvider.recording():
        pass  # a block clears what was recorded when it starts and when it ends
    assert ScriptedProvider.recordings == {}


def test_attempt_counts_are_kept_for_error_turns_only_and_bounded(monkeypatch):
    monkeypatch.setattr(ScriptedProvider, "MAX_COUNTED_TURNS", 2)
    flaky = ScriptedProvider(script=[{"error": "retryable", "times": 1, "content": "fine"}])
    for run in ("a", "b", "c"):
        with pytest.raises(ProviderError):
            complete(flaky, dialogue(0), run_uuid=run)
        assert complete(flaky, dialogue(0), run_uuid=run).content == "fine"
    for run in range(10):
        complete(ScriptedProvider(script=[{"content": "plain"}]), dialogue(0), run_uuid=f"p{run}")
    assert list(ScriptedProvider._attempts) == [("b", 0), ("c", 0)]


def test_the_request_script_overrides_the_configuration_script():
    configuration = scripted_config()
    provider = provider_for(configuration, {"script": [{"content": "from the request"}]})
    assert complete(provider, dialogue(0)).content == "from the request"

    for absent in ({}, {"script": None}, {"script": []}):
        fallback = provider_for(configuration, absent)
        assert complete(fallback, dialogue(0)).tool_calls[0].name == "lookup"


@pytest.mark.parametrize(
    "script",
    [
        {"content": "not a list"},
        ["just a string"],
        [{}],
        [{"content": 3}],
        [{"contents": "typo"}],
        [{"tool_calls": []}],
        [{"tool_calls": [{"arguments": {}}]}],
        [{"tool_calls": [{"name": "t", "arguments": "{}"}]}],
        [{"content": "x", "delay": -1}],
        [{"content": "x", "error": "sometimes"}],
        [{"content": "x", "times": 2}],
        [{"content": "x", "usage": {"prompt_tokens": "many"}}],
        [{"branches": []}],
        [{"branches": [{"content": "x"}], "content": "y"}],
        [{"branches": [{"when": "maybe", "content": "x"}]}],
        [{"branches": [{"when": [], "content": "x"}]}],
        [{"branches": [{"when": "ok"}]}],
        [{"branches": [{"branches": [{"content": "x"}]}]}],
    ],
)
def test_a_malformed_script_is_a_clear_fatal_error(script):
    provider = ScriptedProvider(script=script)
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert caught.value.kind == ErrorKind.SCRIPT_INVALID
    assert caught.value.retryable is False
    assert str(caught.value).startswith("Malformed script:")


def test_scripted_error_turns_raise_their_class():
    retryable = ScriptedProvider(script=[{"error": "retryable"}])
    fatal = ScriptedProvider(script=[{"error": "fatal"}])
    with pytest.raises(ProviderError) as caught:
        complete(retryable, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.SCRIPTED, True)
    with pytest.raises(ProviderError) as caught:
        complete(fatal, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.SCRIPTED, False)


def test_scripted_error_with_times_fails_that_many_attempts_then_answers():
    provider = ScriptedProvider(
        script=[{"content": "a"}, {"error": "retryable", "times": 2, "content": "recovered"}]
    )
    for _ in range(2):
        with pytest.raises(ProviderError):
            complete(provider, dialogue(1))
    assert complete(provider, dialogue(1)).content == "recovered"
    assert complete(provider, dialogue(0)).content == "a"


def test_scripted_delay_sleeps_before_answering():
    provider = ScriptedProvider(script=[{"content": "slow", "delay": 0.2}])
    started = time.monotonic()
    assert complete(provider, dialogue(0)).content == "slow"
    assert time.monotonic() - started >= 0.2


def test_reply_as_message_is_an_openai_assistant_message():
    reply = complete(provider_for(scripted_config(), {}), dialogue(0))
    message = reply.as_message()
    assert message["role"] == "assistant"
    assert message["tool_calls"][0] == {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
    }


def test_an_unknown_provider_name_is_a_configuration_error():
    with pytest.raises(ProviderError) as caught:
        provider_for(AgentConfiguration(provider="carrier-pigeon"), {})
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.CONFIGURATION, False)


# -- openai-compatible, against a real local server --------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def test_openai_completes_a_tool_calling_exchange(chat_server: ChatServer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    chat_server.reply(
        tool_calls=[
            {"id": "call_abc", "name": "lookup", "arguments": {"q": "weather"}},
            {"id": "call_def", "name": "lookup", "arguments": "{not json"},
            {"id": "call_ghi", "name": "lookup", "arguments": ""},
        ],
        usage={"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
    )
    chat_server.reply(content="It is sunny.")
    provider = provider_for(openai_config(chat_server.base_url), {})
    assert isinstance(provider, OpenAIProvider)

    first = complete(provider, dialogue(0), tools=TOOLS)
    assert first.content == ""
    assert first.tool_calls == [
        ToolCall(id="call_abc", name="lookup", arguments={"q": "weather"}),
        ToolCall(id="call_def", name="lookup", arguments={UNPARSED_KEY: "{not json"}),
        ToolCall(id="call_ghi", name="lookup", arguments={}),
    ]
    assert first.usage == {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
    assert first.model == "test-model"

    follow_up = [
        *dialogue(0),
        first.as_message(),
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
    ]
    second = complete(provider, follow_up)
    assert second.content == "It is sunny."
    assert second.tool_calls == []

    sent_first, sent_second = chat_server.requests
    assert sent_first.method == "POST"
    assert sent_first.path == "/v1/chat/completions"
    assert sent_first.headers["authorization"] == f"Bearer {KEY}"
    assert sent_first.body["model"] == "test-model"
    assert sent_first.body["messages"] == dialogue(0)
    assert sent_first.body["tools"] == TOOLS
    assert "tools" not in sent_second.body  # omitted when empty
    assert sent_second.body["messages"][2]["tool_calls"][0]["id"] == "call_abc"
    assert sent_second.body["messages"][3]["tool_call_id"] == "call_abc"


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (500, ErrorKind.SERVER_ERROR, True),
        (503, ErrorKind.SERVER_ERROR, True),
        (429, ErrorKind.RATE_LIMITED, True),
        (401, ErrorKind.AUTH, False),
        (403, ErrorKind.AUTH, False),
        (400, ErrorKind.BAD_REQUEST, False),
        (404, ErrorKind.BAD_REQUEST, False),
        (422, ErrorKind.BAD_REQUEST, False),
        (402, ErrorKind.UNKNOWN, False),
    ],
)
def test_openai_classifies_http_failures(
    chat_server: ChatServer, monkeypatch, status, kind, retryable
):
    monkeypatch.setenv(KEY_ENV, KEY)
    chat_server.fail(status, f"nope, your key {KEY} is wrong")
    provider = provider_for(openai_config(chat_server.base_url), {})

    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))

    error = caught.value
    assert (error.kind, error.retryable, error.status_code) == (kind, retryable, status)
    assert KEY not in str(error)
    assert str(status) in str(error)
    assert len(chat_server.requests) == 1  # no SDK retries: retries are ours


def test_openai_connection_refused_is_retryable(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    provider = provider_for(openai_config(f"http://127.0.0.1:{unused_port()}/v1"), {})
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.CONNECTION, True)
    assert KEY not in str(caught.value)


def test_openai_timeout_is_retryable(chat_server: ChatServer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    chat_server.enqueue(ScriptedResponse(body={"late": True}, delay=5))
    provider = OpenAIProvider(
        model="test-model", base_url=chat_server.base_url, api_key_env=KEY_ENV, timeout_seconds=0.3
    )
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert time.monotonic() - started < 3
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.TIMEOUT, True)


def test_openai_configuration_timeout_is_used(chat_server: ChatServer, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    chat_server.enqueue(ScriptedResponse(body={"late": True}, delay=5))
    provider = provider_for(openai_config(chat_server.base_url, timeout_seconds=1), {})
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert 0.9 <= time.monotonic() - started < 4
    assert caught.value.kind == ErrorKind.TIMEOUT


def test_openai_missing_key_variable_is_a_fatal_auth_error(chat_server: ChatServer, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    provider = provider_for(openai_config(chat_server.base_url), {})
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.AUTH, False)
    assert KEY_ENV in str(caught.value)
    assert chat_server.requests == []  # nothing was sent

    blank = provider_for(openai_config(chat_server.base_url, api_key_env=""), {})
    with pytest.raises(ProviderError) as caught:
        complete(blank, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.AUTH, False)


@pytest.mark.parametrize("variable", ["DJANGO_SECRET_KEY", "OPENAI_API_KEY", "lower_case"])
def test_openai_key_variable_outside_the_allowlist_sends_nothing(
    chat_server: ChatServer, monkeypatch, variable: str
):
    monkeypatch.setenv(variable, "the-process-secret")
    chat_server.reply(content="never asked")
    # Built without model validation, as a row written around the admin would be.
    provider = provider_for(openai_config(chat_server.base_url, api_key_env=variable), {})
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.CONFIGURATION, False)
    assert isinstance(caught.value.__cause__, SecretEnvRefused)
    assert caught.value.__cause__.code == "secret_env_refused"
    assert f"api_key_env: {variable} may not hold a secret" in str(caught.value)
    assert "the-process-secret" not in str(caught.value)
    assert chat_server.requests == []  # nothing left the process


def test_openai_answer_that_is_not_a_completion_is_a_fatal_bad_response(
    chat_server: ChatServer, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    chat_server.enqueue(ScriptedResponse(body={"hello": "world"}))
    provider = provider_for(openai_config(chat_server.base_url), {})
    with pytest.raises(ProviderError) as caught:
        complete(provider, dialogue(0))
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.BAD_RESPONSE, False)
