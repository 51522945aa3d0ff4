"""Structured output: a configuration's ``output_schema``, the final answer checked with the
bounded validator tool arguments go through, one repair round telling the model what failed,
then ``failed`` / ``bad_output``; the API returns the parsed object. Run on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db.models.functions import Now
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentruns.models import AgentConfiguration, AgentRun, EventKind, Provider, Status
from agentruns.models import TerminationReason as Reason
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import reaper, runs
from agentruns.services.runtime.structured_output import (
    judge,
    parse_answer,
    schema_instruction,
)
from agentruns.turns import LoopState
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    config,
    events,
    kinds,
    sent,
)
from tests.support.messages_server import MessagesServer

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
VALID = '{"city": "Lyon", "population": 522000}'
INVALID = '{"city": "lyon", "population": -1}'


def start(configuration: AgentConfiguration, path: str = "sync") -> AgentRun:
    if path == "sync":
        return runs.run_start_sync(configuration=configuration, prompt="Which city?").run
    queued = runs.run_enqueue(configuration=configuration, prompt="Which city?")
    runs.run_process_queued(run_uuid=queued.uuid)
    return AgentRun.objects.get(pk=queued.pk)


# -- the judgement ---------------------------------------------------------------------------


def test_without_a_schema_any_answer_is_accepted_as_text():
    judged = judge(None, "not json at all", LoopState())
    assert (judged.structured, judged.value, judged.repair, judged.failure) == (
        False,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    "answer",
    [VALID, f"  {VALID}\n", f"```json\n{VALID}\n```", f"```\n{VALID}\n```"],
    ids=["bare", "spaced", "fenced-json", "fenced"],
)
def test_a_matching_answer_is_accepted_with_its_value(answer):
    judged = judge(SCHEMA, answer, LoopState())
    assert judged.structured and judged.value == {"city": "Lyon", "population": 522000}


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("The city is Lyon.", "the answer is not JSON"),
        ('{"city": "Lyon", "population": NaN}', "NaN is not a JSON number"),
        ('{"city": "Lyon", "population": 1e999}', "is not a finite number"),
        ('{"city": "Ly\\u0000on", "population": 1}', "holds the NUL character"),
        ("[" * 5000 + "]" * 5000, "nested too deeply to parse"),
        (f"Here you go: ```json\n{VALID}\n```", "the answer is not JSON"),
    ],
)
def test_what_is_not_json_a_column_stores_is_a_problem(answer, problem):
    value, problems = parse_answer(answer)
    assert value is None
    assert [p.path for p in problems] == [()]
    assert problem in problems[0].message


def test_the_first_failure_is_sent_back_with_each_problem_and_the_second_fails():
    state = LoopState()

    first = judge(SCHEMA, INVALID, state)

    assert first.failure is None and state.output_repairs == 1
    assert first.repair is not None and first.repair.kind == EventKind.OUTPUT_CHECK
    payload = first.repair.payload
    assert payload["errors"] == [
        {"path": ["city"], "message": "'lyon' does not match '^[A-Z][a-z]+$'"},
        {"path": ["population"], "message": "-1 is less than the minimum of 0"},
    ]
    assert "city: 'lyon' does not match" in payload["message"]
    assert "population: -1 is less than the minimum of 0" in payload["message"]

    second = judge(SCHEMA, "still not it", state)

    assert second.repair is None and state.output_repairs == 1
    assert second.failure == {
        "type": "BadOutput",
        "message": "the final answer did not match the output schema: the answer is not JSON "
        "(Expecting value: line 1 column 1 (char 0))",
    }


def test_a_schema_the_validator_cannot_use_fails_at_once():
    unusable = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    judged = judge(unusable, '{"a": 1}', LoopState())
    assert judged.repair is None
    assert judged.failure is not None
    assert "output_schema is unusable" in judged.failure["message"]


@pytest.mark.django_db
def test_a_configuration_s_output_schema_is_checked_like_a_tool_s_parameters():
    configuration = AgentConfiguration(slug="s", name="s", script=[{"content": "x"}])
    for schema, problem in [
        ({"type": "array"}, 'must have "type": "object"'),
        ({"type": "object", "properties": {"a": {"$ref": "https://x/s"}}}, "only references"),
        ({"type": "object", "properties": {"a": {"pattern": "(?<=x)"}}}, "RE2"),
        ({"type": "object", "title": "a\x00b"}, "cannot be stored"),
    ]:
        configuration.output_schema = schema
        with pytest.raises(ValidationError) as refused:
            configuration.full_clean()
        assert problem in str(refused.value.message_dict["output_schema"])
    configuration.output_schema = SCHEMA
    configuration.full_clean()


# -- whole runs ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_matching_answer_completes_and_the_api_returns_the_parsed_object(scripted_recordings):
    user = UserFactory()
    configuration = config(
        output_schema=SCHEMA, system_prompt="Be exact.", script=[{"content": VALID}]
    )

    run = runs.run_start_sync(configuration=configuration, prompt="Which city?", initiator=user).run

    assert (run.status, run.termination_reason) == (Status.COMPLETED, Reason.COMPLETED)
    assert (run.output, run.output_object) == (VALID, {"city": "Lyon", "population": 522000})
    (opening, _prompt) = sent(run)[0]
    assert opening["content"] == "Be exact.\n\n" + schema_instruction(SCHEMA)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    body = client.get(f"/api/runs/{run.uuid}/").json()
    assert body["output_object"] == {"city": "Lyon", "population": 522000}
    listed = client.get("/api/runs/").json()
    assert "output_object" not in listed["results"][0]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["sync", "worker"])
def test_an_answer_that_fails_is_sent_back_once_and_the_repair_completes(scripted_recordings, path):
    configuration = config(output_schema=SCHEMA, script=[{"content": INVALID}, {"content": VALID}])

    run = start(configuration, path)

    assert (run.status, run.output_object) == (Status.COMPLETED, json.loads(VALID))
    assert kinds(run)[-4:] == [EventKind.LLM, EventKind.OUTPUT_CHECK, EventKind.REQUEST, "llm"]
    assert run.loop_state["output_repairs"] == 1
    first, second = sent(run)
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": INVALID}
    repair = second[len(first) + 1]
    assert repair["role"] == "user"
    assert "population: -1 is less than the minimum of 0" in repair["content"]
    assert_released(run)


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["sync", "worker"])
def test_an_answer_that_fails_after_its_repair_ends_the_run_bad_output(scripted_recordings, path):
    configuration = config(
        output_schema=SCHEMA, script=[{"content": INVALID}, {"content": "Lyon, about 522000."}]
    )

    run = start(configuration, path)

    assert (run.status, run.termination_reason) == (Status.FAILED, Reason.BAD_OUTPUT)
    assert (run.output, run.output_object) == ("", None)
    assert run.error["type"] == "BadOutput"
    assert "the answer is not JSON" in run.error["message"]
    stream = assert_contiguous(run)
    assert [e.kind for e in stream][-3:] == [EventKind.REQUEST, EventKind.LLM, EventKind.ERROR]
    assert stream[-2].payload["content"] == "Lyon, about 522000."  # the answer is kept
    assert stream[-1].payload == run.error
    assert len(sent(run)) == 2
    assert_released(run)


@pytest.mark.django_db
def test_the_round_cap_does_not_take_the_repair_round(scripted_recordings, probes):
    configuration = config(
        output_schema=SCHEMA,
        max_iterations=1,
        script=[{"tool_calls": [{"name": "probe_read"}]}, {"content": INVALID}, {"content": VALID}],
    )

    run = start(configuration)

    assert (run.status, run.termination_reason) == (Status.COMPLETED, Reason.MAX_ITERATIONS)
    assert run.output_object == json.loads(VALID)
    assert run.iterations == 3


class ProcessDied(BaseException):
    """Stands for the process vanishing: nothing in the runtime catches it."""


@pytest.mark.django_db
def test_a_repair_survives_a_crash_and_is_not_granted_twice(scripted_recordings, monkeypatch):
    """The answer and its repair are one boundary with the count in the loop state: a segment
    dying before the next answer leaves the next segment to ask again — once — and a second
    failure ends the run."""
    configuration = config(
        output_schema=SCHEMA, script=[{"content": INVALID}, {"content": "still prose"}]
    )
    complete = ScriptedProvider.complete
    calls: list[int] = []

    def dies_on_the_second_call(self: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ProcessDied()
        return complete(self, **kwargs)

    monkeypatch.setattr(ScriptedProvider, "complete", dies_on_the_second_call)
    queued = runs.run_enqueue(configuration=configuration, prompt="Which city?")
    with pytest.raises(ProcessDied):
        runs.run_process_queued(run_uuid=queued.uuid)
    run = AgentRun.objects.get(pk=queued.pk)
    assert (run.status, run.loop_state["output_repairs"]) == (Status.RUNNING, 1)
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs(redispatch=False).count(reaper.Verdict.REQUEUED) == 1

    runs.run_process_queued(run_uuid=run.uuid)

    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.FAILED, Reason.BAD_OUTPUT)
    assert sum(e.kind == EventKind.OUTPUT_CHECK for e in events(run)) == 1
    resent = sent(run)[-1]
    assert resent[-2] == {"role": "assistant", "content": INVALID}
    assert resent[-1]["role"] == "user"


@pytest.mark.django_db
def test_the_repair_reaches_the_messages_api_as_a_user_turn(
    messages_server: MessagesServer, monkeypatch
):
    monkeypatch.setenv("LEASEHOLD_TEST_SO_KEY", "sk-ant-so-0123456789")
    configuration = AgentConfiguration.objects.create(
        slug="anthropic-structured",
        name="Anthropic structured",
        provider=Provider.ANTHROPIC,
        model="claude-test",
        base_url=messages_server.base_url,
        api_key_env="LEASEHOLD_TEST_SO_KEY",
        output_schema=SCHEMA,
        tools=[],
    )
    messages_server.reply(text="Lyon!")
    messages_server.reply(text=VALID)

    run = start(configuration)

    assert run.output_object == json.loads(VALID)
    second = messages_server.requests[1].body
    assert second["system"] == schema_instruction(SCHEMA)
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert "the answer is not JSON" in second["messages"][2]["content"][0]["text"]
