"""Unexpected exceptions (issue 11 §4) and arguments checked when proposed (issue 11 §3)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agentruns import transitions
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import read_pending_turn
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.runtime import assert_released, events

pytestmark = pytest.mark.django_db

WRITE = {"name": "create_note", "arguments": {"title": "t", "body": "b"}}
BROKEN = {"name": "create_note", "arguments": {"title": "no body"}}


def start(script, **kwargs):
    configuration = AgentConfigurationFactory(script=script)
    return runs.run_start_sync(configuration=configuration, prompt="p", **kwargs)


# --- 4. An unexpected exception settles the run internal_error --------------------------------


def test_a_raising_observer_settles_the_run_failed_internal_error():
    def observer(spec):
        raise KeyError("observer bug")

    result = start([{"content": "hello"}], observer=observer)

    assert result.outcome == Outcome.FAILED
    run = AgentRun.objects.get()
    assert (run.status, run.termination_reason) == (Status.FAILED, TerminationReason.INTERNAL_ERROR)
    assert run.error == {"type": "KeyError", "message": "'observer bug'"}
    (error,) = [e for e in events(run) if e.kind == EventKind.ERROR]
    assert error.payload == {"type": "KeyError", "message": "'observer bug'"}
    assert_released(run)


def test_an_unexpected_error_while_a_write_is_fenced_is_left_to_the_reaper(monkeypatch):
    def clear_fails(*args, **kwargs):
        raise RuntimeError("bug after the write")

    monkeypatch.setattr(transitions, "run_clear_fence", clear_fails)
    decider = UserFactory(permissions=["agentruns.decide_agentrun"])
    waiting = start([{"tool_calls": [WRITE]}, {"content": "done"}])
    result = runs.run_decide(
        run_uuid=waiting.run.uuid,
        actor=decider,
        approved=True,
        turn_digest=read_pending_turn(waiting.run).turn_digest,
        mode="inline",
    )

    assert result.outcome == Outcome.FAILED
    run = AgentRun.objects.get()
    assert run.status == Status.RUNNING and run.pending_effect == "non_idempotent_write"
    assert run.claimed_by  # the lease runs out; the reaper's fence rule decides
    assert Note.objects.count() == 1


def test_the_api_answers_an_unexpected_error_with_typed_json(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("database on fire")

    monkeypatch.setattr(runs, "run_cancel", broken)
    staff = UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"])
    api = APIClient(raise_request_exception=False)
    api.force_authenticate(staff)
    run = AgentRun.objects.create(configuration=AgentConfigurationFactory(), prompt="p")

    response = api.post(f"/api/runs/{run.uuid}/cancel/")

    assert response.status_code == 500
    assert response.json() == {
        "code": "internal_error",
        "message": "An unexpected error occurred; it was logged.",
    }


# --- 3. Arguments are checked when the model proposes them -------------------------------------


def test_a_call_with_invalid_arguments_is_answered_at_once_and_never_shown_for_approval():
    result = start([{"tool_calls": [BROKEN]}, {"content": "sorry"}])

    assert result.outcome == Outcome.COMPLETED
    run = AgentRun.objects.get()
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()
    (tool,) = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert tool.payload["outcome"] == "invalid_arguments" and tool.payload["ok"] is False
    assert "body" in tool.payload["error"]
    assert not Note.objects.exists()


def test_only_the_valid_calls_of_a_turn_are_shown_for_approval():
    result = start([{"tool_calls": [BROKEN, WRITE]}, {"content": "done"}])

    assert result.outcome == Outcome.AWAITING_APPROVAL
    shown = read_pending_turn(result.run).calls
    assert [c.arguments for c in shown] == [WRITE["arguments"]]
    refused = [e for e in events(result.run) if e.kind == EventKind.TOOL]
    assert [e.payload["outcome"] for e in refused] == ["invalid_arguments"]
