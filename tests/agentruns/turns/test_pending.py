"""Reading a waiting run's stored pending turn: shown with controls only when its shape, its
status and its digest agree."""

from __future__ import annotations

from agentruns.models import AgentRun, Status
from agentruns.turns import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    UNREADABLE,
    read_pending_turn,
    turn_digest,
    waits_for_a_human,
)

CALL = {"id": "call_0", "name": "create_note", "arguments": {"title": "t", "body": "b"}}


def run(status, pending_turn):
    return AgentRun(status=status, pending_turn=pending_turn)


def approval(**overrides):
    return {
        "kind": "approval",
        "calls": [{**CALL, "effect": "non_idempotent_write", "known": True}],
        "turn_digest": turn_digest([CALL]),
        **overrides,
    }


def test_an_approval_turn():
    pending = read_pending_turn(run(Status.WAITING_FOR_APPROVAL, approval()))
    assert pending.kind == APPROVAL and pending.readable
    assert pending.turn_digest == turn_digest([CALL])
    (call,) = pending.calls
    assert (call.name, call.arguments, call.effect_label) == (
        "create_note",
        CALL["arguments"],
        "non-idempotent write",
    )


def test_an_input_turn_binds_its_schema():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    stored = {
        "kind": "input",
        "call": {**CALL, "effect": "read"},
        "input_schema": schema,
        "turn_digest": turn_digest([CALL], input_schema=schema),
    }
    pending = read_pending_turn(run(Status.WAITING_FOR_INPUT, stored))
    assert pending.kind == INPUT and pending.input_schema == schema
    changed = {**stored, "input_schema": {"type": "object", "properties": {}}}
    assert read_pending_turn(run(Status.WAITING_FOR_INPUT, changed)).kind == UNREADABLE


def test_a_reconciliation_turn():
    stored = {
        "kind": "reconciliation",
        "call": {**CALL, "effect": "non_idempotent_write"},
        "idempotency_key": "u:call_0",
        "segment": "worker:h:1",
        "lease_epoch": 3,
        "lease_expired_at": "2026-01-02T03:04:05+00:00",
        "turn_digest": turn_digest([CALL]),
    }
    pending = read_pending_turn(run(Status.WAITING_FOR_RECONCILIATION, stored))
    assert pending.kind == RECONCILIATION
    assert (pending.idempotency_key, pending.segment, pending.lease_epoch) == (
        "u:call_0",
        "worker:h:1",
        3,
    )
    assert pending.lease_expired_at.year == 2026


def test_what_cannot_be_read():
    tampered = approval()
    tampered["calls"][0]["arguments"] = {"title": "something else"}
    cases = [
        run(Status.WAITING_FOR_APPROVAL, None),
        run(Status.WAITING_FOR_APPROVAL, []),
        run(Status.WAITING_FOR_APPROVAL, approval(kind="input")),
        run(Status.WAITING_FOR_APPROVAL, approval(turn_digest="")),
        run(Status.WAITING_FOR_APPROVAL, approval(calls=[])),
        run(Status.WAITING_FOR_APPROVAL, approval(calls=["create_note"])),
        run(Status.WAITING_FOR_APPROVAL, tampered),
        run(Status.WAITING_FOR_INPUT, {"kind": "input", "turn_digest": "x"}),
        run(Status.COMPLETED, approval()),
    ]
    for case in cases:
        pending = read_pending_turn(case)
        assert pending.kind == UNREADABLE and pending.problem, case.pending_turn
        assert not pending.readable


def test_waits_for_a_human():
    assert waits_for_a_human(run(Status.WAITING_FOR_INPUT, None))
    assert not waits_for_a_human(run(Status.QUEUED, None))
