"""The Agents SDK under a Leasehold run when things go wrong, on both databases: a process that
dies mid-write leaves the write in doubt, reaped, reconciled by a person and never run again; a
lease taken over before a write means the write never starts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db.models.functions import Now

from agentruns import transitions
from agentruns.audit import verify
from agentruns.external import openai_agents
from agentruns.external.openai_agents import _tools
from agentruns.external.openai_agents.scripted import ScriptedTurns, call, say
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import reaper
from agentruns.services.decisions import run_decide, run_reconcile
from agentruns.tools import OutcomeUnknown
from agentruns.tools.shown import shown_turn
from agentruns.turns import read_pending_turn
from playground.models import Note
from tests.agentruns.support import openai_agents as support
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.runtime import config, decider

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _clean_steps():
    yield
    support.AFTER_WRITE.clear()
    support.TOUCHED.clear()


def _die() -> None:
    raise ProcessDied()


def test_a_process_killed_mid_write_leaves_it_in_doubt_and_the_reconciled_write_never_runs_again():
    notes_agent = support.agent(support.save_then_answer())
    started = openai_agents.start(
        notes_agent, prompt="note the groceries", configuration=config(tools=support.TOOL_NAMES)
    )
    row = AgentRun.objects.get(uuid=started.run_uuid)
    run_decide(
        run_uuid=row.uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
    )
    support.AFTER_WRITE.append(_die)  # the note is inserted, then the process is gone

    with pytest.raises(ProcessDied):
        openai_agents.resume_all([notes_agent])

    row.refresh_from_db()
    assert row.status == Status.RUNNING and row.pending_effect == "non_idempotent_write"
    assert Note.objects.count() == 1
    AgentRun.objects.filter(pk=row.pk).update(lease_expires=Now() - timedelta(minutes=5))
    [verdict] = reaper.reap_stale_runs().verdicts
    assert verdict.run_uuid == row.uuid
    row.refresh_from_db()
    assert row.status == Status.WAITING_FOR_RECONCILIATION
    assert row.pending_turn["idempotency_key"] == f"{row.uuid}:call_save"
    assert openai_agents.resume_all([notes_agent]) == []  # nobody continues it meanwhile

    run_reconcile(
        run_uuid=row.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=shown_turn(row, read_pending_turn(row)).turn_digest,  # the card's
    )
    support.AFTER_WRITE.clear()
    [result] = openai_agents.resume_all([notes_agent])

    assert result.outcome == openai_agents.COMPLETED
    assert Note.objects.count() == 1  # never run again
    assert "took effect" in result.output or "landed" in result.output
    row.refresh_from_db()
    assert row.status == Status.COMPLETED
    outcomes = [e.payload["outcome"] for e in row.events.filter(kind=EventKind.TOOL)]
    assert outcomes == ["reconciled_landed"]
    report = verify(run_uuid=row.uuid)
    assert report.runs == 1 and not report.broken


OTHER_WORKER = "external-openai-agents:other-host:4242"


def take_over(run_id: int) -> None:
    """What the reaper and another worker do to a run whose holder looks dead."""
    AgentRun.objects.filter(pk=run_id).update(lease_expires=Now() - timedelta(minutes=5))
    assert transitions.run_reclaim_stale(
        run_id=run_id,
        segment="reaper:test:1",
        event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
    )
    claimed = transitions.run_claim_queued_row(
        run_id=run_id, identity=OTHER_WORKER, external_framework=openai_agents.FRAMEWORK
    )
    assert claimed is not None


class _TakenOverFirst(ScriptedTurns):
    """Another worker takes the run over while the model thinks."""

    async def get_response(self, *args, **kwargs):
        holding = _tools.current_holding.get()
        await sync_to_async(take_over, thread_sensitive=True)(holding.lease.run_id)
        return await super().get_response(*args, **kwargs)


def test_a_lease_taken_over_before_a_write_means_the_write_never_starts():
    model = _TakenOverFirst([[call("sdk_touch_notes", {}, call_id="call_touch")], [say("done")]])
    notes_agent = support.agent([], model=model)

    result = openai_agents.start(
        notes_agent, prompt="touch", configuration=config(tools=support.TOOL_NAMES)
    )

    assert result.outcome == openai_agents.LEASE_LOST
    assert support.TOUCHED == []
    row = AgentRun.objects.get(uuid=result.run_uuid)
    assert row.status == Status.RUNNING and row.claimed_by == OTHER_WORKER
    assert row.pending_effect == ""
    assert not row.events.filter(kind=EventKind.TOOL).exists()
    report = verify(run_uuid=row.uuid)
    assert report.runs == 1 and not report.broken


def _unknown() -> None:
    raise OutcomeUnknown("the notes service timed out after the insert was sent")


def test_a_body_that_cannot_tell_whether_its_write_landed_parks_the_run_in_doubt():
    notes_agent = support.agent(support.save_then_answer())
    started = openai_agents.start(
        notes_agent, prompt="note it", configuration=config(tools=support.TOOL_NAMES)
    )
    row = AgentRun.objects.get(uuid=started.run_uuid)
    run_decide(
        run_uuid=row.uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
    )
    support.AFTER_WRITE.append(_unknown)

    [result] = openai_agents.resume_all([notes_agent])

    assert result.outcome == openai_agents.WAITING
    assert result.card is not None and result.card.kind == "reconciliation"
    row.refresh_from_db()
    assert row.status == Status.WAITING_FOR_RECONCILIATION
    assert "timed out" in row.pending_turn["reason"]
    assert Note.objects.count() == 1
    assert not row.events.filter(kind=EventKind.TOOL).exists()  # never told the model it failed
