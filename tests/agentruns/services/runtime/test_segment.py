"""The agent loop on both databases: completion, approval, four-eyes, input, limits, failures.

Lease loss, the ticker and real processes are in ``test_segment_lease.py``; continuation from
the last boundary in ``test_segment_continuation.py``; the ``openai`` provider in
``providers/test_openai_compat_runs.py``.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns.exceptions import (
    InvalidInput,
    NotWaiting,
    SelfApprovalRefused,
    StaleTurn,
    WriteWithoutDurableExecution,
)
from agentruns.leases import Lease
from agentruns.models import AgentRun, Effect, EventKind, Status, TerminationReason
from agentruns.services.runs import (
    run_cancel,
    run_decide,
    run_process_queued,
    run_start_sync,
    run_submit_input,
)
from agentruns.services.runtime import tool_step
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from agentruns.services.runtime.transcript import DENIED_MESSAGE, denied_message
from agentruns.tools import Tool, registry
from agentruns.turns import Call, turn_digest
from playground.models import Note
from tests.agentruns.factories import AgentRunFactory, UserFactory, lease_for
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    call,
    config,
    decide_inline,
    decider,
    events,
    kinds,
    sent,
    snapshot,
    tool_messages,
    tool_turn,
)

# ``sent(run)`` reads what the scripted provider recorded.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scripted_recordings")]


def start(configuration, script, *, initiator=None, **options):
    return run_start_sync(
        configuration=configuration,
        prompt="do the thing",
        initiator=initiator,
        options={"script": script, **options},
    )


# --- A read-only run --------------------------------------------------------------------------


def test_a_read_only_run_completes_with_contiguous_events_and_right_totals(probes):
    Note.objects.create(title="first", body="b")
    script = [
        tool_turn(call("list_notes"), usage={"prompt_tokens": 10, "completion_tokens": 3}),
        tool_turn(
            call("probe_read", value="x"), usage={"prompt_tokens": 20, "completion_tokens": 4}
        ),
        {"content": "all read", "usage": {"prompt_tokens": 30, "completion_tokens": 5}},
    ]

    result = start(config(), script)

    run = result.run
    assert result.outcome == Outcome.COMPLETED
    assert run.status == Status.COMPLETED
    assert run.termination_reason == TerminationReason.COMPLETED
    assert run.output == "all read"
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (60, 12, 72)
    assert run.iterations == 3
    assert run.truncated is False
    assert run.finished_at is not None
    assert_released(run)
    stream = assert_contiguous(run)
    assert [e.kind for e in stream] == [
        EventKind.LEASE,
        EventKind.REQUEST,
        EventKind.LLM,
        EventKind.TOOL,
        EventKind.REQUEST,
        EventKind.LLM,
        EventKind.TOOL,
        EventKind.REQUEST,
        EventKind.LLM,
    ]
    # One segment wrote everything: the interactive identity, epoch 1.
    assert {(e.segment, e.lease_epoch) for e in stream} == {(stream[0].segment, 1)}
    assert stream[0].segment.startswith("interactive:")
    listed = stream[3].payload
    assert listed["ok"] is True and listed["result"]["notes"][0]["title"] == "first"
    # The read ran with the fencing token of the lease and no fence stamped.
    (seen,) = probes.seen
    assert seen["fencing_token"] == 1
    assert seen["row"]["pending_effect"] == ""
    assert seen["row"]["claimed_by"].startswith("interactive:")
    assert seen["idempotency_key"] == f"{run.uuid}:call_1_0"
    # The provider saw the tool results.
    assert len(sent(run)) == 3
    assert json.loads(tool_messages(sent(run)[2])["call_1_0"]) == {
        "probed": "probe_read",
        "value": "x",
    }


# --- Approval -------------------------------------------------------------------------------


def _write_script(note: Note) -> list[dict]:
    return [
        tool_turn(call("read_note", id=note.pk), call("probe_write", value="new")),
        {"content": "finished"},
    ]


def _suspended_write(probes, **config_fields):
    note = Note.objects.create(title="old", body="b")
    initiator = decider()
    result = start(
        config(tools=["read_note", "probe_write"], **config_fields),
        _write_script(note),
        initiator=initiator,
    )
    return result, note, initiator


def test_a_write_suspends_before_executing_with_its_pending_turn(probes):
    result, note, _ = _suspended_write(probes)

    run = result.run
    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert run.status == Status.WAITING_FOR_APPROVAL
    # Nothing of the turn ran, not even the read: the whole turn waits.
    assert probes.seen == []
    assert EventKind.TOOL not in kinds(run)
    note.refresh_from_db()
    assert note.title == "old"
    pending = run.pending_turn
    assert pending["kind"] == "approval"
    assert [(c["id"], c["name"], c["arguments"], c["effect"]) for c in pending["calls"]] == [
        ("call_0_0", "read_note", {"id": note.pk}, Effect.READ),
        ("call_0_1", "probe_write", {"value": "new"}, Effect.IDEMPOTENT_WRITE),
    ]
    assert pending["turn_digest"] == turn_digest(pending["calls"])
    assert_released(run)
    assert run.lease_epoch == 1
    assert_contiguous(run)


def test_approving_inline_runs_the_write_fenced_under_a_resume_identity(probes):
    result, _, initiator = _suspended_write(probes)
    run = result.run
    approver = decider()

    decided = decide_inline(run, actor=approver)

    assert decided.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert run.output == "finished"
    assert run.lease_epoch == 2
    assert_released(run)
    # While the write's body ran, the row carried the fence and the resume claim.
    (seen,) = probes.seen
    assert seen["row"]["status"] == Status.RUNNING
    assert seen["row"]["claimed_by"].startswith("resume:")
    assert seen["row"]["lease_epoch"] == 2
    assert seen["row"]["lease_expires"] is not None
    assert seen["row"]["pending_effect"] == Effect.IDEMPOTENT_WRITE
    assert seen["row"]["pending_call"] == {
        "id": "call_0_1",
        "name": "probe_write",
        "arguments": {"value": "new"},
        "effect": Effect.IDEMPOTENT_WRITE,
    }
    assert seen["fencing_token"] == 2
    assert seen["idempotency_key"] == f"{run.uuid}:call_0_1"
    assert seen["initiator_id"] == initiator.pk
    stream = assert_contiguous(run)
    approval = next(e for e in stream if e.kind == EventKind.APPROVAL)
    assert approval.actor_id == approver.pk
    assert approval.payload["approved"] is True
    tools_run = [e for e in stream if e.kind == EventKind.TOOL]
    assert [e.payload["name"] for e in tools_run] == ["read_note", "probe_write"]
    assert all(e.segment.startswith("resume:") and e.lease_epoch == 2 for e in tools_run)
    assert [e.payload["outcome"] for e in tools_run] == ["executed", "executed"]


def test_approving_a_real_note_update_changes_the_note_once(probes):
    note = Note.objects.create(title="old", body="b")
    result = start(
        config(tools=["update_note"]),
        [tool_turn(call("update_note", id=note.pk, title="new")), {"content": "ok"}],
    )
    note.refresh_from_db()
    assert note.title == "old"

    decided = decide_inline(result.run)

    assert decided.outcome == Outcome.COMPLETED
    note.refresh_from_db()
    assert note.title == "new"


def test_denying_runs_nothing_and_the_model_receives_the_denial(probes):
    result, note, _ = _suspended_write(probes)
    run = result.run
    denier = decider()

    decided = decide_inline(run, actor=denier, approved=False)

    assert decided.outcome == Outcome.COMPLETED
    assert probes.seen == []
    note.refresh_from_db()
    assert note.title == "old"
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert_released(run)
    stream = assert_contiguous(run)
    denied = [e for e in stream if e.kind == EventKind.TOOL]
    assert [(e.payload["call_id"], e.payload["outcome"]) for e in denied] == [
        ("call_0_0", "denied"),
        ("call_0_1", "denied"),
    ]
    approval = next(e for e in stream if e.kind == EventKind.APPROVAL)
    assert approval.payload["approved"] is False and approval.actor_id == denier.pk
    # The second provider call carried one denial per call of the turn, naming who denied.
    last = sent(run)[-1]
    assert {k: json.loads(v) for k, v in tool_messages(last).items()} == {
        "call_0_0": {"error": denied_message(denier.get_username())},
        "call_0_1": {"error": denied_message(denier.get_username())},
    }
    assert denied_message("") == DENIED_MESSAGE  # who, when the decision does not say


@pytest.mark.parametrize("digest", [None, "", "0" * 64])
def test_a_missing_or_stale_digest_is_refused_and_changes_nothing(probes, digest):
    result, _, _ = _suspended_write(probes)
    before = snapshot(result.run)

    with pytest.raises(StaleTurn):
        run_decide(
            run_uuid=result.run.uuid,
            actor=decider(),
            approved=True,
            turn_digest=digest,
            mode="inline",
        )

    assert snapshot(result.run) == before
    assert probes.seen == []


def test_an_approval_after_a_cancel_is_refused(probes):
    result, _, _ = _suspended_write(probes)
    run = result.run
    digest = run.pending_turn["turn_digest"]
    assert run_cancel(run_uuid=run.uuid) is True
    before = snapshot(run)

    with pytest.raises(NotWaiting):
        run_decide(
            run_uuid=run.uuid, actor=decider(), approved=True, turn_digest=digest, mode="inline"
        )

    assert snapshot(run) == before
    assert probes.seen == []
    run.refresh_from_db()
    assert run.status == Status.CANCELLED


def test_a_second_approval_of_the_same_turn_is_refused(probes):
    result, _, _ = _suspended_write(probes)
    digest = result.run.pending_turn["turn_digest"]
    run_decide(
        run_uuid=result.run.uuid, actor=decider(), approved=True, turn_digest=digest, mode="inline"
    )
    before = snapshot(result.run)

    with pytest.raises(Exception) as refused:
        run_decide(
            run_uuid=result.run.uuid,
            actor=decider(),
            approved=True,
            turn_digest=digest,
            mode="inline",
        )

    assert refused.value.code in {"already_decided", "not_waiting"}
    assert snapshot(result.run) == before
    assert len(probes.seen) == 1


# --- Four-eyes ------------------------------------------------------------------------------


def test_four_eyes_refuses_the_initiators_approval_and_accepts_their_denial(probes):
    result, _, initiator = _suspended_write(probes, require_second_approver=True)
    run = result.run
    digest = run.pending_turn["turn_digest"]
    before = snapshot(run)

    with pytest.raises(SelfApprovalRefused):
        run_decide(
            run_uuid=run.uuid, actor=initiator, approved=True, turn_digest=digest, mode="inline"
        )
    assert snapshot(run) == before

    denied = run_decide(
        run_uuid=run.uuid, actor=initiator, approved=False, turn_digest=digest, mode="inline"
    )
    assert denied.outcome == Outcome.COMPLETED
    assert probes.seen == []
    approval = next(e for e in events(run) if e.kind == EventKind.APPROVAL)
    assert approval.actor_id == initiator.pk and approval.payload["approved"] is False


def test_four_eyes_a_colleagues_approval_runs_the_write(probes):
    result, _, _ = _suspended_write(probes, require_second_approver=True)
    colleague = decider()

    decided = decide_inline(result.run, actor=colleague)

    assert decided.outcome == Outcome.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    approval = next(e for e in events(result.run) if e.kind == EventKind.APPROVAL)
    assert approval.actor_id == colleague.pk


def test_without_four_eyes_the_initiator_may_approve(probes):
    result, _, initiator = _suspended_write(probes)

    decided = decide_inline(result.run, actor=initiator)

    assert decided.outcome == Outcome.COMPLETED
    assert len(probes.seen) == 1


# --- The fence hook without a lease ---------------------------------------------------------


@pytest.mark.parametrize("name", ["probe_write", "probe_create"])
def test_a_write_without_a_lease_raises_before_the_body_runs(probes, name):
    with pytest.raises(WriteWithoutDurableExecution):
        tool_step.execute_tool_call(
            tool=registry.get(name),
            name=name,
            call_id="call_0_0",
            arguments={"value": "x"},
            lease=None,
            initiator_id=None,
            run_uuid=uuid.uuid4(),
        )
    assert probes.seen == []


def test_an_unknown_tool_without_a_lease_is_treated_as_a_write(probes):
    with pytest.raises(WriteWithoutDurableExecution):
        tool_step.execute_tool_call(
            tool=None,
            name="no_such_tool",
            call_id="call_0_0",
            arguments={},
            lease=None,
            initiator_id=None,
            run_uuid=uuid.uuid4(),
        )


def test_a_lease_on_no_persisted_run_is_refused_for_a_write(probes):
    unpersisted = Lease(0, uuid.uuid4(), "interactive:x:1", 1, next_sequence=0)
    with pytest.raises(WriteWithoutDurableExecution):
        tool_step.before_tool(
            effect=Effect.NON_IDEMPOTENT_WRITE,
            lease=unpersisted,
            call=Call(id="c", name="probe_create"),
        )


def test_a_read_without_a_lease_runs(probes):
    step = tool_step.execute_tool_call(
        tool=registry.get("probe_read"),
        name="probe_read",
        call_id="call_0_0",
        arguments={"value": "x"},
        lease=None,
        initiator_id=None,
        run_uuid=uuid.uuid4(),
    )
    assert step.ran and step.result is not None
    assert step.result.ok is True
    assert step.result.content == {"probed": "probe_read", "value": "x"}
    assert step.lease_lost is False
    assert [s["tool"] for s in probes.seen] == ["probe_read"]
    assert probes.seen[0]["fencing_token"] == 0


def test_a_write_whose_fence_stamp_matches_no_row_does_not_run(probes):
    """A lease that no longer matches the row (another epoch took it): the body never runs."""
    run = AgentRunFactory(running=True)
    stale = lease_for(run)
    stale.epoch = run.lease_epoch + 5  # not the row's epoch: a zombie's token
    step = tool_step.execute_tool_call(
        tool=registry.get("probe_write"),
        name="probe_write",
        call_id="call_0_0",
        arguments={"value": "x"},
        lease=stale,
        initiator_id=None,
        run_uuid=run.uuid,
    )
    assert (step.ran, step.lease_lost) == (False, True)
    assert probes.seen == []
    run.refresh_from_db()
    assert run.pending_effect == ""


# --- Input ----------------------------------------------------------------------------------


def _waiting_for_input(probes):
    result = start(
        config(tools=["probe_ask"]),
        [
            tool_turn(call("probe_ask", question="which colour?", answer="model's guess")),
            {"content": "thanks"},
        ],
    )
    assert result.outcome == Outcome.AWAITING_INPUT
    return result.run


@pytest.mark.parametrize("values", [{}, {"answer": ""}, {"answer": 3}, "not an object"])
def test_invalid_input_is_refused_before_anything_changes(probes, values):
    run = _waiting_for_input(probes)
    before = snapshot(run)

    with pytest.raises(InvalidInput) as refused:
        run_submit_input(
            run_uuid=run.uuid,
            actor=decider(),
            values=values,
            turn_digest=run.pending_turn["turn_digest"],
            mode="inline",
        )

    assert refused.value.detail["errors"]
    assert snapshot(run) == before
    assert probes.seen == []


def test_input_overlays_declared_keys_only_and_keeps_model_only_keys(probes):
    run = _waiting_for_input(probes)
    pending = run.pending_turn
    assert pending["kind"] == "input"
    assert pending["call"]["name"] == "probe_ask"
    assert pending["turn_digest"] == turn_digest(
        [pending["call"]], input_schema=pending["input_schema"]
    )
    human = decider()

    result = run_submit_input(
        run_uuid=run.uuid,
        actor=human,
        # "question" is not declared by the input schema: it must not override the model's.
        values={"answer": "blue", "question": "hijacked?"},
        turn_digest=pending["turn_digest"],
        mode="inline",
    )

    assert result.outcome == Outcome.COMPLETED
    (seen,) = probes.seen
    assert seen["arguments"] == {"question": "which colour?", "answer": "blue"}
    stream = assert_contiguous(run)
    entered = next(e for e in stream if e.kind == EventKind.INPUT)
    assert entered.actor_id == human.pk
    executed = next(e for e in stream if e.kind == EventKind.TOOL)
    assert executed.payload["arguments"] == {"question": "which colour?", "answer": "blue"}
    assert json.loads(tool_messages(sent(run)[-1])["call_0_0"]) == {
        "question": "which colour?",
        "answer": "blue",
    }


def test_input_with_a_stale_digest_is_refused(probes):
    run = _waiting_for_input(probes)
    before = snapshot(run)
    with pytest.raises(StaleTurn):
        run_submit_input(
            run_uuid=run.uuid,
            actor=decider(),
            values={"answer": "blue"},
            turn_digest="f" * 64,
            mode="inline",
        )
    assert snapshot(run) == before


# --- Limits, cancel and failures ------------------------------------------------------------


def test_max_iterations_ends_with_one_final_call_without_tools(probes):
    script = [
        tool_turn(call("probe_read", value="1")),
        tool_turn(call("probe_read", value="2")),
        {"content": "summary"},
    ]

    result = start(config(), script, max_iterations=2)

    run = result.run
    assert result.outcome == Outcome.COMPLETED
    assert run.status == Status.COMPLETED
    assert run.termination_reason == TerminationReason.MAX_ITERATIONS
    assert run.truncated is True
    assert run.iterations == 3
    assert run.output == "summary"
    assert_released(run)
    stream = assert_contiguous(run)
    requests = [e.payload for e in stream if e.kind == EventKind.REQUEST]
    assert [r["final"] for r in requests] == [False, False, True]
    assert requests[-1]["tools"] == []
    assert requests[0]["tools"]  # tools were offered before the cap
    assert len(probes.seen) == 2


def test_max_iterations_final_reply_with_tool_calls_executes_none(probes):
    script = [tool_turn(call("probe_read", value="1")), tool_turn(call("probe_read", value="2"))]

    result = start(config(), script, max_iterations=1)

    assert result.run.termination_reason == TerminationReason.MAX_ITERATIONS
    assert result.run.truncated is True
    assert len(probes.seen) == 1
    final_llm = [e for e in events(result.run) if e.kind == EventKind.LLM][-1]
    assert final_llm.payload["final"] is True and final_llm.payload["tool_calls"] == []


def test_a_cancel_noticed_at_a_boundary_makes_no_further_call(probes):
    """A tool body cancels the run; the boundary after it notices and stops."""

    def cancel_during(entry):
        run_cancel(run_uuid=AgentRun.objects.get().uuid, note="stop it")

    probes.during = cancel_during
    script = [
        tool_turn(call("probe_read", value="1"), call("probe_read", value="2")),
        {"content": "never"},
    ]

    result = start(config(), script)

    run = result.run
    assert result.outcome == Outcome.CANCELLED
    assert run.status == Status.CANCELLED
    assert run.termination_reason == TerminationReason.CANCELLED
    assert len(probes.seen) == 1  # the second call of the turn never ran
    assert len(sent(run)) == 1  # no further provider call
    stream = assert_contiguous(run)
    # The cancel, then the holder's boundary: the call that completed, and the notice.
    assert [e.kind for e in stream][-3:] == [EventKind.CANCEL, EventKind.TOOL, EventKind.CANCEL]
    assert stream[-3].payload["note"] == "stop it"
    assert stream[-2].payload["call_id"] == "call_0_0"
    assert stream[-1].segment.startswith("interactive:")
    assert [e.kind for e in stream].count(EventKind.TOOL) == 1  # the second call never ran
    assert_released(run)


def test_a_tool_that_raises_and_invalid_arguments_become_results_the_model_sees(probes):
    script = [
        tool_turn(
            call("probe_raises", value="x"),
            call("read_note", id="not a number"),
            call("probe_write", value="y"),
        ),
        {"content": "recovered"},
    ]

    result = start(config(tools=["probe_raises", "read_note", "probe_write"]), script)

    # The write needs approval: approve the turn to see every result.
    assert result.outcome == Outcome.AWAITING_APPROVAL
    decided = decide_inline(result.run)

    run = decided.run
    assert decided.outcome == Outcome.COMPLETED
    assert run.status == Status.COMPLETED and run.output == "recovered"
    results = {e.payload["call_id"]: e.payload for e in events(run) if e.kind == EventKind.TOOL}
    assert results["call_0_0"]["ok"] is False
    assert "RuntimeError: the probe exploded" in results["call_0_0"]["error"]
    assert results["call_0_1"]["ok"] is False
    assert "invalid arguments" in results["call_0_1"]["error"]
    assert results["call_0_2"]["ok"] is True
    # read_note's body never ran
    assert [s["tool"] for s in probes.seen] == ["probe_raises", "probe_write"]
    seen_by_model = {k: json.loads(v) for k, v in tool_messages(sent(run)[-1]).items()}
    assert "the probe exploded" in seen_by_model["call_0_0"]["error"]
    assert "invalid arguments" in seen_by_model["call_0_1"]["error"]
    assert_released(run)


def test_a_tool_unregistered_after_its_turn_was_approved_runs_nothing_and_asks_again(probes):
    """A turn naming a tool nobody registered cannot be approved (docs/design.md §5.6); one that
    was approved while its tool existed is not what would run once the tool is gone (its card
    would show an unknown tool, a non-idempotent write): nothing runs, a ``verification`` event
    says why, and the run waits for a decision on a card that shows the tool unknown."""
    script = [tool_turn(call("probe_create", value="x")), {"content": "recovered"}]
    result = start(config(tools=["probe_create"]), script)
    assert result.outcome == Outcome.AWAITING_APPROVAL
    queued = run_decide(
        run_uuid=result.run.uuid,
        actor=decider(),
        approved=True,
        turn_digest=result.run.pending_turn["turn_digest"],
        mode="queued",
    )
    assert queued.outcome == Outcome.QUEUED

    registry.unregister("probe_create")
    finished = run_process_queued(run_uuid=result.run.uuid)

    assert finished is not None and finished.outcome == Outcome.AWAITING_APPROVAL
    run = finished.run
    assert not [e for e in events(run) if e.kind == EventKind.TOOL]
    (check,) = [e for e in events(run) if e.kind == EventKind.VERIFICATION]
    assert check.payload["verdict"] == "mismatch"
    run.refresh_from_db()
    (shown,) = run.pending_turn["calls"]
    assert shown["known"] is False and shown["effect"] == "non_idempotent_write"
    assert probes.seen == []  # no body ran


def test_a_call_to_a_tool_outside_the_requests_narrowed_list_is_an_unknown_write(probes):
    """A run started with its tools narrowed (the ``tools`` option of the API and the
    playground) is offered those only. A model calling another tool of its configuration — a
    read here — calls a tool unknown to the run: shown as unknown, treated as a non-idempotent
    write, so the turn waits for a decision; approved, the call is answered "unknown tool" and
    the body never runs."""
    script = [tool_turn(call("probe_read", value="x")), {"content": "recovered"}]
    result = start(config(tools=["probe_read", "probe_write"]), script, tools=["probe_write"])

    assert probes.seen == [], "a tool outside the narrowed list ran"
    assert result.outcome == Outcome.AWAITING_APPROVAL
    run = result.run
    [request] = [e for e in events(run) if e.kind == EventKind.REQUEST]
    assert request.payload["tools"] == ["probe_write"]  # offered: the narrowed list only
    [shown] = run.pending_turn["calls"]
    assert (shown["name"], shown["known"], shown["source"]) == ("probe_read", False, "unknown")
    assert (shown["effect"], shown["needs_approval"]) == (Effect.NON_IDEMPOTENT_WRITE, True)

    assert decide_inline(run).outcome == Outcome.COMPLETED

    assert probes.seen == [], "an approved call to a tool outside the narrowed list ran"
    [tool_event] = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert tool_event.payload["error"] == "unknown tool 'probe_read'"
    assert tool_event.payload["effect"] == Effect.NON_IDEMPOTENT_WRITE
    assert_released(run)


def test_a_provider_failure_in_a_sync_run_settles_failed():
    result = start(config(tools=[]), [{"error": "retryable"}])

    assert result.outcome == Outcome.FAILED
    assert result.run.status == Status.FAILED
    assert result.run.termination_reason == TerminationReason.PROVIDER_FAILED
    assert result.run.error["type"].startswith("ProviderError")
    assert_released(result.run)


@pytest.mark.parametrize(
    "loop_state",
    [
        {"iteration": "three"},
        {"turn": {"calls": "not a list"}},
        {"turn": {"calls": [{"id": 7, "name": "x"}]}},
        {"decision": "approve"},
        ["not", "an", "object"],
    ],
)
def test_corrupt_loop_state_settles_failed_not_resumable(loop_state):
    run = AgentRunFactory(running=True, loop_state=loop_state)

    result = continue_segment(lease_for(run))

    assert result.outcome == Outcome.FAILED
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.NOT_RESUMABLE
    assert run.error["type"] == "NotRehydratable"
    assert_released(run)


def test_a_gap_in_the_event_stream_is_not_resumable():
    run = AgentRunFactory(running=True)
    run.events.create(sequence=0, kind=EventKind.LEASE)
    run.events.create(sequence=2, kind=EventKind.LLM, payload={"content": "x"})

    result = continue_segment(lease_for(run, next_sequence=3))

    assert result.outcome == Outcome.FAILED
    run.refresh_from_db()
    assert run.termination_reason == TerminationReason.NOT_RESUMABLE


def test_an_event_actor_is_recorded_for_a_cancel_by_a_user():
    user = UserFactory()
    run = AgentRunFactory(waiting=True, initiator=user)  # they may cancel their own run
    assert run_cancel(run_uuid=run.uuid, actor=user, note="no") is True
    (event,) = events(run)
    assert event.kind == EventKind.CANCEL and event.actor_id == user.pk


def test_a_turn_with_a_write_and_a_question_is_approved_then_asks_for_input(probes):
    script = [
        tool_turn(call("probe_write", value="w"), call("probe_ask", question="why?")),
        {"content": "both done"},
    ]
    suspended = start(config(), script)
    assert suspended.outcome == Outcome.AWAITING_APPROVAL  # approval wins when both apply

    approved = decide_inline(suspended.run)

    assert approved.outcome == Outcome.AWAITING_INPUT
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    assert approved.run.pending_turn["call"]["id"] == "call_0_1"
    assert_released(approved.run)

    answered = run_submit_input(
        run_uuid=suspended.run.uuid,
        actor=decider(),
        values={"answer": "because"},
        turn_digest=approved.run.pending_turn["turn_digest"],
        mode="inline",
    )

    assert answered.outcome == Outcome.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write", "probe_ask"]  # the write ran once
    assert probes.seen[1]["arguments"] == {"question": "why?", "answer": "because"}
    assert probes.seen[1]["fencing_token"] == 3  # a third segment: birth, resume, resume
    assert_contiguous(answered.run)


def test_a_cancel_during_a_write_records_the_write_that_ran(probes):
    """The cancel lands while an approved write runs: the boundary after it notices the cancel
    and still records the step that completed (the write happened: its event must exist)."""
    suspended = start(
        config(),
        [
            tool_turn(call("probe_write", value="w"), call("probe_read", value="r")),
            {"content": "never"},
        ],
    )
    run = suspended.run
    probes.during = lambda entry: run_cancel(run_uuid=run.uuid, note="too late")

    result = decide_inline(run)

    assert result.outcome == Outcome.CANCELLED
    assert [s["tool"] for s in probes.seen] == ["probe_write"]  # no further tool call
    assert len(sent(run)) == 1  # no further provider call
    stream = assert_contiguous(run)
    assert [e.kind for e in stream][-3:] == [EventKind.CANCEL, EventKind.TOOL, EventKind.CANCEL]
    written = stream[-2]
    assert written.payload["name"] == "probe_write" and written.payload["outcome"] == "executed"
    assert written.segment.startswith("resume:") and written.lease_epoch == 2
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.claimed_by == ""


def test_the_fence_is_cleared_before_the_next_provider_call(probes):
    script = [
        tool_turn(call("probe_write", value="w")),
        tool_turn(call("probe_read", value="r")),
        {"content": "done"},
    ]
    suspended = start(config(), script)

    decide_inline(suspended.run)

    write, read = probes.seen
    assert write["row"]["pending_effect"] == Effect.IDEMPOTENT_WRITE
    assert read["row"]["pending_effect"] == "" and read["row"]["pending_call"] is None
    stream = assert_contiguous(suspended.run)
    after_write = [e.kind for e in stream if e.lease_epoch == 2]
    assert after_write[:5] == [
        EventKind.APPROVAL,
        EventKind.TOOL,
        EventKind.REQUEST,
        EventKind.LLM,
        EventKind.TOOL,
    ]


def _writes_of(run_script, configuration) -> Counter:
    with CaptureQueriesContext(connection) as captured:
        result = start(configuration, run_script)
    assert result.outcome == Outcome.COMPLETED
    writes = Counter()
    for query in captured.captured_queries:
        sql = query["sql"].replace('"', "")  # Django quotes names; the named statements do not
        words = sql.split()
        if words[0] == "WITH":  # PostgreSQL: a boundary's UPDATE and INSERT in one statement
            words = sql.replace("(", " ").split()
            update, insert = words.index("UPDATE"), words.index("INSERT")
            writes[f"UPDATE {words[update + 1]} + INSERT {words[insert + 2]}"] += 1
        elif words[0] == "UPDATE":
            writes[f"UPDATE {words[1]}"] += 1
        elif words[0] == "INSERT":
            writes[f"INSERT {words[2]}"] += 1
    return writes


def test_a_read_round_costs_one_lease_update_per_boundary(probes):
    """The statement budget of docs/design.md §6.6: per read round (request, answer, tool
    result) the lease costs one guarded UPDATE per boundary; the tool result and the next request
    share one boundary."""
    configuration = config()

    def round_script(rounds: int) -> list[dict]:
        turns = [tool_turn(call("probe_read", value=str(n))) for n in range(rounds)]
        return [*turns, {"content": "done"}]

    two = _writes_of(round_script(2), configuration)
    three = _writes_of(round_script(3), configuration)

    per_round = three - two
    if connection.vendor == "postgresql":  # one statement per boundary (docs/design.md §6.6)
        assert per_round == Counter(
            {"UPDATE agentruns_agentrun + INSERT agentruns_agentrunevent": 2}
        )
    else:
        assert per_round == Counter(
            {"UPDATE agentruns_agentrun": 2, "INSERT agentruns_agentrunevent": 2}
        )


def _statements_of(run_script, configuration) -> int:
    with CaptureQueriesContext(connection) as captured:
        result = start(configuration, run_script)
    assert result.outcome == Outcome.COMPLETED
    return len(captured.captured_queries)


@contextmanager
def _noop_tool(name: str, effect: str) -> Iterator[None]:
    """A registered tool that does nothing and issues no SQL, so every statement counted is
    the runtime's."""
    registry.register(
        Tool(name, "Test: does nothing.", {"type": "object"}, effect, lambda c, a: {"ok": True})
    )
    try:
        yield
    finally:
        registry.unregister(name)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # autocommit, as in production: no test savepoints
