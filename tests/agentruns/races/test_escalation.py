"""Escalation racing a person's decision (docs/design.md §5.11), with real threads on PostgreSQL.

Each round starts a real run of a configuration that escalates. One thread is the person: they
approve at a moment drawn around a deadline (by the database clock). The other is the reaper:
from the start it keeps trying to settle the run (``run_expire_waiting``, which only takes it once
the deadline passed) until it does or the run no longer waits.

* **The first deadline**: of the person's decision and the escalation, exactly one takes the
  first wait — decided (no escalation, ever), or escalated (once), after which a person's
  decision is one on the escalated wait or was refused past the deadline.
* **The second deadline**: of the person's decision and the final action, exactly one takes
  effect, once.

The assertions never depend on who wins; the ledger verifies after every round.
"""

from __future__ import annotations

import random
import time
from collections import Counter as Tally
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db.models.functions import Now

from agentruns import transitions
from agentruns.exceptions import AlreadyDecided, ApprovalExpired
from agentruns.models import DEADLINE_STATUSES, AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome as SegmentOutcome
from agentruns.transitions.deadlines import Expired
from tests.agentruns.support.races import race
from tests.agentruns.support.runtime import call, config, db_now, decider, tool_turn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 15
TIMEOUT = timedelta(milliseconds=300)
JITTER_S = 0.06  # the person decides up to this far either side of the deadline


def settle_when_due(run_id: int) -> Expired | None:
    """The reaper's side: settle (or escalate) the run once its deadline passed; ``None`` if it
    stopped waiting first."""
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        expired = transitions.run_expire_waiting(run_id=run_id, segment="reaper:race:1")
        if expired is not None:
            return expired
        if AgentRun.objects.values_list("status", flat=True).get(pk=run_id) not in (
            DEADLINE_STATUSES
        ):
            return None
        time.sleep(0.001)
    raise AssertionError("the deadline never settled the run")


def verify(run: AgentRun) -> None:
    out = StringIO()
    call_command("verify_ledger", "--run", str(run.uuid), stdout=out)
    assert "intact" in out.getvalue()


@pytest.fixture
def setting(probes):
    approvers = Group.objects.create(name="approvers")
    leads = Group.objects.create(name="leads")
    person = decider()
    person.groups.add(approvers, leads)
    configuration = config(
        script=[tool_turn(call("probe_create", value="x")), {"content": "done"}],
        approver_group=approvers,
        approval_timeout=TIMEOUT,
        on_approval_timeout="escalate",
        escalation_group=leads,
        escalation_timeout=TIMEOUT,
        on_escalation_timeout="fail",
    )
    return configuration, person


def waiting(configuration) -> tuple[AgentRun, str]:
    result = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert result.outcome == SegmentOutcome.AWAITING_APPROVAL
    run = AgentRun.objects.get(pk=result.run.pk)
    return run, run.pending_turn["turn_digest"]


def approve_around_the_deadline(run: AgentRun, digest: str, person):
    offset = random.uniform(-JITTER_S, JITTER_S)

    def decide() -> object:
        # Read in the racing thread: the moment is drawn from the deadline as it stands now.
        deadline = AgentRun.objects.values_list("approval_deadline", flat=True).get(pk=run.pk)
        time.sleep(max(0.0, (deadline - db_now()).total_seconds() + offset))
        return runs.run_decide(
            run_uuid=run.uuid, actor=person, approved=True, turn_digest=digest, mode="queued"
        )

    return decide


def test_a_decision_and_the_escalation_take_the_first_wait_exactly_once(setting):
    configuration, person = setting
    tally: Tally[str] = Tally()
    for _ in range(ROUNDS):
        run, digest = waiting(configuration)
        decided, settled = race(
            [
                approve_around_the_deadline(run, digest, person),
                lambda run=run: settle_when_due(run.pk),
            ]
        )
        assert settled.error is None, settled.error
        run.refresh_from_db()
        escalations = list(AgentRunEvent.objects.filter(run=run, kind=EventKind.ESCALATION))
        approvals = list(AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL))
        escalated = settled.value is not None
        assert len(escalations) == (1 if escalated else 0)
        assert len(approvals) == (1 if decided.error is None else 0)
        if not escalated:
            # The person took the first wait; it was never escalated.
            assert decided.error is None, decided.error
            assert run.status == Status.QUEUED and run.escalated_at is None
            tally["person"] += 1
        else:
            assert settled.value.action == "escalate"
            if decided.error is None:
                # Their decision came after the hand-over: one on the escalated wait.
                assert approvals[0].sequence > escalations[0].sequence
                assert run.status == Status.QUEUED
                tally["escalated, then decided"] += 1
            else:
                assert isinstance(decided.error, ApprovalExpired), decided.error
                assert run.status == Status.WAITING_FOR_APPROVAL and run.escalated_at is not None
                tally["escalated"] += 1
        verify(run)
    print(f"\nfirst deadline: {dict(tally)} over {ROUNDS} rounds")


def test_a_decision_and_the_final_action_take_effect_exactly_once(setting):
    configuration, person = setting
    tally: Tally[str] = Tally()
    for _ in range(ROUNDS):
        run, digest = waiting(configuration)
        AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))
        escalated = transitions.run_expire_waiting(run_id=run.pk, segment="reaper:setup:1")
        assert escalated is not None and escalated.action == "escalate"
        decided, settled = race(
            [
                approve_around_the_deadline(run, digest, person),
                lambda run=run: settle_when_due(run.pk),
            ]
        )
        assert settled.error is None, settled.error
        person_won = decided.error is None
        deadline_won = settled.value is not None
        assert person_won != deadline_won, (decided, settled)
        if not person_won:
            assert isinstance(decided.error, ApprovalExpired | AlreadyDecided), decided.error
        run.refresh_from_db()
        [event] = AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL)
        if person_won:
            assert event.actor_id == person.pk and run.status == Status.QUEUED
            tally["person"] += 1
        else:
            assert event.payload["by"] == "deadline" and event.payload["action"] == "fail"
            assert (run.status, run.termination_reason) == (Status.FAILED, "approval_expired")
            tally["deadline"] += 1
        assert AgentRunEvent.objects.filter(run=run, kind=EventKind.ESCALATION).count() == 1
        verify(run)
    print(f"\nsecond deadline: {dict(tally)} over {ROUNDS} rounds")
