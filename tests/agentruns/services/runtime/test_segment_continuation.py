"""Continuation from the last step boundary: the provider sees exactly the uninterrupted dialogue.

A run is interrupted by a crash inside a tool body (a ``BaseException`` that no layer catches,
like the process dying), its lease is reclaimed and a new segment continues it. What the
scripted provider was sent, call by call, must equal what an uninterrupted run of the same
script was sent.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from agentruns import transitions
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services.runs import run_start_sync
from agentruns.services.runtime import transcript
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.leases import reclaim_and_claim
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    call,
    config,
    decide_inline,
    decider,
    events,
    sent,
    tool_turn,
)

# ``sent(run)`` reads what the scripted provider recorded.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scripted_recordings")]

SCRIPT = [
    tool_turn(call("probe_read", value="a")),
    tool_turn(call("probe_read", value="b"), call("probe_read", value="c")),
    tool_turn(call("list_notes")),
    {"content": "the end"},
]


def crash_once_on(value: str):
    crashed: list[str] = []

    def during(entry):
        if entry["arguments"].get("value") == value and not crashed:
            crashed.append(value)
            raise ProcessDied()

    return during


def request_messages(run: AgentRun) -> list[list[dict]]:
    return list(transcript.request_messages(run).values())


def uninterrupted(configuration) -> AgentRun:
    result = run_start_sync(configuration=configuration, prompt="p", options={"script": SCRIPT})
    assert result.outcome == Outcome.COMPLETED
    return result.run


@pytest.mark.parametrize("crash_at", ["a", "c"])
def test_a_continued_run_sends_the_provider_the_uninterrupted_transcript(probes, crash_at):
    configuration = config(system_prompt="You are terse.")
    reference = uninterrupted(configuration)
    probes.seen.clear()
    probes.during = crash_once_on(crash_at)

    with pytest.raises(ProcessDied):
        run_start_sync(configuration=configuration, prompt="p", options={"script": SCRIPT})
    interrupted = AgentRun.objects.exclude(pk=reference.pk).get()
    assert interrupted.status == Status.RUNNING  # left behind with a lease, like a dead process
    lease = reclaim_and_claim(interrupted)

    result = continue_segment(lease)

    assert result.outcome == Outcome.COMPLETED
    interrupted.refresh_from_db()
    assert interrupted.output == reference.output == "the end"
    assert sent(interrupted) == sent(reference)
    assert len(sent(reference)) == 4
    assert request_messages(interrupted) == request_messages(reference)
    # The interrupted call ran again; the calls finished before the crash did not.
    values = [s["arguments"]["value"] for s in probes.seen]
    assert values == (["a", "a", "b", "c"] if crash_at == "a" else ["a", "b", "c", "c"])
    assert_contiguous(interrupted)
    assert_released(interrupted)
    # Usage and iterations count every provider call of the run, across both segments.
    assert interrupted.iterations == reference.iterations == 4
    assert interrupted.total_tokens == reference.total_tokens


def test_a_run_continued_across_an_approval_sends_the_same_transcript(probes):
    """The resume segment of an approved turn rebuilds the dialogue from the event stream: it
    matches a run whose identical turn needed no approval (a read instead of the write)."""
    approved_script = [
        tool_turn(call("probe_write", value="w")),
        {"content": "done"},
    ]
    configuration = config()
    suspended = run_start_sync(
        configuration=configuration, prompt="p", options={"script": approved_script}
    )
    assert suspended.outcome == Outcome.AWAITING_APPROVAL
    decide_inline(suspended.run)
    suspended.run.refresh_from_db()
    assert suspended.run.status == Status.COMPLETED

    first, second = sent(suspended.run)
    assert second[: len(first)] == first
    assistant, tool_message = second[len(first) :]
    assert assistant["tool_calls"][0]["id"] == "call_0_0"
    assert assistant["tool_calls"][0]["function"]["name"] == "probe_write"
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "content": '{"probed": "probe_write", "value": "w"}',
    }
    assert request_messages(suspended.run) == [first, second]


def test_continuing_a_finished_segment_boundary_does_not_repeat_provider_calls(probes):
    """Interrupted right after the model answered (before any call of its turn ran): the new
    segment executes the saved turn instead of asking the provider again."""
    configuration = config()
    reference = uninterrupted(configuration)
    probes.seen.clear()
    probes.during = crash_once_on("b")

    with pytest.raises(ProcessDied):
        run_start_sync(configuration=configuration, prompt="p", options={"script": SCRIPT})
    interrupted = AgentRun.objects.exclude(pk=reference.pk).get()
    calls_before = len(sent(interrupted))

    continue_segment(reclaim_and_claim(interrupted))

    # Two provider calls happened before the crash; the continuation made only the remaining two.
    assert calls_before == 2
    assert len(sent(interrupted)) == 4
    assert sent(interrupted) == sent(reference)


def test_an_approval_applied_by_a_segment_that_died_mid_write_survives_reconciliation(probes):
    """The approving segment dies inside the write (after the fence was stamped). The in-doubt
    run is reconciled "landed": the continuation must find the turn approved, not ask again,
    and must not run the write a second time."""
    from agentruns.services.runs import run_reconcile
    from agentruns.turns import PendingTurn

    script = [
        tool_turn(call("probe_create", value="once"), call("probe_read", value="after")),
        {"content": "reconciled"},
    ]
    suspended = run_start_sync(configuration=config(), prompt="p", options={"script": script})
    probes.during = crash_once_on("once")
    with pytest.raises(ProcessDied):
        decide_inline(suspended.run)
    run = AgentRun.objects.get(pk=suspended.run.pk)
    assert run.pending_effect == "non_idempotent_write"
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    run.refresh_from_db()
    assert transitions.run_mark_in_doubt(
        run_id=run.pk,
        pending_turn=PendingTurn.for_reconciliation(run),
        segment="reaper:test:1",
        event=EventSpec(EventKind.REAPER, {"rule": "in_doubt"}),
    )
    run.refresh_from_db()
    probes.during = None

    result = run_reconcile(
        run_uuid=run.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=card_digest(run),
        mode="inline",
    )

    assert result.outcome == Outcome.COMPLETED
    assert [s["arguments"]["value"] for s in probes.seen] == ["once", "after"]
    tools_done = [e.payload for e in events(run) if e.kind == EventKind.TOOL]
    assert [(p["call_id"], p["outcome"]) for p in tools_done] == [
        ("call_0_0", "reconciled_landed"),
        ("call_0_1", "executed"),
    ]


def test_a_crash_after_the_last_call_returned_reruns_it_and_keeps_the_transcript(
    probes, monkeypatch
):
    """The last call of a turn is recorded by the next ``request`` boundary. A segment dying in
    between loses that call's result like a crash inside it: the call runs again and the
    provider still sees the uninterrupted dialogue."""
    from agentruns.services.runtime import model_step

    configuration = config()
    reference = uninterrupted(configuration)
    probes.seen.clear()
    offered = model_step.offered_tools
    died: list[bool] = []

    def dies_after_c(gate):
        if [s["arguments"].get("value") for s in probes.seen][-1:] == ["c"] and not died:
            died.append(True)
            raise ProcessDied()
        return offered(gate)

    monkeypatch.setattr(model_step, "offered_tools", dies_after_c)
    with pytest.raises(ProcessDied):
        run_start_sync(configuration=configuration, prompt="p", options={"script": SCRIPT})
    interrupted = AgentRun.objects.exclude(pk=reference.pk).get()
    assert [e.payload["name"] for e in events(interrupted) if e.kind == EventKind.TOOL] == [
        "probe_read",
        "probe_read",
    ]  # a and b; c's result died with the segment

    continue_segment(reclaim_and_claim(interrupted))

    assert [s["arguments"]["value"] for s in probes.seen] == ["a", "b", "c", "c"]
    assert sent(interrupted) == sent(reference)
    assert request_messages(interrupted) == request_messages(reference)
