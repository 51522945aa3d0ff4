"""The turn's step of a segment: the calls the model proposed, in order (docs/design.md §5, §6.2,
§9.1).

Calls whose arguments break their tool's schema are answered at once; a turn with a call that
needs a decision suspends (its writes previewed first) before anything of it runs; then each call
not done is denied, waits for input, has its approved preview re-checked (compare-and-swap) or
runs behind the fence (``tool_step.execute_tool_call``), and each is a boundary — the last one
rides on the boundary that follows. A non-idempotent write that cannot tell whether it happened
parks the run in doubt.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from agentruns.leases import EventSpec
from agentruns.models import WRITE_EFFECTS, Effect, EventKind, Status
from agentruns.services import dispatch
from agentruns.services.runtime.boundaries import Boundaries
from agentruns.services.runtime.previewing import (
    make_preview,
    preview_changed_event,
    preview_open_calls,
)
from agentruns.services.runtime.results import Outcome, Stop
from agentruns.services.runtime.segment_state import Segment, SegmentState
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.tool_step import (
    ToolStep,
    denied_event,
    edited_marks,
    execute_tool_call,
    refused_event,
)
from agentruns.tools import Tool, ToolResult
from agentruns.tools.gate import ToolGate
from agentruns.tools.invocation import argument_errors, overlay_input
from agentruns.turns import Call, PendingTurn, Preview, Turn

#: Per call id, the tool and the very arguments accepted for it before the turn ran.
Accepted = dict[str, tuple[Tool, Any]]


def waits_for_approval(turn: Turn | None, gate: ToolGate) -> bool:
    """``turn`` goes to a decision before anything of it runs."""
    return (
        turn is not None
        and turn.approved is None
        and any(gate.needs_approval(c.name) for c in turn.open_calls())
    )


def run_turn(
    state: SegmentState, seg: Segment, writer: Boundaries, turn: Turn
) -> SegmentState | Stop:
    """Run ``turn`` (``state.loop.turn``) from its first call not done; the state between
    turns once every call is done."""
    refused, accepted = _check_arguments(turn, seg.gate)
    if refused and (stop := writer.write(state, refused)):
        return stop
    if waits_for_approval(turn, seg.gate):
        return suspend_for_approval(state, seg, writer, turn)
    for index, call in enumerate(turn.calls):
        if call.id in turn.done:
            continue
        if index > 0 and writer.stopping():  # the first call: checked before the turn
            return writer.hand_back(state, at="call")
        last_of_turn = index == len(turn.calls) - 1
        if stop := _run_call(state, seg, writer, turn, call, accepted, last_of_turn=last_of_turn):
            return stop
    state.loop.turn = None
    return state


def _check_arguments(turn: Turn, gate: ToolGate) -> tuple[list[EventSpec], Accepted]:
    """Calls whose arguments break their tool's schema are answered to the model as errors
    at once — never shown for approval, never run: their events. And the calls accepted."""
    refused: list[EventSpec] = []
    accepted: Accepted = {}
    for call in turn.open_calls():
        tool = gate.available(call.name)
        reason = argument_errors(tool, call.arguments) if tool is not None else None
        if reason is not None:
            turn.done.append(call.id)
            refused.append(refused_event(call, reason))
        elif tool is not None:
            accepted[call.id] = (tool, call.arguments)
    return refused, accepted


def _run_call(
    state: SegmentState,
    seg: Segment,
    writer: Boundaries,
    turn: Turn,
    call: Call,
    accepted: Accepted,
    *,
    last_of_turn: bool,
) -> Stop | None:
    """One call not done: denied, waiting, re-checked or run. ``None``: go on."""
    tool = seg.gate.available(call.name)
    needs_approval = tool is None or tool.needs_approval
    if turn.approved is False:  # denied: nothing of the turn executes
        turn.done.append(call.id)
        denied = denied_event(call, by=turn.denied_by, decider=turn.decider, reason=turn.reason)
        return writer.step_done(state, [denied], clear="", last_of_turn=last_of_turn)
    if needs_approval and turn.approved is None:
        # Judged on the tool as it is now, not as the scan before the turn found it: a call
        # whose tool came to need a decision while an earlier call ran (an approval switch
        # turned on, a tool gone) runs only after one. The rest of the turn waits.
        return suspend_for_approval(state, seg, writer, turn)
    arguments = call.arguments
    if tool is not None and tool.input_schema is not None:
        values = turn.inputs.get(call.id)
        if values is None:
            return suspend_for_input(state, seg, writer, call, tool)
        arguments = overlay_input(tool, call.arguments, values)
    elif (stop := _preview_changed(state, seg, writer, turn, call, tool)) is not None:
        return stop
    accepted_as = accepted.pop(call.id, None)
    # Not checked twice: the same tool and the very arguments accepted before the turn ran
    # (identity: a tool resolved afresh, or arguments with a person's input laid over them,
    # are checked again).
    checked = accepted_as is not None and accepted_as[0] is tool and accepted_as[1] is arguments
    return _execute(
        state, seg, writer, turn, call, tool, arguments, checked, last_of_turn=last_of_turn
    )


def _execute(
    state: SegmentState,
    seg: Segment,
    writer: Boundaries,
    turn: Turn,
    call: Call,
    tool: Tool | None,
    arguments: Any,
    checked: bool,
    *,
    last_of_turn: bool,
) -> Stop | None:
    """Run ``call`` with ``arguments`` behind the fence and record its ``tool`` event; or stop
    the segment (a read handed back, the lease lost, a write parked in doubt)."""
    effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
    step = execute_tool_call(
        tool=tool,
        name=call.name,
        call_id=call.id,
        arguments=arguments,
        lease=seg.lease,
        initiator_id=seg.run.initiator_id,
        run_uuid=seg.run.uuid,
        # A write's stamp also saves the state: a decision applied by this segment is
        # durable before the write starts (a reconciliation must find the turn approved).
        loop_state=state.loop.to_json() if effect in WRITE_EFFECTS else None,
        checked=checked,
    )
    if step.interrupted:  # a read cut off because the worker is stopping: it runs again
        return writer.hand_back(state, at="read")
    if step.result is None:  # the fence stamp matched no row: the write did not start
        return writer.lost(state, at="fence")
    result = step.result
    if result.in_doubt and effect == Effect.NON_IDEMPOTENT_WRITE:
        return _park_in_doubt(
            state, seg, writer, call, arguments, result.error, lost=step.lease_lost
        )
    turn.done.append(call.id)
    event = _tool_event(seg, call, arguments, str(effect), step, result)
    if step.lease_lost:  # the ticker's renewal matched no row while the call ran
        return writer.lost(state, at="tool", completed=[event])
    clear = str(effect) if effect in WRITE_EFFECTS else ""
    return writer.step_done(state, [event], clear=clear, last_of_turn=last_of_turn)


def _tool_event(
    seg: Segment, call: Call, arguments: Any, effect: str, step: ToolStep, result: ToolResult
) -> EventSpec:
    """The ``tool`` event of a call that ran, or that its tool refused before doing anything
    (outcome ``refused``: ``ToolRefused``, nothing was sent)."""
    payload: dict[str, Any] = {"call_id": call.id, "name": call.name, **edited_marks(call)}
    if arguments != call.arguments:
        # Only when they are not the proposed ones (a person's input was merged in): the
        # ``llm`` event that proposed the call already stores them (docs/design.md §1.9).
        payload["arguments"] = arguments
    payload.update(
        {
            "effect": effect,
            "outcome": "refused" if result.refused else "executed",
            "ok": result.ok,
            "result": result.content,
            "error": result.error,
            "idempotency_key": f"{seg.run.uuid}:{call.id}",
        }
    )
    if result.normalised:  # what was changed so that the result could be stored (§4.1)
        payload["normalised"] = list(result.normalised)
    return EventSpec(
        EventKind.TOOL, payload, duration_ms=step.duration_ms, shown={"arguments": arguments}
    )


def _park_in_doubt(
    state: SegmentState,
    seg: Segment,
    writer: Boundaries,
    call: Call,
    arguments: Any,
    reason: str,
    *,
    lost: bool,
) -> Stop:
    """A non-idempotent write whose tool could not tell whether it happened is in doubt,
    exactly like one whose segment died: never reported to the model as a failure (it would
    propose it again, under a new key), never retried. The run waits for reconciliation with
    the fence kept (docs/design.md §9.1)."""
    stamped = Call(call.id, call.name, arguments=arguments, effect=Effect.NON_IDEMPOTENT_WRITE)
    doubt = EventSpec(
        EventKind.IN_DOUBT,
        {"call_id": call.id, "name": call.name, "arguments": arguments, "error": reason},
    )
    if lost:
        return writer.lost(state, at="tool", completed=[doubt])
    if stop := writer.flush(state):
        return stop
    check = dispatch.initial_check(seg.gate.available(call.name))
    pending = PendingTurn.in_doubt(
        stamped,
        run_uuid=seg.run.uuid,
        segment=seg.lease.owner,
        lease_epoch=seg.lease.epoch,
        reason=reason,
        check=check,
    )
    return writer.park_in_doubt(state, pending, doubt, checked=check is not None)


# -- pauses for a person --


def suspend_for_approval(state: SegmentState, seg: Segment, writer: Boundaries, turn: Turn) -> Stop:
    """Suspend for a decision on the turn's open calls, each write previewed first (the
    previews are kept on the turn too: the digest that binds the decision covers them)."""
    with LeaseTicker(seg.lease):
        preview_open_calls(turn, tool_of=seg.gate.available, preview=partial(_preview, seg))
    return writer.suspend(
        state,
        Status.WAITING_FOR_APPROVAL,
        PendingTurn.for_approval(seg.gate.shown(c) for c in turn.open_calls()),
        Outcome.AWAITING_APPROVAL,
    )


def suspend_for_input(
    state: SegmentState, seg: Segment, writer: Boundaries, call: Call, tool: Tool
) -> Stop:
    """Suspend for a person's input to ``call`` (its tool's ``input_schema``)."""
    pending = PendingTurn.for_input(seg.gate.shown(call), tool.input_schema or {})
    return writer.suspend(state, Status.WAITING_FOR_INPUT, pending, Outcome.AWAITING_INPUT)


def _preview(seg: Segment, tool: Tool, call: Call) -> Preview | None:
    return make_preview(
        tool,
        call,
        run_uuid=seg.run.uuid,
        initiator_id=seg.run.initiator_id,
        fencing_token=seg.lease.epoch,
    )


def _preview_changed(
    state: SegmentState, seg: Segment, writer: Boundaries, turn: Turn, call: Call, tool: Tool | None
) -> Stop | None:
    """Compare-and-swap: before an approved call whose approval showed a preview runs, the
    preview is made again. ``None``: the same (or nothing to compare) — run it. Otherwise
    nothing runs: a ``verification`` event records both previews and the turn waits for
    approval again on a fresh card. Off when the configuration keeps previews as
    snapshots."""
    approved = call.preview
    if (
        tool is None
        or approved is None
        or not approved.ok
        or turn.approved is not True
        or seg.config.preview_is_snapshot
    ):
        return None
    with LeaseTicker(seg.lease) as ticker:
        fresh = _preview(seg, tool, call)
    if ticker.lost:
        return writer.lost(state, at="preview")
    if approved.still_holds(fresh):
        return None
    turn.approved = None
    changed = preview_changed_event(call, approved, fresh)
    return writer.write(state, [changed]) or suspend_for_approval(state, seg, writer, turn)


# -- one call at a time (an external agent loop, docs/external.md) --


def run_call(
    state: SegmentState, seg: Segment, writer: Boundaries, turn: Turn, call: Call
) -> Stop | None:
    """Run one call of ``turn`` (``state.loop.turn``) as ``run_turn`` runs it, for a caller whose
    framework executes a turn's calls one by one (``agentruns.external``): the turn's arguments
    checked first, the whole turn suspended while it waits for a decision (reads included, as
    ``run_turn``), then the call denied, waiting for input, re-checked (compare-and-swap) or run
    behind the fence, its ``tool`` event written at once (never deferred: nothing of Leasehold's
    follows it). ``None``: the call is done."""
    refused, accepted = _check_arguments(turn, seg.gate)
    if refused and (stop := writer.write(state, refused)):
        return stop
    if call.id in turn.done:
        return None
    if waits_for_approval(turn, seg.gate):
        return suspend_for_approval(state, seg, writer, turn)
    return _run_call(state, seg, writer, turn, call, accepted, last_of_turn=False)
