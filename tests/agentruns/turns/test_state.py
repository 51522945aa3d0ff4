"""The loop state, the stored turn and decisions: each parses what it wrote, keeps what it does
not know, and refuses malformed data with a reason a person can read."""

from __future__ import annotations

import pytest

from agentruns.models import AgentRun, Effect, Status
from agentruns.turns import (
    ApprovalDecision,
    Call,
    InputDecision,
    LoopState,
    PendingTurn,
    ReconciliationDecision,
    Turn,
    Unreadable,
    Usage,
    parse_decision,
    read_pending_turn,
    turn_digest,
    with_decision,
)

WRITE = Call(id="call_1_0", name="create_note", arguments={"title": "é"}, effect="idempotent_write")


def test_a_loop_state_survives_its_own_round_trip():
    state = LoopState(
        iteration=3,
        turn=Turn(calls=[WRITE], done=["call_1_0"], approved=True, inputs={"call_1_0": {"a": 1}}),
        decision=InputDecision(call_id="call_1_0", values={"a": 1}, decider_id=7),
        decided_digests=["d" * 64],
        usage=Usage(prompt_tokens=10, completion_tokens=4),
        extra={"from_a_newer_version": [1, 2]},
    )

    again = LoopState.parse(state.to_json())

    assert again == state
    assert again.to_json()["from_a_newer_version"] == [1, 2]
    assert again.usage.total_tokens == 14


def test_an_empty_or_missing_loop_state_is_a_fresh_one():
    assert LoopState.parse(None) == LoopState()
    assert LoopState.parse({}) == LoopState()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (["not", "an", "object"], "loop_state is not an object"),
        ({"iteration": "three"}, "loop_state.iteration is not an integer"),
        ({"iteration": True}, "loop_state.iteration is not an integer"),
        ({"turn": {"calls": "x"}}, "loop_state.turn is malformed"),
        ({"turn": {"calls": [{"id": 7, "name": "x"}]}}, "loop_state.turn has a malformed call"),
        ({"turn": {"calls": [{"id": "c"}]}}, "loop_state.turn has a call without a name"),
        ({"turn": {"calls": [], "done": "c"}}, "loop_state.turn.done is malformed"),
        ({"turn": {"calls": [], "approved": "yes"}}, "loop_state.turn.approved"),
        ({"turn": {"calls": [], "inputs": []}}, "loop_state.turn.inputs is malformed"),
        ({"decision": "approve"}, "loop_state.decision is malformed"),
        ({"decision": {"kind": "veto"}}, "unknown kind 'veto'"),
        ({"decision": {"kind": "approval", "approved": "yes"}}, "approved is not true or false"),
        ({"decision": {"kind": "input"}}, "loop_state.decision has no call id"),
        ({"decision": {"kind": "reconciliation", "verdict": "maybe"}}, "unknown verdict"),
        ({"decided_digests": "abc"}, "decided_digests is not a list of strings"),
        ({"usage": {"prompt_tokens": "many"}}, "prompt_tokens is not an integer"),
    ],
)
def test_a_corrupt_loop_state_is_refused_with_its_reason(raw, reason):
    with pytest.raises(Unreadable) as refused:
        LoopState.parse(raw)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    "decision",
    [
        ApprovalDecision(approved=False, decider_id=3),
        InputDecision(call_id="c", values={"priority": "high"}),
        ReconciliationDecision(verdict="landed", call=WRITE, decider_id=None),
        ReconciliationDecision(verdict="not_landed", call=None),
    ],
)
def test_decisions_parse_what_they_wrote(decision):
    assert parse_decision(decision.to_json()) == decision


def test_with_decision_keeps_the_stored_state_and_bounds_the_decided_digests():
    stored = {"iteration": 2, "unknown": "kept", "decided_digests": [str(i) for i in range(60)]}

    state = with_decision(stored, decision=ApprovalDecision(approved=True), turn_digest="new")

    assert state["unknown"] == "kept" and state["iteration"] == 2
    assert state["decision"] == {
        "kind": "approval",
        "approved": True,
        "decider_id": None,
        "turn_digest": "",
    }
    assert len(state["decided_digests"]) == 50 and state["decided_digests"][-1] == "new"
    assert stored["decided_digests"][-1] == "59"  # the stored value itself is not changed


def test_with_decision_on_an_unreadable_state_starts_from_nothing_it_cannot_read():
    assert with_decision(["junk"], decision=None, turn_digest="d") == {"decided_digests": ["d"]}


def test_a_pending_turn_reads_back_exactly_as_it_was_built():
    shown = Call(
        id="call_0_0",
        name="create_note",
        arguments={"title": "t"},
        effect=Effect.NON_IDEMPOTENT_WRITE,
        needs_approval=True,
        known=True,
        source="local",
        hints={"destructive": False},
        detailed=True,
    )
    built = PendingTurn.for_approval([shown])
    run = AgentRun(status=Status.WAITING_FOR_APPROVAL, pending_turn=built.to_json())

    assert read_pending_turn(run) == built
    assert built.turn_digest == turn_digest(
        [{"id": "call_0_0", "name": "create_note", "arguments": {"title": "t"}}]
    )


def test_an_input_turn_keeps_the_declared_field_order():
    schema = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "string"}}}
    built = PendingTurn.for_input(Call(id="c", name="ask", effect=Effect.READ), schema)
    run = AgentRun(status=Status.WAITING_FOR_INPUT, pending_turn=built.to_json())

    assert read_pending_turn(run).field_order == ("z", "a")


def test_an_unreadable_turn_cannot_be_stored():
    with pytest.raises(ValueError):
        PendingTurn(kind="unreadable", problem="x").to_json()
