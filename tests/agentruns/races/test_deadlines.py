"""A person's decision arriving as the approval deadline passes (docs/design.md §5.11), with real
threads on PostgreSQL: exactly one of the two takes effect, once.

Each round starts a real run that waits for approval with a short deadline. One thread is the
person: it approves at a moment drawn around the deadline (by the database clock). The other is
the reaper: from the start it keeps trying to settle the run (``run_expire_waiting``, which only
takes it once the deadline passed) until it does or the run no longer waits. The assertions
never depend on who wins: exactly one winner, one decision event, a row that agrees with it,
and a ledger that verifies.
"""

from __future__ import annotations

import random
import time
from collections import Counter as Tally
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from agentruns import transitions
from agentruns.exceptions import AlreadyDecided, ApprovalExpired
from agentruns.models import DEADLINE_STATUSES, AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome as SegmentOutcome
from agentruns.transitions.deadlines import Expired
from tests.agentruns.support.races import race
from tests.agentruns.support.runtime import call, config, db_now, decider, tool_turn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 25
TIMEOUT = timedelta(milliseconds=150)
JITTER_S = 0.02  # the person decides up to this far either side of the deadline


def settle_when_due(run_id: int) -> Expired | None:
    """The reaper's side: settle the run once its deadline passed; ``None`` if it stopped
    waiting first (the person's decision won)."""
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


@pytest.mark.parametrize("action", ["deny", "fail"])
def test_a_decision_and_the_deadline_take_effect_exactly_once(probes, action):
    configuration = config(
        script=[tool_turn(call("probe_create", value="x")), {"content": "done"}],
        approval_timeout=TIMEOUT,
        on_approval_timeout=action,
    )
    person = decider()
    winners: Tally[str] = Tally()
    for _ in range(ROUNDS):
        result = runs.run_start_sync(configuration=configuration, prompt="write x")
        assert result.outcome == SegmentOutcome.AWAITING_APPROVAL
        run = AgentRun.objects.get(pk=result.run.pk)
        digest = run.pending_turn["turn_digest"]
        at = (run.approval_deadline - db_now()).total_seconds()
        at += random.uniform(-JITTER_S, JITTER_S)

        def decide(run: AgentRun = run, digest: str = digest, at: float = at) -> object:
            time.sleep(max(0.0, at))
            return runs.run_decide(
                run_uuid=run.uuid,
                actor=person,
                approved=True,
                turn_digest=digest,
                mode="queued",
            )

        decided, settled = race([decide, lambda run=run: settle_when_due(run.pk)])

        assert settled.error is None, settled.error
        person_won = decided.error is None
        deadline_won = settled.value is not None
        assert person_won != deadline_won, (decided, settled)
        if not person_won:
            # Refused past the deadline, or after the deadline settled it: nothing changed.
            assert isinstance(decided.error, ApprovalExpired | AlreadyDecided), decided.error
        run.refresh_from_db()
        decisions = list(
            AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).order_by("sequence")
        )
        assert len(decisions) == 1
        [event] = decisions
        if person_won:
            winners["person"] += 1
            assert event.actor_id == person.pk and event.payload["approved"] is True
            assert run.status == Status.QUEUED
            assert run.loop_state["decision"]["approved"] is True
        else:
            winners["deadline"] += 1
            assert event.actor_id is None and event.payload["by"] == "deadline"
            if action == "deny":
                assert run.status == Status.QUEUED
                assert run.loop_state["decision"] == {
                    "kind": "approval",
                    "approved": False,
                    "decider_id": None,
                    "turn_digest": digest,
                    "by": "deadline",
                }
            else:
                assert (run.status, run.termination_reason) == (Status.FAILED, "approval_expired")
        assert digest in run.loop_state["decided_digests"]
        out = StringIO()
        call_command("verify_ledger", "--run", str(run.uuid), stdout=out)
        assert "intact" in out.getvalue()
    assert probes.seen == []  # nothing ran: the approved runs wait in the queue
    print(f"\n{action}: {dict(winners)} over {ROUNDS} rounds")


def test_two_reapers_settle_each_overdue_run_exactly_once(probes):
    """Two passes at once over the same overdue runs: ``SKIP LOCKED`` and the re-checked guard
    give every run one settle and one event, whichever pass took it."""
    from agentruns.services import deadline_sweep

    configuration = config(
        script=[tool_turn(call("probe_create", value="x")), {"content": "done"}],
        approval_timeout=timedelta(microseconds=1),
        on_approval_timeout="deny",
    )
    waiting = [
        runs.run_start_sync(configuration=configuration, prompt=f"write {i}").run.pk
        for i in range(30)
    ]
    outcomes = race(
        [
            lambda: deadline_sweep.expire_overdue(identity="reaper:a:1"),
            lambda: deadline_sweep.expire_overdue(identity="reaper:b:2"),
        ]
    )
    assert [o.error for o in outcomes] == [None, None]
    taken = [o.run_uuid for outcome in outcomes for o in outcome.value if o.taken]
    assert len(taken) == len(set(taken)) == len(waiting)
    for run_id in waiting:
        assert AgentRun.objects.get(pk=run_id).status == Status.QUEUED
        assert AgentRunEvent.objects.filter(run_id=run_id, kind=EventKind.APPROVAL).count() == 1
