"""A decision is audited if and only if it took effect (docs/design.md §2.2, §5.4, §13): when its
event cannot be written, the decision raises ``StateWriteFailed`` and leaves the run row and its
events exactly as they were — nothing claimed, no digest spent, no wake-up sent, nothing run —
and the same decision takes effect once the database accepts the event.

Real runs through the services, each decision kind, on both databases in autocommit (the
decision's transaction is the outermost one, as in production). The event ``INSERT`` fails in
two ways: a sequence collision the database refuses (as when another writer took the next
sequence), and a database error from the writer's insert itself.

The slips these catch: a decision event written outside the decision's transaction (after
commit, "the audit can follow"), or an event insert whose failure is swallowed so the decision
stands without its event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, OperationalError
from django_q.models import OrmQ

from agentruns.exceptions import StateWriteFailed
from agentruns.models import AgentRun, AgentRunEvent, EventKind
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome, SegmentResult
from agentruns.transitions import deciding
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import (
    call,
    config,
    decide_inline,
    decider,
    outcome_unknown_once,
    tool_turn,
)
from tests.agentruns.support.transitions import refuse_event_inserts

pytestmark = pytest.mark.django_db(transaction=True)

WRITE = call("probe_create", value="x")


# --- runs waiting for each kind of decision -----------------------------------------------------


def waiting_for_approval(probes: Any) -> AgentRun:
    configuration = config(script=[tool_turn(WRITE), {"content": "done"}])
    result = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def waiting_for_input(probes: Any) -> AgentRun:
    configuration = config(
        script=[tool_turn(call("probe_ask", question="which colour?")), {"content": "thanks"}]
    )
    result = runs.run_start_sync(configuration=configuration, prompt="ask me")
    assert result.outcome == Outcome.AWAITING_INPUT
    return result.run


def waiting_for_reconciliation(probes: Any) -> AgentRun:
    run = waiting_for_approval(probes)
    probes.during = outcome_unknown_once()
    assert decide_inline(run).outcome == Outcome.AWAITING_RECONCILIATION
    probes.during = None
    return run


def digest(run: AgentRun) -> str:
    return card_digest(run)


Decide = Callable[[AgentRun], SegmentResult]


def approve(mode: str, approved: bool = True) -> Decide:
    return lambda run: runs.run_decide(
        run_uuid=run.uuid, actor=decider(), approved=approved, turn_digest=digest(run), mode=mode
    )


def answer(mode: str) -> Decide:
    return lambda run: runs.run_submit_input(
        run_uuid=run.uuid,
        actor=decider(),
        values={"answer": "blue"},
        turn_digest=digest(run),
        mode=mode,
    )


def reconcile(verdict: str, mode: str = "queued") -> Decide:
    return lambda run: runs.run_reconcile(
        run_uuid=run.uuid, actor=decider(), verdict=verdict, turn_digest=digest(run), mode=mode
    )


#: name: (the run waiting for it, the decision, the kind of its event)
DECISIONS: dict[str, tuple[Callable[[Any], AgentRun], Decide, str]] = {
    "approve-inline": (waiting_for_approval, approve("inline"), EventKind.APPROVAL),
    "approve-queued": (waiting_for_approval, approve("queued"), EventKind.APPROVAL),
    "deny-inline": (waiting_for_approval, approve("inline", approved=False), EventKind.APPROVAL),
    "input-inline": (waiting_for_input, answer("inline"), EventKind.INPUT),
    "input-queued": (waiting_for_input, answer("queued"), EventKind.INPUT),
    "landed-inline": (
        waiting_for_reconciliation,
        reconcile("landed", "inline"),
        EventKind.RECONCILIATION,
    ),
    "not-landed-queued": (
        waiting_for_reconciliation,
        reconcile("not_landed"),
        EventKind.RECONCILIATION,
    ),
    "abandon": (waiting_for_reconciliation, reconcile("abandon"), EventKind.RECONCILIATION),
}


# --- ways the event INSERT fails ----------------------------------------------------------------


def sequence_collision(monkeypatch: pytest.MonkeyPatch) -> type[DatabaseError]:
    """The decision numbers its event with a sequence already taken (the locked row's counter
    is behind its events): the database refuses it."""
    lock_run = deciding._lock_run

    def behind(run_uuid: Any) -> Any:
        run = lock_run(run_uuid)
        run.next_sequence -= 1
        return run

    monkeypatch.setattr(deciding, "_lock_run", behind)
    return IntegrityError


def insert_error(monkeypatch: pytest.MonkeyPatch) -> type[DatabaseError]:
    """The writer's event insert fails with a database error (a lost connection, a full disk):
    on PostgreSQL the decision's one statement, on SQLite its INSERT after the UPDATE."""
    refuse_event_inserts(monkeypatch)
    return OperationalError


FAILURES = {"sequence-collision": sequence_collision, "insert-error": insert_error}


def whole(run: AgentRun) -> dict[str, Any]:
    """The run's row, every event in full, the wake-ups queued."""
    return {
        "row": AgentRun.objects.filter(pk=run.pk).values().get(),
        "events": list(AgentRunEvent.objects.filter(run_id=run.pk).order_by("sequence").values()),
        "wake-ups": OrmQ.objects.count(),
    }


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("name", DECISIONS)
def test_a_decision_whose_event_cannot_be_written_changes_nothing(
    probes, monkeypatch, name, failure
):
    waiting, decide, kind = DECISIONS[name]
    run = waiting(probes)
    before = whole(run)
    executions = len(probes.seen)

    with monkeypatch.context() as patch:
        cause = FAILURES[failure](patch)
        with pytest.raises(StateWriteFailed) as caught:
            decide(run)

    assert isinstance(caught.value.__cause__, cause)
    assert whole(run) == before
    assert len(probes.seen) == executions
    # Nothing was spent: the very same decision takes effect now, with its one event.
    result = decide(run)
    assert result.run.status != before["row"]["status"]
    assert AgentRunEvent.objects.filter(run_id=run.pk, kind=kind).count() == 1 + sum(
        1 for e in before["events"] if e["kind"] == kind
    )
