"""External loops racing on PostgreSQL with real threads: of loops claiming one queued run
exactly one holds it, and a loop whose lease another took writes nothing."""

from __future__ import annotations

import pytest

from agentruns import external
from agentruns.external import NotHoldable, ProposedCall
from agentruns.models import AgentRun, Status
from agentruns.services.decisions import run_decide
from playground.models import Note
from tests.agentruns.support.races import race
from tests.agentruns.support.runtime import config, decider

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NOTE = ProposedCall("call-1", "create_note", {"title": "groceries", "body": "eggs"})


def decided_run() -> str:
    configuration = config(tools=["create_note"])
    with (
        external.open_run(configuration=configuration, prompt="p", framework="race") as run,
        pytest.raises(external.RunPaused),
    ):
        run.run_turn([NOTE])
    row = AgentRun.objects.get(uuid=run.run_uuid)
    run_decide(
        run_uuid=run.run_uuid,
        actor=decider(),
        approved=True,
        turn_digest=row.pending_turn["turn_digest"],
    )
    return run.run_uuid


def claim_and_run(run_uuid: str) -> str:
    with external.hold(run_uuid, framework="race") as run:
        [outcome] = run.run_turn([NOTE])
        run.complete("done")
    return outcome.outcome


def test_eight_loops_claim_one_decided_run_exactly_one_holds_it_and_the_note_is_saved_once():
    run_uuid = decided_run()
    outcomes = race([lambda: claim_and_run(run_uuid) for _ in range(8)])
    won = [o.value for o in outcomes if o.error is None]
    lost = [o.error for o in outcomes if o.error is not None]
    assert won == ["executed"]
    assert all(isinstance(error, NotHoldable) for error in lost), lost
    assert Note.objects.count() == 1
    assert AgentRun.objects.get(uuid=run_uuid).status == Status.COMPLETED