def test_a_read_round_is_two_statements_on_postgresql():
    """Issue 15: on PostgreSQL a read round's two boundaries are one statement each (the guarded
    UPDATE and its event INSERT in one data-modifying CTE, no BEGIN/COMMIT). The tool issues no
    SQL, so every statement counted is the runtime's."""
    with _noop_tool("noop_read", Effect.READ):
        configuration = config(tools=["noop_read"])

        def round_script(rounds: int) -> list[dict]:
            turns = [tool_turn(call("noop_read", value=str(n))) for n in range(rounds)]
            return [*turns, {"content": "done"}]

        two = _statements_of(round_script(2), configuration)
        five = _statements_of(round_script(5), configuration)

    assert (five - two) / 3 <= 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # autocommit, as in production: no test savepoints
def test_an_approved_write_round_is_at_most_ten_statements_on_postgresql():
    """Issues 15 and 30: an approved write round (the answer, the suspend, the inline decision,
    the continuing segment, the fence stamp and the boundary that clears it) is at most 10
    statements on PostgreSQL: no MAX(sequence), the locked row handed on, the run's events read
    by the decision's own statement, nothing read back. Three of them are the approver's
    authority read afresh under the row lock (the user and, with the model backend, its own and
    its groups' permissions: docs/design.md §5.6)."""
    with _noop_tool("noop_write", Effect.IDEMPOTENT_WRITE):
        configuration = config(tools=["noop_write"])
        staff = decider()
        assert staff.has_perm("agentruns.decide_agentrun")  # caches the permissions

        def statements(rounds: int) -> int:
            turns = [tool_turn(call("noop_write", value=str(n))) for n in range(rounds)]
            with CaptureQueriesContext(connection) as captured:
                result = start(configuration, [*turns, {"content": "done"}])
                while result.outcome == Outcome.AWAITING_APPROVAL:
                    result = decide_inline(result.run, actor=staff)
            assert result.outcome == Outcome.COMPLETED
            return len(captured.captured_queries)

        one, three = statements(1), statements(3)

    assert (three - one) / 2 <= 10
