"""Applying a human's decision, recorded while the run waited, to the turn it decided
(docs/design.md §5.9).

The decision transition stores the decision in the loop state; the next segment applies it here
before it runs anything: an approval or denial marks the turn, input values are kept for their
call, and a reconciliation verdict settles the in-doubt call as the ``tool`` event the model sees.
Applying it again (a segment that died before its first boundary) gives the same turn.
"""

from __future__ import annotations

from agentruns.leases import EventSpec
from agentruns.models import Effect, EventKind
from agentruns.tools import ToolResult
from agentruns.turns import (
    ApprovalDecision,
    Call,
    InputDecision,
    LoopState,
    ReconciliationDecision,
    Turn,
)


def apply_decision(state: LoopState) -> list[EventSpec]:
    """Take the stored decision out of ``state`` and apply it to ``state.turn``; the events that
    records (a reconciliation verdict: the in-doubt call's ``tool`` event)."""
    decision, state.decision = state.decision, None
    turn = state.turn
    if isinstance(decision, ReconciliationDecision):
        return [_reconciled(turn, decision)]
    if turn is None:
        return []
    if isinstance(decision, ApprovalDecision):
        turn.approved = decision.approved
    elif isinstance(decision, InputDecision):
        turn.inputs[decision.call_id] = decision.values
    return []


def _reconciled(turn: Turn | None, decision: ReconciliationDecision) -> EventSpec:
    call = decision.call or Call(id="", name="")
    content = {
        "reconciled": True,
        "landed": decision.landed,
        "message": (
            "an operator confirmed this call took effect"
            if decision.landed
            else "an operator confirmed this call did NOT take effect"
        ),
    }
    if turn is not None:
        turn.done.append(call.id)
    return EventSpec(
        EventKind.TOOL,
        {
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments if call.arguments is not None else {},
            "effect": call.effect or Effect.NON_IDEMPOTENT_WRITE,
            "outcome": "reconciled_landed" if decision.landed else "reconciled_not_landed",
            "ok": decision.landed,
            "result": content,
            "content": ToolResult(ok=True, content=content).as_message_content(),
        },
    )
