"""The external surface on both databases: a framework's calls under the run's lease, approved in
the inbox, denied with a reason, replayed without running again, the ledger verifying."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from agentruns import external
from agentruns.audit import verify
from agentruns.exceptions import InvalidRequest, SelfApprovalRefused
from agentruns.external import (
    InvalidFramework,
    LeaseLost,
    NotHoldable,
    ProposedCall,
    RunCancelled,
    RunPaused,
    StateNotStorable,
    StateTooLarge,
)
from agentruns.models import AgentRun, EventKind, Status
from agentruns.selectors import unclaimed_queued_runs
from agentruns.services import reaper
from agentruns.services.deadline_sweep import expire_overdue
from agentruns.services.decisions import run_decide
from agentruns.services.runs import run_cancel, run_process_queued
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


def approved_and_held(configuration) -> external.Holding:
    run_uuid = paused_run(configuration)
    row = AgentRun.objects.get(uuid=run_uuid)
    run_decide(
        run_uuid=run_uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
    )
    return external.hold(run_uuid, framework=FRAMEWORK)


def test_a_holding_whose_lease_another_loop_took_raises_before_the_write_and_writes_nothing():
    first = approved_and_held(notes_config())
    AgentRun.objects.filter(uuid=first.run_uuid).update(lease_expires=Now() - timedelta(seconds=5))
    reaper.reap_stale_runs()
    assert AgentRun.objects.get(uuid=first.run_uuid).status == Status.QUEUED
    with external.hold(first.run_uuid, framework=FRAMEWORK) as second:
        assert second.lease.epoch == first.lease.epoch + 1
        with pytest.raises(LeaseLost):
            first.run_turn([NOTE])
        assert Note.objects.count() == 0
        with pytest.raises(LeaseLost):  # and nothing more, ever, under the old lease
            first.save_state({"t": 2})
        [outcome] = second.run_turn([NOTE])
        assert outcome.outcome == "executed"
    assert Note.objects.count() == 1
    assert AgentRun.objects.get(uuid=first.run_uuid).external_state == {"t": 1}


def test_a_cancel_is_noticed_before_the_next_call_and_recorded():
    held = approved_and_held(notes_config())
    run_cancel(run_uuid=held.run_uuid)
    with pytest.raises(RunCancelled):
        held.run_turn([NOTE])
    assert Note.objects.count() == 0
    row = AgentRun.objects.get(uuid=held.run_uuid)
    assert row.status == Status.CANCELLED and row.claimed_by == ""
    assert row.events.filter(kind=EventKind.CANCEL).count() == 2  # the cancel and its notice


def test_a_worker_never_claims_an_external_run_and_the_reaper_never_wakes_one():
    run_uuid = paused_run(notes_config())
    row = AgentRun.objects.get(uuid=run_uuid)
    run_decide(
        run_uuid=run_uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
    )
    assert run_process_queued(run_uuid=run_uuid) is None
    AgentRun.objects.filter(uuid=run_uuid).update(updated_at=Now() - timedelta(days=1))
    assert not unclaimed_queued_runs(older_than_seconds=1).filter(uuid=run_uuid).exists()
    with pytest.raises(NotHoldable):
        external.hold(run_uuid, framework="another")
    assert AgentRun.objects.get(uuid=run_uuid).status == Status.QUEUED


def test_a_framework_state_too_large_or_not_json_is_refused_before_anything_is_written(settings):
    settings.AGENTRUNS = {"EXTERNAL_STATE_MAX_BYTES": 64}
    with pytest.raises(StateTooLarge):
        external.open_run(
            configuration=notes_config(), prompt="p", framework=FRAMEWORK, state={"x": "y" * 100}
        )
    with pytest.raises(StateNotStorable):
        external.open_run(
            configuration=notes_config(), prompt="p", framework=FRAMEWORK, state={"x": "\x00"}
        )
    assert not AgentRun.objects.exists()
    with external.open_run(configuration=notes_config(), prompt="p", framework=FRAMEWORK) as run:
        with pytest.raises(StateTooLarge):
            run.save_state(["z" * 100])
        run.save_state(["ok"])
    assert external.stored_state(run.run_uuid) == ["ok"]


@pytest.mark.parametrize("name", ["", "LangGraph", "a b", "x" * 65, "../etc"])
def test_a_framework_name_outside_its_alphabet_is_refused(name):
    with pytest.raises(InvalidFramework):
        external.open_run(configuration=notes_config(), prompt="p", framework=name)


def test_hostile_calls_are_refused_or_fail_closed():
    with external.open_run(configuration=notes_config(), prompt="p", framework=FRAMEWORK) as run:
        with pytest.raises(InvalidRequest):
            run.propose([ProposedCall("x" * 200, "create_note", {})])
        with pytest.raises(InvalidRequest):
            run.propose([ProposedCall("c1", "create_note", {"title": "\ud800"})])
        # A tool the run may not use is an unknown non-idempotent write: it waits for a person.
        assert run.needs_approval(ProposedCall("c2", "delete_everything", {}))
        with pytest.raises(RunPaused) as paused:
            run.execute(ProposedCall("c2", "delete_everything", {}))
    [shown] = paused.value.card.calls
    assert shown["effect"] == "non_idempotent_write" and shown["known"] is False


def test_the_same_call_id_with_other_arguments_is_another_call():
    configuration = config(tools=["list_notes"])
    first = ProposedCall("c1", "list_notes", {})
    other = ProposedCall("c1", "list_notes", {"unexpected": 1})
    with external.open_run(configuration=configuration, prompt="p", framework=FRAMEWORK) as run:
        ran = run.execute(first)
        refused = run.execute(other)
        assert ran.outcome == "executed" and refused.outcome == "invalid_arguments"
        assert refused.call_id == f"c1~{refused.call_id.split('~')[1]}"
        assert run.execute(first).recorded and run.execute(other).recorded


def test_the_approval_deadline_denies_an_external_turn_and_the_framework_reads_that_it_expired():
    configuration = notes_config(approval_timeout=timedelta(minutes=5), on_approval_timeout="deny")
    run_uuid = paused_run(configuration)
    row = AgentRun.objects.get(uuid=run_uuid)
    assert row.approval_deadline is not None
    AgentRun.objects.filter(pk=row.pk).update(approval_deadline=Now() - timedelta(seconds=1))
    assert len(expire_overdue(identity="reaper:test:1")) == 1
    assert AgentRun.objects.get(pk=row.pk).status == Status.QUEUED
    with external.hold(run_uuid, framework=FRAMEWORK) as run:
        assert run.decision is not None and run.decision["by"] == "deadline"
        [outcome] = run.run_turn([NOTE])
    assert outcome.outcome == "expired" and Note.objects.count() == 0


def test_four_eyes_holds_for_an_external_run_the_initiator_may_deny_not_approve():
    ana = decider(username="ana")
    configuration = notes_config(require_second_approver=True)
    with (
        external.open_run(
            configuration=configuration, prompt="p", framework=FRAMEWORK, initiator=ana
        ) as run,
        pytest.raises(RunPaused) as paused,
    ):
        run.run_turn([NOTE])
    digest = paused.value.card.turn_digest
    with pytest.raises(SelfApprovalRefused):
        run_decide(run_uuid=run.run_uuid, actor=ana, approved=True, turn_digest=digest)
    run_decide(run_uuid=run.run_uuid, actor=decider(), approved=True, turn_digest=digest)
    assert AgentRun.objects.get(uuid=run.run_uuid).status == Status.QUEUED
