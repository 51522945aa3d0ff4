"""A decision per call and a process dying between two approved calls of one turn (docs/design.md
§5, §8; deterministic crash points, both databases): the first stays landed and fenced as any
approved call, the second runs once or is in doubt. The race with whole-turn decisions is in
``tests/agentruns/races/test_call_decisions.py``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from agentruns import transitions
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import reaper
from agentruns.services.reaper import Verdict
from agentruns.services.runs import run_decide, run_process_queued, run_reconcile, run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.tools.shown import shown_turn
from agentruns.turns import CallVerdict, read_pending_turn
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.runtime import call, config, decider, sent, tool_messages, tool_turn

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("scripted_recordings"),
]


def waiting(*calls: dict[str, Any]) -> AgentRun:
    result = run_start_sync(
        configuration=config(),
        prompt="go",
        options={"script": [tool_turn(*calls), {"content": "finished"}]},
    )
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def tool_payloads(run: AgentRun) -> list[dict[str, Any]]:
    return [
        e.payload
        for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL).order_by("sequence")
    ]


def expire_lease(run: AgentRun) -> None:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))


# --- A crash between two approved calls of one turn --------------------------------------------


def three_calls() -> tuple[AgentRun, list[CallVerdict]]:
    run = waiting(
        call("probe_write", value="first"),
        call("probe_read", value="denied"),
        call("probe_create", value="second"),
    )
    return run, [
        CallVerdict("call_0_0", "approve"),
        CallVerdict("call_0_1", "deny", reason="not this one"),
        CallVerdict("call_0_2", "approve"),
    ]


def assert_first_landed_and_fenced(run: AgentRun, probes: Any) -> None:
    first = probes.seen[0]
    assert first["tool"] == "probe_write"
    assert first["row"]["pending_effect"] == Effect.IDEMPOTENT_WRITE
    assert first["row"]["pending_call"]["id"] == "call_0_0"
    executed = [p for p in tool_payloads(run) if p["outcome"] == "executed"]
    assert [p["call_id"] for p in executed] == ["call_0_0"]


def test_dying_inside_the_second_approved_write_leaves_it_in_doubt_and_the_first_landed(probes):
    run, verdicts = three_calls()

    def dies_in_the_second(entry: dict[str, Any]) -> None:
        if entry["tool"] == "probe_create":
            raise ProcessDied()

    probes.during = dies_in_the_second
    with pytest.raises(ProcessDied):
        run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            turn_digest=run.pending_turn["turn_digest"],
            verdicts=verdicts,
            mode="inline",
        )
    probes.during = None

    assert [s["tool"] for s in probes.seen] == ["probe_write", "probe_create"]
    assert_first_landed_and_fenced(run, probes)
    row = AgentRun.objects.get(pk=run.pk)
    assert (row.status, row.pending_effect) == (Status.RUNNING, Effect.NON_IDEMPOTENT_WRITE)
    assert row.pending_call["id"] == "call_0_2"  # the first's fence was cleared before
    expire_lease(run)
    assert reaper.reap_stale_runs().count(Verdict.IN_DOUBT) == 1
    row.refresh_from_db()
    assert row.status == Status.WAITING_FOR_RECONCILIATION

    run_reconcile(
        run_uuid=run.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=shown_turn(row, read_pending_turn(row)).turn_digest,
        mode="inline",
    )

    row.refresh_from_db()
    assert row.status == Status.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write", "probe_create"]  # none again
    outcomes = {p["call_id"]: p["outcome"] for p in tool_payloads(run)}
    assert outcomes == {
        "call_0_0": "executed",
        "call_0_1": "denied",
        "call_0_2": "reconciled_landed",
    }
    assert len(tool_payloads(run)) == 3
    messages = tool_messages(sent(run)[-1])
    assert json.loads(messages["call_0_1"])["reason_given_by_the_reviewer"] == "not this one"


def test_dying_between_the_two_approved_writes_runs_the_second_once_after_a_requeue(
    probes, monkeypatch
):
    run, verdicts = three_calls()
    real_stamp, stamps = transitions.run_stamp_fence, []

    def dies_before_the_second_stamp(*args: Any, **kwargs: Any) -> bool:
        stamps.append(kwargs["call"]["id"])
        if len(stamps) == 2:
            raise ProcessDied()
        return real_stamp(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(transitions, "run_stamp_fence", dies_before_the_second_stamp)
        with pytest.raises(ProcessDied):
            run_decide(
                run_uuid=run.uuid,
                actor=decider(),
                turn_digest=run.pending_turn["turn_digest"],
                verdicts=verdicts,
                mode="inline",
            )

    assert stamps == ["call_0_0", "call_0_2"]
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    assert_first_landed_and_fenced(run, probes)
    row = AgentRun.objects.get(pk=run.pk)
    assert (row.status, row.pending_effect) == (Status.RUNNING, "")  # no write in flight
    expire_lease(run)
    assert reaper.reap_stale_runs().count(Verdict.REQUEUED) == 1

    result = run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.run.status == Status.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write", "probe_create"]
    second = probes.seen[1]
    assert second["row"]["pending_effect"] == Effect.NON_IDEMPOTENT_WRITE  # fenced
    outcomes = [(p["call_id"], p["outcome"]) for p in tool_payloads(run)]
    assert outcomes == [
        ("call_0_1", "denied"),
        ("call_0_0", "executed"),
        ("call_0_2", "executed"),
    ]
