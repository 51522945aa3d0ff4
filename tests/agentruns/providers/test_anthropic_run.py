"""The ``anthropic`` provider driving whole runs against a real local Messages API server: tool
use, an approval end to end, usage and cost, retry classes, a refusal, and hostile replies that
end ``bad_response`` exactly as the OpenAI-compatible provider's do. Run on SQLite and
PostgreSQL (PostgreSQL is the one that refuses NUL in ``jsonb``)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    EventKind,
    Provider,
    SpendDay,
    Status,
    TerminationReason,
)
from agentruns.providers.replies import MAX_CALL_TOKENS
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.storable import REPLACEMENT
from playground.models import Note
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    decide_inline,
    events,
)
from tests.support.messages_server import MessagesServer, raw_message, tool_use

pytestmark = pytest.mark.django_db

KEY_ENV = "LEASEHOLD_TEST_ANTHROPIC_RUN_KEY"
KEY = "sk-ant-run-test-0123456789"
PATHS = ["sync", "worker"]


@pytest.fixture
def anthropic_config(messages_server: MessagesServer, monkeypatch, probes) -> AgentConfiguration:
    monkeypatch.setenv(KEY_ENV, KEY)
    return AgentConfiguration.objects.create(
        slug="anthropic-local",
        name="Anthropic local",
        provider=Provider.ANTHROPIC,
        model="claude-test",
        base_url=messages_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        system_prompt="Be brief.",
        tools=["list_notes", "create_note", "probe_read", "probe_write"],
    )


def start(configuration: AgentConfiguration, path: str) -> AgentRun:
    """Run once: inline (``sync``) or claimed by a worker, which retries."""
    if path == "sync":
        return runs.run_start_sync(configuration=configuration, prompt="go").run
    queued = runs.run_enqueue(configuration=configuration, prompt="go")
    runs.run_process_queued(run_uuid=queued.uuid)
    return AgentRun.objects.get(pk=queued.pk)


def test_an_anthropic_run_completes_a_tool_use_exchange(messages_server, anthropic_config):
    Note.objects.create(title="groceries", body="milk")
    messages_server.reply(
        text="Checking.",
        tool_uses=[{"id": "toolu_list", "name": "list_notes", "input": {}}],
        usage={"input_tokens": 100, "cache_read_input_tokens": 20, "output_tokens": 10},
    )
    messages_server.reply(
        text="You have one note: groceries.", usage={"input_tokens": 150, "output_tokens": 12}
    )

    result = runs.run_start_sync(configuration=anthropic_config, prompt="What notes do I have?")

    run = result.run
    assert (result.outcome, run.status, run.termination_reason) == (
        Outcome.COMPLETED,
        Status.COMPLETED,
        TerminationReason.COMPLETED,
    )
    assert run.output == "You have one note: groceries."
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (270, 22, 292)
    assert_released(run)
    stream = assert_contiguous(run)
    executed = next(e for e in stream if e.kind == EventKind.TOOL)
    assert executed.payload["call_id"] == "toolu_list"
    assert executed.payload["result"]["notes"][0]["title"] == "groceries"
    answered = [e.payload for e in stream if e.kind == EventKind.LLM]
    assert [a["model"] for a in answered] == ["claude-test", "claude-test"]

    first, second = (request.body for request in messages_server.requests)
    assert first["system"] == "Be brief."
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What notes do I have?"}]}
    ]
    assert {t["name"] for t in first["tools"]} == {
        "list_notes",
        "create_note",
        "probe_read",
        "probe_write",
    }
    assistant, results = second["messages"][1:]
    assert assistant["content"][1] == {
        "type": "tool_use",
        "id": "toolu_list",
        "name": "list_notes",
        "input": {},
    }
    (result_block,) = results["content"]
    assert result_block["tool_use_id"] == "toolu_list"
    assert json.loads(result_block["content"])["notes"][0]["title"] == "groceries"


def test_an_anthropic_write_waits_for_approval_then_runs_once(messages_server, anthropic_config):
    messages_server.reply(
        tool_uses=[{"id": "toolu_w", "name": "create_note", "input": {"title": "t", "body": ""}}]
    )
    messages_server.reply(text="Created.")

    suspended = runs.run_start_sync(configuration=anthropic_config, prompt="Make a note")

    assert suspended.outcome == Outcome.AWAITING_APPROVAL
    assert suspended.run.pending_turn["calls"][0]["id"] == "toolu_w"
    assert Note.objects.count() == 0
    assert len(messages_server.requests) == 1

    decided = decide_inline(suspended.run)

    assert decided.outcome == Outcome.COMPLETED
    assert decided.run.output == "Created."
    assert Note.objects.count() == 1
    assert len(messages_server.requests) == 2
    assert_released(decided.run)
    (result_block,) = messages_server.requests[1].body["messages"][-1]["content"]
    assert result_block["tool_use_id"] == "toolu_w"
    assert json.loads(result_block["content"])["title"] == "t"


def test_usage_is_priced_and_charged_to_the_budget(messages_server, anthropic_config):
    AgentConfiguration.objects.filter(pk=anthropic_config.pk).update(
        price_per_million_prompt_tokens=Decimal("3"),
        price_per_million_completion_tokens=Decimal("15"),
        daily_budget=Decimal("10"),
        max_tokens_per_call=200_000,
    )
    anthropic_config.refresh_from_db()
    messages_server.reply(text="ok", usage={"input_tokens": 1000, "output_tokens": 1000})

    run = start(anthropic_config, "worker")

    assert run.status == Status.COMPLETED
    assert run.cost == Decimal("0.018")  # 1000 × 3 + 1000 × 15 per million
    day = SpendDay.objects.get(scope="configuration", key=anthropic_config.pk)
    assert (day.amount, day.calls, day.reserved) == (Decimal("0.018"), 1, 0)
    (answered,) = [e.payload for e in events(run) if e.kind == EventKind.LLM]
    assert answered["cost"] == "0.018000"


def test_an_overloaded_server_requeues_a_worker_run_which_then_completes(
    messages_server, anthropic_config
):
    messages_server.overloaded()
    messages_server.reply(text="Back.")

    run = start(anthropic_config, "worker")

    assert (run.status, run.requeue_count) == (Status.QUEUED, 1)
    assert run.error["type"] == "ProviderError:server_error"
    assert "HTTP 529: Overloaded" in run.error["message"]
    runs.run_process_queued(run_uuid=run.uuid)
    run.refresh_from_db()
    assert (run.status, run.output) == (Status.COMPLETED, "Back.")
    assert len(messages_server.requests) == 2
    assert_released(run)


def test_an_overloaded_server_fails_a_sync_run_with_its_class(messages_server, anthropic_config):
    messages_server.overloaded()

    run = start(anthropic_config, "sync")

    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.PROVIDER_FAILED,
    )
    assert run.error["type"] == "ProviderError:server_error"
    assert KEY not in json.dumps(run.error)
    assert KEY not in json.dumps([e.payload for e in events(run)])


def test_a_timeout_requeues_a_worker_run(messages_server, anthropic_config):
    AgentConfiguration.objects.filter(pk=anthropic_config.pk).update(timeout_seconds=1)
    anthropic_config.refresh_from_db()
    messages_server.reply(text="too late", delay=30)

    run = start(anthropic_config, "worker")

    assert (run.status, run.requeue_count) == (Status.QUEUED, 1)
    assert run.error["type"] == "ProviderError:timeout"


@pytest.mark.parametrize("path", PATHS)
def test_a_refusal_ends_the_run_at_once_and_nothing_of_it_runs(
    messages_server, anthropic_config, probes, path
):
    for _ in range(4):  # what a retry would get: never asked for
        messages_server.reply(
            text="Sure:",
            tool_uses=[{"name": "probe_write", "input": {"value": "x"}}],
            stop_reason="refusal",
        )

    run = start(anthropic_config, path)

    reason = TerminationReason.PROVIDER_FAILED if path == "sync" else "not_retryable"
    assert (run.status, run.termination_reason) == (Status.FAILED, reason)
    assert run.error["type"] == "ProviderError:refused"
    assert len(messages_server.requests) == 1
    assert run.pending_turn is None
    assert not [e for e in events(run) if e.kind == EventKind.LLM]
    assert probes.seen == []
    assert_released(run)


def test_a_call_cut_off_at_max_tokens_never_runs_and_the_model_is_told(
    messages_server, anthropic_config, probes
):
    messages_server.reply(
        tool_uses=[{"id": "toolu_cut", "name": "probe_write", "input": {"value": "partial"}}],
        stop_reason="max_tokens",
    )
    messages_server.reply(text="I will stop here.")

    run = start(anthropic_config, "sync")

    assert (run.status, run.output) == (Status.COMPLETED, "I will stop here.")
    assert probes.seen == []
    refused = next(e for e in events(run) if e.kind == EventKind.TOOL)
    assert refused.payload["call_id"] == "toolu_cut"
    assert "cut off (stop_reason max_tokens)" in refused.payload["error"]
    (result_block,) = messages_server.requests[1].body["messages"][-1]["content"]
    assert result_block["tool_use_id"] == "toolu_cut"
    assert "cut off" in result_block["content"]


def call(input_text: str, *, name: str = '"probe_write"', call_id: str = '"toolu_1"') -> str:
    return "[" + tool_use(name, input_text, call_id=call_id) + "]"


# Each: the raw message's parts, and what the refusal says (as for the openai provider).
RAW_REFUSED = {
    "input-nul": ({"content": call('{"value": "a\\u0000b"}')}, "$.value holds the NUL"),
    "input-surrogate": (
        {"content": call('{"value": "a\\ud800b"}')},
        "$.value holds a lone surrogate",
    ),
    "input-nan": ({"content": call('{"value": NaN}')}, "is not a finite number (nan"),
    "input-1e999": ({"content": call('{"v": [1, 1e999]}')}, "$.v[1] is not a finite number (inf"),
    "input-deep": ({"content": call('{"v": ' * 40 + "1" + "}" * 40)}, "nested deeper than 32"),
    "id-nul": ({"content": call("{}", call_id='"toolu\\u0000"')}, "its id holds the NUL"),
    "id-object": ({"content": call("{}", call_id='{"x": 1}')}, "its id is a dict"),
    "name-number": ({"content": call("{}", name="7")}, "its name is a int"),
    "text-list": ({"content": '[{"type": "text", "text": ["x"]}]'}, "content is a list"),
    "usage-nan": ({"usage": '{"input_tokens": NaN, "output_tokens": 1}'}, "prompt_tokens=nan"),
    "usage-huge": (
        {"usage": f'{{"input_tokens": 1, "output_tokens": {MAX_CALL_TOKENS + 1}}}'},
        f"completion_tokens={MAX_CALL_TOKENS + 1}",
    ),
    "usage-cache-overflow": (
        {
            "usage": f'{{"input_tokens": {MAX_CALL_TOKENS}, "cache_read_input_tokens": 1, '
            '"output_tokens": 1}'
        },
        f"prompt_tokens={MAX_CALL_TOKENS + 1}",
    ),
    "usage-text": ({"usage": '{"input_tokens": "many", "output_tokens": 1}'}, "='many'"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(RAW_REFUSED))
def test_a_raw_hostile_message_ends_the_run_bad_response_after_one_call(
    messages_server, anthropic_config, probes, case, path
):
    parts, problem = RAW_REFUSED[case]
    for _ in range(4):
        messages_server.reply_raw(raw_message(stop_reason='"tool_use"', **parts))

    run = start(anthropic_config, path)

    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.BAD_RESPONSE,
    ), run.error
    assert run.error["type"] == "ProviderError:bad_response"
    assert problem in run.error["message"]
    stream = assert_contiguous(run)
    assert stream[-1].kind == EventKind.ERROR and stream[-1].payload == run.error
    assert not [e for e in stream if e.kind == EventKind.LLM]
    assert len(messages_server.requests) == 1
    assert (run.prompt_tokens, run.completion_tokens) == (0, 0)
    assert probes.seen == []
    assert_released(run)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "body",
    [
        raw_message(content='[{"type": "text", "text": "a\x00b"}]').encode(),
        b'{"content": [',
        raw_message(content="[" * 5000 + "]" * 5000).encode(),
        raw_message(content='[{"type": "text", "text": "a\xffb"}]').encode("latin-1"),
    ],
    ids=["nul-byte", "not-json", "too-deep", "not-utf8"],
)
def test_a_200_whose_body_is_not_a_message_ends_the_run_at_once(
    messages_server, anthropic_config, body, path
):
    for _ in range(4):
        messages_server.reply_raw(body)

    run = start(anthropic_config, path)

    assert (run.status, run.termination_reason) == (Status.FAILED, TerminationReason.BAD_RESPONSE)
    assert "not a valid message" in run.error["message"]
    assert len(messages_server.requests) == 1


def test_raw_free_text_is_mended_and_the_run_completes(messages_server, anthropic_config):
    messages_server.reply_raw(
        raw_message(content='[{"type": "text", "text": "a\\u0000b\\ud800c"}]', model='"m\\u0000"')
    )

    run = start(anthropic_config, "worker")

    assert (run.status, run.output) == (Status.COMPLETED, f"a{REPLACEMENT}b{REPLACEMENT}c")
    (answered,) = [e.payload for e in events(run) if e.kind == EventKind.LLM]
    assert answered["normalised"] == ["content", "model"]
    assert "stop_reason" not in json.dumps(answered)
