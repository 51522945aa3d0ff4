"""Hostile values in a provider's reply never reach the database and never run (docs/design.md
§7.1): a reply holding NUL, a lone surrogate, a number that is not finite or token counts that
are not counts — inside a tool call, in any part — ends the run ``failed`` / ``bad_response`` at
once, with an ``error`` event, after exactly one provider call, no lease left and no tool run.
Free text (content, model) is mended instead. The same on SQLite and PostgreSQL (run this module
on both: PostgreSQL is the one that refuses NUL in ``jsonb``).

Each case goes through the scripted provider and through a real local chat-completions server
that sends the hostile bytes raw (``tests.support.chat_server.raw_completion``).
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    EventKind,
    Provider,
    Status,
    TerminationReason,
)
from agentruns.providers.replies import MAX_CALL_TOKENS, MAX_CONTENT_CHARS, MAX_TOOL_CALLS
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import reaper, runs
from agentruns.services.runtime import model_step, segment
from agentruns.storable import REPLACEMENT
from playground.models import Note
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    config,
    events,
    sent,
)
from tests.support.chat_server import ChatServer, raw_completion

pytestmark = pytest.mark.django_db

KEY_ENV = "LEASEHOLD_TEST_HOSTILE_KEY"
PATHS = ["sync", "worker"]


def start(configuration: AgentConfiguration, path: str) -> AgentRun:
    """Run ``configuration`` once: inline (``sync``) or claimed by a worker, which retries."""
    if path == "sync":
        return runs.run_start_sync(configuration=configuration, prompt="go").run
    queued = runs.run_enqueue(configuration=configuration, prompt="go")
    runs.run_process_queued(run_uuid=queued.uuid)
    return AgentRun.objects.get(pk=queued.pk)


def assert_refused(run: AgentRun, fragment: str, *, provider_calls: int, requeues: int = 0) -> None:
    """Ended ``failed`` / ``bad_response`` with the reason in an ``error`` event, after
    ``provider_calls`` calls (1: no retry; ``requeues``: segments that died after a refusal),
    released, with nothing pending and nothing run."""
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.BAD_RESPONSE,
    ), run.error
    assert run.error["type"] == "ProviderError:bad_response"
    assert fragment in run.error["message"]
    stream = assert_contiguous(run)
    assert stream[-1].kind == EventKind.ERROR
    assert stream[-1].payload == run.error
    assert sum(e.kind == EventKind.ERROR for e in stream) == 1
    assert sum(e.kind == EventKind.LLM for e in stream) == provider_calls - 1 - requeues
    assert provider_calls == sum(e.kind == EventKind.REQUEST for e in stream)
    assert run.requeue_count == requeues
    assert run.pending_turn is None
    assert_released(run)


# --- through the scripted provider -----------------------------------------------------------


@pytest.fixture
def play(monkeypatch, scripted_recordings):
    """Runs play a script held in memory through the real ``ScriptedProvider``: no database
    can store these scripts (PostgreSQL refuses NUL and lone surrogates in ``jsonb``, both
    refuse ``NaN``), so only where the script comes from is replaced."""
    held: dict[str, Any] = {}

    def provider_for(configuration: Any, request: Any) -> ScriptedProvider:
        return ScriptedProvider(script=held["script"], model="scripted")

    monkeypatch.setattr(segment, "provider_for", provider_for)
    return lambda script: held.__setitem__("script", script)


def deep(levels: int) -> dict:
    value: dict = {"v": 1}
    for _ in range(levels):
        value = {"v": value}
    return value


SCRIPTED_ARGUMENTS = {
    "nul": ({"value": "a\x00b"}, "$.value holds the NUL character"),
    "surrogate": ({"value": "a\ud800b"}, "$.value holds a lone surrogate"),
    "nan": ({"value": math.nan}, "$.value is not a finite number (nan"),
    "infinity": ({"value": math.inf}, "$.value is not a finite number (inf"),
    "minus-infinity": ({"value": [-math.inf]}, "$.value[0] is not a finite number (-inf"),
    "nul-key": ({"val\x00ue": "x"}, "has a key holding the NUL character"),
    "deep": (deep(40), "nested deeper than 32 levels"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("tool", ["probe_read", "probe_write"])
@pytest.mark.parametrize("case", list(SCRIPTED_ARGUMENTS))
def test_scripted_arguments_that_cannot_be_stored_end_the_run_at_once(
    probes, play, case, tool, path
):
    arguments, problem = SCRIPTED_ARGUMENTS[case]
    play([{"tool_calls": [{"name": tool, "arguments": arguments}]}, {"content": "never"}])

    run = start(config(), path)

    assert_refused(run, problem, provider_calls=1)
    assert (
        f"tool call 1 ('{tool}') has arguments that cannot be stored as sent"
        in (run.error["message"])
    )
    assert len(sent(run)) == 1
    assert probes.seen == []


@pytest.mark.parametrize("path", PATHS)
def test_a_scripted_tool_name_holding_nul_ends_the_run_at_once(probes, play, path):
    play([{"tool_calls": [{"name": "probe_\x00write", "arguments": {}}]}])

    run = start(config(), path)

    assert_refused(run, "its name holds the NUL character", provider_calls=1)
    assert len(sent(run)) == 1
    assert probes.seen == []


@pytest.mark.parametrize("path", PATHS)
def test_scripted_content_holding_nul_and_a_surrogate_is_mended_and_the_run_completes(play, path):
    play([{"content": "a\x00b\ud800c"}])

    run = start(config(), path)

    assert (run.status, run.output) == (Status.COMPLETED, f"a{REPLACEMENT}b{REPLACEMENT}c")
    answered = [e for e in events(run) if e.kind == EventKind.LLM]
    assert [e.payload["normalised"] for e in answered] == [["content"]]
    assert answered[0].payload["content"] == run.output
    assert_released(run)


@pytest.mark.parametrize("count", [10**20, -5, 2**31, MAX_CALL_TOKENS + 1])
def test_an_impossible_token_count_fails_the_run_instead_of_breaking_it(scripted_recordings, count):
    # Storable on both databases, so the script comes from the configuration itself.
    configuration = config(script=[{"content": "hi", "usage": {"prompt_tokens": count}}])

    run = start(configuration, "sync")

    assert_refused(run, f"it reported prompt_tokens={count}", provider_calls=1)
    assert len(sent(run)) == 1
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (0, 0, 0)


def test_tokens_that_would_overflow_the_run_s_columns_end_it_before_they_are_added(
    probes, scripted_recordings
):
    # Ten rounds of the most one call may report: 2e9 tokens, inside a 32-bit column.
    most = {"prompt_tokens": MAX_CALL_TOKENS, "completion_tokens": MAX_CALL_TOKENS}
    rounds = [{"tool_calls": [{"name": "probe_read"}], "usage": most} for _ in range(11)]
    configuration = config(script=rounds, max_iterations=20)

    run = start(configuration, "worker")

    assert_refused(run, "would take the run's total past 2147483647", provider_calls=11)
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (
        10 * MAX_CALL_TOKENS,
        10 * MAX_CALL_TOKENS,
        20 * MAX_CALL_TOKENS,
    )
    assert len(sent(run)) == 11
    assert len(probes.seen) == 10  # the refused turn's call never ran


class ProcessDied(BaseException):
    """Stands for the process vanishing: nothing in the runtime catches it."""


def test_a_segment_dying_between_the_refusal_and_its_settle_leaves_the_next_to_refuse_it(
    probes, play, monkeypatch
):
    """The worst gap: the reply was refused, nothing of it written, and the process dies before
    the settle. The run is as after a crash inside the call: the reaper requeues it, the next
    segment asks again, is refused again and settles — one ``error`` event, no tool run."""
    play([{"tool_calls": [{"name": "probe_write", "arguments": {"value": "a\x00b"}}]}])
    settle_events = model_step.settle_events

    def dies_once(exc: Any, error: Any) -> Any:
        monkeypatch.setattr(model_step, "settle_events", settle_events)
        raise ProcessDied()

    monkeypatch.setattr(model_step, "settle_events", dies_once)
    queued = runs.run_enqueue(configuration=config(), prompt="go")

    with pytest.raises(ProcessDied):
        runs.run_process_queued(run_uuid=queued.uuid)

    run = AgentRun.objects.get(pk=queued.pk)
    assert run.status == Status.RUNNING
    assert [e.kind for e in events(run)] == [EventKind.LEASE, EventKind.REQUEST]
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs(redispatch=False).count(reaper.Verdict.REQUEUED) == 1
    runs.run_process_queued(run_uuid=run.uuid)

    assert_refused(run, "$.value holds the NUL character", provider_calls=2, requeues=1)
    assert len(sent(run)) == 2
    assert probes.seen == []


# --- through a real chat-completions server, the bytes sent raw ------------------------------


@pytest.fixture
def openai_config(chat_server: ChatServer, monkeypatch, probes) -> AgentConfiguration:
    monkeypatch.setenv(KEY_ENV, "sk-hostile-test-0123456789")
    return AgentConfiguration.objects.create(
        slug="hostile",
        name="Hostile endpoint",
        provider=Provider.OPENAI,
        model="test-model",
        base_url=chat_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        tools=["probe_read", "probe_write", "create_note"],
    )


def call(arguments: str, *, name: str = '"probe_write"', call_id: str = '"call_1"') -> dict:
    return {"id": call_id, "name": name, "arguments": arguments}


# Each: the raw completion's parts, and what the refusal says.
RAW_REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "args-nul": ({"tool_calls": [call('{"value": "a\\u0000b"}')]}, "$.value holds the NUL"),
    # A NUL character itself in the arguments' text: not JSON, so kept unparsed, and refused.
    "args-raw-nul": (
        {"tool_calls": [call('{"value": "a\x00b"}')]},
        "$._unparsed_arguments holds the NUL",
    ),
    "args-surrogate": (
        {"tool_calls": [call('{"value": "a\\ud800b"}')]},
        "$.value holds a lone surrogate",
    ),
    "args-nan": ({"tool_calls": [call('{"value": NaN}')]}, "is not a finite number (nan"),
    "args-infinity": (
        {"tool_calls": [call('{"n": [1, -Infinity]}')]},
        "$.n[1] is not a finite number (-inf",
    ),
    "args-1e999": ({"tool_calls": [call('{"value": 1e999}')]}, "is not a finite number (inf"),
    "args-deep": (
        {"tool_calls": [call('{"v": ' * 40 + "1" + "}" * 40)]},
        "nested deeper than 32 levels",
    ),
    "args-too-deep-to-parse": (
        {"tool_calls": [call('{"v": ' * 5000 + "1" + "}" * 5000)]},
        "nested too deeply to parse",
    ),
    "id-nul": ({"tool_calls": [call("{}", call_id='"call\\u0000"')]}, "its id holds the NUL"),
    "id-huge": (
        {"tool_calls": [call("{}", call_id='"' + "c" * 10_000 + '"')]},
        "its id is 10000 characters long",
    ),
    "id-object": ({"tool_calls": [call("{}", call_id='{"x": 1}')]}, "its id is a dict"),
    "name-surrogate": (
        {"tool_calls": [call("{}", name='"probe_\\udc00"')]},
        "its name holds a lone surrogate",
    ),
    "name-number": ({"tool_calls": [call("{}", name="7")]}, "its name is a int"),
    "many-calls": (
        {"tool_calls": [call("{}", call_id=f'"c{n}"') for n in range(MAX_TOOL_CALLS + 1)]},
        f"at most {MAX_TOOL_CALLS} are taken",
    ),
    "content-list": ({"content": '[{"type": "text", "text": "x"}]'}, "content is a list"),
    "content-huge": (
        {"content": '"' + "x" * (MAX_CONTENT_CHARS + 1) + '"'},
        f"at most {MAX_CONTENT_CHARS} are kept",
    ),
    "usage-nan": ({"usage": '{"prompt_tokens": NaN}'}, "prompt_tokens=nan"),
    "usage-1e999": ({"usage": '{"completion_tokens": 1e999}'}, "completion_tokens=inf"),
    "usage-negative": ({"usage": '{"prompt_tokens": -5}'}, "prompt_tokens=-5"),
    "usage-overflow": ({"usage": '{"prompt_tokens": 2147483648}'}, "prompt_tokens=2147483648"),
    "usage-fraction": ({"usage": '{"prompt_tokens": 1.5}'}, "prompt_tokens=1.5"),
    "usage-text": ({"usage": '{"prompt_tokens": "many"}'}, "prompt_tokens='many'"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(RAW_REFUSED))
def test_a_raw_hostile_reply_ends_the_run_at_once_after_one_call(
    chat_server, openai_config, probes, case, path
):
    parts, problem = RAW_REFUSED[case]
    for _ in range(4):  # what a retry would get: never asked for
        chat_server.reply_raw(raw_completion(**parts))

    run = start(openai_config, path)

    assert_refused(run, problem, provider_calls=1)
    assert len(chat_server.requests) == 1
    assert probes.seen == []
    assert Note.objects.count() == 0


RAW_BODIES = {
    "nul-byte": raw_completion(content='"a\x00b"').encode(),  # a control character in a string
    "not-json": b'{"choices": [',
    "too-deep": raw_completion(content="[" * 5000 + "]" * 5000).encode(),
    "not-utf8": raw_completion(content='"a\xffb"').encode("latin-1"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(RAW_BODIES))
def test_a_200_whose_body_is_not_a_completion_ends_the_run_at_once(
    chat_server, openai_config, case, path
):
    for _ in range(4):
        chat_server.reply_raw(RAW_BODIES[case])

    run = start(openai_config, path)

    assert_refused(run, "not a valid completion", provider_calls=1)
    assert len(chat_server.requests) == 1


@pytest.mark.parametrize("path", PATHS)
def test_raw_free_text_is_mended_and_the_run_completes(chat_server, openai_config, path):
    chat_server.reply_raw(
        raw_completion(
            content='"a\\u0000b\\ud800c"',
            model='"m\\u0000"',
            finish_reason='{"not": ["a", "string", NaN]}',  # never read, never stored
        )
    )

    run = start(openai_config, path)

    assert (run.status, run.termination_reason) == (Status.COMPLETED, TerminationReason.COMPLETED)
    assert run.output == f"a{REPLACEMENT}b{REPLACEMENT}c"
    (answered,) = [e.payload for e in events(run) if e.kind == EventKind.LLM]
    assert answered["normalised"] == ["content", "model"]
    assert answered["model"] == f"m{REPLACEMENT}"
    assert "finish_reason" not in json.dumps(answered)
    assert len(chat_server.requests) == 1
    assert_released(run)


def test_a_clean_write_beside_mended_content_waits_for_approval_unchanged(
    chat_server, openai_config, probes
):
    chat_server.reply_raw(
        raw_completion(
            content='"about to write\\u0000"',
            tool_calls=[call('{"value": "exactly this"}')],
        )
    )

    run = start(openai_config, "sync")

    assert run.status == Status.WAITING_FOR_APPROVAL
    assert [c["arguments"] for c in run.pending_turn["calls"]] == [{"value": "exactly this"}]
    (answered,) = [e.payload for e in events(run) if e.kind == EventKind.LLM]
    assert answered["content"] == f"about to write{REPLACEMENT}"
    assert answered["normalised"] == ["content"]
    assert probes.seen == []


@pytest.mark.parametrize("path", PATHS)
def test_an_error_text_holding_nul_is_stored_mended(chat_server, openai_config, path):
    chat_server.fail(500, "boom \x00 \ud800 boom")

    run = start(openai_config, path)

    expected = Status.FAILED if path == "sync" else Status.QUEUED  # the worker retries a 5xx
    assert run.status == expected
    assert run.error["type"] == "ProviderError:server_error"
    assert f"boom {REPLACEMENT} {REPLACEMENT} boom" in run.error["message"]
    assert run.claimed_by == ""
