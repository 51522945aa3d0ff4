"""The ``openai`` provider driving whole runs against a real local chat-completions server."""

from __future__ import annotations

import json

import pytest

from agentruns.models import AgentConfiguration, EventKind, Provider, Status, TerminationReason
from agentruns.services.runs import run_start_sync
from agentruns.services.runtime.results import Outcome
from playground.models import Note
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    decide_inline,
    events,
)
from tests.support.chat_server import ChatServer

pytestmark = pytest.mark.django_db

KEY_ENV = "LEASEHOLD_TEST_RUN_KEY"
KEY = "sk-run-test-0123456789"


@pytest.fixture
def openai_config(chat_server: ChatServer, monkeypatch) -> AgentConfiguration:
    monkeypatch.setenv(KEY_ENV, KEY)
    return AgentConfiguration.objects.create(
        slug="openai-local",
        name="OpenAI local",
        provider=Provider.OPENAI,
        model="test-model",
        base_url=chat_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        system_prompt="Be brief.",
        tools=["list_notes", "create_note"],
    )


def test_an_openai_run_completes_a_tool_calling_exchange(chat_server, openai_config):
    Note.objects.create(title="groceries", body="milk")
    chat_server.reply(tool_calls=[{"id": "call_abc", "name": "list_notes", "arguments": {}}])
    chat_server.reply(content="You have one note: groceries.")

    result = run_start_sync(configuration=openai_config, prompt="What notes do I have?")

    run = result.run
    assert result.outcome == Outcome.COMPLETED
    assert run.status == Status.COMPLETED
    assert run.termination_reason == TerminationReason.COMPLETED
    assert run.output == "You have one note: groceries."
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (22, 14, 36)
    assert run.iterations == 2
    assert_released(run)
    stream = assert_contiguous(run)
    executed = next(e for e in stream if e.kind == EventKind.TOOL)
    assert executed.payload["call_id"] == "call_abc"
    assert executed.payload["result"]["notes"][0]["title"] == "groceries"

    first, second = (request.body for request in chat_server.requests)
    assert all(r.path.endswith("/chat/completions") for r in chat_server.requests)
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in chat_server.requests)
    assert first["model"] == "test-model"
    assert first["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What notes do I have?"},
    ]
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["create_note", "list_notes"]
    # The second request carries the model's call and the tool's result, keyed by the call id.
    assistant, tool_message = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == "call_abc"
    assert assistant["tool_calls"][0]["function"]["name"] == "list_notes"
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_abc"
    assert json.loads(tool_message["content"])["notes"][0]["title"] == "groceries"


def test_an_openai_write_waits_for_approval_then_runs_once(chat_server, openai_config):
    chat_server.reply(
        tool_calls=[
            {"id": "call_w", "name": "create_note", "arguments": {"title": "t", "body": ""}}
        ]
    )
    chat_server.reply(content="Created.")

    suspended = run_start_sync(configuration=openai_config, prompt="Make a note")

    assert suspended.outcome == Outcome.AWAITING_APPROVAL
    assert Note.objects.count() == 0
    assert len(chat_server.requests) == 1

    decided = decide_inline(suspended.run)

    assert decided.outcome == Outcome.COMPLETED
    assert Note.objects.count() == 1
    assert len(chat_server.requests) == 2
    tool_message = chat_server.requests[1].body["messages"][-1]
    assert tool_message["tool_call_id"] == "call_w"
    assert json.loads(tool_message["content"])["title"] == "t"


def test_an_openai_server_error_fails_a_sync_run_with_its_class(chat_server, openai_config):
    chat_server.fail(500, "boom")

    result = run_start_sync(configuration=openai_config, prompt="hi")

    assert result.outcome == Outcome.FAILED
    run = result.run
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.PROVIDER_FAILED
    assert run.error["type"] == "ProviderError:server_error"
    assert KEY not in json.dumps(run.error)
    assert KEY not in json.dumps([e.payload for e in events(run)])
    assert_released(run)


def test_a_configuration_naming_a_refused_variable_fails_without_a_request(
    chat_server, openai_config, monkeypatch
):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-process-secret")
    AgentConfiguration.objects.filter(pk=openai_config.pk).update(api_key_env="DJANGO_SECRET_KEY")
    openai_config.refresh_from_db()
    chat_server.reply(content="never asked")

    result = run_start_sync(configuration=openai_config, prompt="hello")

    run = result.run
    assert result.outcome == Outcome.FAILED
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.PROVIDER_FAILED,
    )
    assert run.error["type"] == "ProviderError:configuration"
    assert "DJANGO_SECRET_KEY may not hold a secret" in run.error["message"]
    assert "the-process-secret" not in json.dumps(run.error)
    assert chat_server.requests == []
