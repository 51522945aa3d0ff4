"""Applying a human's decision, recorded while the run waited, to the turn it decided
(docs/design.md §5.9).

The decision transition stores the decision in the loop state; the next segment applies it here
before it runs anything: an approval or denial of the whole turn marks the turn; a decision per
call settles its denials and answers as the ``tool`` events the model reads, leaves its approved
calls to run, and puts edited arguments in place (the turn then waits on a new card); input
values are kept for their call, and a reconciliation verdict settles the in-doubt call as the
``tool`` event the model sees. Applying it again (a segment that died before its first boundary)
gives the same turn.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentruns.leases import EventSpec
from agentruns.models import Effect, EventKind
from agentruns.services.runtime.tool_step import answered_event, denied_event
from agentruns.tools import ToolResult
from agentruns.tools.gate import ToolGate
from agentruns.turns import (
    ANSWER,
    DENY,
    EDIT,
    ApprovalDecision,
    Call,
    CallEdit,
    CallVerdict,
    LoopState,
    ReconciliationDecision,
    Turn,
    turn_digest,
)
from agentruns.turns.call_verdicts import by_call


def apply_decision(state: LoopState, *, gate: ToolGate) -> list[EventSpec]:
    """Take the stored decision out of ``state`` and apply it to ``state.turn``; the events that
    records (a reconciliation verdict: the in-doubt call's ``tool`` event).

    An approval or input is applied only to the turn it was given for: its digest is recomputed
    from the turn about to run, each call shown by the run's ``gate`` now (``ToolGate.shown``:
    the effect, description and server it would run with), an input's with the tool's schema
    now.
    On a mismatch nothing of it is applied — the turn waits for a decision again, with a fresh
    card — and a ``verification`` event says why.
    """
    decision, state.decision = state.decision, None
    turn = state.turn
    if isinstance(decision, ReconciliationDecision):
        return [_reconciled(turn, decision)]
    if turn is None or decision is None:
        return []
    if isinstance(decision, ApprovalDecision):
        return _approval(turn, decision, gate)
    call = turn.call(decision.call_id)
    schema = gate.input_schema(call.name) if call is not None else None
    executing = (
        turn_digest([gate.shown(call)], input_schema=schema)
        if call is not None and schema is not None
        else ""
    )
    if executing != decision.turn_digest:
        return [_mismatch(decision.kind, decision.turn_digest, executing)]
    turn.inputs[decision.call_id] = decision.values
    return []


def _approval(turn: Turn, decision: ApprovalDecision, gate: ToolGate) -> list[EventSpec]:
    if decision.verdicts:
        return _per_call(turn, decision, gate)
    if not decision.approved:
        turn.approved = False  # a denial lets nothing run: nothing to verify
        # Denied by the approval deadline (§5.11): the model is told it expired.
        turn.denied_by = decision.by if decision.by != "person" else ""
        turn.decider, turn.reason = decision.decider, decision.reason
        return []
    executing = turn_digest([gate.shown(call) for call in turn.open_calls()])
    if executing != decision.turn_digest:
        return [_mismatch(decision.kind, decision.turn_digest, executing)]
    turn.approved = True
    return []


def _per_call(turn: Turn, decision: ApprovalDecision, gate: ToolGate) -> list[EventSpec]:
    """A decision per call: each open call's verdict, in the turn's order. Denials and answers
    are settled here (``done``, with the ``tool`` event the model reads), before anything runs;
    approved calls stay open and run as any approved call does. A decision holding an edit
    runs nothing: the edited calls take their new arguments (the model's kept beside them),
    and the turn waits for a decision again — the approved calls with it — on a new card with
    fresh previews. Unless every verdict is a denial, the decision is applied only to the turn
    it was given for (its digest recomputed from the turn about to run)."""
    verdicts = by_call(decision.verdicts)
    open_calls = turn.open_calls()
    if {call.id for call in open_calls} != set(verdicts):  # fail closed: one verdict per call
        return [_mismatch(decision.kind, decision.turn_digest, "")]
    if any(v.verdict != DENY for v in decision.verdicts):
        executing = turn_digest([gate.shown(call) for call in open_calls])
        if executing != decision.turn_digest:
            return [_mismatch(decision.kind, decision.turn_digest, executing)]
    edited = any(v.verdict == EDIT for v in decision.verdicts)
    events = []
    for index, call in enumerate(turn.calls):
        verdict = verdicts.get(call.id)
        if call.id in turn.done or verdict is None:
            continue
        if verdict.verdict == DENY:
            turn.done.append(call.id)
            events.append(denied_event(call, decider=decision.decider, reason=verdict.reason))
        elif verdict.verdict == ANSWER:
            turn.done.append(call.id)
            events.append(answered_event(call, decider=decision.decider, answer=verdict.answer))
        elif verdict.verdict == EDIT:
            turn.calls[index] = _edited(call, verdict, decision)
    turn.approved = None if edited else True
    return events


def _edited(call: Call, verdict: CallVerdict, decision: ApprovalDecision) -> Call:
    """``call`` with the edited arguments; the model's own kept (``CallEdit``: the first
    original, however often it is edited) and the editor its author. Its preview is dropped:
    the new card's is made afresh."""
    original = call.edit.original_arguments if call.edit is not None else call.arguments
    return replace(
        call,
        arguments=verdict.arguments,
        preview=None,
        edit=CallEdit(
            original_arguments=original, editor=decision.decider, editor_id=decision.decider_id
        ),
    )


def _mismatch(kind: str, decided: str, executing: str) -> EventSpec:
    return EventSpec(
        EventKind.VERIFICATION,
        {
            "decision": kind,
            "verdict": "mismatch",
            "decided_digest": decided,
            "executing_digest": executing,
            "message": f"the turn about to run is not the one the {kind} was given for: "
            "nothing of it ran, and it waits for a decision again",
        },
    )


def _reconciled(turn: Turn | None, decision: ReconciliationDecision) -> EventSpec:
    call = decision.call or Call(id="", name="")
    who = "the tool's automatic check" if decision.by == "check" else "an operator"
    content: dict[str, Any] = {
        "reconciled": True,
        "landed": decision.landed,
        "message": (
            f"{who} confirmed this call took effect"
            if decision.landed
            else f"{who} confirmed this call did NOT take effect"
        ),
    }
    if decision.by == "check":
        content["by"] = "check"
        if decision.landed and decision.result is not None:
            content["result"] = decision.result
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
