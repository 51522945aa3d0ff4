"""The external surface on both databases: a framework's calls under the run's lease, approved in
the inbox, denied with a reason, replayed without running again, the ledger verifying."""

from __future__ import annotations

import pytest

from agentruns import external
from agentruns.audit import verify
from agentruns.external import ProposedCall, RunPaused
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services.decisions import run_decide
from playground.models import Note
from tests.agentruns.support.runtime import config, decider

pytestmark = [pytest.mark.django_db]

FRAMEWORK = "tests"
NOTE = ProposedCall("call-1", "create_note", {"title": "groceries", "body": "eggs"})


def notes_config(**fields):
    return config(tools=["list_notes", "create_note"], **fields)


def paused_run(configuration) -> str:
    with (
        external.open_run(
            configuration=configuration, prompt="note it", framework=FRAMEWORK, state={"t": 1}
        ) as run,
        pytest.raises(RunPaused) as paused,
    ):
        run.run_turn([NOTE])
    assert paused.value.card.kind == "approval"
    return run.run_uuid


def test_a_write_waits_for_the_inbox_then_runs_once_and_a_replay_returns_the_record():
    run_uuid = paused_run(notes_config())
    row = AgentRun.objects.get(uuid=run_uuid)
    assert row.status == Status.WAITING_FOR_APPROVAL
    assert row.external_framework == FRAMEWORK and row.claimed_by == ""
    assert Note.objects.count() == 0
    run_decide(
        run_uuid=run_uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
        mode="inline",  # an external run is queued whatever is asked: its own loop continues it
    )
    assert AgentRun.objects.get(uuid=run_uuid).status == Status.QUEUED
    assert external.resumable(framework=FRAMEWORK) == [row.uuid]
    with external.hold(run_uuid, framework=FRAMEWORK) as run:
        assert run.decision is not None and run.decision["approved"] is True
        assert run.state == {"t": 1}
        [outcome] = run.run_turn([NOTE])
        assert outcome.outcome == "executed" and not outcome.recorded
        [again] = run.run_turn([NOTE])
        assert again.recorded and again.message == outcome.message
        run.complete("noted")
    assert Note.objects.count() == 1
    row = AgentRun.objects.get(uuid=run_uuid)
    assert row.status == Status.COMPLETED and row.output == "noted"
    report = verify(run_uuid=row.uuid)
    assert report.runs == 1 and not report.broken


def test_a_denial_with_a_reason_reaches_the_framework_and_nothing_runs():
    run_uuid = paused_run(notes_config())
    row = AgentRun.objects.get(uuid=run_uuid)
    run_decide(
        run_uuid=run_uuid,
        actor=decider(username="bob"),
        approved=False,
        reason="not today",
        turn_digest=row.pending_turn["turn_digest"],
    )
    with external.hold(run_uuid, framework=FRAMEWORK) as run:
        verdict = run.verdict(NOTE)
        assert verdict.state == "denied"
        assert "not today" in verdict.outcome.message and "bob" in verdict.outcome.message
        [outcome] = run.run_turn([NOTE])
        assert outcome.outcome == "denied" and outcome.recorded
    assert Note.objects.count() == 0
    assert AgentRun.objects.get(uuid=run_uuid).status == Status.QUEUED
    kinds = list(AgentRun.objects.get(uuid=run_uuid).events.values_list("kind", flat=True))
    assert kinds.count(EventKind.TOOL) == 1
