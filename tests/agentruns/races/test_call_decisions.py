"""A decision per call racing whole-turn decisions on one waiting run (docs/design.md §5; real
threads, PostgreSQL): exactly one wins, every other is told *already decided*, and the worker
runs exactly what the winner decided."""

from __future__ import annotations

from typing import Any

import pytest

from agentruns.exceptions import AlreadyDecided
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services.runs import run_decide, run_process_queued, run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.turns import CallVerdict, parse_decision
from tests.agentruns.support.races import race
from tests.agentruns.support.runtime import call, config, decider, tool_turn

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def waiting(*calls: dict[str, Any]) -> AgentRun:
    result = run_start_sync(
        configuration=config(),
        prompt="go",
        options={"script": [tool_turn(*calls), {"content": "finished"}]},
    )
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


@pytest.mark.parametrize("round_", range(3))
def test_a_per_call_decision_and_whole_turn_decisions_race_and_exactly_one_wins(probes, round_):
    run = waiting(call("probe_write", value="a"), call("probe_create", value="b"))
    digest = run.pending_turn["turn_digest"]
    staff = [decider() for _ in range(6)]
    per_call = [CallVerdict("call_0_0", "approve"), CallVerdict("call_0_1", "deny", reason="no")]

    def decision(i: int):
        if i % 2 == 0:
            return lambda: run_decide(
                run_uuid=run.uuid, actor=staff[i], turn_digest=digest, verdicts=per_call
            )
        return lambda: run_decide(
            run_uuid=run.uuid, actor=staff[i], turn_digest=digest, approved=i % 4 == 1
        )

    outcomes = race([decision(i) for i in range(6)])

    won = [i for i, o in enumerate(outcomes) if o.error is None]
    assert len(won) == 1, outcomes
    (winner,) = won
    assert all(type(o.error) is AlreadyDecided for i, o in enumerate(outcomes) if i != winner)
    row = AgentRun.objects.get(pk=run.pk)
    assert row.status == Status.QUEUED
    stored = parse_decision(row.loop_state["decision"])
    assert stored.decider_id == staff[winner].pk
    assert (stored.verdicts == tuple(per_call)) is (winner % 2 == 0)
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).count() == 1

    # The worker runs exactly what the winner decided.
    result = run_process_queued(run_uuid=run.uuid)
    assert result is not None and result.run.status == Status.COMPLETED
    ran = [seen["tool"] for seen in probes.seen]
    if winner % 2 == 0:
        assert ran == ["probe_write"]
    else:
        assert ran == (["probe_write", "probe_create"] if winner % 4 == 1 else [])
