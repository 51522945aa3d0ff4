"""A waiting run's turn as every interface shows it, and the digest a decision on it must carry
(docs/design.md §5.2, §5.4).

The stored pending turn keeps what the model proposed (id, name, arguments) and the previews
made when the run paused; what a card shows about each call's tool — its effect, whether it is
known and needs a decision, its source, hints, description and MCP server — is read now from the
run's tool gate (``ToolGate.shown``), never from the stored copy. ``shown_turn`` is that turn,
with the digest of exactly what it shows; ``executing_digest`` computes the same digest from the
turn the next segment executes (``loop_state.turn``). A decision is taken only when the digest
the person sent equals both, under the row lock (``transitions.deciding``).

An in-doubt call (reconciliation) shows the effect its fence stamped (``pending_effect``, the
effect it ran with), not the tool's effect now; everything else about its tool is read now, as
for the other turns.

Reads the registry and server rows; writes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from agentruns.tools.gate import ToolGate
from agentruns.turns import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    LoopState,
    PendingTurn,
    Unreadable,
    turn_digest,
)

if TYPE_CHECKING:
    from agentruns.models import AgentRun


def shown_turn(run: AgentRun, pending: PendingTurn, *, gate: ToolGate | None = None) -> PendingTurn:
    """``pending`` (read from ``run`` by ``turns.read_pending_turn``) as a card shows it: each
    call shown by the run's gate now (an in-doubt call with the effect it was stamped with), and
    ``turn_digest`` the digest of exactly that. An unreadable turn is returned as it is."""
    if not pending.readable:
        return pending
    gate = gate if gate is not None else ToolGate.of(run)
    stamped = pending.kind == RECONCILIATION
    calls = tuple(gate.shown(call, effect=call.effect if stamped else "") for call in pending.calls)
    schema = pending.input_schema if pending.kind == INPUT else None
    return replace(pending, calls=calls, turn_digest=turn_digest(calls, input_schema=schema))


def executing_digest(run: AgentRun, pending: PendingTurn, *, gate: ToolGate | None = None) -> str:
    """The digest of what a decision on ``run`` would let run, computed from the turn the next
    segment executes (``loop_state.turn``; for an in-doubt run, the call its fence stamped) and
    shown by the run's gate now — never from the stored pending turn, which is only what was
    shown. ``""`` when there is no such turn: nothing could be bound to it."""
    gate = gate if gate is not None else ToolGate.of(run)
    if pending.kind == RECONCILIATION:
        stamped = PendingTurn.for_reconciliation(run).calls
        return turn_digest([gate.shown(call, effect=call.effect) for call in stamped])
    try:
        turn = LoopState.parse(run.loop_state).turn
    except Unreadable:
        return ""
    if turn is None:
        return ""
    if pending.kind == APPROVAL:
        return turn_digest([gate.shown(call) for call in turn.open_calls()])
    if pending.kind == INPUT and pending.call is not None:
        call = turn.call(pending.call.id)
        if call is None or pending.input_schema is None:
            return ""
        return turn_digest([gate.shown(call)], input_schema=pending.input_schema)
    return ""
