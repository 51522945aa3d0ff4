"""``runs_decide_batch``: one ``run_decide`` per distinct run, a result per run, a refusal of
one run never the batch's."""

from __future__ import annotations

import uuid

import pytest

from agentruns.exceptions import InvalidRequest, NotPermitted, RunNotFound
from agentruns.models import AgentRunEvent, Status
from agentruns.services.batch_decisions import (
    APPROVED,
    MAX_SELECTED,
    REFUSED,
    Selected,
    runs_decide_batch,
)
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import DECIDE, start_waiting_run

pytestmark = pytest.mark.django_db


def test_each_run_once_in_the_order_selected_and_a_missing_run_is_its_own_refusal():
    decider = UserFactory(permissions=[DECIDE])
    first, second = start_waiting_run(), start_waiting_run()
    missing = uuid.uuid4()
    chosen = [
        Selected(run_uuid=second.uuid, turn_digest=card_digest(second)),
        Selected(run_uuid=missing, turn_digest="0" * 64),
        Selected(run_uuid=first.uuid, turn_digest=card_digest(first)),
        Selected(run_uuid=second.uuid, turn_digest=card_digest(second)),
    ]
    outcomes = runs_decide_batch(selections=chosen, actor=decider, approved=True)
    assert [(o.run_uuid, o.outcome) for o in outcomes] == [
        (second.uuid, APPROVED),
        (missing, REFUSED),
        (first.uuid, APPROVED),
    ]
    assert isinstance(outcomes[1].refusal, RunNotFound)
    assert outcomes[0].result is not None and outcomes[0].result.run.status == Status.QUEUED
    assert AgentRunEvent.objects.filter(run=second, kind="approval").count() == 1


def test_without_the_permission_to_decide_every_run_is_refused_and_nothing_changes():
    nobody = UserFactory()
    run = start_waiting_run()
    [outcome] = runs_decide_batch(
        selections=[Selected(run_uuid=run.uuid, turn_digest=card_digest(run))],
        actor=nobody,
        approved=False,
    )
    assert outcome.outcome == REFUSED and isinstance(outcome.refusal, NotPermitted)
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL


def test_an_empty_or_oversized_selection_is_malformed():
    decider = UserFactory(permissions=[DECIDE])
    with pytest.raises(InvalidRequest):
        runs_decide_batch(selections=[], actor=decider, approved=True)
    too_many = [Selected(run_uuid=uuid.uuid4(), turn_digest="x") for _ in range(MAX_SELECTED + 1)]
    with pytest.raises(InvalidRequest):
        runs_decide_batch(selections=too_many, actor=decider, approved=True)
