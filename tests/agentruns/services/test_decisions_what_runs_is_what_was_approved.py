"""What runs hashes to what was approved (issue 12, docs/design.md §5.4, §5.9).

A decision is bound to a digest. Under the row lock the digest is recomputed from the turn the
next segment will execute (``loop_state.turn``), not read from the card that was shown; and the
segment that applies the decision recomputes it once more before any call runs. Each stored part
is tampered with in turn: every tampering is refused or re-asked, and no write runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentruns.exceptions import UnreadableState
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import PendingTurn, read_pending_turn, turn_digest
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import (
    card_digest,
    digest,
    waiting_for_approval,
    waiting_for_input,
)

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"


@pytest.fixture
def decider(db):
    return UserFactory(username="decider", permissions=[DECIDE])


def edit(run: AgentRun, column: str, change: Callable[[dict[str, Any]], None]) -> None:
    value = AgentRun.objects.values_list(column, flat=True).get(pk=run.pk)
    change(value)
    AgentRun.objects.filter(pk=run.pk).update(**{column: value})


def redigest(turn: dict[str, Any]) -> None:
    """Make a tampered approval card self-consistent again: its digest matches what it shows."""
    turn["turn_digest"] = turn_digest(turn["calls"])


def show_another_call(turn: dict[str, Any]) -> None:
    turn["calls"][0].update(name="update_note", arguments={"id": 1, "title": "harmless rename"})
    redigest(turn)


def show_other_arguments(turn: dict[str, Any]) -> None:
    turn["calls"][0]["arguments"] = {"title": "t", "body": "something else"}
    redigest(turn)


def show_another_id(turn: dict[str, Any]) -> None:
    turn["calls"][0]["id"] = "call_9_9"
    redigest(turn)


def run_another_call(state: dict[str, Any]) -> None:
    state["turn"]["calls"][0].update(name="update_note", arguments={"id": 1, "title": "x"})


def run_other_arguments(state: dict[str, Any]) -> None:
    state["turn"]["calls"][0]["arguments"] = {"title": "t", "body": "something else"}


def run_an_extra_call(state: dict[str, Any]) -> None:
    calls = state["turn"]["calls"]
    calls.append({**calls[0], "id": calls[0]["id"] + "~x"})


def drop_the_turn(state: dict[str, Any]) -> None:
    state["turn"] = None


@pytest.mark.parametrize("mode", ["inline", "queued"])
@pytest.mark.parametrize(
    ("column", "change"),
    [
        ("pending_turn", show_another_call),
        ("pending_turn", show_other_arguments),
        ("pending_turn", show_another_id),
        ("loop_state", run_another_call),
        ("loop_state", run_other_arguments),
        ("loop_state", run_an_extra_call),
        ("loop_state", drop_the_turn),
    ],
)
def test_an_approval_of_a_card_that_is_not_what_would_run_is_refused(decider, mode, column, change):
    run = waiting_for_approval()
    edit(run, column, change)
    shown = card_digest(run)  # what the card shows now, and sends
    before = AgentRun.objects.values().get(pk=run.pk)

    with pytest.raises(UnreadableState):
        runs.run_decide(
            run_uuid=run.uuid, actor=decider, approved=True, turn_digest=shown, mode=mode
        )

    assert AgentRun.objects.values().get(pk=run.pk) == before
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()
    assert not Note.objects.filter(title="t").exists()


def test_an_input_whose_call_is_not_the_one_that_would_run_is_refused(decider):
    run = waiting_for_input()
    edit(run, "loop_state", lambda s: s["turn"]["calls"][0].update(arguments={"question": "pin?"}))

    with pytest.raises(UnreadableState):
        runs.run_submit_input(
            run_uuid=run.uuid, actor=decider, values={"answer": "x"}, turn_digest=digest(run)
        )
    assert not run.events.filter(kind=EventKind.INPUT).exists()


def test_a_verdict_on_a_call_that_is_not_the_one_in_flight_is_refused(decider):
    run = waiting_for_approval()
    # Park it in doubt on its write, then change the stamped call under the card.
    pending_call = {**run.pending_turn["calls"][0]}
    AgentRun.objects.filter(pk=run.pk).update(
        status=Status.WAITING_FOR_RECONCILIATION,
        pending_effect="non_idempotent_write",
        pending_call=pending_call,
    )
    run.refresh_from_db()
    AgentRun.objects.filter(pk=run.pk).update(
        pending_turn=PendingTurn.for_reconciliation(run).to_json()
    )
    shown = digest(run)
    edit(run, "pending_call", lambda call: call.update(arguments={"title": "other"}))

    with pytest.raises(UnreadableState):
        runs.run_reconcile(run_uuid=run.uuid, actor=decider, verdict="landed", turn_digest=shown)
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION


def test_the_segment_runs_nothing_when_the_turn_changed_after_the_decision(decider):
    """The decision passed the lock's check; then the turn the worker will execute is changed.
    The worker recomputes the digest before any call: nothing runs, a ``verification`` event
    says why, and the run waits for approval again on a card for what would really run."""
    run = waiting_for_approval()
    shown = digest(run)
    queued = runs.run_decide(
        run_uuid=run.uuid, actor=decider, approved=True, turn_digest=shown, mode="queued"
    )
    assert queued.outcome == Outcome.QUEUED
    edit(run, "loop_state", run_other_arguments)

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.AWAITING_APPROVAL
    assert not Note.objects.exists()
    (check,) = run.events.filter(kind=EventKind.VERIFICATION)
    assert check.payload["verdict"] == "mismatch"
    assert check.payload["decided_digest"] == shown
    assert check.payload["executing_digest"] != shown
    run.refresh_from_db()
    card = read_pending_turn(run)
    assert card.readable and card.turn_digest != shown
    assert card.calls[0].arguments == {"title": "t", "body": "something else"}
    # The fresh card can be approved, and then exactly it runs.
    runs.run_decide(
        run_uuid=run.uuid, actor=decider, approved=True, turn_digest=card.turn_digest, mode="inline"
    )
    assert list(Note.objects.values_list("body", flat=True)) == ["something else"]


def test_a_denial_still_applies_when_the_turn_changed(decider):
    run = waiting_for_approval()
    shown = digest(run)
    runs.run_decide(
        run_uuid=run.uuid, actor=decider, approved=False, turn_digest=shown, mode="queued"
    )
    edit(run, "loop_state", run_other_arguments)

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.COMPLETED
    assert not Note.objects.exists()
    assert not run.events.filter(kind=EventKind.VERIFICATION).exists()
